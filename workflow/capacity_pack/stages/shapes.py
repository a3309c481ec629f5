"""Stage ``shapes``: each load-shape experiment's own answer (:mod:`capacity_pack.decide.shapes`),
``pack/shapes.json`` and one ``pack/shape-<experiment>.png`` each, from the experiment points'
requests, server series and SLO reports."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from capacity_pack.artifacts import SloReport
from capacity_pack.decide.shapes import PointData, ShapesInputs, answer_points, draw
from capacity_pack.io import write_json_atomic


def point_key(path: str | Path) -> str:
    """``exp-x/warm/rep0`` of a point's file (``.../<point>/<cache>/rep<k>/<file>``)."""
    return "/".join(Path(path).parts[-4:-1])


def run(
    *,
    inputs: str | ShapesInputs,
    requests: Sequence[str | Path],
    metrics: Sequence[str | Path],
    reports: Sequence[str | Path],
    json_path: str | Path,
    log: logging.Logger,
) -> dict[str, Any]:
    """Write ``json_path`` (shapes.json) and the plots beside it; return the document."""
    if isinstance(inputs, str):
        inputs = ShapesInputs.model_validate_json(inputs)
    docs = {point_key(p): SloReport.read(p).dump() for p in reports}
    series = {point_key(p): p for p in metrics}
    points = [
        PointData(
            key=point_key(p),
            requests=pd.read_parquet(p),
            metrics=pd.read_parquet(series[point_key(p)]),
            report=docs[point_key(p)],
        )
        for p in requests
    ]
    doc = answer_points(points, inputs)
    folder = Path(json_path).parent
    folder.mkdir(parents=True, exist_ok=True)
    plots = draw(doc, folder)
    write_json_atomic(json_path, doc)
    for e in doc["experiments"]:
        for p in e["points"]:
            log.info("%s (%s): %s", p["key"], e["test_type"], p["answer"])
    log.info("load-shape answers written to %s (%d plots)", json_path, len(plots))
    return doc
