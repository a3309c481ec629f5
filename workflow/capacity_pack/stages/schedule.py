"""Stage ``schedule``: build, validate and write one point's seeded arrival schedule."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from capacity_pack.plan.schedule import Point, ScheduleInputs, build_schedule
from capacity_pack.plan.schedule_table import write_schedule


def run(
    *,
    inputs: str | ScheduleInputs,
    point: str,
    cache_state: str,
    repeat: int,
    schedule: str | Path,
    summary: str | Path,
    log: logging.Logger,
    extension_blocks: int = 0,
) -> dict[str, Any]:
    """Write the point's schedule parquet and its summary JSON; return the summary."""
    pt = Point.parse(point, cache_state, int(repeat))
    if isinstance(inputs, str):
        inputs = ScheduleInputs.model_validate_json(inputs)
    frame = build_schedule(inputs, pt, extension_blocks=extension_blocks)
    doc = write_schedule(frame, inputs, pt, schedule, summary)
    log.info("schedule %s: %d requests over %.1f s", pt.key, len(frame), doc["duration_s"])
    return doc
