"""Stage ``failure_analyze``: one drill's failure-test fields, with the pack's alert rules
evaluated on the drill's series."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from capacity_pack.drills.analyze import DrillAnalysisSpec, analyze_drill
from capacity_pack.io import write_json_atomic


def run(
    *,
    spec: str | DrillAnalysisSpec,
    drill: str | Path,
    rules: str | Path,
    report: str | Path,
    log: logging.Logger,
) -> dict[str, Any]:
    """Analyze the drill whose files lie beside ``drill``; write and return its report."""
    if isinstance(spec, str):
        spec = DrillAnalysisSpec.model_validate_json(spec)
    doc = analyze_drill(Path(drill).parent, rules, spec)
    write_json_atomic(report, doc)
    log.info(
        "drill %s: alerts fired %s; expected alert fired: %s",
        doc["drill"],
        doc.get("alerts_fired"),
        doc.get("expected_alert_fired"),
    )
    return doc
