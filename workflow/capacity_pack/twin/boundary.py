"""The engine model's own long-run SLO boundary for a pack: the reference a measured capacity
is checked against, without the search, the client or any server.

Per cache state, the rate where the worst class's mean long-run attainment
(:func:`capacity_pack.sim.virtual.attainment_at`, one replica) crosses the gate, by doubling
then bisection. Method and its noise: docs/twin.md, "The engine model's own boundary".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from capacity_pack.plan.manifest import Pack, SimTarget, sample_lengths
from capacity_pack.plan.schedule import ScheduleInputs
from capacity_pack.sim.profile import load_profile
from capacity_pack.sim.virtual import SharedPrefixes, VirtualClass, attainment_at

#: Draws standing for a class's length distribution in the model's runs.
POOL = 20_000
#: Doublings (or halvings) from the start before the boundary is given up on.
MAX_STEPS = 12


@dataclass(frozen=True)
class ModelBoundary:
    """A cache state's model boundary: the bracket [meets_rps, misses_rps) and how it was run."""

    cache_state: str
    meets_rps: float
    misses_rps: float
    gate: float
    duration_s: float
    seeds: tuple[int, ...]
    # The worst class's attainment at each rate evaluated, {rate: {class: attainment}}.
    evaluated: dict[float, dict[str, float]]

    @property
    def midpoint_rps(self) -> float:
        return (self.meets_rps + self.misses_rps) / 2

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["evaluated"] = {f"{r:g}": v for r, v in sorted(self.evaluated.items())}
        doc["midpoint_rps"] = self.midpoint_rps
        return doc


def length_pool(spec: Any, seed: int = 0) -> int | tuple[int, ...]:
    """A fixed length as it is; a distribution as a seeded pool of :data:`POOL` draws."""
    if isinstance(spec, int):
        return spec
    return tuple(int(v) for v in sample_lengths(spec, np.random.default_rng(seed), POOL))


def virtual_classes(pack: Pack | ScheduleInputs) -> list[VirtualClass]:
    """The workload classes of a pack (or of a point's schedule inputs) for
    :func:`capacity_pack.sim.virtual.attainment_at`."""
    return [
        VirtualClass(
            c.name,
            c.mix,
            length_pool(c.input_tokens),
            length_pool(c.output_tokens),
            c.request_ttft_cutoff_ms / 1e3,
            c.request_tpot_cutoff_ms / 1e3,
        )
        for c in pack.workload
    ]


def shared_prefixes(pack: Pack | ScheduleInputs, cache_state: str) -> SharedPrefixes | None:
    """The warm cache's shared prefixes (None cold)."""
    if cache_state != "warm":
        return None
    spec = pack.prompts.prefix
    return SharedPrefixes(spec.shared_prefixes, spec.prefix_tokens, spec.zipf_exponent)


def model_boundary(
    pack: Pack,
    cache_state: str,
    *,
    duration_s: float = 300.0,
    seeds: tuple[int, ...] = tuple(range(8)),
    resolution_rps: float = 0.25,
    start_rps: float | None = None,
) -> ModelBoundary:
    """The engine model's boundary of ``pack`` in ``cache_state`` (module docstring)."""
    if not isinstance(pack.target, SimTarget):
        raise ValueError("the model boundary is defined for a simulated target only")
    if pack.target.replicas != 1:
        raise ValueError("the model boundary is computed for one replica")
    profile = load_profile(pack.target.profile)
    classes = virtual_classes(pack)
    prefixes = shared_prefixes(pack, cache_state)
    gate = pack.acceptance.class_slo_attainment_min
    evaluated: dict[float, dict[str, float]] = {}

    def attainment(rate: float) -> dict[str, float]:
        if rate not in evaluated:
            evaluated[rate] = attainment_at(
                profile, classes, rate, duration_s, seeds, prefixes=prefixes
            )
        return evaluated[rate]

    def meets(rate: float) -> bool:
        return min(attainment(rate).values()) >= gate

    rate = start_rps or 8.0
    if meets(rate):
        low = rate
        for _ in range(MAX_STEPS):
            if not meets(rate * 2):
                break
            rate *= 2
            low = rate
        high = low * 2
    else:
        high = rate
        for _ in range(MAX_STEPS):
            if meets(rate / 2):
                break
            rate /= 2
            high = rate
        low = high / 2
    if not meets(low) or meets(high):
        raise ValueError(f"no boundary found from {start_rps or 8.0:g} RPS")
    # Bisection on the cached evaluations (sim.virtual.slo_boundary would run both ends again).
    low, high = _bisect(meets, low, high, resolution_rps)
    return ModelBoundary(cache_state, low, high, gate, duration_s, tuple(seeds), evaluated)


def _bisect(meets, low: float, high: float, resolution_rps: float) -> tuple[float, float]:
    while high - low > resolution_rps:
        mid = (low + high) / 2
        if meets(mid):
            low = mid
        else:
            high = mid
    return low, high
