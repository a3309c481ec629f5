"""A drill's files, written once it ran (live or in virtual time): ``schedule.parquet``,
``samples.parquet``, ``scrapes.parquet``, ``events.json`` and ``drill.json`` (each atomically;
``records.jsonl`` is the load generator's, or the virtual drill's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from capacity_pack.io import atomic_path, write_text_atomic


def write_outputs(
    out: Path,
    facts: dict[str, Any],
    events: list[dict[str, Any]] | None,
    samples: pd.DataFrame,
    scrapes: pd.DataFrame,
    schedule: pd.DataFrame | None,
) -> None:
    from capacity_pack.io import finite_or_none

    if schedule is not None:
        with atomic_path(out / "schedule.parquet") as tmp:
            schedule.to_parquet(tmp, index=False)
    elif not (out / "records.jsonl").exists():
        write_text_atomic(out / "records.jsonl", "")
    for name, frame in (("samples.parquet", samples), ("scrapes.parquet", scrapes)):
        with atomic_path(out / name) as tmp:
            frame.to_parquet(tmp, index=False)
    write_text_atomic(out / "events.json", json.dumps({"events": events}, indent=1) + "\n")
    write_text_atomic(out / "drill.json", json.dumps(finite_or_none(facts), indent=1) + "\n")
