"""The Prometheus names an engine gives the canonical signals, for alerts, dashboards and the
cold-cache check: :class:`EngineMetrics`, one per engine module.

A signal an engine does not expose is ``None``. Histograms are named by their family, with the
engine's default bucket bounds (an SLO-burn rule counts observations at or below a bound only);
``replica_label`` tells replicas apart; ``router`` says the router's ``router:*`` series
(:data:`ROUTER_METRICS`) are exposed beside the engine's. :data:`SIGNALS` names the field of
each canonical signal :func:`capacity_pack.engines.signals.read_signals` reads.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Names of the router's series (the simulated cluster's router; real routers differ, so
# engines without ``router=True`` never reference them).
ROUTER_UP = "router:replica_up"
ROUTER_STARTING = "router:replica_starting"
ROUTER_OUTSTANDING = "router:replica_outstanding_requests"
ROUTER_REQUESTS = "router:requests_total"
ROUTER_UPSTREAM_ERRORS = "router:upstream_errors_total"
ROUTER_STARTS = "router:replica_starts_total"
ROUTER_NO_REPLICA = "router:no_replica_total"
ROUTER_ADMISSION_REJECTED = "router:admission_rejected_total"
ROUTER_RETRIES = "router:retries_total"
ROUTER_RESPONSES = "router:responses_total"
ROUTER_RELAY_FAILURES = "router:relay_failures_total"
ROUTER_HEALTH_RTT = "router:replica_health_rtt_seconds"
ROUTER_RELAYED_BYTES = "router:relayed_bytes_total"
ROUTER_METRICS = (
    ROUTER_UP,
    ROUTER_STARTING,
    ROUTER_OUTSTANDING,
    ROUTER_REQUESTS,
    ROUTER_UPSTREAM_ERRORS,
    ROUTER_STARTS,
    ROUTER_NO_REPLICA,
    ROUTER_ADMISSION_REJECTED,
    ROUTER_RETRIES,
    ROUTER_RESPONSES,
    ROUTER_RELAY_FAILURES,
    ROUTER_HEALTH_RTT,
    ROUTER_RELAYED_BYTES,
)
ROUTER_REPLICA_LABEL = "replica"
ROUTER_CODE_LABEL = "code"

# Canonical signal -> EngineMetrics field, for the signals a cold check and the idle wait read.
SIGNALS: dict[str, str] = {
    "queue_depth": "waiting",
    "running": "running",
    "kv_usage": "kv_usage",
    "prefix_cache_hits": "prefix_hits",
    "prefix_cache_queries": "prefix_queries",
    "prefix_cache_misses": "prefix_misses",
    "prefix_cache_hit_rate": "prefix_hit_rate",
}


def prefix_cache_source(m: EngineMetrics | None) -> str | None:
    """How a map's prefix-cache hit rate is computed, in its own metric names (None: the engine
    exposes none): hits / queries, hits / (hits + misses) (llama.cpp), or a hit-rate gauge."""
    if m is None:
        return None
    if m.prefix_hits and m.prefix_queries:
        return f"{m.prefix_hits} / {m.prefix_queries} (tokens, over the measured window)"
    if m.prefix_hits and m.prefix_misses:
        return (
            f"{m.prefix_hits} / ({m.prefix_hits} + {m.prefix_misses}) (tokens, over the "
            "measured window)"
        )
    if m.prefix_hit_rate:
        return f"{m.prefix_hit_rate} (a gauge)"
    return None


class MetricMapError(ValueError):
    """An engine map or override that cannot be used; the message says what to give."""


class EngineMetrics(BaseModel):
    """Prometheus names of the canonical signals of one engine (``None``: not exposed)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    waiting: str | None = Field(default=None, description="Gauge: requests queued to be scheduled.")
    running: str | None = Field(default=None, description="Gauge: requests in the running batch.")
    kv_usage: str | None = Field(default=None, description="Gauge: KV-cache usage, 0..1.")
    prefix_hits: str | None = Field(
        default=None,
        description="Counter: prefix-cache hits (tokens), paired with prefix_queries or "
        "prefix_misses.",
    )
    prefix_queries: str | None = Field(
        default=None, description="Counter: prefix-cache queries (tokens), paired with prefix_hits."
    )
    prefix_misses: str | None = Field(
        default=None,
        description="Counter: prompt tokens computed, not taken from the prefix cache, paired with "
        "prefix_hits where the engine counts no queries (llama.cpp): queries = hits + misses.",
    )
    prefix_hit_rate: str | None = Field(
        default=None, description="Gauge: prefix-cache hit rate 0..1, when no counters exist."
    )
    preemptions: str | None = Field(
        default=None, description="Counter: requests preempted (or retracted) for KV space."
    )
    evictions: str | None = Field(default=None, description="Counter: prefix-cache evictions.")
    engine_rejections: str | None = Field(
        default=None, description="Counter: requests the engine refused before queueing."
    )
    prompt_tokens: str | None = Field(default=None, description="Counter: prefill tokens.")
    generation_tokens: str | None = Field(default=None, description="Counter: generated tokens.")
    request_success: str | None = Field(
        default=None, description="Counter: finished requests, labelled with the finish reason."
    )
    finish_reason_label: str | None = Field(
        default=None, description="Label of request_success that carries the finish reason."
    )
    abort_reason: str | None = Field(
        default=None, description="Value of finish_reason_label for aborted (cancelled) requests."
    )
    ttft_hist: str | None = Field(default=None, description="Histogram: time to first token, s.")
    ttft_buckets: tuple[float, ...] | None = Field(
        default=None, description="Bucket upper bounds of ttft_hist, s (ascending)."
    )
    itl_hist: str | None = Field(
        default=None, description="Histogram: latency between consecutive output tokens, s."
    )
    itl_buckets: tuple[float, ...] | None = Field(
        default=None, description="Bucket upper bounds of itl_hist, s (ascending)."
    )
    e2e_hist: str | None = Field(default=None, description="Histogram: end-to-end latency, s.")
    queue_time_hist: str | None = Field(
        default=None, description="Histogram: time a request waited in the queue, s."
    )
    iteration_tokens_hist: str | None = Field(
        default=None, description="Histogram: tokens batched per engine iteration."
    )
    replica_label: str | None = Field(
        default=None,
        description="Label that tells replicas/engines apart on engine series (None: one series).",
    )
    router: bool = Field(
        default=False, description="True when the router's router:* series are exposed too."
    )

    @model_validator(mode="after")
    def _check(self) -> EngineMetrics:
        if self.request_success is not None and (
            self.finish_reason_label is None or self.abort_reason is None
        ):
            raise ValueError("request_success needs finish_reason_label and abort_reason")
        pairs = (self.prefix_queries is not None) + (self.prefix_misses is not None)
        if (self.prefix_hits is not None and pairs != 1) or (self.prefix_hits is None and pairs):
            raise ValueError(
                "prefix_hits comes with exactly one of prefix_queries and prefix_misses"
            )
        for name in ("ttft_buckets", "itl_buckets"):
            bounds = getattr(self, name)
            if bounds is not None and (
                not bounds or any(b <= a for a, b in zip(bounds, bounds[1:], strict=False))
            ):
                raise ValueError(f"{name} must be non-empty and strictly ascending")
        return self

    def metric_names(self) -> set[str]:
        """Every series name a query over this map may select (histograms expand to their
        ``_bucket``/``_count``/``_sum`` series; the router's series when ``router``)."""
        names: set[str] = set()
        for field, value in self:
            if not isinstance(value, str) or field.endswith("_label") or field == "abort_reason":
                continue
            if field.endswith("_hist"):
                names.update(f"{value}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
            else:
                names.add(value)
        if self.router:
            names.update(ROUTER_METRICS)
        return names
