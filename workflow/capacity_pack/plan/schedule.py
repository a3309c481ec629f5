"""Seeded request schedules: which requests a measurement point sends, and when.

A *point* is one measurement: an open-loop rate (``open-r16``), a closed-loop concurrency level
(``closed-c8``) or a named load-shape experiment (``exp-spike_smoke``), crossed with a cache
state and a repeat index. Each point's schedule is a table with one row per request:
class, input/output tokens, scheduled arrival offset (ns from the run start), shared-prefix
assignment, a prompt seed and an optional cancellation deadline.

Construction, per block (0 = warm-up, 1 = the measured schedule, 2.. = extension blocks):

1. Exact class counts by the largest-remainder method over the block's size and the mix, then a
   seeded shuffle of the class labels: stratified before shuffling, so every block holds each
   class's exact quota (22,000 at 0.70/0.20/0.10 is always 15,400/4,400/2,200) rather than a
   binomial draw around it.
2. Lengths: fixed, or drawn from the class's lognormal/empirical distribution.
3. Arrivals in *operational time* (unit rate): gaps are exponential (``poisson``),
   gamma with shape 1/CV^2 and scale CV^2 (``gamma``, mean 1, coefficient of variation CV), or 1
   (``constant``). Real time is t = Lambda^-1(u), where Lambda(t) = integral of rate(s) ds; for a
   constant rate r this is t = u / r. Blocks continue the same process: each block's
   operational clock starts where the previous one ended.
   Load-shape experiments use a piecewise-linear rate (steps, ramps, plus an optional spike on
   top); their measured block holds N = round(Lambda(T)) requests, drawn as N+1 gaps whose sum is
   scaled to Lambda(T), so the (N+1)-th arrival falls exactly at the profile end (for Poisson this
   is exactly the conditional law of an inhomogeneous Poisson process given N events).
   Trace replay (:mod:`capacity_pack.plan.traces`) uses the trace's offsets: stretched so that
   its mean rate equals the point rate (``replay: stretch``), or as recorded times the point's
   declared time scale (``replay: verbatim``), with the trace's classes and lengths and, for a
   block-hash trace, its hash ids in ``prefix_blocks``; a trace schedule has no extension block.
4. Warm-cache points draw a shared-prefix id per request (Zipf with exponent s: P(k) ~ 1/(k+1)^s,
   or uniform) from the versioned prefix set; cold points get -1, i.e. a unique prefix.

Seeds: every random stream is a ``numpy.random.SeedSequence`` whose entropy is the manifest's
``client.request_schedule_seed`` plus a sha256-derived integer of the point identity (mode, level,
repeat), with spawn keys (block, stream). So adding a rate leaves every other schedule unchanged,
extension blocks continue the same seeded stream, and the cold and warm schedules of one point and
repeat send the same classes, lengths and arrival times (they differ only in prefix reuse), which
makes cold/warm a paired comparison.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.io import canonical_json, sha256_of_obj
from capacity_pack.plan import sessions
from capacity_pack.plan.limits import MIN_OPEN_LOOP_RPS
from capacity_pack.plan.manifest import (
    Client,
    Experiment,
    ManifestError,
    Pack,
    PackInfo,
    Prompts,
    TraceSpec,
    WorkloadClass,
    sample_lengths,
    stratified_counts,
)
from capacity_pack.plan.traces import (
    TraceError,
    block_ids_text,
    check_classes,
    native_rate,
    verbatim_rates,
)

Mode = Literal["open", "closed", "exp"]
PHASES = ("warmup", "measure", "extension")
NS_PER_S = 1_000_000_000

# Independent random streams within one block (spawn-key second component).
_CLASS, _LENGTH, _ARRIVAL, _PREFIX, _PROMPT, _CANCEL = range(6)


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


def _rng(entropy: list[int], block: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(block, stream)))


# ---------------------------------------------------------------------------------------------
# Rate profiles
# ---------------------------------------------------------------------------------------------


class RateProfile:
    """A piecewise-linear rate r(t) on [0, T] with its integral Lambda and inverse."""

    def __init__(self, times: np.ndarray, rates_start: np.ndarray, rates_end: np.ndarray):
        # Interval i spans [times[i], times[i+1]], rate linear from rates_start[i] to rates_end[i].
        self.times = times
        self.r0 = rates_start
        self.r1 = rates_end
        widths = np.diff(times)
        self.cum = np.concatenate([[0.0], np.cumsum((rates_start + rates_end) / 2 * widths)])

    @property
    def duration_s(self) -> float:
        return float(self.times[-1])

    @property
    def total(self) -> float:
        return float(self.cum[-1])

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        i = np.clip(np.searchsorted(self.times, t, side="right") - 1, 0, len(self.r0) - 1)
        w = self.times[i + 1] - self.times[i]
        frac = np.where(w > 0, (t - self.times[i]) / np.where(w > 0, w, 1), 0)
        return self.r0[i] + (self.r1[i] - self.r0[i]) * frac

    def inverse(self, u: np.ndarray) -> np.ndarray:
        """t with Lambda(t) = u (u clipped to [0, Lambda(T)])."""
        u = np.clip(np.asarray(u, dtype=float), 0, self.total)
        i = np.clip(np.searchsorted(self.cum, u, side="right") - 1, 0, len(self.r0) - 1)
        w = self.times[i + 1] - self.times[i]
        slope = np.where(w > 0, (self.r1[i] - self.r0[i]) / np.where(w > 0, w, 1), 0)
        d = u - self.cum[i]
        r0 = self.r0[i]
        with np.errstate(divide="ignore", invalid="ignore"):
            # Solve slope/2 tau^2 + r0 tau = d for tau >= 0 (linear when the slope is ~0).
            quad = (-r0 + np.sqrt(np.maximum(r0 * r0 + 2 * slope * d, 0))) / slope
            lin = np.where(r0 > 0, d / r0, 0)
        tau = np.where(np.abs(slope) > 1e-12, quad, lin)
        return self.times[i] + np.clip(np.nan_to_num(tau), 0, w)


def experiment_profile(exp: Experiment) -> RateProfile:
    """The experiment's rate profile: segments, plus its spike added on top."""
    bounds = [0.0]
    for seg in exp.segments:
        bounds.append(bounds[-1] + seg.duration_s)
    cuts = set(bounds)
    if exp.spike is not None:
        cuts.update({exp.spike.at_s, min(bounds[-1], exp.spike.at_s + exp.spike.duration_s)})
    times = np.array(sorted(cuts))

    def base(t: float, *, left: bool) -> float:
        # Rate of the segment containing t; `left` takes the limit from the left at a boundary.
        for k, seg in enumerate(exp.segments):
            a, b = bounds[k], bounds[k + 1]
            if (a < t <= b) if left else (a <= t < b):
                if seg.rate_rps is not None:
                    return seg.rate_rps
                frac = (t - a) / (b - a)
                return seg.from_rps + (seg.to_rps - seg.from_rps) * frac  # type: ignore[operator]
        return 0.0

    def spike(t: float, *, left: bool) -> float:
        s = exp.spike
        if s is None:
            return 0.0
        lo, hi = s.at_s, s.at_s + s.duration_s
        inside = (lo < t <= hi) if left else (lo <= t < hi)
        return s.rate_rps if inside else 0.0

    r0 = np.array([base(t, left=False) + spike(t, left=False) for t in times[:-1]])
    r1 = np.array([base(t, left=True) + spike(t, left=True) for t in times[1:]])
    return RateProfile(times, r0, r1)


def warmup_rate(profile: RateProfile) -> float:
    """Warm-up runs at the profile's starting rate, or its mean rate when it starts from zero."""
    start = float(profile.rate_at(np.array([0.0]))[0])
    return start if start > 0 else profile.total / profile.duration_s


def constant_profile(rate: float, duration_s: float) -> RateProfile:
    return RateProfile(np.array([0.0, duration_s]), np.array([rate]), np.array([rate]))


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def _gaps(pattern: str, cv: float, rng: np.random.Generator, n: int) -> np.ndarray:
    """Inter-arrival gaps in operational time (mean 1)."""
    if pattern == "poisson":
        return rng.exponential(1.0, size=n)
    if pattern == "gamma":
        return rng.gamma(shape=1.0 / (cv * cv), scale=cv * cv, size=n)
    if pattern == "constant":
        return np.ones(n)
    raise ValueError(f"no gap generator for arrival pattern {pattern!r}")


def _class_sequence(inputs: ScheduleInputs, n: int, rng: np.random.Generator) -> np.ndarray:
    counts = stratified_counts(n, {c.name: c.mix for c in inputs.workload})
    labels = np.repeat(np.array(inputs.class_names, dtype=object), [counts[c] for c in counts])
    rng.shuffle(labels)
    return labels


def _block_requests(
    inputs: ScheduleInputs,
    entropy: list[int],
    block: int,
    n: int,
    classes: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Classes, lengths, prompt seeds and cancellations for ``n`` requests of one block."""
    if classes is None:
        classes = _class_sequence(inputs, n, _rng(entropy, block, _CLASS))
    inp = np.empty(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    length_rng = _rng(entropy, block, _LENGTH)
    for c in inputs.workload:
        mask = classes == c.name
        k = int(mask.sum())
        inp[mask] = sample_lengths(c.input_tokens, length_rng, k)
        out[mask] = sample_lengths(c.output_tokens, length_rng, k)
    prompt_seed = _rng(entropy, block, _PROMPT).integers(0, 2**63 - 1, size=n, dtype=np.int64)
    cancel = np.full(n, -1, dtype=np.int64)
    client = inputs.client
    if client.cancellation_policy == "seeded_fraction" and client.cancel_fraction > 0:
        hit = _rng(entropy, block, _CANCEL).random(n) < client.cancel_fraction
        cancel[hit] = round(client.cancel_after_seconds * NS_PER_S)
    return {
        "class": classes,
        "input_tokens": inp,
        "output_tokens": out,
        "prompt_seed": prompt_seed,
        "cancel_after_ns": cancel,
    }


def _prefixes(
    inputs: ScheduleInputs, point: Point, entropy: list[int], block: int, input_tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    n = input_tokens.size
    spec = inputs.prompts.prefix
    if point.cache_state == "cold" or spec is None:
        return np.full(n, -1, dtype=np.int32), np.zeros(n, dtype=np.int32)
    k = np.arange(spec.shared_prefixes)
    weights = (
        1.0 / np.power(k + 1.0, spec.zipf_exponent)
        if spec.distribution == "zipf"
        else (np.ones(spec.shared_prefixes))
    )
    # The cache state gets its own stream so cold and warm keep identical classes and arrivals.
    rng = _rng(entropy + [1], block, _PREFIX)
    ids = rng.choice(spec.shared_prefixes, size=n, p=weights / weights.sum()).astype(np.int32)
    # A prompt shorter than the prefix keeps at least one token of its own.
    tokens = np.minimum(spec.prefix_tokens, input_tokens - 1).astype(np.int32)
    ids[tokens <= 0] = -1
    tokens[tokens <= 0] = 0
    return ids, tokens


def _measure_size(inputs: ScheduleInputs, point: Point) -> int:
    client = inputs.client
    if point.mode == "open":
        assert point.rate_rps is not None
        return max(
            client.initial_scheduled_requests,
            math.ceil(point.rate_rps * client.minimum_duration_seconds),
        )
    if point.mode == "closed":
        assert point.concurrency is not None
        return max(
            inputs.closed_loop_min_requests,
            inputs.closed_loop_requests_per_worker * point.concurrency,
        )
    return max(1, round(experiment_profile(_experiment(inputs, point)).total))


def extension_block_size(inputs: ScheduleInputs) -> int:
    """Requests per extension block: ``client.extension_block_requests``, else 10% of initial."""
    if inputs.client.extension_block_requests is not None:
        return inputs.client.extension_block_requests
    return max(1, math.ceil(inputs.client.initial_scheduled_requests / 10))


def _warmup_size(inputs: ScheduleInputs, point: Point) -> int:
    w = inputs.client.warmup_seconds
    if w <= 0:
        return 0
    if point.mode == "closed":
        return int(point.concurrency or 1)  # one request per worker before measuring
    if point.mode == "open":
        return max(1, round((point.rate_rps or 0) * w))
    return max(1, round(warmup_rate(experiment_profile(_experiment(inputs, point))) * w))


def _experiment(inputs: ScheduleInputs, point: Point) -> Experiment:
    for e in inputs.experiments:
        if e.name == point.experiment:
            return e
    raise ManifestError(f"no experiment named {point.experiment!r} in the pack")


def _pattern(inputs: ScheduleInputs, point: Point) -> tuple[str, float]:
    if point.mode == "exp":
        e = _experiment(inputs, point)
        return (
            e.arrival_pattern or _base_pattern(inputs),
            e.arrival_cv if e.arrival_cv is not None else inputs.client.arrival_cv,
        )
    return inputs.client.arrival_pattern, inputs.client.arrival_cv


def _base_pattern(inputs: ScheduleInputs) -> str:
    # Experiments built on a trace-driven pack still need a synthetic process.
    p = inputs.client.arrival_pattern
    return "poisson" if p == "trace" else p


# ---------------------------------------------------------------------------------------------
# Trace replay
# ---------------------------------------------------------------------------------------------


def load_trace(inputs: ScheduleInputs) -> pd.DataFrame:
    """The trace's requests (:func:`capacity_pack.plan.traces.read_trace`), sorted by time,
    offsets from the first arrival; a row whose class is not the pack's is an error naming it."""
    spec = inputs.client.trace
    assert spec is not None
    try:
        trace = spec.arrivals(default_class=inputs.class_names[0])
        check_classes(trace, inputs.class_names, spec.path, spec.format)
    except TraceError as err:
        raise ManifestError(str(err)) from None
    return trace


def trace_native_rate(trace: pd.DataFrame) -> float:
    return native_rate(trace)


def verbatim_time_scale(inputs: ScheduleInputs, trace: pd.DataFrame, point: Point) -> float:
    """The declared time scale whose verbatim rate is ``point``'s rate."""
    spec = inputs.client.trace
    assert spec is not None and point.rate_rps is not None
    rates = verbatim_rates(trace, spec.time_scales)
    for scale, rate in zip(spec.time_scales, rates, strict=True):
        if format_level(rate) == format_level(point.rate_rps):
            return scale
    raise ManifestError(
        f"{point.point_id}: not a rate of the verbatim trace {spec.path} (its time_scales "
        f"{spec.time_scales} give {rates} RPS)"
    )


# ---------------------------------------------------------------------------------------------
# The schedule
# ---------------------------------------------------------------------------------------------

COLUMNS = [
    "request_id",
    "seq",
    "block",
    "phase",
    "class",
    "input_tokens",
    "output_tokens",
    "scheduled_offset_ns",
    "prefix_id",
    "prefix_tokens",
    "prefix_blocks",
    "prompt_seed",
    "cancel_after_ns",
]


def as_inputs(source: Pack | ScheduleInputs, point: Point) -> ScheduleInputs:
    return source if isinstance(source, ScheduleInputs) else ScheduleInputs.for_point(source, point)


def build_schedule(
    source: Pack | ScheduleInputs, point: Point, *, extension_blocks: int = 0
) -> pd.DataFrame:
    """The point's schedule: warm-up block, measured block and ``extension_blocks`` more.

    Deterministic: the same inputs and point always give the same table, and the rows of a
    schedule built with k extension blocks are a prefix of the one built with k+1.
    """
    inputs = as_inputs(source, point)
    if extension_blocks < 0:
        raise ValueError("extension_blocks must be >= 0")
    entropy = point_entropy(inputs, point)
    if inputs.client.arrival_pattern == "trace" and point.mode == "open":
        frame = _trace_schedule(inputs, point, entropy)
    else:
        frame = _synthetic_schedule(inputs, point, entropy, extension_blocks)
    columns = COLUMNS
    if sessions.has_sessions(inputs.workload):
        frame = sessions.expand_sessions(frame, inputs.workload, inputs.prompts, entropy)
        columns = COLUMNS + sessions.SESSION_COLUMNS
    frame.insert(0, "seq", np.arange(len(frame), dtype=np.int64))
    stem = f"{point.point_id}.{point.cache_state}.rep{point.repeat}"
    frame.insert(0, "request_id", [f"{stem}.{i:06d}" for i in range(len(frame))])
    return frame[columns]


def _synthetic_schedule(
    inputs: ScheduleInputs, point: Point, entropy: list[int], extension_blocks: int
) -> pd.DataFrame:
    pattern, cv = _pattern(inputs, point)
    sizes = [
        (0, "warmup", _warmup_size(inputs, point)),
        (1, "measure", _measure_size(inputs, point)),
    ]
    sizes += [
        (1 + k, "extension", extension_block_size(inputs)) for k in range(1, extension_blocks + 1)
    ]
    max_offset_ns = round(
        (inputs.client.warmup_seconds + inputs.client.maximum_duration_seconds) * NS_PER_S
    )
    frames = []
    clock_s = 0.0  # real-time end of the previous block's arrivals
    for block, phase, n in sizes:
        if n == 0:
            continue
        cols = _block_requests(inputs, entropy, block, n)
        gaps = _gaps(
            pattern,
            cv,
            _rng(entropy, block, _ARRIVAL),
            n if point.mode != "exp" or phase != "measure" else n + 1,
        )
        if point.mode == "closed":
            offsets = np.zeros(n)
        elif point.mode == "open":
            assert point.rate_rps is not None
            offsets = clock_s + np.cumsum(gaps) / point.rate_rps
            clock_s = float(offsets[-1])
        else:
            profile = experiment_profile(_experiment(inputs, point))
            if phase == "warmup":
                offsets = np.cumsum(gaps) / warmup_rate(profile)
            elif phase == "measure":
                u = np.cumsum(gaps)
                u = u[:-1] * (profile.total / u[-1])
                start_s = clock_s
                offsets = start_s + profile.inverse(u)
            else:
                last_rate = float(profile.r1[-1]) or float(profile.total / profile.duration_s)
                offsets = clock_s + np.cumsum(gaps) / last_rate
            clock_s = float(offsets[-1]) if phase != "measure" else start_s + profile.duration_s
        offset_ns = np.rint(offsets * NS_PER_S).astype(np.int64)
        prefix_id, prefix_tokens = _prefixes(inputs, point, entropy, block, cols["input_tokens"])
        frame = pd.DataFrame(
            {
                "block": np.int64(block),
                "phase": phase,
                **cols,
                "scheduled_offset_ns": offset_ns,
                "prefix_id": prefix_id,
                "prefix_tokens": prefix_tokens,
                "prefix_blocks": "",
            }
        )
        if phase == "extension" and point.mode != "closed":
            frame = frame[frame["scheduled_offset_ns"] <= max_offset_ns]
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    # Rounding to ns can reorder nothing (gaps >= 0), but keep the invariant explicit.
    out["scheduled_offset_ns"] = np.maximum.accumulate(out["scheduled_offset_ns"].to_numpy())
    return out


def trace_facts(inputs: ScheduleInputs, trace: pd.DataFrame, point: Point) -> dict[str, Any]:
    """What a trace point replays: the file, its layout and sha256, how (verbatim at which time
    scale, or stretched by which factor) and its requests per class."""
    spec = inputs.client.trace
    assert spec is not None and point.rate_rps is not None
    verbatim = spec.verbatim
    return {
        "path": spec.path,
        "format": spec.format,
        "sha256": spec.sha256,
        "replay": spec.replay,
        "time_scale": verbatim_time_scale(inputs, trace, point) if verbatim else None,
        "stretch": None if verbatim else trace_native_rate(trace) / point.rate_rps,
        "rows": len(trace),
        "class_rows": {c: int((trace["class"] == c).sum()) for c in inputs.class_names},
        "block_hashes": "hash_ids" in trace.columns,
    }


def _trace_schedule(inputs: ScheduleInputs, point: Point, entropy: list[int]) -> pd.DataFrame:
    # Verbatim: the recorded offsets times the point's declared time scale; else stretched so
    # the trace's mean rate is the point's. Never extended (plan.traces).
    spec = inputs.client.trace
    assert spec is not None and point.rate_rps is not None
    trace = load_trace(inputs)
    if spec.verbatim:
        factor = verbatim_time_scale(inputs, trace, point)
    else:
        factor = trace_native_rate(trace) / point.rate_rps
    offsets = trace["offset_s"].to_numpy() * factor
    n = len(trace)
    cols = _block_requests(inputs, entropy, 1, n, classes=trace["class"].to_numpy(dtype=object))
    for name in ("input_tokens", "output_tokens"):
        if name in trace.columns:
            cols[name] = trace[name].to_numpy(dtype=np.int64)
    phase = np.where(offsets < inputs.client.warmup_seconds, "warmup", "measure")
    block = np.where(phase == "warmup", 0, 1)
    prefix_id, prefix_tokens = _prefixes(inputs, point, entropy, 1, cols["input_tokens"])
    blocks = np.full(n, "", dtype=object)
    if "hash_ids" in trace.columns:
        # The trace's own block hashes make each prompt (plan.prompts.block_prompt), shared
        # prefixes and all: no prefix set on top.
        blocks = np.array([block_ids_text(h) for h in trace["hash_ids"]], dtype=object)
        prefix_id[:], prefix_tokens[:] = -1, 0
    return pd.DataFrame(
        {
            "block": block.astype(np.int64),
            "phase": phase,
            **cols,
            "scheduled_offset_ns": np.rint(offsets * NS_PER_S).astype(np.int64),
            "prefix_id": prefix_id,
            "prefix_tokens": prefix_tokens,
            "prefix_blocks": blocks,
        }
    )


# ---------------------------------------------------------------------------------------------
# Summary (the table's schema and writer: capacity_pack.plan.schedule_table)
# ---------------------------------------------------------------------------------------------


def summarize(frame: pd.DataFrame, inputs: ScheduleInputs, point: Point) -> dict[str, Any]:
    """Counts per class and phase, offered and realised rate, duration, gap statistics."""
    measured = frame[frame["phase"] != "warmup"]
    offsets_s = measured["scheduled_offset_ns"].to_numpy() / NS_PER_S
    gaps = np.diff(offsets_s)
    pattern, cv = _pattern(inputs, point)
    summary: dict[str, Any] = {
        "point": point.point_id,
        "key": point.key,
        "mode": point.mode,
        "cache_state": point.cache_state,
        "repeat": point.repeat,
        "pack": inputs.pack.name,
        "pack_label": inputs.pack.label,
        "arrival_pattern": "closed-loop" if point.mode == "closed" else pattern,
        "arrival_cv": cv if pattern == "gamma" else None,
        "seed_entropy": point_entropy(inputs, point),
        "requests": len(frame),
        "phase_counts": {ph: int((frame["phase"] == ph).sum()) for ph in PHASES},
        "class_counts": {
            ph: {
                c: int(((frame["phase"] == ph) & (frame["class"] == c)).sum())
                for c in inputs.class_names
            }
            for ph in PHASES
        },
        "duration_s": float(frame["scheduled_offset_ns"].max() / NS_PER_S) if len(frame) else 0.0,
        "warmup_seconds": inputs.client.warmup_seconds,
        "inputs_sha256": inputs.sha256(),
    }
    if point.mode == "open":
        summary["offered_rps"] = point.rate_rps
    if point.mode == "closed":
        summary["concurrency"] = point.concurrency
    if point.mode == "exp":
        e = _experiment(inputs, point)
        prof = experiment_profile(e)
        summary["experiment"] = {
            "name": e.name,
            "test_type": e.test_type,
            "profile_duration_s": prof.duration_s,
            "expected_requests": prof.total,
        }
    if inputs.client.arrival_pattern == "trace" and point.mode == "open":
        trace = load_trace(inputs)
        summary["trace_native_rps"] = trace_native_rate(trace)
        summary["trace"] = trace_facts(inputs, trace, point)
    if point.mode != "closed" and gaps.size > 1:
        span = offsets_s[-1] - offsets_s[0]
        summary["realised_rps"] = float(gaps.size / span) if span > 0 else None
        summary["gap_mean_s"] = float(gaps.mean())
        summary["gap_cv"] = float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else None
    if "session" in frame.columns:
        summary.update(sessions.summary(frame, inputs.workload))
    if inputs.prompts.prefix is not None and point.cache_state == "warm":
        summary["distinct_prefixes_used"] = int(
            frame.loc[frame["prefix_id"] >= 0, "prefix_id"].nunique()
        )
    return summary


def prewarm_rows(source: Pack | ScheduleInputs, point: Point) -> pd.DataFrame:
    """Warm-cache prewarm requests: one per shared prefix of the versioned set, sent (and
    recorded, phase ``prewarm``) before the point's clock starts; empty for cold points.

    Each is the shared prefix plus one unique token, asking for one output token, so it leaves
    exactly the prefix's KV blocks in the cache and little else.
    """
    inputs = as_inputs(source, point)
    spec = inputs.prompts.prefix
    if point.cache_state != "warm" or spec is None:
        return pd.DataFrame(columns=COLUMNS)
    n = spec.shared_prefixes
    stem = f"{point.point_id}.{point.cache_state}.rep{point.repeat}.prewarm"
    seeds = _rng(point_entropy(inputs, point), 0, _PROMPT + 10).integers(
        0, 2**63 - 1, size=n, dtype=np.int64
    )
    return pd.DataFrame(
        {
            "request_id": [f"{stem}.{k:04d}" for k in range(n)],
            "seq": np.arange(-n, 0, dtype=np.int64),
            "block": np.int64(0),
            "phase": "prewarm",
            "class": inputs.class_names[0],
            "input_tokens": np.int64(spec.prefix_tokens + 1),
            "output_tokens": np.int64(1),
            "scheduled_offset_ns": np.int64(0),
            "prefix_id": np.arange(n, dtype=np.int32),
            "prefix_tokens": np.int32(spec.prefix_tokens),
            "prefix_blocks": "",
            "prompt_seed": seeds,
            "cancel_after_ns": np.int64(-1),
        }
    )[COLUMNS]


def read_schedule(path: str | Path) -> pd.DataFrame:
    return pd.read_parquet(path)
