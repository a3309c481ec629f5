"""Rule `sweep`: measure one point (logic in capacity_pack.measure.sweep)."""

from pathlib import Path

import pandas as pd

from capacity_pack.io import write_json_atomic
from capacity_pack.logs import job_logging
from capacity_pack.measure.sweep import SweepInputs, measure_point
from capacity_pack.plan.schedule import Point

with job_logging(snakemake.log[0]) as log:
    p = snakemake.params
    inputs = SweepInputs.model_validate_json(p.inputs)
    point = Point.parse(p.point, p.cache_state, p.repeat)
    schedule = pd.read_parquet(snakemake.input.schedule)
    out_dir = Path(snakemake.output.records).parent
    summary = measure_point(inputs, point, schedule, out_dir)
    write_json_atomic(snakemake.output.summary, summary)
    log.info(
        "%s: %d recorded, %d failed, lateness p99 %.3f ms%s",
        point.key,
        summary["requests_recorded"],
        summary["failed"],
        summary["dispatch_lateness_ms"]["p99"] or 0.0,
        " (CLIENT-BOUND)" if summary["client_bound"] else "",
    )
