"""Stage ``report``: the pack folder a person reads (README, plots, manifest, the selected point's
requests and SLO report). The ``publish`` stage puts it on the MLflow parent run, last."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from capacity_pack.artifacts import Capacity, FailureTest, Plan, TwinValidation
from capacity_pack.decide.report import load_reports, selected_point, write_pack
from capacity_pack.decide.shapes import readme_lines as shapes_readme
from capacity_pack.twin.validate import readme_lines as twin_readme


def run(
    *,
    frozen: str | Path,
    fit: str | Path,
    capacity: str | Path,
    plan: str | Path,
    reports: Sequence[str | Path],
    tables: Sequence[str | Path],
    metrics: Sequence[str | Path],
    readme: str | Path,
    log: logging.Logger,
    failure: str | Path | None = None,
    shapes: str | Path | None = None,
    twin: str | Path | None = None,
) -> list[Path]:
    """Write the pack beside ``readme``; ``tables`` are the points' requests.csv and ``metrics``
    their server-metrics tables (the open-loop ones make the time-series plot); ``failure`` the
    failure test's JSON (its plan drill answers the failure question at the README's top);
    ``twin`` the twin's validation (predicted vs measured capacity). Returns the files written."""
    frozen_doc = json.loads(Path(frozen).read_text())
    cap, replicas = Capacity.read(capacity).dump(), Plan.read(plan).dump()
    docs = load_reports(list(reports))
    selected = selected_point(cap, docs)
    tables_dir = Path(tables[0]).parents[3]
    series = {
        str(Path(p).parent.relative_to(tables_dir)): pd.read_parquet(p)
        for p in metrics
        if Path(p).parts[-4].startswith("open-")
    }
    out_dir = Path(readme).parent
    files = write_pack(
        out_dir,
        frozen=frozen_doc,
        capacity=cap,
        plan=replicas,
        reports=docs,
        selected_tables=tables_dir / selected["key"] if selected else None,
        selected_report=selected,
        series=series,
        extra_files=[Path(fit)],
        failure=FailureTest.read(failure).dump() if failure else None,
        shapes=_shapes(shapes),
        twin=(twin_readme(TwinValidation.read(twin).dump()), Path(twin)) if twin else None,
    )
    log.info("pack written to %s (%d files)", out_dir, len(files))
    return files


def _shapes(path: str | Path | None) -> tuple[list[str], list[str]] | None:
    """The README's load-shape section and the pack files it refers to."""
    if path is None:
        return None
    doc = json.loads(Path(path).read_text())
    return shapes_readme(doc), [Path(path).name, *(e["plot"] for e in doc["experiments"])]
