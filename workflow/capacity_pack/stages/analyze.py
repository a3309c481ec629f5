"""Stage ``analyze``: one point's per-class SLO report (gates, CIs, trend, Little's Law), each
class's misses attributed to their causes by the request autopsy's ``server_series`` method
(estimated from the scraped series: the analysis has no ground truth), its lengths checked
against the manifest (:mod:`capacity_pack.evidence.lengths`) and the system and per-user
throughput (:mod:`capacity_pack.evidence.throughput`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd

from capacity_pack.artifacts import SloReport
from capacity_pack.autopsy.requests import attribute_misses, miss_shares
from capacity_pack.evidence.analysis import AnalysisSpec, analyze_point
from capacity_pack.evidence.lengths import length_report
from capacity_pack.evidence.throughput import throughput_report
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
    control: str | None = None,
) -> dict[str, Any]:
    """Write the point's ``slo-report.json`` from its tables and sweep summary; return it.
    ``control`` (JSON of :class:`capacity_pack.twin.control.ControlInputs`; empty where it does
    not apply): each class also gets the engine model as its attainment's control variate."""
    pt = Point.parse(point, cache_state, int(repeat))
    if isinstance(spec, str):
        spec = AnalysisSpec.model_validate_json(spec)
    table, series = pd.read_parquet(requests), pd.read_parquet(metrics)
    summary = json.loads(Path(sweep).read_text())
    doc = analyze_point(
        table, pd.read_parquet(chunks), series, summary, spec.classes(), spec.gates()
    )
    if control:
        from capacity_pack.twin.control import ControlInputs, annotate

        blocks = int(summary.get("extension_blocks") or 0)  # the extension blocks it sent
        annotate(doc, table, ControlInputs.model_validate_json(control), pt, blocks)
    attribute(doc, table, series, spec)
    lengths_and_throughput(doc, table, spec)
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
    SloReport.parse(doc, report).write(report)
    log.info("%s: %s (%s)", pt.key, doc["verdict"], "; ".join(doc["verdict_reasons"]))
    return doc


def lengths_and_throughput(doc: dict[str, Any], table: pd.DataFrame, spec) -> None:
    """Each class entry of ``doc`` gets its ``lengths``, ``lengths_match_manifest`` and
    ``lengths_match_why``; ``doc`` gets the point's ``lengths_match_manifest``, the check's
    ``lengths_check`` (method, alpha) and ``throughput`` (system and per user)."""
    lengths = length_report(table, spec.workload)
    for name, entry in lengths["classes"].items():
        doc["classes"][name].update(entry)
    doc["lengths_match_manifest"] = lengths["lengths_match_manifest"]
    doc["lengths_check"] = lengths["lengths_check"]
    names = [c.name for c in spec.workload]
    doc["throughput"] = throughput_report(table, doc["measured_window_s"], names)


def attribute(doc: dict[str, Any], table: pd.DataFrame, series: pd.DataFrame, spec) -> None:
    """Each class entry of ``doc`` gets ``attribution``: its misses' causes, or None without."""
    shares = miss_shares(attribute_misses(table, spec.workload, None, series), table)["classes"]
    for name, entry in doc["classes"].items():
        s = shares.get(name)
        if not s or not s["missed"]:
            entry["attribution"] = None
            continue
        share = {c: v for c, v in s["cause_share"].items() if v > 0}
        entry["attribution"] = {
            "method": "server_series (estimated from the scraped queue and preemption series)",
            "missed": s["missed"],
            "primary_cause": max(share, key=share.get),
            "cause_share": share,
            "mean_excess_ms": {c: s["mean_excess_ms"][c] for c in share},
        }
