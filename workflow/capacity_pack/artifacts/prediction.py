"""``twin/prediction.json``: the calibrated twin's open-loop capacity, predicted before any
open-loop point is read; written by ``twin_predict``, compared with ``capacity.json`` by
``twin_validate``.
"""

from __future__ import annotations

from typing import Any

from capacity_pack.artifacts.base import Artifact, Num, Part

FORMAT = "capacity-pack/twin-prediction/v1"


class PredictedBracket(Part):
    """A cache state's predicted [pass_rps, fail_rps), its text, why the search stopped there,
    and every virtual probe it ran (rate, verdict, per-class attainment)."""

    pass_rps: Num | None
    fail_rps: Num | None
    resolution_rps: Num | None = None
    text: str
    why: str
    probes: list[dict[str, Any]] = []


class TwinPrediction(Artifact):
    """The prediction: its format, pack, profile (path and sha256), the calibration it came
    from (the calibration document's parameters, method, points and residuals), the virtual
    search's method and CPU seconds, each cache state's :class:`PredictedBracket`, and
    ``unavailable`` (why no prediction could be made) when none was."""

    format: str = FORMAT
    pack: str
    profile: str
    profile_sha256: str
    calibration: dict[str, Any] = {}
    made_from: str
    cache_states: dict[str, PredictedBracket] = {}
    cpu_s: Num | None = None
    method: str | None = None
    unavailable: str | None = None
