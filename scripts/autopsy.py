"""Rule `autopsy`: the run's and the SLO misses' autopsy (logic in capacity_pack.autopsy)."""

import json
from pathlib import Path

from capacity_pack.autopsy import autopsy_markdown
from capacity_pack.autopsy.requests import request_autopsy
from capacity_pack.autopsy.run import run_autopsy
from capacity_pack.io import write_json_atomic, write_text_atomic
from capacity_pack.logs import job_logging
from capacity_pack.plan.manifest import validate_pack

with job_logging(snakemake.log[0]) as log:
    p = snakemake.params
    pack = validate_pack(json.loads(p.pack), "autopsy params")
    results = Path(p.results_dir)
    run = run_autopsy(
        results,
        Path(p.log_dir),
        Path(p.repo_dir),
        pack.pack.name,
        mlflow_db=results.parent / "mlflow.db",
    )
    tables = results / "tables"
    keys = [Path(f).parent.relative_to(tables).as_posix() for f in snakemake.input.requests]
    requests = request_autopsy(tables, results / "raw", pack, keys=keys)
    doc = {"pack": pack.pack.name, "run": run, "requests": requests}
    write_json_atomic(snakemake.output.json, doc)
    write_text_atomic(snakemake.output.markdown, autopsy_markdown(doc, pack))
    log.info("autopsy of %s written", pack.pack.name)
