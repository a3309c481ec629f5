"""``twin/validation.json`` (``pack/twin-validation.json`` in the pack): the twin's predicted
capacity against the measured one, per cache state, and whether the twin is trusted; written by
``twin_validate`` (:func:`capacity_pack.twin.validate.validate`), read by ``report``, the plan
drill's twin (:mod:`capacity_pack.twin.trust`), ``capacity-pack what-if`` and
``capacity-pack failure --twin``.
"""

from __future__ import annotations

from typing import Any

from capacity_pack.artifacts.base import Artifact, Num, Part

FORMAT = "capacity-pack/twin-validation/v1"


class PredictedEnds(Part):
    """The twin's bracket and the capacity it predicts (its midpoint, or its one end)."""

    pass_rps: Num | None
    fail_rps: Num | None
    capacity_rps: Num | None


class MeasuredEnds(Part):
    """The measured open-loop bracket, from ``capacity.json``."""

    pass_rps: Num | None
    fail_rps: Num | None


class ValidatedState(Part):
    """One cache state compared: both brackets, the capacity error (relative to the measured
    bracket; None: nothing to compare) and its sign, whether it is within the tolerance, why, the
    sentence, and the per-class attainment at every measured rate, measured beside predicted
    (``offered_rps``, ``class``, ``measured``, ``predicted``, ``error``)."""

    cache_state: str
    predicted: PredictedEnds
    measured: MeasuredEnds
    capacity_error_rel: Num | None
    signed_error_rel: Num | None
    within_tolerance: bool | None
    why: str
    sentence: str
    attainment: list[dict[str, Any]]
    attainment_error_max_abs: Num | None


class Misfit(Part):
    """The calibration's worst replayed closed-loop metric."""

    point: str | None
    concurrency: Num | None
    metric: str
    median_rel_error: Num


class TwinValidation(Artifact):
    """The validation: the tolerance, the verdict ``trusted`` (every compared state within it;
    False when none could be compared or no prediction was made) and why, the calibration's
    largest misfit, each :class:`ValidatedState`, and why the per-class attainments were not
    computed where they were not."""

    format: str = FORMAT
    pack: str | None = None
    tolerance_rel: Num
    trusted: bool
    why: str
    largest_misfit: Misfit | None
    states: list[ValidatedState]
    attainment_skipped: str | None = None

    @property
    def worst(self) -> ValidatedState | None:
        """The compared cache state with the largest capacity error (None: none compared)."""
        compared = [s for s in self.states if s.capacity_error_rel is not None]
        return max(compared, key=lambda s: s.capacity_error_rel) if compared else None
