"""``capacity.json``: the capacity decision per cache state, written by the ``capacity`` stage
(:func:`capacity_pack.decide.capacity.build_capacity`) and copied into ``pack/``.

Each open-loop cache state carries its bracket, the capacity, per-replica and per-GPU figures
and one row per tested rate; each closed-loop state its curve and operating point. A rate row's
pooled evidence and variation are open-ended documents (:mod:`capacity_pack.decide.pooled`,
:mod:`capacity_pack.decide.repeats`).
"""

from __future__ import annotations

from typing import Any

from capacity_pack.artifacts.base import Artifact, Num, Part


class Bracket(Part):
    """[pass_rps, fail_rps): the highest rate shown to pass and the lowest shown to fail above it,
    what each end showed, its width against the search's resolution, and its sentence."""

    pass_rps: Num | None
    fail_rps: Num | None
    pass_status: str | None = None
    pass_evidence: str | None = None
    fail_status: str | None = None
    fail_summary: str | None = None
    fail_evidence: str | None = None
    width_rps: Num | None = None
    resolution_rps: Num | None = None
    reached: bool | None = None
    confidence: Num | None = None
    note: str | None = None


class PooledCount(Part):
    """A proportion's counts summed over the repeats: count / trials = value."""

    count: int
    trials: int
    value: Num | None


class Spread(Part):
    """One quantity over a rate's repeats (:func:`capacity_pack.decide.repeats.t_interval`,
    ``pooled_proportion``): n, mean, min, max, its interval and, for a proportion with counts,
    the pooled counts."""

    n: int
    mean: Num | None
    min: Num | None
    max: Num | None
    interval: list[Num] | None
    interval_method: str | None
    interval_note: str | None
    confidence: Num
    pooled: PooledCount | None = None


class ClassVariation(Part):
    attainment: Spread
    p95_ttft_ms: Spread
    p95_tpot_ms: Spread
    p95_e2e_ms: Spread


class Variation(Part):
    """Run-to-run variation of a rate's deciding repeats (:func:`capacity_pack.decide.repeats.
    variation`)."""

    observed_goodput_rps: Spread
    request_throughput_rps: Spread
    output_throughput_tps: Spread
    error_rate: Spread
    classes: dict[str, ClassVariation]


class RateRow(Part):
    """One tested open-loop rate: its status over the deciding repeats and why."""

    offered_rps: Num
    status: str
    pooled: dict[str, Any] | None = None
    evidence: str | None = None
    repeats: int | None = None
    verdicts: list[str] = []
    set_aside_repeats: list[int] = []
    set_aside_why: dict[str, str] = {}
    reasons: list[str] = []
    per_repeat: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    failure_summary: str | None = None
    variation: Variation | None = None


class NextRateUp(Part):
    offered_rps: Num
    status: str
    limited_by: list[str] = []
    failure_summary: str | None = None


class OpenLoopState(Part):
    """A cache state's open-loop decision."""

    rates: list[RateRow] = []
    capacity_rps: Num | None = None
    bracket: Bracket | None = None
    shown_to_pass_rps: Num | None = None
    capacity_per_replica_rps: Num | None = None
    capacity_per_gpu_nominal_rps: Num | None = None
    goodput_at_capacity_rps: Num | None = None
    goodput_per_gpu_rps: Num | None = None
    non_monotonic_passes_rps: list[Num] = []
    next_rate_up: NextRateUp | None = None
    decision: str | None = None

    @property
    def at_capacity(self) -> RateRow | None:
        """The row of the capacity rate (None: no rate meets the gates)."""
        return next((r for r in self.rates if r.offered_rps == self.capacity_rps), None)


class CurvePoint(Part):
    """One concurrency of the closed-loop curve: its status, throughputs (repeats' mean), each
    class's P95 TTFT/TPOT and attainment, whether it meets the latency gates, and why not."""

    concurrency: int
    status: str
    output_throughput_tps: Num | None
    request_throughput_rps: Num | None
    p95_ttft_ms: dict[str, Num | None]
    p95_tpot_ms: dict[str, Num | None]
    attainment: dict[str, Num | None]
    meets_latency_gates: bool
    reasons: list[str]


class ClosedLoopState(Part):
    """A cache state's closed-loop curve (one entry per concurrency) and its operating point."""

    curve: list[CurvePoint] = []
    operating_point: CurvePoint | None = None
    operating_point_status: str | None = None
    operating_point_is_largest_tested: bool | None = None
    operating_point_note: str | None = None
    single_user: CurvePoint | None = None
    saturation_tps: Num | None = None


class Finding(Part):
    """A measurement fault or note (:mod:`capacity_pack.decide.faults`)."""

    kind: str
    cache_state: str
    message: str


class Capacity(Artifact):
    """The decision: the pack, what it holds for, each cache state's open- and closed-loop
    answer, the physical-sanity faults and notes, the experiments' verdicts, and the sha256 of
    the settings it was decided on (``inputs_sha256``: a dry run judges the drills on it)."""

    pack: str | None = None
    pack_label: str | None = None
    primary_cache_state: str | None = None
    holds_for: dict[str, Any] | None = None
    open_loop: dict[str, OpenLoopState]
    closed_loop: dict[str, ClosedLoopState] = {}
    measurement_faults: list[Finding] = []
    measurement_notes: list[Finding] = []
    experiments: list[tuple[str, str]] = []
    inputs_sha256: str | None = None

    def primary(self) -> OpenLoopState | None:
        """The primary cache state's open-loop decision (None: not measured)."""
        return self.open_loop.get(self.primary_cache_state or "")
