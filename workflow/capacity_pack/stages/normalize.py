"""Stage ``normalize``: one point's records -> validated requests, chunks and metrics tables."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from capacity_pack.evidence.normalize import normalize_point, seed_csv_frame
from capacity_pack.io import atomic_path, write_json_atomic
from capacity_pack.plan.schedule import Point, ScheduleInputs


def run(
    *,
    inputs: str | ScheduleInputs,
    point: str,
    cache_state: str,
    repeat: int,
    records: str | Path,
    sweep_metrics: str | Path,
    sweep_summary: str | Path,
    schedule: str | Path,
    requests: str | Path,
    chunks: str | Path,
    metrics: str | Path,
    csv: str | Path,
    summary: str | Path,
    log: logging.Logger,
) -> dict[str, Any]:
    """Write the point's tables (parquet, and requests as CSV) and the reconciliation summary."""
    pt = Point.parse(point, cache_state, int(repeat))
    if isinstance(inputs, str):
        inputs = ScheduleInputs.model_validate_json(inputs)
    sweep = json.loads(Path(sweep_summary).read_text())
    tables = normalize_point(records, schedule, sweep_metrics, sweep, inputs, pt)
    for key, path in (("requests", requests), ("chunks", chunks), ("metrics", metrics)):
        with atomic_path(path) as tmp:
            tables[key].to_parquet(tmp, index=False)
    with atomic_path(csv) as tmp:
        seed_csv_frame(tables["requests"]).to_csv(tmp, index=False)
    doc = {"point": pt.key, **tables["reconciliation"]}
    write_json_atomic(summary, doc)
    log.info("%s: %s", pt.key, tables["reconciliation"])
    return doc
