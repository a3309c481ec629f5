"""The Prometheus alerting rules of a pack: one rule per failure mechanism a drill injects, plus
the symptoms a user sees.

:func:`alert_rules` runs each rule definition of :data:`RULES` in order; a rule (or clause)
whose signal the metric map lacks is left out and reported. Every rule carries
:data:`STATIC_LABELS`. Windows default to drill scale; thresholds are :class:`AlertThresholds`
(``failure.alert_thresholds``). SLO burn: ``1 - within / count`` above
``burn_factor x (1 - attainment gate)``, within the bucket at the cutoff rounded up.

The rules and why: docs/failure-drills.md, "The alert rules".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capacity_pack.drills.queries import (
    DashboardError,
    agg,
    any_of,
    duration,
    histogram_cutoff,
    hit_rates,
    le,
    num,
    pack_metrics,
    rate,
    round_up,
    sel,
)
from capacity_pack.engines.metric_map import (
    ROUTER_ADMISSION_REJECTED,
    ROUTER_CODE_LABEL,
    ROUTER_HEALTH_RTT,
    ROUTER_REPLICA_LABEL,
    ROUTER_RESPONSES,
    ROUTER_STARTING,
    ROUTER_UP,
    EngineMetrics,
)
from capacity_pack.evidence.gates import CLASS_ATTAINMENT, ERROR_RATE
from capacity_pack.io import atomic_path
from capacity_pack.validation import problems

SEVERITIES = ("critical", "warning", "info")
STATIC_LABELS = ("severity", "mechanism", "pack", "model_revision", "engine_version")


class AlertThresholds(BaseModel):
    """Thresholds and windows of the alerting rules; plain numbers so a pack can override them
    as a mapping (``failure.alert_thresholds``)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

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
    # 2: a drill's degraded link is 20-60x its healthy peer; on a loaded 2-core host single
    # probes of healthy peers differed by up to 2.9x, but not for as long as the rule's `for`.
    health_rtt_ratio_min: float = Field(
        default=2.0,
        ge=1,
        description="A degraded link's round trip is also above this x the fleet's fastest.",
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


def _resolve_thresholds(pack: Any, thresholds: AlertThresholds | dict | None) -> AlertThresholds:
    if isinstance(thresholds, AlertThresholds):
        return thresholds
    if thresholds is None:
        failure = getattr(pack, "failure", None)
        thresholds = dict(getattr(failure, "alert_thresholds", None) or {})
    try:
        return AlertThresholds.model_validate(thresholds)
    except ValidationError as err:
        raise DashboardError(
            f"invalid alert thresholds ({problems(err)}); valid fields: "
            f"{', '.join(AlertThresholds.model_fields)}"
        ) from None


class RuleFile:
    """One rule file being built: what every rule reads (the pack, its metric map ``m``, the
    thresholds ``t``, the rate window ``w``, the replica label ``rl`` and how a description
    names a replica, ``who``) and what the rules write (:meth:`add`, :meth:`skip`)."""

    def __init__(self, pack: Any, m: EngineMetrics, t: AlertThresholds) -> None:
        self.pack, self.m, self.t = pack, m, t
        self.w = duration(t.rate_window_s)
        self.rl = m.replica_label
        self.who = f"{{{{ $labels.{self.rl} }}}}" if self.rl else "(all)"
        self.static = {
            "pack": pack.pack.name,
            "model_revision": pack.model.revision,
            "engine_version": pack.engine.version,
        }
        self.rules: list[dict[str, Any]] = []
        self.omitted: list[dict[str, str]] = []

    def add(
        self,
        alert: str,
        mechanism: str,
        severity: str,
        for_s: float,
        expr: str,
        summary: str,
        desc: str,
    ) -> None:
        self.rules.append(
            {
                "alert": alert,
                "expr": expr,
                "for": duration(for_s),
                "labels": {"severity": severity, "mechanism": mechanism, **self.static},
                "annotations": {"summary": summary, "description": desc},
            }
        )

    def skip(self, alert: str, mechanism: str, reason: str, scope: str = "rule") -> None:
        """Leave out the rule (``scope="rule"``) or one clause of it (``"clause"``), with why."""
        self.omitted.append(
            {"alert": alert, "mechanism": mechanism, "scope": scope, "reason": reason}
        )


# --- The rules, one function each, in the order of the file (RULES) ---


def replica_down(r: RuleFile) -> None:
    """Replica failure: the router's view, and Prometheus's own scrape health."""
    if r.m.router:
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
            f"engine {r.pack.engine.name!r} has no router series, so only Prometheus's 'up' can "
            "tell."
        )
        r.skip(
            "ReplicaDown",
            "replica_failure",
            "no router series in the engine map: the rule uses Prometheus's 'up' only",
            "clause",
        )
    r.add(
        "ReplicaDown",
        "replica_failure",
        "critical",
        r.t.replica_down_for_s,
        expr,
        f"Replica {where} is down",
        desc,
    )


def queue_saturation(r: RuleFile) -> None:
    """Waiting grows while KV has room (else it is KV pressure), or the router sheds load."""
    m, t, rl, who = r.m, r.t, r.rl, r.who
    parts: list[str] = []
    if m.waiting is not None:
        waiting = f"{agg('sum', rl, m.waiting)} > {num(t.queue_waiting_max)}"
        if m.kv_usage is not None:
            kv_room = f"{agg('max', rl, m.kv_usage)} < {num(t.kv_usage_max)}"
            parts.append(f"({waiting}) and ({kv_room})")
        else:
            parts.append(waiting)
            r.skip(
                "QueueSaturation",
                "queue_saturation",
                "no KV-usage gauge: waiting requests alone, so KV pressure also fires this",
                "clause",
            )
    else:
        r.skip("QueueSaturation", "queue_saturation", "no waiting-requests gauge", "clause")
    if m.router:
        # Sustained shedding, not the odd request refused at the peak of a Poisson burst: a
        # burst of refusals lifts the rate over the window for as long as the window (so a rate
        # alone fires on one burst), but not the share of the window's responses it refused.
        shed_rate = f"sum({rate(ROUTER_ADMISSION_REJECTED, r.w)})"
        shed = (
            f"({shed_rate} > {num(t.shed_rate_min)}) and "
            f"({shed_rate} / sum({rate(ROUTER_RESPONSES, r.w)}) > {num(t.shed_share_min)})"
        )
        if m.kv_usage is not None:
            shed = f"({shed}) and (max({m.kv_usage}) < {num(t.kv_usage_max)})"
        parts.append(shed)
    else:
        r.skip(
            "QueueSaturation",
            "queue_saturation",
            "no router series: router admission shedding is not part of the rule",
            "clause",
        )
    if not parts:
        r.skip("QueueSaturation", "queue_saturation", "no waiting gauge and no router series")
        return
    r.add(
        "QueueSaturation",
        "queue_saturation",
        "warning",
        t.for_s,
        any_of(parts),
        f"Queue saturation on replica {who}",
        f"Replica {who}: {{{{ $value }}}} requests waiting (threshold "
        f"{num(t.queue_waiting_max)}) while KV usage stays below {num(t.kv_usage_max)}, "
        "or the router's admission control is shedding load. Offered load exceeds what "
        "the fleet serves; add replicas or shed load before the queue grows without bound.",
    )


def kv_cache_pressure(r: RuleFile) -> None:
    """KV usage near full, or requests preempted for KV space."""
    m, t, rl, who = r.m, r.t, r.rl, r.who
    parts = []
    if m.kv_usage is not None:
        parts.append(f"{agg('max', rl, m.kv_usage)} > {num(t.kv_usage_max)}")
    else:
        r.skip("KVCachePressure", "kv_pressure", "no KV-usage gauge", "clause")
    if m.preemptions is not None:
        parts.append(f"{agg('sum', rl, rate(m.preemptions, r.w))} > {num(t.preemption_rate_max)}")
    else:
        r.skip("KVCachePressure", "kv_pressure", "no preemption counter", "clause")
    if not parts:
        r.skip("KVCachePressure", "kv_pressure", "no KV-usage gauge and no preemption counter")
        return
    r.add(
        "KVCachePressure",
        "kv_pressure",
        "warning",
        t.for_s,
        any_of(parts),
        f"KV-cache pressure on replica {who}",
        f"Replica {who}: KV usage above {num(t.kv_usage_max)} or requests preempted "
        f"faster than {num(t.preemption_rate_max)}/s (value {{{{ $value }}}}). The batch "
        "is limited by KV memory, not compute: expect queueing and recomputation.",
    )


def transfer_degraded(r: RuleFile) -> None:
    """The router's health-check round trip to one replica is slow."""
    t = r.t
    if not r.m.router:
        r.skip("TransferDegraded", "transfer_degradation", "no router health-check RTT series")
        return
    rtt = f"max by ({ROUTER_REPLICA_LABEL}) ({ROUTER_HEALTH_RTT})"
    slow = f"{rtt} > {num(t.health_rtt_max_s)}"
    # Slow and slower than the fleet's fastest: a loaded router or host delays every probe
    # alike, a degraded link only its own replica's. Alone in its fleet, a replica has no peer.
    slower = f"{rtt} > on() group_left() ({num(t.health_rtt_ratio_min)} * min({ROUTER_HEALTH_RTT}))"
    alone = f"count({rtt}) == 1"
    r.add(
        "TransferDegraded",
        "transfer_degradation",
        "warning",
        t.for_s,
        f"(({slow}) and ({slower})) or (({slow}) and on() ({alone}))",
        "Degraded link to replica {{ $labels.replica }}",
        "Health-check round trip to replica {{ $labels.replica }} is {{ $value }} s "
        f"(threshold {num(t.health_rtt_max_s)} s and {num(t.health_rtt_ratio_min)} x the "
        "fleet's fastest; a loopback check takes about 1 ms). The network path to it is slow or "
        "lossy: latency rises without KV or queue pressure.",
    )


def request_cancellations(r: RuleFile) -> None:
    """The share of finished requests that ended aborted."""
    m, t = r.m, r.t
    if m.request_success is None:
        r.skip(
            "RequestCancellations",
            "cancellation",
            "no finished-requests counter labelled with the finish reason",
        )
        return
    aborted = sel(m.request_success, f'{m.finish_reason_label}="{m.abort_reason}"')
    r.add(
        "RequestCancellations",
        "cancellation",
        "warning",
        t.for_s,
        f"sum({rate(aborted, r.w)}) / sum({rate(m.request_success, r.w)}) "
        f"> {num(t.cancel_share_max)}",
        "Requests are being cancelled",
        f"{{{{ $value | humanizePercentage }}}} of finished requests ended with "
        f"{m.finish_reason_label}={m.abort_reason} (threshold {num(t.cancel_share_max)}). "
        "Clients give up (timeouts, disconnects): work is spent on answers nobody reads.",
    )


def cold_replica(r: RuleFile) -> None:
    """A replica still loading, or its prefix-cache hit rate far below the fleet's."""
    m, t, w, rl, who = r.m, r.t, r.w, r.rl, r.who
    rates = hit_rates(m, rl, lambda x: rate(x, w), lambda x: f"avg_over_time({x}[{w}])")
    if rates is None:
        r.skip("ColdReplica", "cold_start", "no prefix-cache hit/query (or miss) counters or gauge")
        return
    per, fleet = rates
    if not rl:
        r.skip("ColdReplica", "cold_start", "no replica label: no per-replica hit rate to compare")
        return
    # scalar() of the filtered fleet rate is NaN when the fleet itself is cold, and a
    # comparison with NaN is false, so nothing fires then.
    cold = (
        f"({per}) < {num(t.cold_hit_ratio)} * scalar(({fleet}) > {num(t.cold_fleet_hit_rate_min)})"
    )
    if m.router:
        # A replica still loading its weights is the other half of a cold start: the
        # capacity the autoscaler asked for is not there yet.
        cold = f"(max by ({ROUTER_REPLICA_LABEL}) ({ROUTER_STARTING}) == 1) or ({cold})"
    r.add(
        "ColdReplica",
        "cold_start",
        "info",
        t.for_s,
        cold,
        f"Replica {who}{{{{ $labels.replica }}}} is cold",
        f"Replica {who}{{{{ $labels.replica }}}} is still loading (started, not yet healthy)"
        f" or hits its prefix cache {{{{ $value | humanizePercentage }}}} of the time, below "
        f"{num(t.cold_hit_ratio)}x the fleet's rate (itself above "
        f"{num(t.cold_fleet_hit_rate_min)}): a new or restarted replica adds no capacity "
        "until it loads, and recomputes shared prefixes until its cache warms.",
    )


def error_rate(r: RuleFile) -> None:
    """Symptom: the share of router responses that are not 2xx."""
    t = r.t
    # The error-rate gate's threshold unless the pack overrides it: the same quantity (the share
    # of failed requests), here counted on the router's responses.
    err_max = t.error_rate_max
    if err_max is None:
        err_max = ERROR_RATE.threshold(r.pack.acceptance)
    if not r.m.router:
        r.skip("ErrorRate", "errors", "no per-response status counter (router series absent)")
        return
    non2xx = sel(ROUTER_RESPONSES, f'{ROUTER_CODE_LABEL}!~"2.."')
    r.add(
        "ErrorRate",
        "errors",
        "critical",
        t.symptom_for_s,
        f"sum({rate(non2xx, r.w)}) / sum({rate(ROUTER_RESPONSES, r.w)}) > {num(err_max)}",
        "Error rate above the acceptance cap",
        f"{{{{ $value | humanizePercentage }}}} of responses are not 2xx (cap "
        f"{num(err_max)}, acceptance.{ERROR_RATE.field}). A symptom: look at ReplicaDown, "
        "QueueSaturation and KVCachePressure for the cause.",
    )


# Two alert names, not one "SLOBurn" twice: both results are label-less fleet ratios, so under
# one name Alertmanager would merge them into one alert (and so would the drills' episodes,
# keyed by alert name and labels).
def slo_burn_ttft(r: RuleFile) -> None:
    """Symptom: first tokens slower than the strictest class TTFT cutoff."""
    _slo_burn(r, "SLOBurnTTFT", r.m.ttft_hist, r.m.ttft_buckets, "ttft")


def slo_burn_tpot(r: RuleFile) -> None:
    """Symptom: inter-token gaps slower than the loosest class TPOT cutoff."""
    _slo_burn(r, "SLOBurnTPOT", r.m.itl_hist, r.m.itl_buckets, "itl")


def _slo_burn(
    r: RuleFile, alert: str, hist: str | None, bounds: tuple[float, ...] | None, metric: str
) -> None:
    t = r.t
    # The error budget of the attainment gate: the share of requests allowed to miss their SLO.
    attainment_min = CLASS_ATTAINMENT.threshold(r.pack.acceptance)
    burn = t.burn_factor * (1.0 - attainment_min)
    tpot = metric == "itl"
    what = "inter-token gaps" if tpot else "first tokens"
    cutoff_ms, classes = histogram_cutoff(r.pack, metric)
    if hist is None or bounds is None:
        r.skip(alert, "slo", f"no {'ITL' if tpot else 'TTFT'} histogram with bounds")
        return
    bound = round_up(cutoff_ms / 1000.0, bounds)
    if bound is None:
        r.skip(alert, "slo", f"cutoff {cutoff_ms:g} ms exceeds the largest bucket ({bounds[-1]})")
        return
    within = sel(f"{hist}_bucket", f'le="{le(bound)}"')
    expr = f"(1 - sum({rate(within, r.w)}) / sum({rate(f'{hist}_count', r.w)})) > {num(burn)}"
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
    r.add(
        alert,
        "slo",
        "critical",
        t.symptom_for_s,
        expr,
        f"SLO burn: slow {what}",
        f"{{{{ $value | humanizePercentage }}}} of {what} took longer than {num(bound)} s "
        f"(bucket le={le(bound)} of {hist}, {gap}), above {num(t.burn_factor)}x the error "
        f"budget 1 - {num(attainment_min)}. The engine histogram "
        f"carries no workload-class label, so the {which} class cutoff ({cutoff_ms:g} ms, "
        f"{', '.join(classes)}) applies to every request{note}.",
    )


RULES: tuple[Callable[[RuleFile], None], ...] = (
    replica_down,
    queue_saturation,
    kv_cache_pressure,
    transfer_degraded,
    request_cancellations,
    cold_replica,
    error_rate,
    slo_burn_ttft,
    slo_burn_tpot,
)


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
    m = pack_metrics(pack, overrides)
    t = _resolve_thresholds(pack, thresholds)
    r = RuleFile(pack, m, t)
    for rule in RULES:
        rule(r)
    doc = {
        "groups": [
            {
                "name": f"capacity-pack-{pack.pack.name}",
                "interval": duration(t.evaluation_interval_s),
                "rules": r.rules,
            }
        ]
    }
    return doc, r.omitted


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
