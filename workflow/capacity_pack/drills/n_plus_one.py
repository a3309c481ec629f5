"""The plan drill's N+1 verdict: does the recommended fleet, one replica down, carry its peak?

PASS when (0) the plan holds before the failure, (1) the survivors carry the peak (requests
sent while one replica short: per-class attainment over all attempts >=
``class_slo_attainment_min``, failure share <= ``error_rate_max``), (2) every lost request was
sent before the router removed the replica, and (3) the fleet recovered. UNDECIDED when nothing
failed but 0 or 1 has no request to judge; each check is ``True``, ``False`` or ``None``.

Method: docs/failure-drills.md, "The plan drill".
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from capacity_pack.drills.plan import NS, DrillPlan
from capacity_pack.drills.stats import DrillAnalysisSpec, all_attempt_attainment
from capacity_pack.evidence.gates import CLASS_ATTAINMENT, ERROR_RATE


def n_plus_one(
    req: pd.DataFrame,
    report: dict[str, Any],
    plan: DrillPlan,
    spec: DrillAnalysisSpec,
    inj_ns: int,
    cleared_ns: int | None,
    end_ns: int,
    base_lo_ns: int,
) -> dict[str, Any]:
    """The plan drill's verdict (PASS, FAIL or UNDECIDED; the checks are this module's): its
    checks, why it failed, and the counts behind every share."""
    lo, hi = inj_ns, cleared_ns if cleared_ns is not None else end_ns
    att_min, err_max = spec.threshold(CLASS_ATTAINMENT), spec.threshold(ERROR_RATE)
    # Before the failure, by end time: a request sent before the kill but cut by it is the
    # blast radius (check 2), not the healthy fleet's.
    base = _sent_window(req, base_lo_ns, inj_ns, spec, att_min, err_max, by="end_offset_ns")
    one_short = _sent_window(req, lo, hi, spec, att_min, err_max)
    after_removal = _lost_after_removal(req, inj_ns, report.get("router_removal_time_s"))
    rec = report.get("recovery_time_s")
    inj_s = inj_ns / NS
    checks, why = _checks(base, one_short, after_removal, rec, att_min, err_max)
    verdict = _verdict(checks)
    planned = plan.planned or {}
    n = plan.replicas
    sentence = _sentence(plan, verdict, rec, inj_s, report)
    predicted = plan.twin is not None and report["execution"] == "virtual"
    if predicted:
        # A real target's plan, too large to run live: the calibrated twin's prediction.
        sentence += f"; {plan.twin['label']}"
    return {
        "verdict": verdict,
        "sentence": sentence,
        "checks": checks,
        "why_fail": why,
        "window": {
            "from_s": lo / NS,
            "to_s": hi / NS,
            "to": "the killed replica back in rotation"
            if cleared_ns is not None
            else "the end of the run (the replica never came back)",
            "requests_sent": one_short["requests_sent"],
        },
        "classes": one_short["classes"],
        "failure_share": one_short["failure_share"],
        "failed": one_short["failed"],
        "before_the_failure": base,
        "gates": {"class_slo_attainment_min": att_min, "error_rate_max": err_max},
        "requests_lost": report["requests_lost"],
        "lost_sent_after_removal": after_removal,
        "requests_rejected": report["requests_rejected"],
        "recovery_after_injection_s": rec - inj_s if rec is not None else None,
        "replicas": n,
        "peak_rps": plan.rate_rps,
        "planned": planned,
        "execution": report["execution"],
        # A real target's virtual plan drill: the calibrated twin's label (None: measured, or
        # a simulated target's exact engine model).
        "prediction": plan.twin["label"] if predicted else None,
    }


def _lost_after_removal(req: pd.DataFrame, inj_ns: int, removal: float | None) -> int | None:
    """Requests lost (error or timeout, ended from the injection on) that were sent after the
    router took the replica out of rotation (None: the removal time is unknown)."""
    lost = req[req["status"].isin(["error", "timeout"]) & (req["end_offset_ns"] >= inj_ns)]
    return int((lost["sent_offset_ns"] >= int(removal * NS)).sum()) if removal is not None else None


def _checks(
    base: dict[str, Any],
    one_short: dict[str, Any],
    after_removal: int | None,
    rec: float | None,
    att_min: float,
    err_max: float,
) -> tuple[dict[str, bool | None], list[str]]:
    """The four checks (:func:`_judged` windows, the blast radius, recovery) and, in words,
    every reason one of them failed or had nothing to judge."""
    classes, share = one_short["classes"], one_short["failure_share"]
    error_holds = one_short["failure_share_holds"]
    blast_holds = after_removal == 0
    base_check, base_empty = _judged(base)
    short_check, short_empty = _judged(one_short)
    checks = {
        "plan_holds_before_the_failure": base_check,
        "survivors_carry_the_peak": short_check,
        "blast_radius_is_the_failed_replica": blast_holds,
        "recovered": rec is not None,
    }
    why = []
    if base_check is False:
        why.append(
            "before the failure the planned fleet already missed its gates ("
            + ", ".join(
                f"{name} {_fmt_share(c['all_attempt_attainment'])} of {c['attempted']}"
                for name, c in base["classes"].items()
            )
            + f"; failure share {_fmt_share(base['failure_share'])}): the plan's linear "
            "scaling does not hold here"
        )
    if base_empty:
        why.append(
            f"before the failure no {' or '.join(base_empty)} request ended "
            f"({base['from_s']:.1f}-{base['to_s']:.1f} s), nothing to judge the healthy fleet by"
        )
    for name, c in classes.items():
        if c["attempted"] and not c["holds"]:
            why.append(
                f"class {name}: {_fmt_share(c['all_attempt_attainment'])} of "
                f"{c['attempted']} attempts met the SLO (gate {att_min:g})"
            )
    if short_empty:
        why.append(
            f"no {' or '.join(short_empty)} request sent while one replica short, nothing to "
            "judge the survivors by"
        )
    if share is not None and not error_holds:
        why.append(
            f"failure share {_fmt_share(share)} of {one_short['requests_sent']} (gate {err_max:g})"
        )
    if not blast_holds:
        why.append(
            "the router's removal time is unknown"
            if after_removal is None
            else f"{after_removal} request(s) sent after the router removed the replica were lost"
        )
    if rec is None:
        why.append("the fleet did not recover before the run ended")

    return checks, why


def _verdict(checks: dict[str, bool | None]) -> str:
    """FAIL when a check failed, else UNDECIDED when one had nothing to judge, else PASS."""
    if any(v is False for v in checks.values()):
        return "FAIL"
    if any(v is None for v in checks.values()):
        return "UNDECIDED"
    return "PASS"


def _sentence(
    plan: DrillPlan, verdict: str, rec: float | None, inj_s: float, report: dict[str, Any]
) -> str:
    """The verdict in one sentence: the fleet, the peak, the recovery and the requests lost."""
    n = plan.replicas
    return (
        f"Losing 1 of {n} replica{'s' if n != 1 else ''} at the {plan.rate_rps:g} RPS peak: "
        f"{verdict}"
        + (
            f", recovered in {rec - inj_s:.1f} s"
            if rec is not None
            else ", not recovered during the run"
        )
        + f", {report['requests_rejected']} requests rejected, {report['requests_lost']} lost"
    )


def _sent_window(
    req: pd.DataFrame,
    lo_ns: int,
    hi_ns: int,
    spec: DrillAnalysisSpec,
    att_min: float,
    err_max: float,
    by: str = "sent_offset_ns",
) -> dict[str, Any]:
    """The requests sent (``by``: or ended) in [lo, hi): per class attainment over all
    attempts against the attainment gate, pooled failure share against the error gate."""
    sent = req[(req[by] >= lo_ns) & (req[by] < hi_ns)]
    classes: dict[str, Any] = {}
    for c in spec.workload:
        k = sent[sent["class"] == c.name]
        att = all_attempt_attainment(k) if len(k) else None
        classes[c.name] = {
            "attempted": int(len(k)),
            "met_slo": int(k["meets_slo"].sum()),
            "failed": int(k["failed"].sum()),
            "all_attempt_attainment": att,
            "holds": bool(att is not None and CLASS_ATTAINMENT.holds(att, att_min)),
        }
    judged = sent[sent["status"] != "cancelled"]
    failed = int(judged["failed"].sum())
    share = failed / len(judged) if len(judged) else None
    share_holds = bool(share is not None and ERROR_RATE.holds(share, err_max))
    return {
        "from_s": lo_ns / NS,
        "to_s": hi_ns / NS,
        "requests_sent": int(len(sent)),
        "window_by": "send time" if by == "sent_offset_ns" else "end time",
        "classes": classes,
        "failed": failed,
        "failure_share": share,
        "failure_share_holds": share_holds,
        "holds": share_holds and all(c["holds"] for c in classes.values()),
    }


def _judged(window: dict[str, Any]) -> tuple[bool | None, list[str]]:
    """A window's check (False: a class or the failure share failed on requests it saw; None:
    none failed but some class had no request, so there is nothing to judge it by) and the
    classes with no request."""
    empty = [name for name, c in window["classes"].items() if not c["attempted"]]
    failed = any(c["attempted"] and not c["holds"] for c in window["classes"].values()) or (
        window["failure_share"] is not None and not window["failure_share_holds"]
    )
    if failed:
        return False, empty
    return (None if empty else True), empty


def _fmt_share(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"
