"""Stage ``twin_predict``: the calibrated twin's open-loop capacity per cache state, predicted in
virtual time from the calibration and the manifest alone: no open-loop point's file is an input,
so what it writes is a prediction that ``twin_validate`` compares with the measurement.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from capacity_pack.artifacts.prediction import FORMAT, PredictedBracket, TwinPrediction
from capacity_pack.io import file_sha256
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.twin.preflight import preflight

# What of the calibration document the prediction keeps beside it.
CALIBRATION_KEYS = ("parameters", "method", "points", "residuals")


def run(
    *,
    pack: str,
    profile: str | Path,
    calibration: str | Path,
    prediction: str | Path,
    log: logging.Logger,
) -> TwinPrediction:
    """Write ``prediction.json``: each cache state's predicted bracket and the rates the
    prediction ran, with the profile's sha256 and the calibration it came from."""
    from capacity_pack.sim.profile import load_profile

    validated = validate_pack(json.loads(pack), "twin_predict params")
    calibrated = json.loads(Path(calibration).read_text(encoding="utf-8"))
    result = preflight(validated, load_profile(profile))
    doc = TwinPrediction(
        format=FORMAT,
        pack=validated.pack.name,
        profile=str(profile),
        profile_sha256=file_sha256(profile),
        calibration={k: calibrated[k] for k in CALIBRATION_KEYS if k in calibrated},
        made_from="the calibrated profile and the manifest; no open-loop measurement",
        cache_states={
            b.cache_state: PredictedBracket(
                pass_rps=b.pass_rps, fail_rps=b.fail_rps, resolution_rps=b.resolution_rps,
                text=b.text(), why=b.why, probes=[p.to_dict() for p in b.probes],
            )
            for b in result.brackets
        },
        cpu_s=result.cpu_s,
        method=result.method,
    )  # fmt: skip
    for state, b in doc.cache_states.items():
        log.info("twin_predict: %s: the twin predicts %s", state, b.text)
    if result.unavailable:
        doc.unavailable = result.unavailable
    doc.write(prediction)
    return doc
