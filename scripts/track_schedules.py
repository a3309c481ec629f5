"""Rule `track_schedules`: one MLflow child run per schedule job under the current parent."""

import json
from pathlib import Path

from capacity_pack import tracking
from capacity_pack.io import write_json_atomic
from capacity_pack.logs import job_logging
from capacity_pack.schedule import tracking_record

with job_logging(snakemake.log[0]) as log:
    frozen = json.loads(Path(snakemake.input.frozen).read_text())
    runs = {}
    for path in map(Path, snakemake.input.summaries):
        record = tracking_record(json.loads(path.read_text()))
        runs[record["job"]] = tracking.log_child_run(
            frozen, artifacts=[path], results_dir=snakemake.params.results_root, **record
        )
    write_json_atomic(
        snakemake.output[0], {"manifest_sha256": frozen["sha256"], "child_runs": runs}
    )
    log.info("%d schedule jobs tracked under manifest %s", len(runs), frozen["sha256"][:12])
