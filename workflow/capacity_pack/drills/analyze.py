"""Failure drills, analysed: the failure-test fields of one drill from its records and series.

Everything is on the load generator's clock (seconds from its t0), router events mapped through
the run's (t0, t0_realtime) anchor. This module holds the drill's times (injection, fault
cleared, recovery, detection) and the report (:func:`analyze_drill`);
:mod:`capacity_pack.drills.stats` the statistics it reads, :mod:`capacity_pack.drills.n_plus_one`
the plan drill's verdict. Recovery time = max(fault cleared, injection, start of the first
window from which every later window passes :data:`DRILL_GATES`).

Definitions: docs/failure-drills.md, "The fields, and where each comes from" and "How the
fields are computed".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.drills.kinds import DrillKind, kind
from capacity_pack.drills.n_plus_one import n_plus_one
from capacity_pack.drills.plan import NS, SYMPTOMS, DrillPlan
from capacity_pack.drills.stats import (
    DRILL_GATES,
    DrillAnalysisSpec,
    alert_episodes,
    all_attempt_attainment,
    clock_check,
    counter_increase,
    drill_seconds,
    phase_stats,
    queue_evidence,
    request_frame,
    timeline,
    windows,
)


@dataclass
class _Incident:
    """A drill's times on its clock (ns from the load generator's t0) and its windows."""

    injection: dict[str, Any]  # t_s and source
    completeness: dict[str, Any]
    base_lo: int  # the end of the warm-up
    end_ns: int  # just past the last request's end
    wins: pd.DataFrame
    inj_ns: int
    cleared_ns: int | None
    cleared_how: str
    recovered_ns: int | None
    recovery_how: str


def analyze_drill(
    drill_dir: str | Path, rules_path: str | Path, spec: DrillAnalysisSpec
) -> dict[str, Any]:
    """The failure-test fields of one drill, all from its records, scrapes and events."""
    d = Path(drill_dir)
    facts = json.loads((d / "drill.json").read_text())
    plan = DrillPlan.model_validate(facts["plan"])
    name, drill_kind = plan.drill.name, kind(plan.drill.kind)
    report: dict[str, Any] = {
        "drill": name,
        "kind": plan.drill.kind,
        "mechanism": drill_kind.mechanism,
        "plan": facts["plan"],
    }
    if facts.get("skipped"):
        report["skipped"] = facts["skipped"]
        return report
    from capacity_pack.drills.queries import engine_metrics

    req = request_frame(d / "records.jsonl", spec, name)
    samples = pd.read_parquet(d / "samples.parquet")
    scrapes = pd.read_parquet(d / "scrapes.parquet")
    events = _router_events(d / "events.json", int(facts["t0_realtime_ns"]))
    inc = _incident(d, facts, plan, req, events, spec)
    waiting = engine_metrics(spec.engine_name).waiting or "vllm:num_requests_waiting"
    report.update(
        _report_fields(facts, plan, req, samples, scrapes, events, inc, waiting, rules_path, spec)
    )
    report["capacity_returned_without_manual_repair"] = _capacity_returned(
        report, drill_kind, events, spec
    )
    report["timeline"] = timeline(req, samples, scrapes, spec, waiting, inc.base_lo, inc.end_ns)
    report["scope"] = plan.scope
    report["execution"] = facts.get("execution", "live")
    report["execution_reason"] = plan.execution_reason
    if plan.scope == "plan":
        report["n_plus_one"] = n_plus_one(
            req, report, plan, spec, inc.inj_ns, inc.cleared_ns, inc.end_ns, inc.base_lo
        )
    return report


def _incident(
    d: Path,
    facts: dict[str, Any],
    plan: DrillPlan,
    req: pd.DataFrame,
    events: list[dict[str, Any]],
    spec: DrillAnalysisSpec,
) -> _Incident:
    """When the fault was injected and cleared and the service recovered, with the windows
    recovery is judged on (and the schedule's completeness)."""
    drill_kind = kind(plan.drill.kind)
    start = int(facts["profile_start_s"] * NS)
    inject_planned = start + int(plan.inject_at_s * NS)
    actions = facts.get("actions") or []
    inject_act = next((a for a in actions if a["action"] == "inject"), None)
    restore_act = next((a for a in actions if a["action"] == "restore"), None)
    injection = injection_time(drill_kind, plan, events, inject_act, inject_planned)
    completeness = _completeness(d, req)
    last_due = int(req["end_offset_ns"].max()) if len(req) else start
    base_lo = start + int(spec.warmup_s * NS)
    wins = windows(req, base_lo, last_due + 1, spec.window_s)
    # round, not int: t_s came from integer ns, and a truncated ns would move a request that
    # ended at the injection into the healthy window before it.
    inj_ns = round(injection["t_s"] * NS)
    cleared_ns, cleared_how = fault_cleared(drill_kind, plan, events, restore_act, inj_ns)
    recovered_ns, recovery_how = _recovery(wins, inj_ns, cleared_ns, spec, start_s=base_lo)
    return _Incident(
        injection=injection,
        completeness=completeness,
        base_lo=base_lo,
        end_ns=last_due + 1,
        wins=wins,
        inj_ns=inj_ns,
        cleared_ns=cleared_ns,
        cleared_how=cleared_how,
        recovered_ns=recovered_ns,
        recovery_how=recovery_how,
    )


def _report_fields(
    facts: dict[str, Any],
    plan: DrillPlan,
    req: pd.DataFrame,
    samples: pd.DataFrame,
    scrapes: pd.DataFrame,
    events: list[dict[str, Any]],
    inc: _Incident,
    waiting: str,
    rules_path: str | Path,
    spec: DrillAnalysisSpec,
) -> dict[str, Any]:
    """The report's measured fields: clocks, times, phases, queue, counters, alerts, windows."""
    injection = inc.injection
    inj_ns, recovered_ns, base_lo, end_ns = inc.inj_ns, inc.recovered_ns, inc.base_lo, inc.end_ns
    queue = queue_evidence(samples, scrapes, inj_ns, base_lo, waiting, recovered_ns)
    # Alerts over the same scrapes, on the same clock.
    evaluation = alert_episodes(Path(rules_path), samples, scrapes)
    fired = _alerts_fired(evaluation.episodes)
    firing = [a for a in fired if a["firing_t_s"] is not None]
    detection, own, others = first_detection(firing, kind(plan.drill.kind), injection["t_s"])
    detection_source = "first firing of the alert naming the mechanism (else of any alert)"
    if not evaluation.evaluated:
        detection_source = f"not evaluated: {evaluation.note}"
    router_removal = _router_removal(events, plan, injection["t_s"])
    # Failed requests (errors, timeouts, rejections) that ended at or after the injection.
    fails = req[req["failed"]] if len(req) else req
    fails_after = fails[fails["end_ns"] - fails["sent_ns"] + fails["sent_offset_ns"] >= inj_ns]
    end_off = fails_after["sent_offset_ns"] + (fails_after["end_ns"] - fails_after["sent_ns"])
    lost = fails_after[fails_after["status"].isin(["error", "timeout"])]
    return dict(
        clock=facts["clock"] + "; router events mapped from CLOCK_REALTIME via t0_realtime_ns",
        clock_check=clock_check(req),
        schedule_completeness=inc.completeness,
        terminal_statuses=req["status"].value_counts().to_dict() if len(req) else {},
        rate_rps=plan.rate_rps,
        rate_after_rps=plan.rate_after_rps,
        replicas=plan.replicas,
        admission_max_outstanding=plan.admission_max_outstanding,
        injection_time_s=injection["t_s"],
        injection_source=injection["source"],
        detection_time_s=detection,
        detection_source=detection_source,
        router_removal_time_s=router_removal,
        router_events=[e for e in events if e["t_s"] >= -1.0],
        fault_cleared_time_s=drill_seconds(inc.cleared_ns),
        fault_cleared_by=inc.cleared_how,
        first_error_time_s=float(end_off.min() / NS) if len(end_off) else None,
        last_error_time_s=float(end_off.max() / NS) if len(end_off) else None,
        recovery_time_s=drill_seconds(recovered_ns),
        recovery_rule=inc.recovery_how,
        phases={
            "before": phase_stats(req, base_lo, inj_ns, spec),
            "during": phase_stats(req, inj_ns, recovered_ns or end_ns, spec),
            "after": phase_stats(req, recovered_ns, end_ns, spec) if recovered_ns else None,
        },
        queue=queue,
        requests_retried=counter_increase(samples, "router:retries_total"),
        retried_source="router:retries_total increase (the client does not retry: "
        "automatic_retries is false)",
        requests_rejected=int((fails_after["status"] == "rejected").sum()),
        requests_lost=int(len(lost)),
        requests_cancelled=int((req["status"] == "cancelled").sum()) if len(req) else 0,
        admission_rejected=counter_increase(samples, "router:admission_rejected_total"),
        alerts_evaluated=evaluation.evaluated,
        alert_evaluation=evaluation.note,
        alerts=fired,
        alerts_fired=sorted({a["alert"] for a in firing}),
        # None, not False: without an evaluation nobody knows whether the alert would fire.
        expected_alert_fired=bool(own) if evaluation.evaluated else None,
        unexpected_mechanisms_fired=others,
        windows=inc.wins.replace({np.nan: None}).to_dict("records"),
    )


def _router_events(path: Path, t0_realtime_ns: int) -> list[dict[str, Any]]:
    """The router's events, each with ``t_s`` on the drill clock (mapped from CLOCK_REALTIME)."""
    events = json.loads(path.read_text()).get("events") or []
    for e in events:
        e["t_s"] = (int(e["unix_ns"]) - t0_realtime_ns) / NS
    return events


def _completeness(d: Path, req: pd.DataFrame) -> dict[str, Any]:
    """The schedule must be complete: every scheduled request recorded exactly once, terminal."""
    sched = pd.read_parquet(d / "schedule.parquet")
    from capacity_pack.evidence.normalize import reconcile

    rec_ids = req[["request_id"]] if len(req) else pd.DataFrame(columns=["request_id"])
    return reconcile(rec_ids, sched, f"{d}/records.jsonl")


def _alerts_fired(ep: pd.DataFrame) -> list[dict[str, Any]]:
    """Alert episodes with their times in seconds on the drill clock."""
    fired = []
    for row in ep.itertuples():
        first = row.firing_t_ns
        fired.append(
            {
                "alert": row.alert,
                "mechanism": row.mechanism,
                "labels": row.labels,
                "pending_t_s": drill_seconds(row.pending_t_ns),
                "firing_t_s": None if pd.isna(first) else drill_seconds(first),
                "resolved_t_s": None
                if pd.isna(row.resolved_t_ns)
                else drill_seconds(row.resolved_t_ns),
                "max_value": float(row.max_value),
            }
        )
    return fired


def first_detection(
    firing: list[dict[str, Any]], drill_kind: DrillKind, inj_s: float
) -> tuple[float | None, list[dict[str, Any]], list[str]]:
    """(detection time, the drill's own alerts fired after the injection, unexpected mechanisms).

    Detection is the first firing at or after the injection of the alert naming the drill's
    mechanism, else of any alert; unexpected mechanisms are those fired that are neither the
    drill's own, its allowed consequences nor generic symptoms.
    """
    after_inj = [a for a in firing if a["firing_t_s"] >= inj_s]
    own = [a for a in after_inj if a["mechanism"] == drill_kind.mechanism]
    detection = min((a["firing_t_s"] for a in own), default=None)
    if detection is None:
        detection = min((a["firing_t_s"] for a in after_inj), default=None)
    mech_fired = {a["mechanism"] for a in firing}
    others = sorted(mech_fired - {drill_kind.mechanism} - drill_kind.consequences - SYMPTOMS)
    return detection, own, others


def _router_removal(events: list[dict[str, Any]], plan: DrillPlan, inj_s: float) -> float | None:
    """When the router took the killed replica out of rotation (kinds that kill one only)."""
    removed = [
        e for e in events
        if e["event"] == "removed" and e.get("replica") == plan.drill.replica
        and e["t_s"] >= inj_s - 1e-3
    ]  # fmt: skip
    return removed[0]["t_s"] if removed and kind(plan.drill.kind).kills_replica else None


def injection_time(drill_kind: DrillKind, plan, events, act, planned_ns) -> dict[str, Any]:
    marker = drill_kind.injected
    ev = marker.matching(events, plan.drill) if marker is not None else []
    if ev:
        return {"t_s": ev[0]["t_s"], "source": f"router event '{marker.event}' ({marker.what})"}
    if act is not None:
        return {
            "t_s": act["t_s"],
            "source": "injector action started "
            f"({act.get('request') or act.get('command') or 'client side'})",
        }
    return {"t_s": planned_ns / NS, "source": "planned injection time (no action recorded)"}


def fault_cleared(
    drill_kind: DrillKind, plan, events, restore_act, inj_ns
) -> tuple[int | None, str]:
    marker = drill_kind.cleared
    if marker is not None:
        ready = [e for e in marker.matching(events, plan.drill) if e["t_s"] * NS > inj_ns]
        if ready:
            return (
                int(ready[0]["t_s"] * NS),
                f"router event '{marker.event}': the {marker.what} is in rotation",
            )
        # A killed replica of a real target: its commands act, and no router reports back.
        if drill_kind.kills_replica and plan.drill.commands is not None and not events:
            return None, "unknown: a real target exposes no router events"
        return None, "never: the replica did not come back into rotation during the run"
    if restore_act is not None:
        return int(restore_act["done_t_s"] * NS), "the drill lifted the fault"
    return None, "never: the fault was not lifted"


def _recovery(wins: pd.DataFrame, inj_ns: int, cleared_ns, spec, start_s: int):
    width = int(spec.window_s * NS)
    after = wins[(wins["start_s"] * NS) >= inj_ns - width]
    ok = pd.Series(True, index=after.index)
    for gate, column, _, _ in DRILL_GATES:
        ok &= gate.holds(after[column].fillna(0), spec.threshold(gate))
    # The first window from which every later one passes.
    tail_ok = ok[::-1].cummin()[::-1]
    first = after.loc[tail_ok[tail_ok].index, "start_s"]
    rule = (
        "later of: fault cleared, and the start of the first window from which every window has "
        + " and ".join(f"{words} {g.op} {spec.threshold(g)}" for g, _, _, words in DRILL_GATES)
    )
    if not len(first) or cleared_ns is None:
        return None, rule + " (not reached during the run)"
    return max(int(first.iloc[0] * NS), int(cleared_ns), inj_ns), rule


def _capacity_returned(report, drill_kind: DrillKind, events, spec) -> dict[str, Any]:
    """Did the service get back to passing its gates with nobody repairing anything?"""
    after = (report["phases"] or {}).get("after")
    evidence = []
    passing = bool(
        after and all(g.holds(after[key] or 0.0, spec.threshold(g)) for g, _, key, _ in DRILL_GATES)
    )
    if drill_kind.kills_replica:
        restarted = [e for e in events if e["event"] == "restarted"]
        evidence.append(
            f"supervisor restarts: {len(restarted)}; the replica was back in rotation at "
            f"{report['fault_cleared_time_s']} s (router event)"
        )
    elif report["fault_cleared_by"]:
        evidence.append(f"fault cleared: {report['fault_cleared_by']}")
    if after:
        evidence.append(
            f"after recovery ({after['from_s']:.1f}-{after['to_s']:.1f} s): attainment "
            f"{after['attainment']}, error rate {after['error_rate']}"
        )
    else:
        evidence.append("no recovered window during the run")
    return {
        "value": bool(passing and report["recovery_time_s"] is not None),
        # The drill only lifts the fault it injected; nothing touches data or replicas by hand.
        "manual_actions": 0,
        "evidence": evidence,
    }


# Moved to stats and n_plus_one; importers name them from here too.
__all__ = [
    "DRILL_GATES",
    "DrillAnalysisSpec",
    "alert_episodes",
    "all_attempt_attainment",
    "analyze_drill",
    "clock_check",
    "counter_increase",
    "n_plus_one",
    "phase_stats",
    "queue_evidence",
    "request_frame",
    "timeline",
    "windows",
]
