"""Stage ``analyze``: one point's per-class SLO report (gates, CIs, trend, Little's Law)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd

from capacity_pack.evidence.analysis import AnalysisSpec, analyze_point
from capacity_pack.io import write_json_atomic
from capacity_pack.plan.schedule import Point


def run(
    *,
    spec: str | AnalysisSpec,
    point: str,
    cache_state: str,
    repeat: int,
    requests: str | Path,
    chunks: str | Path,
    metrics: str | Path,
    sweep: str | Path,
    report: str | Path,
    log: logging.Logger,
) -> dict[str, Any]:
    """Write the point's ``slo-report.json`` from its tables and sweep summary; return it."""
    pt = Point.parse(point, cache_state, int(repeat))
    if isinstance(spec, str):
        spec = AnalysisSpec.model_validate_json(spec)
    doc = analyze_point(
        pd.read_parquet(requests),
        pd.read_parquet(chunks),
        pd.read_parquet(metrics),
        json.loads(Path(sweep).read_text()),
        spec.classes(),
        spec.gates(),
    )
    doc.update(
        point=pt.point_id,
        key=pt.key,
        cache_state=pt.cache_state,
        repeat=pt.repeat,
        mode=pt.mode,
        offered_rps=pt.rate_rps,
        concurrency=pt.concurrency,
        pack_label=spec.pack_label,
    )
    write_json_atomic(report, doc)
    log.info("%s: %s (%s)", pt.key, doc["verdict"], "; ".join(doc["verdict_reasons"]))
    return doc
