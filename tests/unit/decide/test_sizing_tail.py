"""Sizing from the tail: the P95 and max of a context distribution with a tail, and the KV the
requests in flight hold at the planned concurrency (``capacity_pack.decide.sizing``)."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from capacity_pack.decide.contexts import manifest_contexts
from capacity_pack.decide.sizing import context_tail, fit_probe, kv_at_concurrency
from capacity_pack.plan.manifest import validate_pack
from tests.conftest import small_pack_data

# Three classes with lognormal prompts (p50, p95, max) and fixed outputs: most requests short,
# a tenth long, a fiftieth very long.
CLASSES = {
    "interactive": (0.88, (300, 1200, 8000), 64),
    "long_context": (0.10, (3000, 9000, 30000), 128),
    "generation_heavy": (0.02, (200, 600, 4000), 1024),
}


def tail_pack_data(name: str = "tail") -> dict:
    """The small default pack with its workload replaced by ``CLASSES`` (each class keeps the
    first default class's other fields: cutoffs, and whatever else a class carries)."""
    data = small_pack_data(name, requests=40, min_samples=5)
    template = {k: v for k, v in data["workload"][0].items() if k not in {"name", "mix"}}
    data["workload"] = []
    for cls, (mix, (p50, p95, top), out) in CLASSES.items():
        data["workload"].append({
            **template, "name": cls, "mix": mix, "output_tokens": out,
            "input_tokens": {"distribution": "lognormal", "p50": p50, "p95": p95, "max": top},
        })  # fmt: skip
    return data


def mixture_quantile(p: float) -> float:
    """The p-quantile of prompt + output over the mix, from the lognormal CDFs (bisection)."""
    nd = NormalDist()

    def cdf(x: float) -> float:
        total = 0.0
        for mix, (p50, p95, top), out in CLASSES.values():
            sigma = (math.log(p95) - math.log(p50)) / nd.inv_cdf(0.95)
            y = x - out
            total += mix * (
                0.0
                if y <= 0
                else 1.0
                if y >= top
                else nd.cdf((math.log(y) - math.log(p50)) / sigma)
            )
        return total

    lo, hi = 1.0, 40_000.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return hi


def test_the_p95_of_a_mix_is_not_the_mix_of_p95s():
    pack = validate_pack(tail_pack_data())
    tail = context_tail(manifest_contexts(pack), kv_bytes_per_token := 131_072)
    exact = mixture_quantile(0.95)
    # The mix's own P95 (nearest rank of 20,000 seeded draws) against the exact mixture quantile.
    assert tail.p95_tokens == pytest.approx(exact, rel=0.03)
    # Walking the classes' P95s up the cumulative mix (88 %, 90 %, 100 %) lands on the long class's
    # P95, 9,000 + 128: twice the mix's P95, which sits in the long class's body.
    mix_of_p95s = 9000 + 128
    assert exact < 0.6 * mix_of_p95s
    assert 3000 + 128 < tail.p95_tokens < mix_of_p95s
    assert tail.kv_bytes_per_request_p95 == kv_bytes_per_token * tail.p95_tokens
    # The max is the longest context drawn, within the classes' clipped maxima.
    assert tail.max_tokens <= 30000 + 128 and tail.max_tokens > tail.p99_tokens > tail.p95_tokens
    assert tail.kv_bytes_per_request_max == kv_bytes_per_token * tail.max_tokens


def test_context_tail_order_statistics_by_nearest_rank():
    t = context_tail(np.arange(1, 101), 2.0)
    assert (t.p50_tokens, t.p95_tokens, t.p99_tokens, t.max_tokens) == (50, 95, 99, 100)
    assert t.mean_tokens == 50.5 and t.kv_bytes_per_request_p95 == 190.0
    with pytest.raises(ValueError, match="no contexts"):
        context_tail(np.array([]), 1.0)


def poisson_quantile(mean: float, p: float) -> int:
    k, term, total = 0, math.exp(-mean), math.exp(-mean)
    while total < p:
        k += 1
        term *= mean / k
        total += term
    return k


def test_kv_at_concurrency_with_equal_requests_is_the_poisson_count_times_one_request():
    # 2 RPS per replica x 1.5 s = 3 in flight on average; P(N <= 5) = 0.916, P(N <= 6) = 0.966.
    assert poisson_quantile(3.0, 0.95) == 6
    contexts, durations = np.full(500, 1000), np.full(500, 1.5)
    held = kv_at_concurrency(2.0, contexts, 1e6, durations_s=durations)
    assert held.in_flight_mean == pytest.approx(3.0) and held.in_flight_p95 == 6
    assert held.kv_gb == pytest.approx(6.0) and held.kv_mean_gb == pytest.approx(3.0)
    # The worked fit example at the planned concurrency: 12 + 6 + 4 = 22 of 24 - 2: zero headroom;
    # one request at a time (1 GB) would have shown 5 GB of headroom.
    assert fit_probe(24, 2, 12, held.kv_gb, 4).verdict == "zero-headroom"
    assert fit_probe(24, 2, 12, 1.0, 4).headroom_gb == 5.0
    assert fit_probe(24, 2, 12, held.kv_gb * 1.5, 4).verdict == "does-not-fit"
    # The same seed gives the same figure; the figure does not depend on a lucky draw.
    again = kv_at_concurrency(2.0, contexts, 1e6, durations_s=durations)
    assert again.kv_gb == held.kv_gb and held.seed == 0 and held.resamples == 20_000


def test_long_requests_are_in_flight_longer_so_they_weigh_more():
    # 90 % short (0.1 s, 100 tokens), 10 % long (10 s, 10,000 tokens): the long ones are
    # 10 % of arrivals but 99 % of the time in system.
    contexts = np.array([100] * 90 + [10_000] * 10)
    durations = np.array([0.1] * 90 + [10.0] * 10)
    held = kv_at_concurrency(5.0, contexts, 1.0, durations_s=durations)
    assert held.mean_time_in_system_s == pytest.approx(1.09)
    assert held.in_flight_mean == pytest.approx(5.45)
    # H = lambda G: 5 x mean(S x C) = 5 x (0.9 x 10 + 0.1 x 100,000) = 50,045 tokens.
    assert held.kv_mean_gb * 1e9 == pytest.approx(50_045)
    naive = kv_at_concurrency(5.0, contexts, 1.0, mean_time_in_system_s=1.09)
    assert not naive.duration_weighted and held.duration_weighted
    assert naive.kv_mean_gb * 1e9 == pytest.approx(5.45 * 1090)
    assert held.kv_gb > 4 * naive.kv_gb


def test_the_p95_matches_a_simulated_timeline_of_concurrent_requests():
    # An independent check of the method: Poisson arrivals at 4 RPS, each request in flight
    # for its own time (lognormal, longer for longer outputs) holding its context; the KV held
    # at random instants of a long timeline, against the figure from the sample alone.
    rng = np.random.default_rng(7)
    n = 3000
    outputs = np.clip(np.rint(rng.lognormal(math.log(200), 0.9, n)), 1, 4000)
    prompts = np.clip(np.rint(rng.lognormal(math.log(800), 0.8, n)), 1, 16000)
    contexts = (prompts + outputs).astype(np.int64)
    durations = 0.05 + 0.02 * outputs  # time in system grows with the output length
    held = kv_at_concurrency(4.0, contexts, 1.0, durations_s=durations)

    horizon = 100_000.0
    arrivals = np.cumsum(rng.exponential(1 / 4.0, int(4.0 * horizon * 1.1)))
    arrivals = arrivals[arrivals < horizon]
    pick = rng.integers(0, n, arrivals.size)
    times = np.concatenate([arrivals, arrivals + durations[pick]])
    deltas = np.concatenate([contexts[pick], -contexts[pick]]).astype(np.float64)
    order = np.argsort(times, kind="stable")
    level = np.cumsum(deltas[order])
    instants = rng.uniform(1000.0, horizon - 1000.0, 20_000)
    at = level[np.searchsorted(times[order], instants, side="right") - 1]
    assert np.mean(at) == pytest.approx(held.kv_mean_gb * 1e9, rel=0.05)
    assert np.quantile(at, 0.95) == pytest.approx(held.kv_gb * 1e9, rel=0.05)
    # Equal weights would miss the tail: the in-flight set over-represents long requests.
    plain = kv_at_concurrency(4.0, contexts, 1.0, mean_time_in_system_s=held.mean_time_in_system_s)
    assert plain.kv_gb * 1e9 < 0.9 * np.quantile(at, 0.95)


def test_kv_at_concurrency_refuses_bad_input():
    with pytest.raises(ValueError, match="durations"):
        kv_at_concurrency(1.0, np.array([1, 2]), 1.0, durations_s=np.array([1.0]))
    with pytest.raises(ValueError, match="mean time in system"):
        kv_at_concurrency(1.0, np.array([1, 2]), 1.0)
    with pytest.raises(ValueError, match="no contexts"):
        kv_at_concurrency(1.0, np.array([]), 1.0, mean_time_in_system_s=1.0)
