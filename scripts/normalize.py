"""Rule `normalize`: records -> validated requests, chunks and metrics tables."""

import json
from pathlib import Path

from capacity_pack.evidence.normalize import normalize_point, seed_csv_frame
from capacity_pack.io import atomic_path, write_json_atomic
from capacity_pack.logs import job_logging
from capacity_pack.plan.schedule import Point, ScheduleInputs

with job_logging(snakemake.log[0]) as log:
    p, i, o = snakemake.params, snakemake.input, snakemake.output
    point = Point.parse(p.point, p.cache_state, p.repeat)
    sweep = json.loads(Path(i.summary).read_text())
    tables = normalize_point(
        i.records, i.schedule, i.metrics, sweep, ScheduleInputs.model_validate_json(p.inputs), point
    )
    for key in ("requests", "chunks", "metrics"):
        with atomic_path(getattr(o, key)) as tmp:
            tables[key].to_parquet(tmp, index=False)
    with atomic_path(o.csv) as tmp:
        seed_csv_frame(tables["requests"]).to_csv(tmp, index=False)
    write_json_atomic(o.summary, {"point": point.key, **tables["reconciliation"]})
    log.info("%s: %s", point.key, tables["reconciliation"])
