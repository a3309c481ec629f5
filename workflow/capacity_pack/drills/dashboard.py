"""Operations artifacts of a pack: engine metric-name maps, Prometheus alerting rules, and a
Grafana dashboard.

- Every rule and panel reads the engine's series through its metric map
  (:class:`~capacity_pack.engines.EngineMetrics`, declared by each engine module in
  :mod:`capacity_pack.engines`): queue depth, KV usage, prefix-cache hits, preemptions, token
  counters, the latency histograms and their bucket bounds, the label that tells replicas apart,
  and whether the router's ``router:*`` series exist. A signal an engine does not expose is
  ``None``; nothing is invented. :func:`engine_metrics` picks the map by the manifest's
  ``engine.name`` (or ``engine.metric_names``, :func:`metric_map_name`) and applies overrides.
- :func:`alert_rules` builds a Prometheus rule file (one group), one rule per failure mechanism
  the seed's drills target (replica failure, queue saturation, KV pressure, transfer
  degradation, cancellation, cold start) plus the symptom rules ErrorRate and SLOBurnTTFT /
  SLOBurnTPOT (SLO burn, one per cutoff). Every rule carries the same five bounded labels
  (severity, mechanism, pack, model_revision, engine_version); aggregation is only ever by the
  replica label, ``replica``, ``code`` or the finish-reason label. A rule whose signal the
  engine lacks is left out and reported.
- :func:`grafana_dashboard` builds an importable Grafana dashboard (schemaVersion 39) with the
  seed's four signal groups as rows: Request and SLO, Scheduler and queue, KV and GPU,
  Distributed. Panels whose signal is missing are left out and reported.

Windows and ``for:`` durations default to drill scale (10 s rate windows, 1-3 s ``for``, 1 s
evaluation) because a failure drill lasts tens of seconds. A production deployment should
lengthen them (e.g. 5 m windows, ``for: 5m``, 30 s-1 m evaluation) through
:class:`AlertThresholds`, or the alerts will flap on ordinary noise.

SLO burn from engine histograms: the histograms carry no workload-class label, so the rule uses
the strictest class cutoff for every request, rounded up to the nearest histogram bucket bound
(a histogram can only count observations at or below a bound). The TPOT rule reads the
inter-token-latency histogram, which counts gaps, not requests; it is an early signal, while the
analyzer's per-request attainment stays the decision.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capacity_pack import engines
from capacity_pack.engines.metric_map import (
    ROUTER_ADMISSION_REJECTED,
    ROUTER_CODE_LABEL,
    ROUTER_HEALTH_RTT,
    ROUTER_NO_REPLICA,
    ROUTER_OUTSTANDING,
    ROUTER_RELAY_FAILURES,
    ROUTER_RELAYED_BYTES,
    ROUTER_REPLICA_LABEL,
    ROUTER_REQUESTS,
    ROUTER_RESPONSES,
    ROUTER_RETRIES,
    ROUTER_STARTING,
    ROUTER_STARTS,
    ROUTER_UP,
    ROUTER_UPSTREAM_ERRORS,
    EngineMetrics,
    MetricMapError,
)
from capacity_pack.evidence.gates import CLASS_ATTAINMENT, ERROR_RATE
from capacity_pack.io import atomic_path, sha256_hex, write_json_atomic

# dcgm-exporter's field names; they exist only where dcgm-exporter runs beside the engine.
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
DCGM_POWER = "DCGM_FI_DEV_POWER_USAGE"
DCGM_METRICS = (DCGM_GPU_UTIL, DCGM_FB_USED, DCGM_POWER)

SEVERITIES = ("critical", "warning", "info")
STATIC_LABELS = ("severity", "mechanism", "pack", "model_revision", "engine_version")
ROW_TITLES = ("Request and SLO", "Scheduler and queue", "KV and GPU", "Distributed")

GRID_COLUMNS = 24
PANEL_WIDTH = 8
PANEL_HEIGHT = 8
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


class DashboardError(ValueError):
    """An engine map, override or threshold that cannot be used; the message says what to give."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


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


# ---------------------------------------------------------------------------------------------
# Alert thresholds and PromQL helpers
# ---------------------------------------------------------------------------------------------


class AlertThresholds(_Model):
    """Thresholds and windows of the alerting rules; plain numbers so a pack can override them
    as a mapping (``failure.alert_thresholds``)."""

    rate_window_s: float = Field(default=10.0, gt=0, description="rate()/ratio window.")
    evaluation_interval_s: float = Field(default=1.0, gt=0, description="Group interval.")
    replica_down_for_s: float = Field(default=1.0, ge=0, description="'for' of ReplicaDown.")
    for_s: float = Field(default=2.0, ge=0, description="'for' of the mechanism rules.")
    symptom_for_s: float = Field(default=3.0, ge=0, description="'for' of ErrorRate and SLOBurn.")
    queue_waiting_max: float = Field(
        default=8.0, ge=0, description="Waiting requests per replica above which it is saturated."
    )
    shed_rate_min: float = Field(
        default=0.5, ge=0, description="Requests/s shed by admission control called saturation."
    )
    shed_share_min: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Share of completion responses that admission control refused, above which "
        "shedding is called saturation (with shed_rate_min).",
    )
    kv_usage_max: float = Field(default=0.9, gt=0, le=1, description="KV usage called pressure.")
    preemption_rate_max: float = Field(
        default=0.0, ge=0, description="Preemptions per second per replica called KV pressure."
    )
    health_rtt_max_s: float = Field(
        default=0.1, gt=0, description="Health-check round trip above which the link is degraded."
    )
    cancel_share_max: float = Field(
        default=0.05, ge=0, le=1, description="Share of finished requests aborted."
    )
    cold_hit_ratio: float = Field(
        default=0.5, gt=0, le=1, description="A replica below this x the fleet hit rate is cold."
    )
    cold_fleet_hit_rate_min: float = Field(
        default=0.2, ge=0, le=1, description="ColdReplica needs the fleet's hit rate above this."
    )
    burn_factor: float = Field(
        default=2.0, gt=0, description="SLOBurn fires above this x the error budget."
    )
    error_rate_max: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description=f"Non-2xx share; default acceptance.{ERROR_RATE.field} (its gate's threshold).",
    )


def _num(x: float) -> str:
    return f"{x:.10g}"


def _duration(seconds: float) -> str:
    """A Prometheus duration: whole seconds as ``10s``, anything finer in milliseconds."""
    ms = round(seconds * 1000)
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


def _le(bound: float) -> str:
    # Python's float repr is how prometheus_client writes bounds ("0.25", "1.0") and what
    # Prometheus 3 normalizes classic-histogram "le" values to.
    return repr(float(bound))


def _sel(metric: str, *matchers: str) -> str:
    return f"{metric}{{{','.join(matchers)}}}" if matchers else metric


def _agg(op: str, label: str | None, inner: str) -> str:
    return f"{op} by ({label}) ({inner})" if label else f"{op}({inner})"


def _any(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else " or ".join(f"({p})" for p in parts)


def _rate(selector: str, window: str) -> str:
    return f"rate({selector}[{window}])"


def _round_up(cutoff_s: float, bounds: tuple[float, ...]) -> float | None:
    for b in bounds:
        if b >= cutoff_s - 1e-12:
            return b
    return None


def _strictest(pack: Any, field: str, loosest: bool = False) -> tuple[float, list[str]]:
    pick = max if loosest else min
    cutoff = pick(getattr(c, field) for c in pack.workload)
    return cutoff, [c.name for c in pack.workload if getattr(c, field) == cutoff]


def _resolve_thresholds(pack: Any, thresholds: AlertThresholds | dict | None) -> AlertThresholds:
    if isinstance(thresholds, AlertThresholds):
        return thresholds
    if thresholds is None:
        failure = getattr(pack, "failure", None)
        thresholds = dict(getattr(failure, "alert_thresholds", None) or {})
    try:
        return AlertThresholds.model_validate(thresholds)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        raise DashboardError(
            f"invalid alert thresholds ({problems}); valid fields: "
            f"{', '.join(AlertThresholds.model_fields)}"
        ) from None


# ---------------------------------------------------------------------------------------------
# Alerting rules
# ---------------------------------------------------------------------------------------------


def alert_rules(
    pack: Any,
    thresholds: AlertThresholds | dict | None = None,
    overrides: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Prometheus rule file of ``pack`` and the rules (or clauses) left out.

    ``thresholds`` defaults to the pack's ``failure.alert_thresholds`` over the
    :class:`AlertThresholds` defaults; ``overrides`` go to :func:`engine_metrics`. Each omitted
    entry has ``alert``, ``mechanism``, ``scope`` (``rule``: the whole rule is absent;
    ``clause``: the rule exists without that part) and ``reason``. Prometheus rejects unknown
    keys in a rule file, so the omissions are returned beside it rather than inside it.
    """
    m = engine_metrics(metric_map_name(pack), overrides)
    t = _resolve_thresholds(pack, thresholds)
    acc = pack.acceptance
    w = _duration(t.rate_window_s)
    rl = m.replica_label
    static = {
        "pack": pack.pack.name,
        "model_revision": pack.model.revision,
        "engine_version": pack.engine.version,
    }
    rules: list[dict[str, Any]] = []
    omitted: list[dict[str, str]] = []
    who = f"{{{{ $labels.{rl} }}}}" if rl else "(all)"

    def add(
        alert: str, mechanism: str, severity: str, for_s: float, expr: str, summary: str, desc: str
    ) -> None:
        rules.append(
            {
                "alert": alert,
                "expr": expr,
                "for": _duration(for_s),
                "labels": {"severity": severity, "mechanism": mechanism, **static},
                "annotations": {"summary": summary, "description": desc},
            }
        )

    def skip(alert: str, mechanism: str, reason: str, scope: str = "rule") -> None:
        omitted.append({"alert": alert, "mechanism": mechanism, "scope": scope, "reason": reason})

    engine = pack.engine.name

    # -- replica failure: the router's view, and Prometheus's own scrape health ---------------
    if m.router:
        # A replica still loading (restart, scale-out) is the cold-start mechanism, not a failure.
        expr = (
            f"(min by ({ROUTER_REPLICA_LABEL}) ({ROUTER_UP}) == 0 unless on "
            f"({ROUTER_REPLICA_LABEL}) (max by ({ROUTER_REPLICA_LABEL}) "
            f"({ROUTER_STARTING}) == 1)) or up == 0"
        )
        where = "{{ $labels.replica }}{{ $labels.instance }}"
        desc = (
            f"Replica {where} is out of rotation (router health check failed) or its scrape "
            "target is down. Expect errors or backpressure while the fleet runs one replica "
            "short; check that the router stopped selecting it and that it comes back."
        )
    else:
        expr = "up == 0"
        where = "{{ $labels.instance }}"
        desc = (
            f"Scrape target {where} is down: the engine process or its host failed. The map of "
            f"engine {engine!r} has no router series, so only Prometheus's 'up' can tell."
        )
        skip(
            "ReplicaDown",
            "replica_failure",
            "no router series in the engine map: the rule uses Prometheus's 'up' only",
            "clause",
        )
    add(
        "ReplicaDown",
        "replica_failure",
        "critical",
        t.replica_down_for_s,
        expr,
        f"Replica {where} is down",
        desc,
    )

    # -- queue saturation: waiting grows while KV has room (else it is KV pressure) ----------
    parts: list[str] = []
    if m.waiting is not None:
        waiting = f"{_agg('sum', rl, m.waiting)} > {_num(t.queue_waiting_max)}"
        if m.kv_usage is not None:
            kv_room = f"{_agg('max', rl, m.kv_usage)} < {_num(t.kv_usage_max)}"
            parts.append(f"({waiting}) and ({kv_room})")
        else:
            parts.append(waiting)
            skip(
                "QueueSaturation",
                "queue_saturation",
                "no KV-usage gauge: waiting requests alone, so KV pressure also fires this",
                "clause",
            )
    else:
        skip("QueueSaturation", "queue_saturation", "no waiting-requests gauge", "clause")
    if m.router:
        # Sustained shedding, not the odd request refused at the peak of a Poisson burst: a
        # burst of refusals lifts the rate over the window for as long as the window (so a rate
        # alone fires on one burst), but not the share of the window's responses it refused.
        shed_rate = f"sum({_rate(ROUTER_ADMISSION_REJECTED, w)})"
        shed = (
            f"({shed_rate} > {_num(t.shed_rate_min)}) and "
            f"({shed_rate} / sum({_rate(ROUTER_RESPONSES, w)}) > {_num(t.shed_share_min)})"
        )
        if m.kv_usage is not None:
            shed = f"({shed}) and (max({m.kv_usage}) < {_num(t.kv_usage_max)})"
        parts.append(shed)
    else:
        skip(
            "QueueSaturation",
            "queue_saturation",
            "no router series: router admission shedding is not part of the rule",
            "clause",
        )
    if parts:
        add(
            "QueueSaturation",
            "queue_saturation",
            "warning",
            t.for_s,
            _any(parts),
            f"Queue saturation on replica {who}",
            f"Replica {who}: {{{{ $value }}}} requests waiting (threshold "
            f"{_num(t.queue_waiting_max)}) while KV usage stays below {_num(t.kv_usage_max)}, "
            "or the router's admission control is shedding load. Offered load exceeds what "
            "the fleet serves; add replicas or shed load before the queue grows without bound.",
        )
    else:
        skip("QueueSaturation", "queue_saturation", "no waiting gauge and no router series")

    # -- KV pressure ---------------------------------------------------------------------------
    parts = []
    if m.kv_usage is not None:
        parts.append(f"{_agg('max', rl, m.kv_usage)} > {_num(t.kv_usage_max)}")
    else:
        skip("KVCachePressure", "kv_pressure", "no KV-usage gauge", "clause")
    if m.preemptions is not None:
        parts.append(f"{_agg('sum', rl, _rate(m.preemptions, w))} > {_num(t.preemption_rate_max)}")
    else:
        skip("KVCachePressure", "kv_pressure", "no preemption counter", "clause")
    if parts:
        add(
            "KVCachePressure",
            "kv_pressure",
            "warning",
            t.for_s,
            _any(parts),
            f"KV-cache pressure on replica {who}",
            f"Replica {who}: KV usage above {_num(t.kv_usage_max)} or requests preempted "
            f"faster than {_num(t.preemption_rate_max)}/s (value {{{{ $value }}}}). The batch "
            "is limited by KV memory, not compute: expect queueing and recomputation.",
        )
    else:
        skip("KVCachePressure", "kv_pressure", "no KV-usage gauge and no preemption counter")

    # -- transfer degradation ------------------------------------------------------------------
    if m.router:
        add(
            "TransferDegraded",
            "transfer_degradation",
            "warning",
            t.for_s,
            f"max by ({ROUTER_REPLICA_LABEL}) ({ROUTER_HEALTH_RTT}) > {_num(t.health_rtt_max_s)}",
            "Degraded link to replica {{ $labels.replica }}",
            "Health-check round trip to replica {{ $labels.replica }} is {{ $value }} s "
            f"(threshold {_num(t.health_rtt_max_s)} s; a loopback check takes about 1 ms). The "
            "network path to it is slow or lossy: latency rises without KV or queue pressure.",
        )
    else:
        skip("TransferDegraded", "transfer_degradation", "no router health-check RTT series")

    # -- cancellations -------------------------------------------------------------------------
    if m.request_success is not None:
        aborted = _sel(m.request_success, f'{m.finish_reason_label}="{m.abort_reason}"')
        add(
            "RequestCancellations",
            "cancellation",
            "warning",
            t.for_s,
            f"sum({_rate(aborted, w)}) / sum({_rate(m.request_success, w)}) "
            f"> {_num(t.cancel_share_max)}",
            "Requests are being cancelled",
            f"{{{{ $value | humanizePercentage }}}} of finished requests ended with "
            f"{m.finish_reason_label}={m.abort_reason} (threshold {_num(t.cancel_share_max)}). "
            "Clients give up (timeouts, disconnects): work is spent on answers nobody reads.",
        )
    else:
        skip(
            "RequestCancellations",
            "cancellation",
            "no finished-requests counter labelled with the finish reason",
        )

    # -- cold replica: its prefix-cache hit rate far below the fleet's -------------------------
    if m.prefix_hits is not None and m.prefix_queries is not None:
        per = (
            f"{_agg('sum', rl, _rate(m.prefix_hits, w))} / "
            f"{_agg('sum', rl, _rate(m.prefix_queries, w))}"
        )
        fleet = f"sum({_rate(m.prefix_hits, w)}) / sum({_rate(m.prefix_queries, w)})"
    elif m.prefix_hit_rate is not None:
        per = _agg("avg", rl, f"avg_over_time({m.prefix_hit_rate}[{w}])")
        fleet = f"avg(avg_over_time({m.prefix_hit_rate}[{w}]))"
    else:
        per = fleet = ""
    if per and rl:
        # scalar() of the filtered fleet rate is NaN when the fleet itself is cold, and a
        # comparison with NaN is false, so nothing fires then.
        cold = (
            f"({per}) < {_num(t.cold_hit_ratio)} * "
            f"scalar(({fleet}) > {_num(t.cold_fleet_hit_rate_min)})"
        )
        if m.router:
            # A replica still loading its weights is the other half of a cold start: the
            # capacity the autoscaler asked for is not there yet.
            cold = f"(max by ({ROUTER_REPLICA_LABEL}) ({ROUTER_STARTING}) == 1) or ({cold})"
        add(
            "ColdReplica",
            "cold_start",
            "info",
            t.for_s,
            cold,
            f"Replica {who}{{{{ $labels.replica }}}} is cold",
            f"Replica {who}{{{{ $labels.replica }}}} is still loading (started, not yet healthy)"
            f" or hits its prefix cache {{{{ $value | humanizePercentage }}}} of the time, below "
            f"{_num(t.cold_hit_ratio)}x the fleet's rate (itself above "
            f"{_num(t.cold_fleet_hit_rate_min)}): a new or restarted replica adds no capacity "
            "until it loads, and recomputes shared prefixes until its cache warms.",
        )
    elif per:
        skip("ColdReplica", "cold_start", "no replica label: no per-replica hit rate to compare")
    else:
        skip("ColdReplica", "cold_start", "no prefix-cache hit/query counters or hit-rate gauge")

    # -- symptom: error rate -------------------------------------------------------------------
    # The error-rate gate's threshold unless the pack overrides it: the same quantity (the share
    # of failed requests), here counted on the router's responses.
    err_max = t.error_rate_max if t.error_rate_max is not None else ERROR_RATE.threshold(acc)
    if m.router:
        non2xx = _sel(ROUTER_RESPONSES, f'{ROUTER_CODE_LABEL}!~"2.."')
        add(
            "ErrorRate",
            "errors",
            "critical",
            t.symptom_for_s,
            f"sum({_rate(non2xx, w)}) / sum({_rate(ROUTER_RESPONSES, w)}) > {_num(err_max)}",
            "Error rate above the acceptance cap",
            f"{{{{ $value | humanizePercentage }}}} of responses are not 2xx (cap "
            f"{_num(err_max)}, acceptance.{ERROR_RATE.field}). A symptom: look at ReplicaDown, "
            "QueueSaturation and KVCachePressure for the cause.",
        )
    else:
        skip("ErrorRate", "errors", "no per-response status counter (router series absent)")

    # -- symptom: SLO burn ---------------------------------------------------------------------
    # The error budget of the attainment gate: the share of requests allowed to miss their SLO.
    attainment_min = CLASS_ATTAINMENT.threshold(acc)
    budget = 1.0 - attainment_min
    burn = t.burn_factor * budget
    # Two alert names, not one "SLOBurn" twice: both results are label-less fleet ratios, so
    # under one name Alertmanager would merge them into one alert (and promql.load_rules
    # rejects duplicate names in a group).
    for alert, hist, bounds, field, what in (
        ("SLOBurnTTFT", m.ttft_hist, m.ttft_buckets, "request_ttft_cutoff_ms", "first tokens"),
        ("SLOBurnTPOT", m.itl_hist, m.itl_buckets, "request_tpot_cutoff_ms", "inter-token gaps"),
    ):
        # A request's TPOT is the mean of its gaps, and the gaps' tail is heavier than the
        # means' (a prefill in the batch stretches a few gaps of every request): against the
        # strictest cutoff, per-gap shares burn at a point whose requests all meet their TPOT.
        # So the gaps are held to the loosest class TPOT cutoff.
        tpot = alert == "SLOBurnTPOT"
        cutoff_ms, classes = _strictest(pack, field, loosest=tpot)
        if hist is None or bounds is None:
            skip(alert, "slo", f"no {'TTFT' if 'TTFT' in alert else 'ITL'} histogram with bounds")
            continue
        bound = _round_up(cutoff_ms / 1000.0, bounds)
        if bound is None:
            skip(alert, "slo", f"cutoff {cutoff_ms:g} ms exceeds the largest bucket ({bounds[-1]})")
            continue
        within = _sel(f"{hist}_bucket", f'le="{_le(bound)}"')
        expr = f"(1 - sum({_rate(within, w)}) / sum({_rate(f'{hist}_count', w)})) > {_num(burn)}"
        gap = (
            "exact"
            if math.isclose(bound * 1000, cutoff_ms)
            else (f"rounded up from {cutoff_ms:g} ms; observations between the two count as met")
        )
        note = (
            "; the histogram counts gaps, not requests, whose tail is heavier than the "
            "per-request mean TPOT, so the loosest class TPOT cutoff is used"
            if tpot
            else ""
        )
        which = "loosest" if tpot else "strictest"
        add(
            alert,
            "slo",
            "critical",
            t.symptom_for_s,
            expr,
            f"SLO burn: slow {what}",
            f"{{{{ $value | humanizePercentage }}}} of {what} took longer than {_num(bound)} s "
            f"(bucket le={_le(bound)} of {hist}, {gap}), above {_num(t.burn_factor)}x the error "
            f"budget 1 - {_num(attainment_min)}. The engine histogram "
            f"carries no workload-class label, so the {which} class cutoff ({cutoff_ms:g} ms, "
            f"{', '.join(classes)}) applies to every request{note}.",
        )

    doc = {
        "groups": [
            {
                "name": f"capacity-pack-{pack.pack.name}",
                "interval": _duration(t.evaluation_interval_s),
                "rules": rules,
            }
        ]
    }
    return doc, omitted


def write_alert_rules(
    pack: Any,
    path: str | Path,
    thresholds: AlertThresholds | dict | None = None,
    overrides: dict[str, Any] | None = None,
) -> list[dict[str, str]]:
    """Write the rule file atomically (temp file + rename); returns what was left out.

    The omissions are also written as YAML comments at the top, which Prometheus ignores.
    """
    doc, omitted = alert_rules(pack, thresholds, overrides)
    lines = [
        f"# Prometheus alerting rules of pack {pack.pack.name!r} "
        f"(engine {pack.engine.name} {pack.engine.version}), written by capacity-pack.",
        "# Windows are drill-scale (seconds); lengthen them for production.",
    ]
    for o in omitted:
        lines.append(f"# left out ({o['scope']}): {o['alert']}: {o['reason']}")
    body = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=10_000)
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n" + body, encoding="utf-8")
    return omitted


# ---------------------------------------------------------------------------------------------
# Grafana dashboard
# ---------------------------------------------------------------------------------------------

_MECH = {
    "queue": "queue saturation",
    "kv": "KV pressure",
    "gpu": "GPU/replica failure",
    "net": "network/transfer degradation",
}


def _panel(
    title: str,
    description: str,
    unit: str,
    targets: list[tuple[str, str]],
    *,
    min_max: tuple[float, float] | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "custom": {"drawStyle": "line", "lineWidth": 1}}
    if min_max is not None:
        defaults["min"], defaults["max"] = min_max
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": dict(DATASOURCE),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": dict(DATASOURCE),
                "expr": expr,
                "legendFormat": legend,
                "range": True,
            }
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def _uid(name: str) -> str:
    """Grafana uids allow 40 characters of [A-Za-z0-9_-]; a hash keeps long names distinct."""
    slug = re.sub(r"[^A-Za-z0-9_-]", "-", name)
    uid = f"cp-{slug}"
    if len(uid) > 40:
        uid = f"cp-{slug[:28]}-{sha256_hex(name)[:8]}"
    return uid


Builder = Callable[[str], "dict[str, Any] | str"]


def build_dashboard(
    pack: Any, overrides: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The Grafana dashboard of ``pack`` and the panels left out (``row``, ``panel``,
    ``reason``)."""
    m = engine_metrics(metric_map_name(pack), overrides)
    rl = m.replica_label
    rr = ROUTER_REPLICA_LABEL
    eng = [f'{rl}=~"$replica"'] if rl else []
    rtr = [f'{rr}=~"$replica"']
    who = f"replica {{{{{rl}}}}}" if rl else "all"
    r_who = f"replica {{{{{rr}}}}}"

    def es(metric: str, *extra: str) -> str:
        return _sel(metric, *eng, *extra)

    def rs(metric: str) -> str:
        return _sel(metric, *rtr)

    def quantiles(hist: str, qs: tuple[float, ...] = (0.5, 0.95)) -> list[tuple[str, str]]:
        inner = f"sum by (le) ({_rate(es(f'{hist}_bucket'), RATE)})"
        return [(f"histogram_quantile({q}, {inner})", f"p{round(q * 100)}") for q in qs]

    def need(*signals: str) -> str | None:
        missing = [s for s in signals if getattr(m, s) is None]
        return f"engine map has no {', '.join(missing)}" if missing else None

    no_router = "no router series for this engine"

    # Each builder gets its panel title and returns the panel, or the reason it is left out.
    def responses(title: str) -> dict | str:
        if not m.router:
            return no_router
        return _panel(
            title,
            "Router responses per second by HTTP code. Errors with replicas down point to "
            f"{_MECH['gpu']}; 429/503 shedding with queues high points to {_MECH['queue']}.",
            "reqps",
            [(f"sum by ({ROUTER_CODE_LABEL}) ({_rate(ROUTER_RESPONSES, RATE)})", "{{code}}")],
        )

    def finished(title: str) -> dict | str:
        if (r := need("request_success")) is not None:
            return r
        lab = m.finish_reason_label
        return _panel(
            title,
            f"Engine-finished requests per second by {lab}; a rising '{m.abort_reason}' share "
            "is client cancellation, which frees capacity rather than showing "
            f"{_MECH['queue']} or {_MECH['kv']}.",
            "reqps",
            [(f"sum by ({lab}) ({_rate(es(m.request_success), RATE)})", f"{{{{{lab}}}}}")],
        )

    def latency(field: str, text: str) -> Builder:
        def build(title: str) -> dict | str:
            if (r := need(field)) is not None:
                return r
            return _panel(title, text, "s", quantiles(getattr(m, field)))

        return build

    def tokens(title: str) -> dict | str:
        targets = [
            (f"sum({_rate(es(getattr(m, f)), RATE)})", label)
            for f, label in (("prompt_tokens", "prompt"), ("generation_tokens", "generation"))
            if getattr(m, f) is not None
        ]
        if not targets:
            return "engine map has no prompt_tokens or generation_tokens"
        return _panel(
            title,
            "Prompt and generated tokens per second. Falling generation throughput with "
            f"steady offered load and high KV usage points to {_MECH['kv']}; with a replica "
            f"missing, to {_MECH['gpu']}.",
            "suffix:tok/s",
            targets,
        )

    def within_cutoffs(title: str) -> dict | str:
        targets = []
        for hist, bounds, field, label in (
            (m.ttft_hist, m.ttft_buckets, "request_ttft_cutoff_ms", "TTFT"),
            (m.itl_hist, m.itl_buckets, "request_tpot_cutoff_ms", "TPOT (ITL gaps)"),
        ):
            if hist is None or bounds is None:
                continue
            cutoff_ms, _ = _strictest(pack, field)
            bound = _round_up(cutoff_ms / 1000.0, bounds)
            if bound is None:
                continue
            le = f'le="{_le(bound)}"'
            num = f"sum({_rate(es(f'{hist}_bucket', le), RATE)})"
            den = f"sum({_rate(es(f'{hist}_count'), RATE)})"
            targets.append((f"{num} / {den}", f"{label} <= {_num(bound)} s ({cutoff_ms:g} ms)"))
        if not targets:
            return "no TTFT/ITL histogram with a bucket at or above the strictest cutoff"
        return _panel(
            title,
            "Share of first tokens (and of inter-token gaps) at or below the strictest class "
            "cutoff, rounded up to a histogram bucket bound (engine histograms carry no class "
            "label). A drop marks an SLO symptom; the other rows tell "
            f"{_MECH['queue']}, {_MECH['kv']}, {_MECH['gpu']} and {_MECH['net']} apart.",
            "percentunit",
            targets,
            min_max=(0, 1),
        )

    def retries(title: str) -> dict | str:
        if not m.router:
            return no_router
        return _panel(
            title,
            "Requests the router re-sent after a failed attempt, by the replica that failed. "
            f"Retries concentrated on one replica point to {_MECH['gpu']} or {_MECH['net']}.",
            "reqps",
            [(f"sum by ({rr}) ({_rate(rs(ROUTER_RETRIES), RATE)})", r_who)],
        )

    def gauge_per_replica(field: str, text: str) -> Builder:
        def build(title: str) -> dict | str:
            if (r := need(field)) is not None:
                return r
            return _panel(title, text, "short", [(_agg("sum", rl, es(getattr(m, field))), who)])

        return build

    def queue_time(title: str) -> dict | str:
        if (r := need("queue_time_hist")) is not None:
            return r
        by = f"le, {rl}" if rl else "le"
        inner = f"sum by ({by}) ({_rate(es(f'{m.queue_time_hist}_bucket'), RATE)})"
        return _panel(
            title,
            "95th percentile of the time requests waited before scheduling. Long waits with "
            f"low KV usage are {_MECH['queue']}; with high KV usage and preemptions, "
            f"{_MECH['kv']}.",
            "s",
            [(f"histogram_quantile(0.95, {inner})", f"p95 {who}")],
        )

    def iteration_tokens(title: str) -> dict | str:
        if (r := need("iteration_tokens_hist")) is not None:
            return r
        return _panel(
            title,
            "Tokens scheduled per engine step (prefill + decode). A full token budget with a "
            f"growing queue is {_MECH['queue']}; small batches with a queue point to "
            f"{_MECH['kv']} (no room to admit).",
            "short",
            quantiles(m.iteration_tokens_hist),
        )

    def counter_per_replica(field: str, text: str) -> Builder:
        def build(title: str) -> dict | str:
            if (r := need(field)) is not None:
                return r
            return _panel(
                title, text, "cps", [(_agg("sum", rl, _rate(es(getattr(m, field)), RATE)), who)]
            )

        return build

    def admission(title: str) -> dict | str:
        targets = []
        if m.router:
            targets.append((f"sum({_rate(ROUTER_ADMISSION_REJECTED, RATE)})", "router admission"))
            targets.append((f"sum({_rate(ROUTER_NO_REPLICA, RATE)})", "no healthy replica"))
        if m.engine_rejections is not None:
            targets.append(
                (f"sum by (reason) ({_rate(es(m.engine_rejections), RATE)})", "engine: {{reason}}")
            )
        if not targets:
            return "no router series and no engine rejection counter"
        return _panel(
            title,
            "Requests refused before queueing: by the router's admission control, for lack of "
            "a healthy replica, or by the engine. Shedding with free KV is "
            f"{_MECH['queue']} handled honestly; 'no healthy replica' is {_MECH['gpu']}.",
            "reqps",
            targets,
        )

    def kv_usage(title: str) -> dict | str:
        if (r := need("kv_usage")) is not None:
            return r
        return _panel(
            title,
            f"Share of KV-cache blocks in use. Near 1 with preemptions is {_MECH['kv']}; a "
            f"growing queue with KV to spare is {_MECH['queue']} instead.",
            "percentunit",
            [(_agg("max", rl, es(m.kv_usage)), who)],
            min_max=(0, 1),
        )

    def hit_rate(title: str) -> dict | str:
        if m.prefix_hits is not None and m.prefix_queries is not None:
            per = (
                f"{_agg('sum', rl, _rate(es(m.prefix_hits), RATE))} / "
                f"{_agg('sum', rl, _rate(es(m.prefix_queries), RATE))}"
            )
            fleet = (
                f"sum({_rate(es(m.prefix_hits), RATE)}) / sum({_rate(es(m.prefix_queries), RATE)})"
            )
        elif m.prefix_hit_rate is not None:
            per = _agg("avg", rl, es(m.prefix_hit_rate))
            fleet = f"avg({es(m.prefix_hit_rate)})"
        else:
            return "engine map has no prefix-cache counters or hit-rate gauge"
        return _panel(
            title,
            "Share of prompt tokens served from the prefix cache. One replica far below the "
            "fleet is a cold (new or restarted) replica after "
            f"{_MECH['gpu']}; a fleet-wide drop with evictions is {_MECH['kv']}.",
            "percentunit",
            [(per, who), (fleet, "fleet")],
            min_max=(0, 1),
        )

    def dcgm(metric: str, unit: str, what: str) -> Builder:
        def build(title: str) -> dict | str:
            return _panel(
                title,
                f"{what} from dcgm-exporter ({metric}); empty unless dcgm-exporter runs on the "
                "GPU hosts and Prometheus scrapes it (the simulated engine has no GPU). Helps "
                f"tell {_MECH['gpu']} (utilisation and power drop to idle on one GPU) from "
                f"{_MECH['kv']} (HBM full, compute busy).",
                unit,
                [(metric, "{{Hostname}} GPU {{gpu}}")],
            )

        return build

    def replicas_up(title: str) -> dict | str:
        targets = []
        if m.router:
            targets.append((f"min by ({rr}) ({rs(ROUTER_UP)})", f"in rotation: {r_who}"))
        targets.append(("up", "scrape {{job}} {{instance}}"))
        return _panel(
            title,
            "1 while a replica is in the router's rotation (health checks pass), and "
            f"Prometheus's scrape health. A drop to 0 is {_MECH['gpu']}; latency rising "
            f"while every replica stays up points to {_MECH['net']} or {_MECH['queue']}.",
            "short",
            targets,
            min_max=(0, 1),
        )

    def router_panel(
        metric: str, unit: str, text: str, *, rate: bool = True, op: str = "sum"
    ) -> Builder:
        def build(title: str) -> dict | str:
            if not m.router:
                return no_router
            inner = _rate(rs(metric), RATE) if rate else rs(metric)
            return _panel(title, text, unit, [(f"{op} by ({rr}) ({inner})", r_who)])

        return build

    def relay_failures(title: str) -> dict | str:
        if not m.router:
            return no_router
        return _panel(
            title,
            "Responses the router could not relay, and connections to a replica that "
            f"failed. Both on one replica with it still 'up' is {_MECH['net']}; with it down, "
            f"{_MECH['gpu']}.",
            "cps",
            [
                (f"sum by ({rr}) ({_rate(rs(ROUTER_RELAY_FAILURES), RATE)})", f"relay {r_who}"),
                (
                    f"sum by ({rr}) ({_rate(rs(ROUTER_UPSTREAM_ERRORS), RATE)})",
                    f"upstream {r_who}",
                ),
            ],
        )

    rows: list[tuple[str, list[tuple[str, Builder]]]] = [
        (
            "Request and SLO",
            [
                ("Responses by status code", responses),
                ("Finished requests by reason", finished),
                (
                    "TTFT p50 / p95",
                    latency(
                        "ttft_hist",
                        "Time to first token from the engine histogram. TTFT rising with "
                        f"waiting requests is {_MECH['queue']}; with KV near full and "
                        f"preemptions, {_MECH['kv']}; with health RTT up, {_MECH['net']}.",
                    ),
                ),
                (
                    "ITL p50 / p95",
                    latency(
                        "itl_hist",
                        "Latency between consecutive output tokens. Decode slows under "
                        f"{_MECH['kv']} (preempted, recomputed requests) and over a degraded "
                        f"link ({_MECH['net']}); queueing alone barely moves it "
                        f"({_MECH['queue']}).",
                    ),
                ),
                (
                    "E2E latency p50 / p95",
                    latency(
                        "e2e_hist",
                        "End-to-end request latency; read it with TTFT and ITL to see whether "
                        f"waiting ({_MECH['queue']}) or decoding ({_MECH['kv']}, "
                        f"{_MECH['net']}) grew.",
                    ),
                ),
                ("Token throughput", tokens),
                ("Share within the strictest TTFT / TPOT cutoff", within_cutoffs),
                ("Router retries per replica", retries),
            ],
        ),
        (
            "Scheduler and queue",
            [
                (
                    "Waiting requests per replica",
                    gauge_per_replica(
                        "waiting",
                        "Requests queued in each engine. Growth on every replica with KV to "
                        f"spare is {_MECH['queue']}; growth right after another replica went "
                        f"down is {_MECH['gpu']} shifting load.",
                    ),
                ),
                (
                    "Running requests per replica",
                    gauge_per_replica(
                        "running",
                        "Requests in each engine's running batch. A batch that shrinks while "
                        f"the queue grows is {_MECH['kv']}; a full batch with a growing queue "
                        f"is {_MECH['queue']}.",
                    ),
                ),
                ("Queue time p95 per replica", queue_time),
                ("Batched tokens per iteration", iteration_tokens),
                (
                    "Preemptions per replica",
                    counter_per_replica(
                        "preemptions",
                        "Running requests pushed back for KV space (recomputed later): the "
                        f"signature of {_MECH['kv']}, absent under {_MECH['queue']}.",
                    ),
                ),
                ("Admission rejections", admission),
            ],
        ),
        (
            "KV and GPU",
            [
                ("KV-cache usage per replica", kv_usage),
                ("Prefix-cache hit rate per replica", hit_rate),
                (
                    "Prefix-cache evictions per replica",
                    counter_per_replica(
                        "evictions",
                        "Cached blocks evicted to make room. High eviction with a falling hit "
                        f"rate is {_MECH['kv']}: the cache cannot hold the working set.",
                    ),
                ),
                ("GPU utilisation", dcgm(DCGM_GPU_UTIL, "percent", "GPU utilisation")),
                ("GPU memory (HBM) used", dcgm(DCGM_FB_USED, "mbytes", "Framebuffer (HBM) used")),
                ("GPU power", dcgm(DCGM_POWER, "watt", "Board power draw")),
            ],
        ),
        (
            "Distributed",
            [
                ("Replicas up", replicas_up),
                (
                    "Outstanding requests per replica",
                    router_panel(
                        ROUTER_OUTSTANDING,
                        "short",
                        "Requests the router has in flight on each replica. One replica "
                        f"holding more than the rest points to a slow replica ({_MECH['net']} "
                        f"or {_MECH['kv']}); all rising together is {_MECH['queue']}.",
                        rate=False,
                    ),
                ),
                (
                    "Router selection rate per replica",
                    router_panel(
                        ROUTER_REQUESTS,
                        "reqps",
                        "Requests per second the router sends to each replica. A replica at 0 "
                        f"while others carry its share is {_MECH['gpu']} handled by the router.",
                    ),
                ),
                (
                    "Health-check RTT per replica",
                    router_panel(
                        ROUTER_HEALTH_RTT,
                        "s",
                        "Round trip of the router's health check (about 1 ms on loopback). A "
                        f"rise on one replica without queue or KV growth is {_MECH['net']}.",
                        rate=False,
                        op="max",
                    ),
                ),
                (
                    "Relayed bytes per replica",
                    router_panel(
                        ROUTER_RELAYED_BYTES,
                        "Bps",
                        "Response bytes the router relays from each replica. Throughput "
                        f"falling on one replica while it stays up points to {_MECH['net']}.",
                    ),
                ),
                ("Relay failures and upstream errors per replica", relay_failures),
                (
                    "Replica process starts",
                    router_panel(
                        ROUTER_STARTS,
                        "short",
                        "Processes started per replica; a step is a restart after "
                        f"{_MECH['gpu']}, and the restarted replica serves with a cold cache.",
                        rate=False,
                        op="max",
                    ),
                ),
            ],
        ),
    ]

    panels: list[dict[str, Any]] = []
    omitted: list[dict[str, str]] = []
    next_id = 1
    y = 0
    for row_title, builders in rows:
        built = []
        for title, build in builders:
            out = build(title)
            if isinstance(out, str):
                omitted.append({"row": row_title, "panel": title, "reason": out})
            else:
                built.append(out)
        panels.append(
            {
                "type": "row",
                "id": next_id,
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_COLUMNS, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id += 1
        y += 1
        per_line = GRID_COLUMNS // PANEL_WIDTH
        for i, p in enumerate(built):
            p["id"] = next_id
            next_id += 1
            p["gridPos"] = {
                "h": PANEL_HEIGHT,
                "w": PANEL_WIDTH,
                "x": (i % per_line) * PANEL_WIDTH,
                "y": y + (i // per_line) * PANEL_HEIGHT,
            }
            panels.append(p)
        y += math.ceil(len(built) / per_line) * PANEL_HEIGHT

    if rl is not None and m.waiting is not None:
        replica_query = f"label_values({m.waiting}, {rl})"
    elif m.router:
        replica_query = f"label_values({ROUTER_UP}, {rr})"
    else:
        replica_query = ""
    templating: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {"selected": False, "text": "Prometheus", "value": "${DS_PROMETHEUS}"},
            "hide": 0,
            "refresh": 1,
            "regex": "",
            "options": [],
        }
    ]
    if replica_query:
        templating.append(
            {
                "name": "replica",
                "label": "Replica",
                "type": "query",
                "datasource": dict(DATASOURCE),
                "definition": replica_query,
                "query": {"query": replica_query, "refId": "PrometheusVariableQueryEditor"},
                "includeAll": True,
                "multi": True,
                "allValue": ".*",
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "refresh": 2,
                "sort": 3,
                "hide": 0,
                "regex": "",
                "options": [],
            }
        )

    description = (
        f"Pack {pack.pack.name}: engine {pack.engine.name} {pack.engine.version}, model "
        f"{pack.model.id}@{pack.model.revision}. Rows follow the seed's signal groups."
    )
    if omitted:
        description += " Left out: " + "; ".join(f"{o['panel']} ({o['reason']})" for o in omitted)
    dashboard = {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "description": "Prometheus that scrapes the engine (and router) /metrics.",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
        ],
        "uid": _uid(pack.pack.name),
        "title": f"capacity-pack: {pack.pack.title}",
        "description": description,
        "tags": ["capacity-pack", pack.pack.name, pack.engine.name],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-15m", "to": "now"},
        # Drills last tens of seconds; a production dashboard would refresh every 30 s or so.
        "refresh": "5s",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": templating},
        "panels": panels,
    }
    return dashboard, omitted


def grafana_dashboard(pack: Any, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The importable Grafana dashboard JSON of ``pack`` (omissions in its description; use
    :func:`build_dashboard` for them as data)."""
    return build_dashboard(pack, overrides)[0]


def write_grafana_dashboard(
    pack: Any, path: str | Path, overrides: dict[str, Any] | None = None
) -> list[dict[str, str]]:
    """Write the dashboard JSON atomically; returns the panels left out."""
    dashboard, omitted = build_dashboard(pack, overrides)
    write_json_atomic(path, dashboard)
    return omitted
