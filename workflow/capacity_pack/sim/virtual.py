"""Virtual-time runs of the scheduler and performance model, with no server and no sleeping.

The same :class:`~capacity_pack.sim.scheduler.Scheduler` the live engine drives, stepped on a
simulated clock: idle until the next arrival, otherwise step ``k`` starts when step ``k - 1``
ends and lasts the modelled step time; arrivals during a step join at its end, as in the live
loop. Per request it reports, from the engine's point of view:

- queue time = first scheduled - arrival;  TTFT = first token - arrival;
- TPOT = (last token - first token) / (output tokens - 1)  (0 for one-token outputs);
- E2E = last token - arrival.

A closed loop (:func:`simulate_closed_loop`) has no arrival schedule: each of N workers sends
its own sequence back to back, the next request ``client_gap`` after the previous one's last
token, so arrivals depend on the modelled step times (the replay a calibration fits against).

Used to calibrate profiles and to test that throughput saturates and TTFT climbs as the offered
load passes capacity, in milliseconds of CPU per simulated minute.
"""

from __future__ import annotations

import heapq
import random
import struct
from dataclasses import dataclass, field

from capacity_pack.sim.profile import Profile
from capacity_pack.sim.scheduler import Scheduler, SimRequest

NS = 1_000_000_000


@dataclass(frozen=True)
class VirtualRequest:
    arrival_s: float
    prompt: int | tuple[int, ...]
    output_tokens: int
    label: str = ""


@dataclass(frozen=True)
class VirtualResult:
    label: str
    arrival_s: float
    queue_s: float
    ttft_s: float
    tpot_s: float
    e2e_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    preemptions: int
    finish_reason: str


@dataclass
class VirtualRun:
    results: list[VirtualResult] = field(default_factory=list)
    steps: int = 0
    busy_s: float = 0.0
    end_s: float = 0.0
    preemptions: int = 0
    failed: int = 0

    @property
    def output_tokens_per_s(self) -> float:
        return sum(r.output_tokens for r in self.results) / self.end_s if self.end_s else 0.0


def simulate(profile: Profile, requests: list[VirtualRequest], seed: int = 0) -> VirtualRun:
    """Run ``requests`` (any order) to completion on a fresh engine of ``profile``."""
    rng = random.Random(seed)
    sched = Scheduler(profile)
    pending = sorted(requests, key=lambda r: r.arrival_s)
    arrival_ns = [round(r.arrival_s * NS) for r in pending]
    labels: dict[int, VirtualRequest] = {}
    run = VirtualRun()
    t_ns = 0
    i = 0
    while i < len(pending) or sched.has_work():
        if not sched.has_work():
            t_ns = max(t_ns, arrival_ns[i])
        while i < len(pending) and arrival_ns[i] <= t_ns:
            v = pending[i]
            ids = (
                list(random_tokens(rng, v.prompt)) if isinstance(v.prompt, int) else list(v.prompt)
            )
            req = SimRequest(f"v{i}", ids, v.output_tokens, arrival_ns=arrival_ns[i])
            labels[id(req)] = v
            sched.add(req)
            i += 1
        step = sched.schedule(t_ns)
        run.failed += len(step.failed)
        if not step.reqs:
            continue  # the step only failed a request that can never fit
        t_ns += round(step.duration_s * NS)
        run.steps += 1
        run.busy_s += step.duration_s
        _, finished = sched.complete(step, t_ns)
        for req in finished:
            v = labels.pop(id(req))
            first = req.first_token_ns or t_ns
            n = req.num_output
            run.results.append(
                VirtualResult(
                    label=v.label,
                    arrival_s=v.arrival_s,
                    queue_s=((req.scheduled_ns or first) - req.arrival_ns) / NS,
                    ttft_s=(first - req.arrival_ns) / NS,
                    tpot_s=((req.last_token_ns or first) - first) / NS / (n - 1) if n > 1 else 0.0,
                    e2e_s=((req.last_token_ns or first) - req.arrival_ns) / NS,
                    prompt_tokens=req.num_prompt,
                    output_tokens=n,
                    cached_tokens=req.num_cached_tokens,
                    preemptions=req.num_preemptions,
                    finish_reason=req.finish_reason or "",
                )
            )
    run.end_s = t_ns / NS
    run.preemptions = sched.num_preemptions
    return run


Lengths = int | tuple[int, ...]


def poisson_arrivals(
    rate_rps: float,
    duration_s: float,
    classes: list[tuple[float, Lengths, Lengths, str]],
    seed: int = 0,
) -> list[VirtualRequest]:
    """Poisson arrivals at ``rate_rps`` for ``duration_s``; ``classes`` holds
    ``(mix, input_tokens, output_tokens, label)`` drawn independently per arrival. A length is
    a fixed count or a pool of lengths, one drawn uniformly per arrival (a pool sampled from a
    length distribution stands for it)."""
    rng = random.Random(seed)
    out: list[VirtualRequest] = []
    t = rng.expovariate(rate_rps)
    weights = [c[0] for c in classes]
    while t < duration_s:
        _, inp, outp, label = rng.choices(classes, weights=weights)[0]
        if not isinstance(inp, int):
            inp = rng.choice(inp)
        if not isinstance(outp, int):
            outp = rng.choice(outp)
        out.append(VirtualRequest(t, inp, outp, label))
        t += rng.expovariate(rate_rps)
    return out


@dataclass(frozen=True)
class VirtualClass:
    """A workload class for :func:`attainment_at`: its share, lengths (fixed, or a pool to draw
    from) and SLO cutoffs."""

    label: str
    mix: float
    input_tokens: Lengths
    output_tokens: Lengths
    ttft_cutoff_s: float
    tpot_cutoff_s: float


@dataclass(frozen=True)
class SharedPrefixes:
    """Warm-cache prompts: each request starts with one of ``count`` shared prefixes of
    ``tokens`` tokens, prefix k drawn with probability ~ 1 / (k + 1)^``zipf_exponent`` (0:
    uniform); a prompt keeps at least one token of its own."""

    count: int
    tokens: int
    zipf_exponent: float = 0.0


def random_tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    """``n`` random 32-bit token ids: the values of ``n`` calls of ``rng.getrandbits(32)``
    (CPython's ``randbytes`` is ``getrandbits(8 * n)`` little-endian, whose 32-bit words come
    in the order the calls would draw them), in one call instead of ``n``."""
    return struct.unpack(f"<{n}I", rng.randbytes(4 * n))


def with_shared_prefixes(
    requests: list[VirtualRequest], prefixes: SharedPrefixes, seed: int = 0
) -> list[VirtualRequest]:
    """``requests`` with explicit prompts: a shared prefix, then tokens of their own."""
    rng = random.Random(seed ^ 0x5EED)
    heads = [random_tokens(rng, prefixes.tokens) for _ in range(prefixes.count)]
    weights = [1.0 / (k + 1) ** prefixes.zipf_exponent for k in range(prefixes.count)]
    out = []
    for r in requests:
        n = r.prompt if isinstance(r.prompt, int) else len(r.prompt)
        head = rng.choices(heads, weights=weights)[0][: max(0, n - 1)]
        own = random_tokens(rng, n - len(head))
        out.append(VirtualRequest(r.arrival_s, head + own, r.output_tokens, r.label))
    return out


def attainment_at(
    profile: Profile,
    classes: list[VirtualClass],
    rate_rps: float,
    duration_s: float,
    seeds: tuple[int, ...] = (0, 1, 2, 3),
    warmup_s: float = 2.0,
    prefixes: SharedPrefixes | None = None,
) -> dict[str, float]:
    """Mean SLO attainment per class at ``rate_rps`` over ``len(seeds)`` Poisson runs, with
    unique prompts (a cold cache) or ``prefixes`` (a warm one).

    A request meets its SLO when TTFT <= its class's TTFT cutoff and TPOT <= its TPOT cutoff
    (the pack's joint predicate, on the engine's own times); arrivals in the first
    ``warmup_s`` are left out, as a point's warm-up is."""
    shares: dict[str, list[float]] = {c.label: [] for c in classes}
    for run in poisson_runs(profile, classes, rate_rps, duration_s, seeds, prefixes):
        for c in classes:
            rs = [r for r in run.results if r.label == c.label and r.arrival_s >= warmup_s]
            met = sum(meets_slo(r, c) for r in rs)
            shares[c.label].append(met / len(rs) if rs else 0.0)
    return {label: sum(v) / len(v) for label, v in shares.items()}


def meets_slo(result: VirtualResult, c: VirtualClass) -> bool:
    """The pack's joint predicate on the engine's own times: TTFT <= the class's TTFT cutoff
    and TPOT <= its TPOT cutoff."""
    return result.ttft_s <= c.ttft_cutoff_s and result.tpot_s <= c.tpot_cutoff_s


def poisson_runs(
    profile: Profile,
    classes: list[VirtualClass],
    rate_rps: float,
    duration_s: float,
    seeds,
    prefixes: SharedPrefixes | None = None,
):
    """One run per seed of ``duration_s`` seconds of Poisson arrivals of ``classes`` at
    ``rate_rps`` on a fresh engine (unique prompts, or ``prefixes``), lazily."""
    mixes = [(c.mix, c.input_tokens, c.output_tokens, c.label) for c in classes]
    for seed in seeds:
        arrivals = poisson_arrivals(rate_rps, duration_s, mixes, seed=seed)
        if prefixes is not None:
            arrivals = with_shared_prefixes(arrivals, prefixes, seed)
        yield simulate(profile, arrivals, seed)


def slo_boundary(
    profile: Profile,
    classes: list[VirtualClass],
    gate: float,
    low_rps: float,
    high_rps: float,
    resolution_rps: float,
    duration_s: float = 300.0,
    seeds: tuple[int, ...] = (0, 1, 2, 3),
    prefixes: SharedPrefixes | None = None,
) -> tuple[float, float]:
    """The rate at which the engine model's worst class attainment crosses ``gate``, as a
    bracket (highest rate meeting it, lowest missing it) no wider than ``resolution_rps``,
    by bisection between ``low_rps`` (must meet it) and ``high_rps`` (must miss it).

    This is the model's own boundary on point estimates from long runs (no confidence bound,
    no client): the truth a capacity search over the same workload and gates should find."""

    def meets(rate: float) -> bool:
        att = attainment_at(profile, classes, rate, duration_s, seeds, prefixes=prefixes)
        return min(att.values()) >= gate

    if not meets(low_rps) or meets(high_rps):
        raise ValueError(f"the boundary is not inside [{low_rps:g}, {high_rps:g}] RPS")
    while high_rps - low_rps > resolution_rps:
        mid = (low_rps + high_rps) / 2
        if meets(mid):
            low_rps = mid
        else:
            high_rps = mid
    return low_rps, high_rps


@dataclass(frozen=True)
class ClosedLoopRequest:
    """One request of a closed-loop worker's sequence: its prompt (a length, or explicit token
    IDs) and output length."""

    prompt: int | tuple[int, ...]
    output_tokens: int
    label: str = ""


@dataclass(frozen=True)
class ClosedLoopResult(VirtualResult):
    """A :class:`VirtualResult` of a closed-loop run, with the worker that sent it and its
    place in that worker's sequence."""

    worker: int
    order: int


def simulate_closed_loop(
    profile: Profile,
    workers: list[list[ClosedLoopRequest]],
    *,
    client_gap_s: float = 0.0,
    seed: int = 0,
) -> VirtualRun:
    """Run a closed loop on a fresh engine of ``profile``: worker ``w`` sends ``workers[w]`` in
    order, the first at time 0 and each next one ``client_gap_s`` after the previous one's last
    token (a failed request frees its worker at the step that failed it).

    Arrivals follow the same rule as :func:`simulate` (those due during a step join at its
    end), so a measured closed loop replays request for request: the same lengths in the same
    worker order. Results are :class:`ClosedLoopResult` in completion order;
    ``VirtualRun.failed`` counts requests that could never fit."""
    rng = random.Random(seed)
    sched = Scheduler(profile)
    gap_ns = round(client_gap_s * NS)
    # (arrival_ns, worker, order): the next request of each worker, earliest first.
    due: list[tuple[int, int, int]] = [(0, w, 0) for w, seq in enumerate(workers) if seq]
    heapq.heapify(due)
    owner: dict[int, tuple[int, int]] = {}
    run = VirtualRun()
    t_ns = 0

    def release(worker: int, order: int, at_ns: int) -> None:
        if order + 1 < len(workers[worker]):
            heapq.heappush(due, (at_ns + gap_ns, worker, order + 1))

    while due or sched.has_work():
        if not sched.has_work():
            t_ns = max(t_ns, due[0][0])
        while due and due[0][0] <= t_ns:
            arrival, w, k = heapq.heappop(due)
            v = workers[w][k]
            ids = (
                list(random_tokens(rng, v.prompt)) if isinstance(v.prompt, int) else list(v.prompt)
            )
            req = SimRequest(f"w{w}.{k}", ids, v.output_tokens, arrival_ns=arrival)
            owner[id(req)] = (w, k)
            sched.add(req)
        step = sched.schedule(t_ns)
        run.failed += len(step.failed)
        for req in step.failed:
            release(*owner.pop(id(req)), t_ns)
        if not step.reqs:
            continue
        t_ns += round(step.duration_s * NS)
        run.steps += 1
        run.busy_s += step.duration_s
        _, finished = sched.complete(step, t_ns)
        for req in finished:
            w, k = owner.pop(id(req))
            v = workers[w][k]
            first = req.first_token_ns or t_ns
            last = req.last_token_ns or first
            n = req.num_output
            run.results.append(
                ClosedLoopResult(
                    label=v.label,
                    arrival_s=req.arrival_ns / NS,
                    queue_s=((req.scheduled_ns or first) - req.arrival_ns) / NS,
                    ttft_s=(first - req.arrival_ns) / NS,
                    tpot_s=(last - first) / NS / (n - 1) if n > 1 else 0.0,
                    e2e_s=(last - req.arrival_ns) / NS,
                    prompt_tokens=req.num_prompt,
                    output_tokens=n,
                    cached_tokens=req.num_cached_tokens,
                    preemptions=req.num_preemptions,
                    finish_reason=req.finish_reason or "",
                    worker=w,
                    order=k,
                )
            )
            release(w, k, last)
    run.end_s = t_ns / NS
    run.preemptions = sched.num_preemptions
    return run
