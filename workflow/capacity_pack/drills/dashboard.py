"""The Grafana dashboard of a pack: an importable dashboard JSON (schemaVersion 39) whose panels
read the engine's series through its metric map.

:data:`ROWS` lists one :class:`PanelSpec` per panel; :func:`build_dashboard` leaves out, with
the reason, a panel whose series the map lacks, and lays the rest out :data:`PANEL_WIDTH` x
:data:`PANEL_HEIGHT`. To change a panel: its :class:`PanelSpec` in :data:`ROWS`.
Docs: docs/failure-drills.md, "The dashboard".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capacity_pack.drills.queries import (
    agg,
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
    ROUTER_NO_REPLICA,
    ROUTER_OUTSTANDING,
    ROUTER_RELAY_FAILURES,
    ROUTER_RELAYED_BYTES,
    ROUTER_REPLICA_LABEL,
    ROUTER_REQUESTS,
    ROUTER_RESPONSES,
    ROUTER_RETRIES,
    ROUTER_STARTS,
    ROUTER_UP,
    ROUTER_UPSTREAM_ERRORS,
    EngineMetrics,
)
from capacity_pack.io import sha256_hex, write_json_atomic

# dcgm-exporter's field names; they exist only where dcgm-exporter runs beside the engine.
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
DCGM_POWER = "DCGM_FI_DEV_POWER_USAGE"
DCGM_METRICS = (DCGM_GPU_UTIL, DCGM_FB_USED, DCGM_POWER)

GRID_COLUMNS = 24
PANEL_WIDTH = 8
PANEL_HEIGHT = 8
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
RR = ROUTER_REPLICA_LABEL

# The mechanisms the descriptions name.
_QUEUE = "queue saturation"
_KV = "KV pressure"
_GPU = "GPU/replica failure"
_NET = "network/transfer degradation"

NO_ROUTER = "no router series for this engine"


class Scope:
    """What a panel's targets read: the pack, its metric map ``m``, the replica label ``rl``,
    selectors filtered by ``$replica`` and the legends that name a replica."""

    def __init__(self, pack: Any, m: EngineMetrics) -> None:
        self.pack, self.m = pack, m
        self.rl = m.replica_label
        self.engine_matchers = [f'{self.rl}=~"$replica"'] if self.rl else []
        self.who = f"replica {{{{{self.rl}}}}}" if self.rl else "all"
        self.r_who = f"replica {{{{{RR}}}}}"

    def es(self, metric: str, *extra: str) -> str:
        """An engine series, filtered to the chosen replicas."""
        return sel(metric, *self.engine_matchers, *extra)

    def rs(self, metric: str) -> str:
        """A router series, filtered to the chosen replicas."""
        return sel(metric, f'{RR}=~"$replica"')

    def quantiles(self, hist: str, qs: tuple[float, ...] = (0.5, 0.95)) -> list[tuple[str, str]]:
        inner = f"sum by (le) ({rate(self.es(f'{hist}_bucket'), RATE)})"
        return [(f"histogram_quantile({q}, {inner})", f"p{round(q * 100)}") for q in qs]


Targets = Callable[[Scope], list[tuple[str, str]]]


@dataclass(frozen=True)
class PanelSpec:
    """One panel: ``needs`` are metric-map fields that must be set (``router``: the router's
    series exist), else the panel is left out with why; ``targets`` builds its ``(expr,
    legend)`` pairs, and an empty list leaves it out with ``empty`` as the reason."""

    title: str
    unit: str
    description: str | Callable[[EngineMetrics], str]
    targets: Targets
    needs: tuple[str, ...] = ()
    empty: str = ""
    min_max: tuple[int, int] | None = None


# --- Target builders: each gives a function of the Scope returning the panel's (expr, legend)s


def quantiles(field: str) -> Targets:
    """p50 and p95 of the histogram in map field ``field``."""
    return lambda s: s.quantiles(getattr(s.m, field))


def per_replica(field: str, op: str = "sum", *, counter: bool = False) -> Targets:
    """``op`` by replica label of the gauge (``counter``: the rate of the counter) ``field``."""

    def build(s: Scope) -> list[tuple[str, str]]:
        inner = s.es(getattr(s.m, field))
        return [(agg(op, s.rl, rate(inner, RATE) if counter else inner), s.who)]

    return build


def per_router_replica(metric: str, op: str = "sum", *, counter: bool = True) -> Targets:
    """``op`` by router replica of a router series (``counter``: its rate)."""

    def build(s: Scope) -> list[tuple[str, str]]:
        inner = rate(s.rs(metric), RATE) if counter else s.rs(metric)
        return [(f"{op} by ({RR}) ({inner})", s.r_who)]

    return build


def dcgm(metric: str) -> Targets:
    return lambda s: [(metric, "{{Hostname}} GPU {{gpu}}")]


def _dcgm_text(metric: str, what: str) -> str:
    return (
        f"{what} from dcgm-exporter ({metric}); empty unless dcgm-exporter runs on the "
        "GPU hosts and Prometheus scrapes it (the simulated engine has no GPU). Helps "
        f"tell {_GPU} (utilisation and power drop to idle on one GPU) from "
        f"{_KV} (HBM full, compute busy)."
    )


def responses(s: Scope) -> list[tuple[str, str]]:
    return [(f"sum by ({ROUTER_CODE_LABEL}) ({rate(ROUTER_RESPONSES, RATE)})", "{{code}}")]


def finished(s: Scope) -> list[tuple[str, str]]:
    lab = s.m.finish_reason_label
    return [(f"sum by ({lab}) ({rate(s.es(s.m.request_success), RATE)})", f"{{{{{lab}}}}}")]


def tokens(s: Scope) -> list[tuple[str, str]]:
    return [
        (f"sum({rate(s.es(getattr(s.m, f)), RATE)})", label)
        for f, label in (("prompt_tokens", "prompt"), ("generation_tokens", "generation"))
        if getattr(s.m, f) is not None
    ]


def within_cutoffs(s: Scope) -> list[tuple[str, str]]:
    """Share of first tokens (and gaps) at or below the bucket of the cutoff the SLO-burn
    alerts hold them to (:func:`~capacity_pack.drills.queries.histogram_cutoff`)."""
    m, targets = s.m, []
    for hist, bounds, metric, label in (
        (m.ttft_hist, m.ttft_buckets, "ttft", "TTFT"),
        (m.itl_hist, m.itl_buckets, "itl", "TPOT (ITL gaps)"),
    ):
        if hist is None or bounds is None:
            continue
        cutoff_ms, _ = histogram_cutoff(s.pack, metric)
        bound = round_up(cutoff_ms / 1000.0, bounds)
        if bound is None:
            continue
        bucket = f'le="{le(bound)}"'
        within = f"sum({rate(s.es(f'{hist}_bucket', bucket), RATE)})"
        count = f"sum({rate(s.es(f'{hist}_count'), RATE)})"
        targets.append((f"{within} / {count}", f"{label} <= {num(bound)} s ({cutoff_ms:g} ms)"))
    return targets


def queue_time(s: Scope) -> list[tuple[str, str]]:
    by = f"le, {s.rl}" if s.rl else "le"
    inner = f"sum by ({by}) ({rate(s.es(f'{s.m.queue_time_hist}_bucket'), RATE)})"
    return [(f"histogram_quantile(0.95, {inner})", f"p95 {s.who}")]


def admission(s: Scope) -> list[tuple[str, str]]:
    targets = []
    if s.m.router:
        targets.append((f"sum({rate(ROUTER_ADMISSION_REJECTED, RATE)})", "router admission"))
        targets.append((f"sum({rate(ROUTER_NO_REPLICA, RATE)})", "no healthy replica"))
    if s.m.engine_rejections is not None:
        targets.append(
            (f"sum by (reason) ({rate(s.es(s.m.engine_rejections), RATE)})", "engine: {{reason}}")
        )
    return targets


def hit_rate(s: Scope) -> list[tuple[str, str]]:
    rates = hit_rates(s.m, s.rl, lambda x: rate(s.es(x), RATE), s.es)
    return [(rates[0], s.who), (rates[1], "fleet")] if rates else []


def replicas_up(s: Scope) -> list[tuple[str, str]]:
    targets = []
    if s.m.router:
        targets.append((f"min by ({RR}) ({s.rs(ROUTER_UP)})", f"in rotation: {s.r_who}"))
    targets.append(("up", "scrape {{job}} {{instance}}"))
    return targets


def relay_failures(s: Scope) -> list[tuple[str, str]]:
    return [
        (f"sum by ({RR}) ({rate(s.rs(ROUTER_RELAY_FAILURES), RATE)})", f"relay {s.r_who}"),
        (f"sum by ({RR}) ({rate(s.rs(ROUTER_UPSTREAM_ERRORS), RATE)})", f"upstream {s.r_who}"),
    ]


# --- The panels, row by row ---

UNIT = (0, 1)

ROWS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    (
        "Request and SLO",
        (
            PanelSpec(
                "Responses by status code",
                "reqps",
                "Router responses per second by HTTP code. Errors with replicas down point to "
                f"{_GPU}; 429/503 shedding with queues high points to {_QUEUE}.",
                responses,
                needs=("router",),
            ),
            PanelSpec(
                "Finished requests by reason",
                "reqps",
                lambda m: (
                    f"Engine-finished requests per second by {m.finish_reason_label}; a rising "
                    f"'{m.abort_reason}' share is client cancellation, which frees capacity "
                    f"rather than showing {_QUEUE} or {_KV}."
                ),
                finished,
                needs=("request_success",),
            ),
            PanelSpec(
                "TTFT p50 / p95",
                "s",
                "Time to first token from the engine histogram. TTFT rising with waiting "
                f"requests is {_QUEUE}; with KV near full and preemptions, {_KV}; with health "
                f"RTT up, {_NET}.",
                quantiles("ttft_hist"),
                needs=("ttft_hist",),
            ),
            PanelSpec(
                "ITL p50 / p95",
                "s",
                f"Latency between consecutive output tokens. Decode slows under {_KV} "
                f"(preempted, recomputed requests) and over a degraded link ({_NET}); queueing "
                f"alone barely moves it ({_QUEUE}).",
                quantiles("itl_hist"),
                needs=("itl_hist",),
            ),
            PanelSpec(
                "E2E latency p50 / p95",
                "s",
                "End-to-end request latency; read it with TTFT and ITL to see whether waiting "
                f"({_QUEUE}) or decoding ({_KV}, {_NET}) grew.",
                quantiles("e2e_hist"),
                needs=("e2e_hist",),
            ),
            PanelSpec(
                "Token throughput",
                "suffix:tok/s",
                "Prompt and generated tokens per second. Falling generation throughput with "
                f"steady offered load and high KV usage points to {_KV}; with a replica "
                f"missing, to {_GPU}.",
                tokens,
                empty="engine map has no prompt_tokens or generation_tokens",
            ),
            PanelSpec(
                "Share within the SLO-burn TTFT / TPOT cutoff",
                "percentunit",
                "Share of first tokens at or below the strictest class TTFT cutoff, and of "
                "inter-token gaps at or below the loosest class TPOT cutoff (the SLO-burn "
                "alerts' cutoffs: a request's TPOT is the mean of its gaps, whose tail is "
                "heavier), each rounded up to a histogram bucket bound (engine histograms carry "
                "no class label). A drop marks an SLO symptom; the other rows tell "
                f"{_QUEUE}, {_KV}, {_GPU} and {_NET} apart.",
                within_cutoffs,
                empty="no TTFT/ITL histogram with a bucket at or above its cutoff",
                min_max=UNIT,
            ),
            PanelSpec(
                "Router retries per replica",
                "reqps",
                "Requests the router re-sent after a failed attempt, by the replica that failed. "
                f"Retries concentrated on one replica point to {_GPU} or {_NET}.",
                per_router_replica(ROUTER_RETRIES),
                needs=("router",),
            ),
        ),
    ),
    (
        "Scheduler and queue",
        (
            PanelSpec(
                "Waiting requests per replica",
                "short",
                "Requests queued in each engine. Growth on every replica with KV to spare is "
                f"{_QUEUE}; growth right after another replica went down is {_GPU} shifting "
                "load.",
                per_replica("waiting"),
                needs=("waiting",),
            ),
            PanelSpec(
                "Running requests per replica",
                "short",
                "Requests in each engine's running batch. A batch that shrinks while the queue "
                f"grows is {_KV}; a full batch with a growing queue is {_QUEUE}.",
                per_replica("running"),
                needs=("running",),
            ),
            PanelSpec(
                "Queue time p95 per replica",
                "s",
                "95th percentile of the time requests waited before scheduling. Long waits with "
                f"low KV usage are {_QUEUE}; with high KV usage and preemptions, {_KV}.",
                queue_time,
                needs=("queue_time_hist",),
            ),
            PanelSpec(
                "Batched tokens per iteration",
                "short",
                "Tokens scheduled per engine step (prefill + decode). A full token budget with a "
                f"growing queue is {_QUEUE}; small batches with a queue point to {_KV} (no room "
                "to admit).",
                quantiles("iteration_tokens_hist"),
                needs=("iteration_tokens_hist",),
            ),
            PanelSpec(
                "Preemptions per replica",
                "cps",
                "Running requests pushed back for KV space (recomputed later): the signature of "
                f"{_KV}, absent under {_QUEUE}.",
                per_replica("preemptions", counter=True),
                needs=("preemptions",),
            ),
            PanelSpec(
                "Admission rejections",
                "reqps",
                "Requests refused before queueing: by the router's admission control, for lack "
                "of a healthy replica, or by the engine. Shedding with free KV is "
                f"{_QUEUE} handled honestly; 'no healthy replica' is {_GPU}.",
                admission,
                empty="no router series and no engine rejection counter",
            ),
        ),
    ),
    (
        "KV and GPU",
        (
            PanelSpec(
                "KV-cache usage per replica",
                "percentunit",
                f"Share of KV-cache blocks in use. Near 1 with preemptions is {_KV}; a growing "
                f"queue with KV to spare is {_QUEUE} instead.",
                per_replica("kv_usage", "max"),
                needs=("kv_usage",),
                min_max=UNIT,
            ),
            PanelSpec(
                "Prefix-cache hit rate per replica",
                "percentunit",
                "Share of prompt tokens served from the prefix cache. One replica far below the "
                f"fleet is a cold (new or restarted) replica after {_GPU}; a fleet-wide drop "
                f"with evictions is {_KV}.",
                hit_rate,
                empty="engine map has no prefix-cache counters or hit-rate gauge",
                min_max=UNIT,
            ),
            PanelSpec(
                "Prefix-cache evictions per replica",
                "cps",
                "Cached blocks evicted to make room. High eviction with a falling hit rate is "
                f"{_KV}: the cache cannot hold the working set.",
                per_replica("evictions", counter=True),
                needs=("evictions",),
            ),
            PanelSpec(
                "GPU utilisation",
                "percent",
                _dcgm_text(DCGM_GPU_UTIL, "GPU utilisation"),
                dcgm(DCGM_GPU_UTIL),
            ),
            PanelSpec(
                "GPU memory (HBM) used",
                "mbytes",
                _dcgm_text(DCGM_FB_USED, "Framebuffer (HBM) used"),
                dcgm(DCGM_FB_USED),
            ),
            PanelSpec(
                "GPU power",
                "watt",
                _dcgm_text(DCGM_POWER, "Board power draw"),
                dcgm(DCGM_POWER),
            ),
        ),
    ),
    (
        "Distributed",
        (
            PanelSpec(
                "Replicas up",
                "short",
                "1 while a replica is in the router's rotation (health checks pass), and "
                f"Prometheus's scrape health. A drop to 0 is {_GPU}; latency rising while every "
                f"replica stays up points to {_NET} or {_QUEUE}.",
                replicas_up,
                min_max=UNIT,
            ),
            PanelSpec(
                "Outstanding requests per replica",
                "short",
                "Requests the router has in flight on each replica. One replica holding more "
                f"than the rest points to a slow replica ({_NET} or {_KV}); all rising together "
                f"is {_QUEUE}.",
                per_router_replica(ROUTER_OUTSTANDING, counter=False),
                needs=("router",),
            ),
            PanelSpec(
                "Router selection rate per replica",
                "reqps",
                "Requests per second the router sends to each replica. A replica at 0 while "
                f"others carry its share is {_GPU} handled by the router.",
                per_router_replica(ROUTER_REQUESTS),
                needs=("router",),
            ),
            PanelSpec(
                "Health-check RTT per replica",
                "s",
                "Round trip of the router's health check (about 1 ms on loopback). A rise on one "
                f"replica without queue or KV growth is {_NET}.",
                per_router_replica(ROUTER_HEALTH_RTT, "max", counter=False),
                needs=("router",),
            ),
            PanelSpec(
                "Relayed bytes per replica",
                "Bps",
                "Response bytes the router relays from each replica. Throughput falling on one "
                f"replica while it stays up points to {_NET}.",
                per_router_replica(ROUTER_RELAYED_BYTES),
                needs=("router",),
            ),
            PanelSpec(
                "Relay failures and upstream errors per replica",
                "cps",
                "Responses the router could not relay, and connections to a replica that "
                f"failed. Both on one replica with it still 'up' is {_NET}; with it down, "
                f"{_GPU}.",
                relay_failures,
                needs=("router",),
            ),
            PanelSpec(
                "Replica process starts",
                "short",
                f"Processes started per replica; a step is a restart after {_GPU}, and the "
                "restarted replica serves with a cold cache.",
                per_router_replica(ROUTER_STARTS, "max", counter=False),
                needs=("router",),
            ),
        ),
    ),
)
ROW_TITLES = tuple(title for title, _ in ROWS)


# --- The builder ---


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


def build_panel(spec: PanelSpec, s: Scope) -> dict[str, Any] | str:
    """The panel of ``spec``, or the reason it is left out."""
    if "router" in spec.needs and not s.m.router:
        return NO_ROUTER
    missing = [f for f in spec.needs if f != "router" and getattr(s.m, f) is None]
    if missing:
        return f"engine map has no {', '.join(missing)}"
    targets = spec.targets(s)
    if not targets:
        return spec.empty
    text = spec.description if isinstance(spec.description, str) else spec.description(s.m)
    return _panel(spec.title, text, spec.unit, targets, min_max=spec.min_max)


def _layout(rows: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Rows and their panels on Grafana's grid, ids from 1, rows of panels left to right."""
    panels: list[dict[str, Any]] = []
    next_id = 1
    y = 0
    per_line = GRID_COLUMNS // PANEL_WIDTH
    for row_title, built in rows:
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
    return panels


def _templating(m: EngineMetrics) -> list[dict[str, Any]]:
    """The data-source variable, and ``$replica`` over the engine's (else the router's)
    replica label."""
    rl = m.replica_label
    if rl is not None and m.waiting is not None:
        replica_query = f"label_values({m.waiting}, {rl})"
    elif m.router:
        replica_query = f"label_values({ROUTER_UP}, {RR})"
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
    return templating


def _uid(name: str) -> str:
    """Grafana uids allow 40 characters of [A-Za-z0-9_-]; a hash keeps long names distinct."""
    slug = re.sub(r"[^A-Za-z0-9_-]", "-", name)
    uid = f"cp-{slug}"
    if len(uid) > 40:
        uid = f"cp-{slug[:28]}-{sha256_hex(name)[:8]}"
    return uid


def _document(
    pack: Any,
    panels: list[dict[str, Any]],
    templating: list[dict[str, Any]],
    omitted: list[dict[str, str]],
) -> dict[str, Any]:
    description = (
        f"Pack {pack.pack.name}: engine {pack.engine.name} {pack.engine.version}, model "
        f"{pack.model.id}@{pack.model.revision}. Rows: request and SLO, scheduler and "
        "queue, KV and GPU, distributed."
    )
    if omitted:
        description += " Left out: " + "; ".join(f"{o['panel']} ({o['reason']})" for o in omitted)
    return {
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


def build_dashboard(
    pack: Any, overrides: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The Grafana dashboard of ``pack`` and the panels left out (``row``, ``panel``,
    ``reason``); ``overrides`` go to :func:`~capacity_pack.drills.queries.engine_metrics`."""
    m = pack_metrics(pack, overrides)
    s = Scope(pack, m)
    rows: list[tuple[str, list[dict[str, Any]]]] = []
    omitted: list[dict[str, str]] = []
    for row_title, specs in ROWS:
        built = []
        for spec in specs:
            out = build_panel(spec, s)
            if isinstance(out, str):
                omitted.append({"row": row_title, "panel": spec.title, "reason": out})
            else:
                built.append(out)
        rows.append((row_title, built))
    return _document(pack, _layout(rows), _templating(m), omitted), omitted


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
