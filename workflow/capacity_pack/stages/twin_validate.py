"""Stage ``twin_validate``: the twin's prediction against the pack's measured capacity
(:func:`capacity_pack.twin.validate.validate`), with the twin run at every measured open-loop
rate for the per-class attainment errors. Method: docs/twin.md, "Prediction, then validation".
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from capacity_pack.artifacts import Capacity, TwinPrediction, TwinValidation
from capacity_pack.artifacts.twin_validation import FORMAT
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.twin.validate import DEFAULT_TOLERANCE_REL, validate
from capacity_pack.twin.virtual_point import VirtualPointError, predict_point


def run(
    *,
    pack: str,
    profile: str | Path,
    prediction: str | Path,
    capacity: str | Path,
    validation: str | Path,
    log: logging.Logger,
    tolerance_rel: float = DEFAULT_TOLERANCE_REL,
) -> TwinValidation:
    """Write ``validation.json``; return it."""
    from capacity_pack.sim.profile import load_profile

    validated = validate_pack(json.loads(pack), "twin_validate params")
    predicted, measured = TwinPrediction.read(prediction), Capacity.read(capacity)
    attainment: dict[str, dict[float, dict[str, float]]] = {}
    skipped = None
    if not predicted.unavailable:
        model = load_profile(profile)
        for state, entry in sorted(measured.open_loop.items()):
            for row in entry.rates:
                rate = float(row.offered_rps)
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
        **validate(predicted.dump(), measured.dump(), tolerance_rel, attainment),
    }
    if predicted.unavailable:
        doc["trusted"] = False
        doc["why"] = f"no prediction: {predicted.unavailable}"
    if skipped:
        doc["attainment_skipped"] = skipped
    written = TwinValidation.parse(doc, validation)
    written.write(validation)
    for s in written.states:
        log.info("twin_validate: %s (%s)", s.sentence, s.why)
    log.info("twin_validate: trusted %s: %s", written.trusted, written.why)
    return written
