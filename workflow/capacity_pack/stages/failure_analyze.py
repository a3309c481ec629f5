"""Stage ``failure_analyze``: one drill's failure-test fields, with the pack's alert rules
evaluated on the drill's series, and its timeline picture."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from capacity_pack.drills.analyze import DrillAnalysisSpec, analyze_drill
from capacity_pack.drills.timeline import plot_drill_timeline
from capacity_pack.evidence.gates import CLASS_ATTAINMENT
from capacity_pack.io import write_json_atomic


def run(
    *,
    spec: str | DrillAnalysisSpec,
    drill: str | Path,
    rules: str | Path,
    report: str | Path,
    log: logging.Logger,
    timeline: str | Path | None = None,
) -> dict[str, Any]:
    """Analyze the drill whose files lie beside ``drill``; write and return its report, and
    draw its timeline to ``timeline`` (a skipped drill's picture says so)."""
    if isinstance(spec, str):
        spec = DrillAnalysisSpec.model_validate_json(spec)
    doc = analyze_drill(Path(drill).parent, rules, spec)
    write_json_atomic(report, doc)
    if timeline is not None:
        plot_drill_timeline(doc, spec.threshold(CLASS_ATTAINMENT), timeline)
    if doc.get("alerts_evaluated", True):
        log.info(
            "drill %s: alerts fired %s; expected alert fired: %s",
            doc["drill"],
            doc.get("alerts_fired"),
            doc.get("expected_alert_fired"),
        )
    else:
        log.warning("drill %s: alerts not evaluated: %s", doc["drill"], doc["alert_evaluation"])
    return doc
