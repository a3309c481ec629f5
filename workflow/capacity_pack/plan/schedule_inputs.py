"""What a measurement point is, and exactly what of the manifest its schedule depends on.

A *point* (:class:`Point`) is one measurement: an open-loop rate (``open-r16``), a closed-loop
concurrency level (``closed-c8``) or a named load-shape experiment (``exp-spike_smoke``), crossed
with a cache state and a repeat index; :func:`points` lists those the manifest fixes, and
:func:`find_point` also those a searched sweep may measure. :class:`ScheduleInputs` is the
manifest content one point's schedule reads, and :func:`point_entropy` the seed of its random
streams (:mod:`capacity_pack.plan.schedule`).
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.io import canonical_json, sha256_of_obj
from capacity_pack.plan.client import Client, TraceSpec
from capacity_pack.plan.limits import MIN_OPEN_LOOP_RPS
from capacity_pack.plan.manifest import ManifestError, Pack, PackInfo
from capacity_pack.plan.sweep import Experiment
from capacity_pack.plan.workload import Prompts, WorkloadClass

Mode = Literal["open", "closed", "exp"]
NS_PER_S = 1_000_000_000


SCHEDULE_CLIENT_FIELDS = (
    "arrival_pattern",
    "arrival_cv",
    "trace",
    "minimum_duration_seconds",
    "initial_scheduled_requests",
    "request_schedule_seed",
    "warmup_seconds",
    "maximum_duration_seconds",
    "extension_block_requests",
    "cancellation_policy",
    "cancel_fraction",
    "cancel_after_seconds",
)


class ScheduleClient(BaseModel):
    """The client settings a schedule depends on (not timeouts, endpoint or scrape interval)."""

    model_config = ConfigDict(extra="forbid")

    arrival_pattern: Literal["poisson", "gamma", "constant", "trace"]
    arrival_cv: float
    trace: TraceSpec | None
    minimum_duration_seconds: float
    initial_scheduled_requests: int
    request_schedule_seed: int
    warmup_seconds: float
    maximum_duration_seconds: float
    extension_block_requests: int | None
    cancellation_policy: Literal["none", "seeded_fraction"]
    cancel_fraction: float
    cancel_after_seconds: float

    @classmethod
    def of(cls, client: Client) -> ScheduleClient:
        return cls.model_validate(client.model_dump(include=set(SCHEDULE_CLIENT_FIELDS)))


class SchedulePack(BaseModel):
    """The pack's identity as a schedule records it: its name and size, never its title or
    description, whose edits must not re-measure anything."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Pack id; names results/<name>/.")
    size: Literal["rehearsal", "full"] = Field(description="Rehearsal or full-size pack.")

    @property
    def label(self) -> str:
        return PackInfo(name=self.name, size=self.size, title="").label


class ScheduleInputs(BaseModel):
    """Exactly the manifest content one point's schedule depends on.

    The schedule rule passes this (as JSON) in its params, so a schedule reruns when, and only
    when, something it reads changes: not when the acceptance gate changes, nor when another
    rate is added to the sweep.
    """

    model_config = ConfigDict(extra="forbid")

    pack: SchedulePack = Field(description="Pack name and size label (shown in summaries).")
    client: ScheduleClient = Field(description="Seed, arrival process, counts, durations.")
    workload: list[WorkloadClass] = Field(description="Classes, mix and length distributions.")
    prompts: Prompts = Field(description="Prompt source and shared-prefix distribution.")
    closed_loop_requests_per_worker: int = Field(default=10, description="Closed points only.")
    closed_loop_min_requests: int = Field(default=50, description="Closed points only.")
    experiments: list[Experiment] = Field(
        default_factory=list, description="The point's experiment (exp points only)."
    )

    @classmethod
    def for_point(cls, pack: Pack, point: Point) -> ScheduleInputs:
        extra: dict[str, Any] = {}
        if point.mode == "closed":
            extra = {
                "closed_loop_requests_per_worker": pack.sweep.closed_loop_requests_per_worker,
                "closed_loop_min_requests": pack.sweep.closed_loop_min_requests,
            }
        if point.mode == "exp":
            extra["experiments"] = [e for e in pack.experiments if e.name == point.experiment]
            if not extra["experiments"]:
                raise ManifestError(f"no experiment named {point.experiment!r} in the pack")
        return cls.of_pack(pack, **extra)

    @classmethod
    def of_pack(cls, pack: Pack, **extra: Any) -> ScheduleInputs:
        """The pack-wide part (a drill's schedule is exactly this)."""
        return cls(
            pack=SchedulePack(name=pack.pack.name, size=pack.pack.size),
            client=ScheduleClient.of(pack.client),
            workload=pack.workload,
            prompts=pack.prompts,
            **extra,
        )

    @property
    def class_names(self) -> list[str]:
        return [c.name for c in self.workload]

    def canonical_json(self) -> str:
        return canonical_json(self.model_dump(mode="json"))

    def sha256(self) -> str:
        return sha256_of_obj(self.model_dump(mode="json"))


class Point(BaseModel):
    """One measurement point: load level x cache state x repeat."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Mode = Field(description="open (rate), closed (concurrency) or exp (load shape).")
    rate_rps: float | None = Field(default=None, description="Offered rate of an open point.")
    concurrency: int | None = Field(default=None, description="Workers of a closed point.")
    experiment: str | None = Field(default=None, description="Experiment name of an exp point.")
    cache_state: Literal["cold", "warm"] = Field(description="Cache-state family.")
    repeat: int = Field(ge=0, description="Repeat index.")

    @property
    def point_id(self) -> str:
        if self.mode == "open":
            return f"open-r{format_level(self.rate_rps)}"
        if self.mode == "closed":
            return f"closed-c{self.concurrency}"
        return f"exp-{self.experiment}"

    @property
    def key(self) -> str:
        """Path-like identity: ``<point_id>/<cache_state>/rep<repeat>``."""
        return f"{self.point_id}/{self.cache_state}/rep{self.repeat}"

    @property
    def identity(self) -> str:
        """What the random streams derive from; the cache state is deliberately not part of it."""
        return f"{self.point_id}|{self.repeat}"

    @classmethod
    def parse(cls, point_id: str, cache_state: str, repeat: int) -> Point:
        if point_id.startswith("open-r"):
            return cls(
                mode="open", rate_rps=float(point_id[6:]), cache_state=cache_state, repeat=repeat
            )
        if point_id.startswith("closed-c"):
            return cls(
                mode="closed", concurrency=int(point_id[8:]), cache_state=cache_state, repeat=repeat
            )
        if point_id.startswith("exp-"):
            return cls(mode="exp", experiment=point_id[4:], cache_state=cache_state, repeat=repeat)
        raise ValueError(f"unknown point id {point_id!r} (open-r<rps>, closed-c<n>, exp-<name>)")


def format_level(value: float | None) -> str:
    """16.0 -> '16', 2.5 -> '2.5': a stable text form for ids and seeds."""
    assert value is not None
    return f"{value:.6f}".rstrip("0").rstrip(".")


def points(pack: Pack) -> list[Point]:
    """Every point the manifest fixes, in a stable order.

    A searched sweep (``sweep.search``) decides its points round by round from the measurements
    (:mod:`capacity_pack.decide.search`): its open-loop rates, and its closed-loop levels when
    ``search.concurrency`` is set, are not here (:func:`searchable_point` says which may be).
    """
    out: list[Point] = []
    sweep = pack.sweep
    search = sweep.search
    rates = sweep.open_loop_rps if search is None else []
    levels = sweep.closed_loop_concurrency
    if search is not None and search.concurrency is not None:
        levels = []
    for cache in sweep.cache_states:
        for rep in range(sweep.repeats):
            out += [Point(mode="open", rate_rps=r, cache_state=cache, repeat=rep) for r in rates]
            out += [
                Point(mode="closed", concurrency=c, cache_state=cache, repeat=rep) for c in levels
            ]
    for exp in pack.experiments:
        for cache in exp.cache_states:
            out += [
                Point(mode="exp", experiment=exp.name, cache_state=cache, repeat=rep)
                for rep in range(exp.repeats)
            ]
    return out


def searchable_point(pack: Pack, point: Point) -> bool:
    """Whether the pack's search may measure ``point``: a searched mode, a cache state and a
    repeat of the sweep (for a rate, also one of the ``search.extra_repeats`` beyond
    them), a rate within the search's bounds (any rate with ``initial: auto`` below an
    explicit ``max_rps``) or a level up to the closed-loop search's bound."""
    sweep, search = pack.sweep, pack.sweep.search
    if search is None or point.cache_state not in sweep.cache_states:
        return False
    # An open-loop rate may be measured again when its repeats decided nothing.
    retries = search.extra_repeats if point.mode == "open" else 0
    if not 0 <= point.repeat < sweep.repeats + retries:
        return False
    if point.mode == "open":
        assert point.rate_rps is not None
        first = sweep.search_initial_rps
        low, high = search.rate_bounds(first) if first else (MIN_OPEN_LOOP_RPS, search.max_rps)
        return low <= point.rate_rps and (high is None or point.rate_rps <= high)
    bound = sweep.concurrency_bound
    return point.mode == "closed" and bound is not None and point.concurrency <= bound


def find_point(pack: Pack, point_id: str, cache_state: str, repeat: int) -> Point:
    for p in points(pack):
        if p.point_id == point_id and p.cache_state == cache_state and p.repeat == repeat:
            return p
    if point_id.startswith(("open-r", "closed-c")):
        try:
            candidate = Point.parse(point_id, cache_state, repeat)
        except ValueError:
            candidate = None
        if candidate is not None and searchable_point(pack, candidate):
            return candidate
    raise ManifestError(f"the pack has no point {point_id}/{cache_state}/rep{repeat}")


def match_points(pack: Pack, point_id: str, cache_state: str | None, repeat: int) -> list[Point]:
    """The points of ``point_id`` and ``repeat`` (in ``cache_state``, or in any): the fixed
    ones, else those the pack's search may measure."""
    caches = [cache_state] if cache_state is not None else list(pack.sweep.cache_states)
    caches += sorted(pack.all_cache_states() - set(caches)) if cache_state is None else []
    out = []
    for cache in caches:
        try:
            out.append(find_point(pack, point_id, cache, repeat))
        except ManifestError:
            continue
    return out


def point_entropy(inputs: ScheduleInputs, point: Point) -> list[int]:
    digest = hashlib.sha256(point.identity.encode()).digest()
    return [inputs.client.request_schedule_seed, int.from_bytes(digest[:8], "big")]
