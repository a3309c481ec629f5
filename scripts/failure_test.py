"""Rule `failure_test`: failure-test.md and its JSON twin (capacity_pack.drills.render)."""

import json
from pathlib import Path

from capacity_pack.drills.render import failure_test, failure_test_markdown
from capacity_pack.io import write_json_atomic, write_text_atomic
from capacity_pack.logs import job_logging

with job_logging(snakemake.log[0]) as log:
    reports = [json.loads(Path(p).read_text()) for p in snakemake.input.reports]
    doc = failure_test(reports, json.loads(snakemake.params.pack))
    write_json_atomic(snakemake.output.json, doc)
    write_text_atomic(snakemake.output.markdown, failure_test_markdown(doc))
    log.info("failure test: %s", doc["summary"])
