"""What is measured: the sweep's open-loop rates and closed-loop levels, the boundary search
that may replace the declared rates, and the named load-shape experiments (k6 test types)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from capacity_pack.plan.limits import (
    MAX_ARRIVAL_CV,
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_REQUESTS,
    MIN_OPEN_LOOP_RPS,
)
from capacity_pack.plan.section import NAME_PATTERN, Section
from capacity_pack.plan.system import SimTarget

#: The most rounds a boundary search may run (each a Snakemake checkpoint).
MAX_SEARCH_ROUNDS = 50


class ConcurrencySearch(Section):
    """The closed-loop search: ``sweep.closed_loop_concurrency`` is its first round."""

    resolution: int = Field(
        default=1,
        ge=1,
        le=MAX_CONCURRENCY,
        description="Stop when the highest level meeting every class's SLO and the lowest "
        "level above it that does not differ by at most this many workers.",
    )
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        le=MAX_CONCURRENCY,
        description="Bound of the upward search (default 4 x the highest declared level).",
    )


class RateSearch(Section):
    """The open-loop boundary search (capacity_pack.decide.search): round 1 is ``initial``,
    each later round bisects the bracket [highest passing rate, lowest failing rate above it]
    until it is within the resolution, or ``max_rounds`` search rounds ran."""

    initial: (
        list[Annotated[float, Field(ge=MIN_OPEN_LOOP_RPS)]] | Literal["auto", "predicted"] | None
    ) = Field(
        default=None,
        description="Round 1's rates; 'auto': 0.5, 0.75 and 1 x the closed-loop saturation "
        "request throughput; 'predicted': the ends and midpoint of the preflight prediction's "
        "bracket (a simulated target); omitted: sweep.open_loop_rps.",
    )
    resolution_rps: float | None = Field(
        default=None, gt=0, description="Stop when the bracket is at most this wide (RPS)."
    )
    resolution_rel: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="Stop when the bracket is at most this fraction of its passing rate wide.",
    )
    max_rounds: int = Field(
        default=6,
        ge=1,
        le=MAX_SEARCH_ROUNDS,
        description="Search rounds at most (round 1 included; confirmation rounds are not).",
    )
    min_rps: float | None = Field(
        default=None,
        ge=MIN_OPEN_LOOP_RPS,
        description="Bound of the downward search (default round 1's lowest rate / 8).",
    )
    max_rps: float | None = Field(
        default=None,
        ge=MIN_OPEN_LOOP_RPS,
        description="Bound of the upward search (default 4 x round 1's highest rate).",
    )
    extra_repeats: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Measurements beyond sweep.repeats the search may spend on an open-loop "
        "rate whose repeats decided nothing (client-bound: the load generator fell behind its "
        "schedule; disturbed: other work on the host beyond client.other_cpu_bound or "
        "step_lateness_bound_ms; or superseded: decided in run under another attainment gate "
        "and undecided at the pack's): such a rate is measured again at the next repeat index "
        "instead of being taken as not passing.",
    )
    pooled_steps: bool = Field(
        default=False,
        description="Each open-loop search step measures every repeat (sweep.repeats) of its "
        "new rates in one round, so a rate is decided on its pooled repeats as soon as it is "
        "measured; false: repeat 0 only, the other repeats confirming the final bracket's ends. "
        "For a search that starts near the boundary ('predicted'), where every rate it "
        "measures decides.",
    )
    concurrency: ConcurrencySearch | None = Field(
        default=None, description="Search the closed loop too (its operating point)."
    )

    @model_validator(mode="after")
    def _check(self) -> RateSearch:
        if (self.resolution_rps is None) == (self.resolution_rel is None):
            raise ValueError("give exactly one of resolution_rps and resolution_rel")
        if isinstance(self.initial, list):
            if not self.initial:
                raise ValueError("initial: give at least one rate, or 'auto'")
            ids = [f"{r:.6f}".rstrip("0").rstrip(".") for r in self.initial]
            if len(set(ids)) != len(ids):
                raise ValueError(f"initial has rates equal to 6 decimals: {self.initial}")
        if self.min_rps is not None and self.max_rps is not None and self.min_rps >= self.max_rps:
            raise ValueError(f"min_rps ({self.min_rps:g}) must be below max_rps ({self.max_rps:g})")
        return self

    def rate_bounds(self, first_round: Sequence[float]) -> tuple[float, float]:
        """The lowest and highest rate the search may measure, given round 1's rates."""
        return search_rate_bounds(self.min_rps, self.max_rps, first_round)


def judged_by_engine_model(target: Any, client: Any, workload: Sequence[Any]) -> bool:
    """Whether a pack's open-loop rate points are judged by the engine model as control variate
    (:mod:`capacity_pack.twin.control`): a simulated target of one replica (its profile is the
    model, whose long run is computed for one engine) and independent requests (no trace
    replay, no multi-turn sessions). Such a point measures to its maximum duration, no in-run
    stop (:func:`capacity_pack.measure.inputs.sequential_settings`)."""
    return (
        isinstance(target, SimTarget)
        and target.replicas == 1
        and client.arrival_pattern != "trace"
        and all(c.session is None for c in workload)
    )


def search_rate_bounds(
    min_rps: float | None, max_rps: float | None, first_round: Sequence[float]
) -> tuple[float, float]:
    """A rate search's bounds: ``min_rps`` (default round 1's lowest rate / 8, at least
    MIN_OPEN_LOOP_RPS) and ``max_rps`` (default 4 x round 1's highest), widened to round 1."""
    low = min_rps if min_rps is not None else max(MIN_OPEN_LOOP_RPS, min(first_round) / 8)
    high = max_rps if max_rps is not None else 4 * max(first_round)
    return min(low, min(first_round)), max(high, max(first_round))


class Sweep(Section):
    open_loop_rps: list[Annotated[float, Field(ge=MIN_OPEN_LOOP_RPS)]] = Field(
        default_factory=list, description="Offered rates of the open-loop sweep."
    )
    closed_loop_concurrency: list[Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]] = Field(
        default_factory=list, description="Concurrency levels of the saturation sweep."
    )
    closed_loop_requests_per_worker: int = Field(
        default=10, ge=1, description="Closed-loop requests per point = this x concurrency..."
    )
    closed_loop_min_requests: int = Field(default=50, ge=1, description="...but at least this.")
    cache_states: list[Literal["cold", "warm"]] = Field(
        min_length=1, description="Cache-state families; never mixed in one point."
    )
    repeats: int = Field(default=1, ge=1, description="Repeats of every point (variance).")
    search: RateSearch | None = Field(
        default=None,
        description="Search the SLO boundary round by round instead of measuring only the "
        "declared rates (each round's points run repeat 0; the final bracket's, every repeat).",
    )

    @model_validator(mode="after")
    def _check(self) -> Sweep:
        for name in ("open_loop_rps", "closed_loop_concurrency", "cache_states"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name} has duplicates: {values}")
        # Point ids print a rate to 6 decimals (plan.schedule.format_level): two rates that print
        # alike would be one point.
        ids = [f"{r:.6f}".rstrip("0").rstrip(".") for r in self.open_loop_rps]
        if len(set(ids)) != len(ids):
            raise ValueError(f"open_loop_rps has rates equal to 6 decimals: {self.open_loop_rps}")
        if self.closed_loop_concurrency and 1 not in self.closed_loop_concurrency:
            raise ValueError(
                "closed_loop_concurrency must include 1: the single-user regime is always measured"
            )
        if self.search is not None:
            self._check_search(self.search)
        return self

    def _check_search(self, search: RateSearch) -> None:
        if (isinstance(search.initial, list) or search.initial == "predicted") and (
            self.open_loop_rps
        ):
            raise ValueError(
                "search.initial and open_loop_rps both name round 1's rates: give one of them"
            )
        if search.initial is None and not self.open_loop_rps:
            raise ValueError(
                "search: round 1 is sweep.open_loop_rps, which is empty; give it, or "
                "search.initial (rates, 'auto' or 'predicted')"
            )
        if search.initial == "auto" and not self.closed_loop_concurrency:
            raise ValueError(
                "search.initial 'auto' derives round 1 from the closed-loop throughput: "
                "closed_loop_concurrency is empty"
            )
        if search.concurrency is not None and not self.closed_loop_concurrency:
            raise ValueError(
                "search.concurrency: round 1 of the closed-loop search is "
                "closed_loop_concurrency, which is empty"
            )
        first = self.search_initial_rps
        if first is not None:
            if search.min_rps is not None and search.min_rps > min(first):
                raise ValueError(
                    f"search.min_rps ({search.min_rps:g}) is above round 1's lowest rate "
                    f"({min(first):g})"
                )
            if search.max_rps is not None and search.max_rps < max(first):
                raise ValueError(
                    f"search.max_rps ({search.max_rps:g}) is below round 1's highest rate "
                    f"({max(first):g})"
                )
        limit = search.concurrency.max_concurrency if search.concurrency else None
        if limit is not None and limit < max(self.closed_loop_concurrency):
            raise ValueError(
                f"search.concurrency.max_concurrency ({limit}) is below the highest level of "
                f"closed_loop_concurrency ({max(self.closed_loop_concurrency)})"
            )

    @property
    def search_initial_rps(self) -> list[float] | None:
        """Round 1's rates of the search (None: derived at run time, 'auto'; or no search)."""
        if self.search is None or self.search.initial in ("auto", "predicted"):
            return None
        return list(self.search.initial or self.open_loop_rps)

    @property
    def has_open_loop(self) -> bool:
        """Whether the pack measures open-loop rates (declared or searched)."""
        return bool(self.open_loop_rps) or self.search is not None

    @property
    def concurrency_bound(self) -> int | None:
        """The highest level the closed-loop search may measure (None: no closed search)."""
        if self.search is None or self.search.concurrency is None:
            return None
        limit = self.search.concurrency.max_concurrency
        return limit or min(MAX_CONCURRENCY, 4 * max(self.closed_loop_concurrency))


class Segment(Section):
    duration_s: float = Field(gt=0, description="Segment length in seconds.")
    rate_rps: float | None = Field(default=None, ge=0, description="Constant rate (a step).")
    from_rps: float | None = Field(default=None, ge=0, description="Ramp start rate.")
    to_rps: float | None = Field(default=None, ge=0, description="Ramp end rate.")

    @model_validator(mode="after")
    def _check(self) -> Segment:
        step = self.rate_rps is not None
        ramp = self.from_rps is not None or self.to_rps is not None
        if step == ramp or (ramp and (self.from_rps is None or self.to_rps is None)):
            raise ValueError("a segment is either a step (rate_rps) or a ramp (from_rps, to_rps)")
        return self


class Spike(Section):
    at_s: float = Field(ge=0, description="Spike start, seconds from the profile start.")
    duration_s: float = Field(gt=0, description="Spike length.")
    rate_rps: float = Field(gt=0, description="Rate added on top of the base profile.")


K6_TEST_TYPES = ("smoke", "average-load", "stress", "spike", "soak", "breakpoint")


class Experiment(Section):
    name: str = Field(pattern=NAME_PATTERN, description="Experiment name.")
    test_type: Literal["smoke", "average-load", "stress", "spike", "soak", "breakpoint"] = Field(
        description="k6 load-test type this profile implements."
    )
    arrival_pattern: Literal["poisson", "gamma", "constant"] | None = Field(
        default=None, description="Defaults to client.arrival_pattern."
    )
    arrival_cv: float | None = Field(
        default=None, gt=0, le=MAX_ARRIVAL_CV, description="Gamma CV override."
    )
    segments: list[Segment] = Field(min_length=1, description="Piecewise rate profile.")
    spike: Spike | None = Field(default=None, description="A burst on top of the base profile.")
    cache_states: list[Literal["cold", "warm"]] = Field(default_factory=lambda: ["warm"])
    repeats: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> Experiment:
        # One point per cache state and repeat: a state named twice would be one point id twice.
        if len(set(self.cache_states)) != len(self.cache_states):
            raise ValueError(f"cache_states has duplicates: {self.cache_states}")
        if self.test_type == "spike" and self.spike is None:
            raise ValueError("a 'spike' experiment needs a 'spike' block")
        if self.test_type == "breakpoint":
            last = self.segments[-1]
            if last.to_rps is None or last.from_rps is None or last.to_rps <= last.from_rps:
                raise ValueError("a 'breakpoint' experiment must end in an increasing ramp")
        if self.spike is not None and self.spike.at_s >= self.total_duration_s:
            raise ValueError("the spike starts after the profile ends")
        area = sum(
            s.duration_s * (s.rate_rps if s.rate_rps is not None else (s.from_rps + s.to_rps) / 2)
            for s in self.segments
        )
        if area <= 0:
            raise ValueError("the rate profile sends no requests (every rate is 0)")
        if self.total_duration_s > MAX_DURATION_S:
            raise ValueError(
                f"the rate profile lasts {self.total_duration_s:g} s, above the bound of "
                f"{MAX_DURATION_S:,} seconds (30 days)"
            )
        if self.expected_requests > MAX_REQUESTS:
            raise ValueError(
                f"the rate profile sends {self.expected_requests:.4g} requests, above the bound of "
                f"{MAX_REQUESTS:,} requests per point"
            )
        return self

    @property
    def total_duration_s(self) -> float:
        return float(sum(s.duration_s for s in self.segments))

    @property
    def peak_rps(self) -> float:
        """The highest rate of the profile, spike included."""
        peak = max(max(g.rate_rps or 0, g.from_rps or 0, g.to_rps or 0) for g in self.segments)
        return peak + (self.spike.rate_rps if self.spike is not None else 0)

    @property
    def expected_requests(self) -> float:
        """Lambda(T), the area under the rate profile, plus the spike's rate x duration."""
        area = math.fsum(
            g.duration_s * (g.rate_rps if g.rate_rps is not None else (g.from_rps + g.to_rps) / 2)
            for g in self.segments
        )
        return area + (self.spike.rate_rps * self.spike.duration_s if self.spike else 0)
