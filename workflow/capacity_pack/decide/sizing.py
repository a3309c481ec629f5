"""Sizing arithmetic: replicas and GPUs from throughput and from memory, fit, bandwidth, cost.

replicas = ceil(peak_rps / (capacity_per_replica x target_utilization)), then N+k and a warm
pool; memory replicas = ceil(peak_rps x P95 latency / floor(KV capacity / KV per request at the
P95 context)); the plan takes the larger. Fit probe: weights + KV + overhead <= memory - margin;
KV at the planned concurrency (:func:`kv_at_concurrency`): the P95 of the M/G/infinity compound
sum of duration-weighted contexts; MBU = achieved / spec bandwidth; cost per completed request =
GPUs x price per GPU-hour / (3600 x successful RPS).

Method: docs/metrics.md, "Sizing arithmetic" and "Sizing from the tail".
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.evidence.statistics import little_in_flight
from capacity_pack.vocab.percentile import rank_index


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _ceil(x: float) -> int:
    # 36 / (6 x 0.75) = 8.000000000000002 in floating point; it is 8 replicas, not 9.
    return math.ceil(round(x, 9))


class ThroughputPlan(_Model):
    peak_rps: float = Field(description="Forecast peak offered load.")
    capacity_per_replica_rps: float = Field(description="SLO-compliant capacity of one replica.")
    target_utilization: float = Field(description="Planned utilization (headroom policy).")
    gpus_per_replica: int = Field(description="GPUs in one replica.")
    replicas_for_load: int = Field(description="ceil(peak / (capacity x utilization)).")
    redundancy_replicas: int = Field(description="N+k: replicas added for failures.")
    warm_pool_replicas: int = Field(description="Replicas kept warm for cold starts.")
    required_replicas: int = Field(description="Load + redundancy + warm pool.")
    required_gpus: int = Field(description="required_replicas x gpus_per_replica.")
    planned_utilization: float = Field(description="peak / (replicas_for_load x capacity).")


def plan_replicas(
    peak_rps: float,
    capacity_per_replica_rps: float,
    target_utilization: float,
    gpus_per_replica: int,
    *,
    redundancy_replicas: int = 0,
    warm_pool_replicas: int = 0,
) -> ThroughputPlan:
    if peak_rps < 0 or capacity_per_replica_rps <= 0:
        raise ValueError("peak_rps must be >= 0 and capacity_per_replica_rps > 0")
    if not 0 < target_utilization <= 1:
        raise ValueError("target_utilization must be in (0, 1]")
    if gpus_per_replica < 1 or redundancy_replicas < 0 or warm_pool_replicas < 0:
        raise ValueError("gpus_per_replica >= 1; redundancy and warm pool >= 0")
    for_load = max(1, _ceil(peak_rps / (capacity_per_replica_rps * target_utilization)))
    total = for_load + redundancy_replicas + warm_pool_replicas
    return ThroughputPlan(
        peak_rps=peak_rps,
        capacity_per_replica_rps=capacity_per_replica_rps,
        target_utilization=target_utilization,
        gpus_per_replica=gpus_per_replica,
        replicas_for_load=for_load,
        redundancy_replicas=redundancy_replicas,
        warm_pool_replicas=warm_pool_replicas,
        required_replicas=total,
        required_gpus=total * gpus_per_replica,
        planned_utilization=peak_rps / (for_load * capacity_per_replica_rps),
    )


def gpus_from_gpu_seconds(
    peak_rps: float, gpu_seconds_per_request: float, utilization: float
) -> int:
    """ceil(peak x GPU-seconds per request / utilization); GPU-seconds per request is the
    inverse of one GPU's request throughput."""
    if not 0 < utilization <= 1:
        raise ValueError("utilization must be in (0, 1]")
    return _ceil(peak_rps * gpu_seconds_per_request / utilization)


class FitResult(_Model):
    memory_gb: float
    margin_gb: float
    budget_gb: float = Field(description="memory - margin")
    need_gb: float = Field(description="weights + KV + overhead")
    headroom_gb: float = Field(description="budget - need")
    fits: bool
    verdict: Literal["fits", "zero-headroom", "does-not-fit"]


def fit_probe(
    memory_gb: float, margin_gb: float, weights_gb: float, kv_gb: float, overhead_gb: float
) -> FitResult:
    if min(memory_gb, margin_gb, weights_gb, kv_gb, overhead_gb) < 0:
        raise ValueError("memory sizes must be non-negative")
    budget = memory_gb - margin_gb
    need = weights_gb + kv_gb + overhead_gb
    headroom = round(budget - need, 9)
    verdict = "fits" if headroom > 0 else "zero-headroom" if headroom == 0 else "does-not-fit"
    return FitResult(
        memory_gb=memory_gb,
        margin_gb=margin_gb,
        budget_gb=budget,
        need_gb=need,
        headroom_gb=headroom,
        fits=headroom >= 0,
        verdict=verdict,
    )


class BandwidthResult(_Model):
    bytes_per_token_gb: float
    effective_bandwidth_gbps: float
    spec_bandwidth_gbps: float | None
    tokens_per_second: float = Field(description="effective bandwidth / bytes per token")
    mbu: float | None = Field(description="effective / spec bandwidth")


def bandwidth(
    bytes_per_token_gb: float, effective_bandwidth_gbps: float, spec_bandwidth_gbps: float | None
) -> BandwidthResult:
    if bytes_per_token_gb <= 0 or effective_bandwidth_gbps < 0:
        raise ValueError("bytes per token must be > 0 and bandwidth >= 0")
    return BandwidthResult(
        bytes_per_token_gb=bytes_per_token_gb,
        effective_bandwidth_gbps=effective_bandwidth_gbps,
        spec_bandwidth_gbps=spec_bandwidth_gbps,
        tokens_per_second=effective_bandwidth_gbps / bytes_per_token_gb,
        mbu=effective_bandwidth_gbps / spec_bandwidth_gbps if spec_bandwidth_gbps else None,
    )


def kv_bytes_per_token(
    layers: int, kv_heads: int, head_dim: int, bytes_per_element: float
) -> float:
    """2 (K and V) x layers x kv_heads x head_dim x bytes per element."""
    return 2.0 * layers * kv_heads * head_dim * bytes_per_element


class MemoryPlan(_Model):
    in_flight_at_peak: float = Field(description="peak_rps x p95 latency (Little's Law)")
    kv_bytes_per_request: float = Field(description="KV bytes per token x p95 context")
    kv_capacity_bytes_per_replica: float
    requests_per_replica: int = Field(description="KV capacity / KV per request (floor)")
    replicas_for_memory: int


def plan_memory(
    peak_rps: float,
    p95_latency_s: float,
    kv_bytes_token: float,
    p95_context_tokens: float,
    memory_gb_per_replica: float,
    weights_gb: float,
    overhead_gb: float,
    memory_utilization: float = 0.9,
) -> MemoryPlan:
    in_flight = little_in_flight(peak_rps, p95_latency_s)
    per_request = kv_bytes_token * p95_context_tokens
    capacity = (memory_gb_per_replica * memory_utilization - weights_gb - overhead_gb) * 1e9
    if capacity <= 0:
        raise ValueError("weights and overhead leave no KV memory on a replica")
    per_replica = int(capacity // per_request) if per_request > 0 else 10**9
    if per_replica < 1:
        raise ValueError("one request's KV at the p95 context does not fit on a replica")
    return MemoryPlan(
        in_flight_at_peak=in_flight,
        kv_bytes_per_request=per_request,
        kv_capacity_bytes_per_replica=capacity,
        requests_per_replica=per_replica,
        replicas_for_memory=max(1, _ceil(in_flight / per_replica)),
    )


def combine(throughput: ThroughputPlan, memory: MemoryPlan | None) -> dict[str, Any]:
    """The plan: the larger replica count of the two calculations, and which one bound it."""
    out: dict[str, Any] = {"throughput": throughput.model_dump()}
    load = throughput.replicas_for_load
    bound = "throughput"
    if memory is not None:
        out["memory"] = memory.model_dump()
        if memory.replicas_for_memory > load:
            load, bound = memory.replicas_for_memory, "memory"
    replicas = load + throughput.redundancy_replicas + throughput.warm_pool_replicas
    out.update(
        bound_by=bound,
        required_replicas=replicas,
        required_gpus=replicas * throughput.gpus_per_replica,
    )
    return out


def cost(
    gpus: int, price_per_gpu_hour: float, successful_rps: float, requests_per_task: float = 1.0
) -> dict[str, float | None]:
    per_hour = gpus * price_per_gpu_hour
    per_request = per_hour / (3600 * successful_rps) if successful_rps > 0 else None
    return {
        "cost_per_hour": per_hour,
        "cost_per_request": per_request,
        "cost_per_task": per_request * requests_per_task if per_request is not None else None,
    }


class ContextTail(_Model):
    """The context distribution a plan sizes from: its order statistics and KV per request."""

    requests: int = Field(description="Requests in the sample.")
    mean_tokens: float
    p50_tokens: int
    p95_tokens: int = Field(description="Nearest-rank P95 of prompt + output tokens (the mix).")
    p99_tokens: int
    max_tokens: int
    kv_bytes_per_request_p95: float = Field(description="KV bytes per token x P95 context")
    kv_bytes_per_request_max: float = Field(description="KV bytes per token x max context")


def context_tail(contexts: np.ndarray, kv_bytes_token: float) -> ContextTail:
    """Order statistics of a sample of contexts (tokens) and the KV of one request at each."""
    v = np.sort(np.asarray(contexts, dtype=np.int64))
    if v.size == 0:
        raise ValueError("no contexts to size from")

    def rank(p: float) -> int:
        return int(v[rank_index(p, v.size)])

    return ContextTail(
        requests=int(v.size),
        mean_tokens=float(v.mean()),
        p50_tokens=rank(0.50),
        p95_tokens=rank(0.95),
        p99_tokens=rank(0.99),
        max_tokens=int(v[-1]),
        kv_bytes_per_request_p95=kv_bytes_token * rank(0.95),
        kv_bytes_per_request_max=kv_bytes_token * int(v[-1]),
    )


class ConcurrencyKV(_Model):
    """KV held per replica at the planned load (docs/metrics.md, "Sizing from the tail")."""

    rate_per_replica_rps: float = Field(description="lambda_r: planned arrivals per replica.")
    mean_time_in_system_s: float = Field(description="E[S]: mean send-to-last-event time.")
    in_flight_mean: float = Field(description="L = lambda_r x E[S] (Little's law).")
    in_flight_p95: int = Field(description="P95 of the Poisson(L) number in flight.")
    kv_mean_gb: float = Field(
        description="lambda_r x E[S x C] x KV bytes per token (H = lambda G)."
    )
    kv_gb: float = Field(description="P95 of the KV held: the compound sum's resampled P95.")
    quantile: float
    resamples: int
    seed: int
    duration_weighted: bool = Field(
        description="Draws weighted by time in system (False: no per-request times known)."
    )


def kv_at_concurrency(
    rate_per_replica_rps: float,
    contexts: np.ndarray,
    kv_bytes_token: float,
    *,
    durations_s: np.ndarray | None = None,
    mean_time_in_system_s: float | None = None,
    quantile: float = 0.95,
    resamples: int = 20_000,
    seed: int = 0,
) -> ConcurrencyKV:
    """The KV held by the requests in flight on one replica at ``rate_per_replica_rps``.

    With ``durations_s`` (each sent request's time in system) E[S] is their mean and each draw
    picks a request with probability proportional to its time in system; without them every
    request is equally likely and ``mean_time_in_system_s`` gives E[S]."""
    c = np.asarray(contexts, dtype=np.float64)
    if c.size == 0:
        raise ValueError("no contexts to size from")
    if rate_per_replica_rps < 0 or not 0 < quantile < 1 or resamples < 1:
        raise ValueError("rate >= 0, quantile in (0, 1), resamples >= 1")
    if durations_s is not None:
        s = np.asarray(durations_s, dtype=np.float64)
        if s.shape != c.shape or np.any(s < 0) or not np.all(np.isfinite(s)):
            raise ValueError("durations must be finite, non-negative, one per context")
        mean_s = float(s.mean())
        weights = s / s.sum() if s.sum() > 0 else None
        kv_mean_tokens = rate_per_replica_rps * float((s * c).mean())
    else:
        if mean_time_in_system_s is None or mean_time_in_system_s < 0:
            raise ValueError("give per-request durations or a non-negative mean time in system")
        mean_s, weights = float(mean_time_in_system_s), None
        kv_mean_tokens = rate_per_replica_rps * mean_s * float(c.mean())
    in_flight = little_in_flight(rate_per_replica_rps, mean_s)
    rng = np.random.default_rng(seed)
    counts = rng.poisson(in_flight, size=resamples)
    sums = np.zeros(resamples)
    # In blocks of at most ~2M draws, so a large L does not hold every draw in memory at once.
    block = max(1, int(2_000_000 // max(in_flight, 1.0)))
    for lo in range(0, resamples, block):
        n = counts[lo : lo + block]
        picks = rng.choice(c, size=int(n.sum()), p=weights)
        owner = np.repeat(np.arange(n.size), n)
        sums[lo : lo + block] = np.bincount(owner, weights=picks, minlength=n.size)
    rank = rank_index(quantile, resamples)
    kv_tokens = float(np.partition(sums, rank)[rank])
    return ConcurrencyKV(
        rate_per_replica_rps=rate_per_replica_rps,
        mean_time_in_system_s=mean_s,
        in_flight_mean=in_flight,
        in_flight_p95=int(np.partition(counts, rank)[rank]),
        kv_mean_gb=kv_mean_tokens * kv_bytes_token / 1e9,
        kv_gb=kv_tokens * kv_bytes_token / 1e9,
        quantile=quantile,
        resamples=resamples,
        seed=seed,
        duration_weighted=weights is not None,
    )
