"""Prometheus' alert state machine, run over the scrapes of a load test.

At every evaluation time each rule's expression is evaluated (:func:`~.evaluator.evaluate_node`)
and, as https://prometheus.io/docs/prometheus/latest/configuration/alerting_rules/ describes:

- an instance (the expression's labels without ``__name__`` and ``alertname``, plus the rule's
  ``labels``; an empty rule label removes the label) becomes *pending* at the first evaluation
  that returns it;
- it *fires* once it has been continuously active for ``for`` (at once for ``for: 0s``): at the
  first evaluation ``t`` with ``t - pending_t >= for``;
- a firing instance that vanishes *resolves* at the first evaluation without it, or with
  ``keep_firing_for`` stays firing until the first evaluation at least that long after the
  first evaluation without it (and resolves there unless it has come back);
- a pending instance that vanishes ends without firing.

Two instances with one label set after the rule's labels are applied are an error, as in
Prometheus. Evaluation times are given (the drills use every successful scrape) or, like
Prometheus, every group ``interval`` (1m, the default ``evaluation_interval``, when the group
states none) from the first to the last scrape. :func:`evaluate_alerts` returns one row per
episode (pending until resolved, with the largest value seen); :func:`alert_timeline` returns
every active instance at every evaluation (the tests compare it with ``promtool test rules``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.drills.promql.errors import PromQLError
from capacity_pack.drills.promql.evaluator import DEFAULT_LOOKBACK_NS, evaluate_node
from capacity_pack.drills.promql.labels import Labels, format_labels
from capacity_pack.drills.promql.lexer import NS_PER_S
from capacity_pack.drills.promql.rules import AlertRule
from capacity_pack.drills.promql.store import SeriesStore

# Prometheus' default global evaluation_interval, for groups that state none.
DEFAULT_EVAL_INTERVAL_NS = 60 * NS_PER_S


@dataclass
class _Instance:
    pending_t: int
    firing_t: int | None = None
    max_value: float = math.nan
    value: float = math.nan
    keep_since: int | None = None


def _eval_times(rule: AlertRule, store: SeriesStore, eval_t_ns: Any) -> np.ndarray:
    if eval_t_ns is not None:
        return np.unique(np.asarray(eval_t_ns, dtype=np.int64))
    scrapes = store.scrape_t_ns
    if len(scrapes) == 0:
        return np.empty(0, dtype=np.int64)
    step = round(rule.interval_s * NS_PER_S) if rule.interval_s else DEFAULT_EVAL_INTERVAL_NS
    return np.arange(scrapes[0], scrapes[-1] + 1, step, dtype=np.int64)


def _instance_labels(labels: Labels, static: Mapping[str, str]) -> str:
    out = {k: v for k, v in labels if k not in ("__name__", "alertname")}
    for key, value in static.items():
        # An empty value removes the label, as setting it to "" does in Prometheus.
        if value:
            out[key] = value
        else:
            out.pop(key, None)
    return format_labels(out)


def _instances_at(
    rule: AlertRule, store: SeriesStore, t: int, lookback_ns: int, left_open: bool
) -> dict[str, float]:
    """The rule's active instances at ``t``: instance label text -> expression value."""
    try:
        result = evaluate_node(rule.node, store, t, lookback_ns, left_open)
        vec = [((), result)] if isinstance(result, float) else result
        current: dict[str, float] = {}
        for labels, value in vec:
            key = _instance_labels(labels, rule.labels)
            if key in current:
                raise PromQLError(
                    f"vector contains metrics with the same labelset {key or '{}'} after "
                    "applying alert labels"
                )
            current[key] = value
    except PromQLError as err:
        raise PromQLError(
            f"alert {rule.alert!r} (group {rule.group!r}) at t_ns={t}: {err}"
        ) from err
    return current


def _run_rule(
    rule: AlertRule,
    store: SeriesStore,
    times: np.ndarray,
    lookback_ns: int,
    left_open: bool,
    timeline: list[dict[str, Any]] | None,
) -> list[dict[str, Any]]:
    """The rule's episodes over ``times``; each active instance per time appended to
    ``timeline`` when one is given."""
    active: dict[str, _Instance] = {}
    episodes: list[dict[str, Any]] = []
    for_ns, keep_ns = rule.for_ns, rule.keep_firing_for_ns

    def close(key: str, inst: _Instance, resolved: int | None) -> None:
        episodes.append(
            {
                "alert": rule.alert,
                "labels": key,
                "pending_t_ns": inst.pending_t,
                "firing_t_ns": inst.firing_t,
                "resolved_t_ns": resolved,
                "max_value": inst.max_value,
                "group": rule.group,
            }
        )

    for t in times.tolist():
        current = _instances_at(rule, store, t, lookback_ns, left_open)
        for key, value in current.items():
            inst = active.get(key)
            if inst is None:
                inst = active[key] = _Instance(pending_t=t)
            inst.value = value
            inst.keep_since = None
            if not math.isnan(value) and not value <= inst.max_value:
                inst.max_value = value
        for key in [k for k in active if k not in current]:
            inst = active[key]
            if inst.firing_t is not None and keep_ns > 0:
                if inst.keep_since is None:
                    inst.keep_since = t
                if t - inst.keep_since < keep_ns:
                    continue
            close(key, active.pop(key), t)
        for key, inst in active.items():
            if inst.firing_t is None and t - inst.pending_t >= for_ns:
                inst.firing_t = t
            if timeline is not None:
                timeline.append(
                    {
                        "t_ns": t,
                        "alert": rule.alert,
                        "labels": key,
                        "state": "pending" if inst.firing_t is None else "firing",
                        "value": inst.value,
                        "group": rule.group,
                    }
                )
    for key, inst in active.items():
        close(key, inst, None)
    return episodes


_EPISODE_COLUMNS = [
    "alert",
    "labels",
    "pending_t_ns",
    "firing_t_ns",
    "resolved_t_ns",
    "max_value",
    "group",
]


def evaluate_alerts(
    rules: Sequence[AlertRule],
    store: SeriesStore,
    eval_t_ns: Sequence[int] | np.ndarray | None = None,
    *,
    lookback_ns: int = DEFAULT_LOOKBACK_NS,
    left_open: bool = False,
) -> pd.DataFrame:
    """One row per alert instance episode (pending until resolved), with Prometheus semantics.

    ``eval_t_ns`` are the rule evaluation times; without them each rule is evaluated every group
    ``interval`` (1m when the group states none) from the first to the last scrape. Times are
    nullable ``Int64``: ``firing_t_ns`` is missing for an episode that never fired,
    ``resolved_t_ns`` for one still active at the last evaluation.
    """
    rows: list[dict[str, Any]] = []
    for rule in rules:
        times = _eval_times(rule, store, eval_t_ns)
        rows.extend(_run_rule(rule, store, times, lookback_ns, left_open, None))
    df = pd.DataFrame(rows, columns=_EPISODE_COLUMNS)
    for col in ("pending_t_ns", "firing_t_ns", "resolved_t_ns"):
        df[col] = df[col].astype("Int64")
    df["max_value"] = df["max_value"].astype(float)
    return df.sort_values(["pending_t_ns", "alert", "labels"], kind="stable").reset_index(drop=True)


def alert_timeline(
    rules: Sequence[AlertRule],
    store: SeriesStore,
    eval_t_ns: Sequence[int] | np.ndarray | None = None,
    *,
    lookback_ns: int = DEFAULT_LOOKBACK_NS,
    left_open: bool = False,
) -> pd.DataFrame:
    """Every active instance at every evaluation: ``t_ns, alert, labels, state, value, group``.

    ``state`` is ``pending`` or ``firing``; ``value`` is the expression's latest value (kept while
    ``keep_firing_for`` holds a vanished instance).
    """
    rows: list[dict[str, Any]] = []
    for rule in rules:
        times = _eval_times(rule, store, eval_t_ns)
        _run_rule(rule, store, times, lookback_ns, left_open, rows)
    df = pd.DataFrame(rows, columns=["t_ns", "alert", "labels", "state", "value", "group"])
    df["t_ns"] = df["t_ns"].astype(np.int64)
    return df.sort_values(["t_ns", "alert", "labels"], kind="stable").reset_index(drop=True)
