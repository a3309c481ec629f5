"""Stage ``twin_validate``: the twin's prediction against the pack's measured capacity.

Reads the prediction (``twin_predict``, made before the open loop was read) and ``capacity.json``,
runs the twin at every measured open-loop rate of every cache state (per-class attainment, the
virtual point's point estimate) and writes :func:`capacity_pack.twin.validate.validate`'s
document: capacity error per cache state against the measured bracket, attainment errors, and
whether the twin is trusted within the pack's tolerance.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from capacity_pack.io import write_json_atomic
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.twin.validate import DEFAULT_TOLERANCE_REL, validate
from capacity_pack.twin.virtual_point import VirtualPointError, predict_point

FORMAT = "capacity-pack/twin-validation/v1"


def run(
    *,
    pack: str,
    profile: str | Path,
    prediction: str | Path,
    capacity: str | Path,
    validation: str | Path,
    log: logging.Logger,
    tolerance_rel: float = DEFAULT_TOLERANCE_REL,
) -> dict[str, Any]:
    """Write ``validation.json``; return it."""
    from capacity_pack.sim.profile import load_profile

    validated = validate_pack(json.loads(pack), "twin_validate params")
    predicted = json.loads(Path(prediction).read_text(encoding="utf-8"))
    measured = json.loads(Path(capacity).read_text(encoding="utf-8"))
    attainment: dict[str, dict[float, dict[str, float]]] = {}
    skipped = None
    if not predicted.get("unavailable"):
        model = load_profile(profile)
        for state, entry in sorted(measured.get("open_loop", {}).items()):
            for row in entry.get("rates", []):
                rate = float(row["offered_rps"])
                try:
                    point = predict_point(validated, rate, state, model)
                except VirtualPointError as err:
                    skipped = str(err)
                    break
                attainment.setdefault(state, {})[rate] = {
                    c.name: c.attainment for c in point.classes if c.attainment is not None
                }
    doc = {
        "format": FORMAT,
        "pack": validated.pack.name,
        **validate(predicted, measured, tolerance_rel, attainment),
    }
    if predicted.get("unavailable"):
        doc["trusted"] = False
        doc["why"] = f"no prediction: {predicted['unavailable']}"
    if skipped:
        doc["attainment_skipped"] = skipped
    write_json_atomic(validation, doc)
    for s in doc["states"]:
        log.info("twin_validate: %s (%s)", s["sentence"], s["why"])
    log.info("twin_validate: trusted %s: %s", doc["trusted"], doc["why"])
    return doc
