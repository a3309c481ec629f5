"""Rule `track`: one MLflow child run per job of a stage (logic in capacity_pack.track.tracking)."""

import json
from pathlib import Path

from capacity_pack.io import write_json_atomic
from capacity_pack.logs import job_logging
from capacity_pack.track import tracking

with job_logging(snakemake.log[0]) as log:
    frozen = json.loads(Path(snakemake.input.frozen).read_text())
    runs = tracking.log_stage(
        frozen,
        snakemake.params.stage,
        [Path(p) for p in snakemake.input.summaries],
        results_dir=snakemake.params.results_root,
    )
    write_json_atomic(
        snakemake.output[0], {"manifest_sha256": frozen["sha256"], "child_runs": runs}
    )
    log.info(
        "%d %s jobs tracked under manifest %s",
        len(runs),
        snakemake.params.stage,
        frozen["sha256"][:12],
    )
