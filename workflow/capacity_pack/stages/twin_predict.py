"""Stage ``twin_predict``: the calibrated twin's open-loop capacity per cache state, predicted in
virtual time from the calibration and the manifest alone, before any open-loop point is read.

The rule's inputs are the calibrated profile and its calibration document, never an open-loop
point's file: what it writes is a prediction, and ``twin_validate`` compares it with the
measurement afterwards (:mod:`capacity_pack.twin.validate`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from capacity_pack.io import file_sha256, write_json_atomic
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.twin.preflight import preflight

FORMAT = "capacity-pack/twin-prediction/v1"


def run(
    *,
    pack: str,
    profile: str | Path,
    calibration: str | Path,
    prediction: str | Path,
    log: logging.Logger,
) -> dict[str, Any]:
    """Write ``prediction.json``: each cache state's predicted bracket and the rates the
    prediction ran, with the profile's sha256 and the calibration it came from."""
    from capacity_pack.sim.profile import load_profile

    validated = validate_pack(json.loads(pack), "twin_predict params")
    calibrated = json.loads(Path(calibration).read_text(encoding="utf-8"))
    doc: dict[str, Any] = {
        "format": FORMAT,
        "pack": validated.pack.name,
        "profile": str(profile),
        "profile_sha256": file_sha256(profile),
        "calibration": {
            k: calibrated.get(k)
            for k in ("parameters", "method", "points", "residuals")
            if k in calibrated
        },
        "made_from": "the calibrated profile and the manifest; no open-loop measurement",
        "cache_states": {},
    }
    result = preflight(validated, load_profile(profile))
    doc["cpu_s"] = result.cpu_s
    doc["method"] = result.method
    for b in result.brackets:
        doc["cache_states"][b.cache_state] = {
            "pass_rps": b.pass_rps,
            "fail_rps": b.fail_rps,
            "resolution_rps": b.resolution_rps,
            "text": b.text(),
            "why": b.why,
            "probes": [p.to_dict() for p in b.probes],
        }
        log.info("twin_predict: %s: the twin predicts %s", b.cache_state, b.text())
    if result.unavailable:
        doc["unavailable"] = result.unavailable
    write_json_atomic(prediction, doc)
    return doc
