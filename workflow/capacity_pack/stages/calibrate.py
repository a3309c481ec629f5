"""Stage ``calibrate``: the target's engine model fitted to the pack's declared closed-loop points
of the cold cache state (:mod:`capacity_pack.twin.calibrate`), never to an open-loop point, so a
prediction made with it has not seen the open loop."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from capacity_pack.io import write_text_atomic
from capacity_pack.sim.profile import Profile
from capacity_pack.twin.calibrate import CalibrationInputs, fit, load_point, report


def run(
    *,
    inputs: str | CalibrationInputs,
    tables: list[str | Path],
    calibration: str | Path,
    profile: str | Path,
    log: logging.Logger,
) -> dict[str, Any]:
    """Fit the profile to ``tables`` (the requests tables of ``inputs.points``, in order); write
    ``calibration`` (JSON) and ``profile`` (YAML); return the calibration document."""
    if isinstance(inputs, str):
        inputs = CalibrationInputs.model_validate_json(inputs)
    if len(tables) != len(inputs.points):
        raise ValueError(f"{len(tables)} tables for {len(inputs.points)} calibration points")
    points = [
        load_point(path, f"{p.point}/{p.cache_state}/rep{p.repeat}", p.concurrency)
        for p, path in zip(inputs.points, tables, strict=True)
    ]
    base = Profile.model_validate(inputs.base_profile)
    fitted = fit(base, points)
    doc, text = report(fitted, inputs)
    doc_text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    write_text_atomic(profile, text)
    write_text_atomic(calibration, doc_text)
    est, se = fitted.estimates, fitted.std_errors
    keys = ("flops_per_s", "bytes_per_s", "step_overhead_ms", "per_sequence_overhead_us")
    log.info(
        "calibrate: F %.4g FLOP/s (se %.2g), B %.4g B/s (se %.2g), step overhead %.3f ms "
        "(se %.3f), per-sequence %.2f us (se %.2f), request latency %.3f ms; poorly identified: "
        "%s; %d replays",
        *(v for k in keys for v in (est[k], se[k])),
        est["request_latency_ms"],
        ", ".join(fitted.poorly_identified) or "none",
        fitted.evaluations,
    )
    return doc
