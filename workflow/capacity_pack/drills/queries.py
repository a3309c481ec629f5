"""What the alert rules (:mod:`~capacity_pack.drills.alerts`) and the Grafana dashboard
(:mod:`~capacity_pack.drills.dashboard`) share: the engine's metric map and PromQL text.

The metric map of a pack's engine (:func:`engine_metrics`, :func:`metric_map_name`; an unusable
one is a :class:`DashboardError`), PromQL builders returning expression text, and SLO cutoffs
against histograms (:func:`strictest`, :func:`round_up`: a histogram counts observations at or
below a bound only, so a cutoff between two bounds is met by the next bound up).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from capacity_pack import engines
from capacity_pack.engines.metric_map import EngineMetrics, MetricMapError


class DashboardError(ValueError):
    """An engine map, override or threshold that cannot be used; the message says what to give."""


def metric_map_name(pack: Any) -> str:
    """Which map a pack's series follow (:func:`capacity_pack.engines.metric_map_name`)."""
    return engines.metric_map_name(pack)


def engine_metrics(engine_name: str, overrides: dict[str, Any] | None = None) -> EngineMetrics:
    """The registered metric map of ``engine_name`` with ``overrides`` applied
    (:func:`capacity_pack.engines.engine_metrics`); :class:`DashboardError` when unusable."""
    try:
        return engines.engine_metrics(engine_name, overrides)
    except MetricMapError as err:
        raise DashboardError(str(err)) from None


def managed_behind_router(pack: Any) -> bool:
    """Whether the pack's drills run a managed target's copies as the project's router's
    replicas (:mod:`capacity_pack.drills.run`)."""
    return getattr(pack.target, "managed", None) is not None


def pack_metrics(pack: Any, overrides: dict[str, Any] | None = None) -> EngineMetrics:
    """The series a pack's alerts and dashboard read: its engine's map (:func:`engine_metrics`),
    plus the router's ``router:*`` series and its per-replica ``engine`` label for a managed
    target, whose drills run its copies behind the project's router
    (:func:`managed_behind_router`). A simulated target's series are the map's as chosen
    (the simulator's own map has the router's; another engine's map stands for that engine's
    deployment)."""
    m = engine_metrics(metric_map_name(pack), overrides)
    if managed_behind_router(pack) and not m.router:
        m = m.model_copy(update={"router": True, "replica_label": m.replica_label or "engine"})
    return m


def num(x: float) -> str:
    return f"{x:.10g}"


def duration(seconds: float) -> str:
    """A Prometheus duration: whole seconds as ``10s``, anything finer in milliseconds."""
    ms = round(seconds * 1000)
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


def le(bound: float) -> str:
    # Python's float repr is how prometheus_client writes bounds ("0.25", "1.0") and what
    # Prometheus 3 normalizes classic-histogram "le" values to.
    return repr(float(bound))


def sel(metric: str, *matchers: str) -> str:
    return f"{metric}{{{','.join(matchers)}}}" if matchers else metric


def agg(op: str, label: str | None, inner: str) -> str:
    return f"{op} by ({label}) ({inner})" if label else f"{op}({inner})"


def any_of(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else " or ".join(f"({p})" for p in parts)


def rate(selector: str, window: str) -> str:
    return f"rate({selector}[{window}])"


def hit_rates(
    m: EngineMetrics, rl: str | None, counter: Callable[[str], str], gauge: Callable[[str], str]
) -> tuple[str, str] | None:
    """(per replica, fleet) prefix-cache hit rate: hits / queries of the counters (queries =
    hits + misses where the engine counts the computed tokens, as llama.cpp does), else the mean
    hit-rate gauge; ``counter`` and ``gauge`` wrap a metric name. None without any of them."""
    if m.prefix_hits is not None and m.prefix_queries is not None:
        hits, queries = counter(m.prefix_hits), counter(m.prefix_queries)
        per = f"{agg('sum', rl, hits)} / {agg('sum', rl, queries)}"
        return per, f"sum({hits}) / sum({queries})"
    if m.prefix_hits is not None and m.prefix_misses is not None:
        hits, misses = counter(m.prefix_hits), counter(m.prefix_misses)
        per_hits = agg("sum", rl, hits)
        per = f"{per_hits} / ({per_hits} + {agg('sum', rl, misses)})"
        return per, f"sum({hits}) / (sum({hits}) + sum({misses}))"
    if m.prefix_hit_rate is not None:
        g = gauge(m.prefix_hit_rate)
        return agg("avg", rl, g), f"avg({g})"
    return None


def round_up(cutoff_s: float, bounds: tuple[float, ...]) -> float | None:
    """The smallest bound at or above ``cutoff_s`` (1e-12 s of float slack), or None."""
    for b in bounds:
        if b >= cutoff_s - 1e-12:
            return b
    return None


def strictest(pack: Any, field: str, loosest: bool = False) -> tuple[float, list[str]]:
    """The smallest (``loosest``: largest) value of workload-class ``field`` and the classes
    that have it."""
    pick = max if loosest else min
    cutoff = pick(getattr(c, field) for c in pack.workload)
    return cutoff, [c.name for c in pack.workload if getattr(c, field) == cutoff]


def histogram_cutoff(pack: Any, metric: str) -> tuple[float, list[str]]:
    """The cutoff (ms) an engine histogram is held to, for the SLO-burn alerts and the
    dashboard's "within cutoff" panel alike, and the classes that have it. The histograms carry
    no class label: first tokens (``ttft``) are held to the strictest class TTFT cutoff; the
    inter-token gaps (``itl``) to the loosest class TPOT cutoff, because a request's TPOT is the
    mean of its gaps and the gaps' tail is heavier than the means' (a prefill in the batch
    stretches a few gaps of every request): against the strictest cutoff, per-gap shares fall at
    a point whose requests all meet their TPOT."""
    if metric == "ttft":
        return strictest(pack, "request_ttft_cutoff_ms")
    if metric == "itl":
        return strictest(pack, "request_tpot_cutoff_ms", loosest=True)
    raise ValueError(f"metric: expected 'ttft' or 'itl', got {metric!r}")
