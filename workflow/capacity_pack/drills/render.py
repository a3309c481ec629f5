"""Failure drills, rendered: failure-test.md, its JSON twin, and each drill's MLflow child run.

A drill whose alerts were not evaluated (no ``promtool``) reads "not evaluated", with why,
wherever alerts appear. Contents: docs/failure-drills.md, "How the fields are computed".
"""

from __future__ import annotations

from typing import Any

from capacity_pack.drills.kinds import kind


def _fmt(v: Any, unit: str = "", digits: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}{unit}"
    return f"{v}{unit}"


def alerts_evaluated(r: dict[str, Any]) -> bool:
    """Were the drill's alert rules evaluated? (Reports from before the field: yes.)"""
    return r.get("alerts_evaluated", True)


def alerts_fired_text(r: dict[str, Any], none: str = "none") -> str:
    """The alerts that fired, ``none``, or "not evaluated (why)"."""
    if not alerts_evaluated(r):
        return f"not evaluated ({r.get('alert_evaluation')})"
    return ", ".join(r["alerts_fired"]) or none


def expected_alert_text(r: dict[str, Any]) -> str:
    """Did the drill's own mechanism alert fire: yes, NO, or not evaluated."""
    if not alerts_evaluated(r):
        return "not evaluated"
    return "yes" if r["expected_alert_fired"] else "NO"


def _rel(t: float | None, inj: float | None) -> str:
    if t is None:
        return "n/a"
    if inj is None:
        return f"{t:.2f} s"
    return f"{t:.2f} s (injection {t - inj:+.2f} s)"


def failure_test(reports: list[dict[str, Any]], pack: dict[str, Any]) -> dict[str, Any]:
    """The JSON twin of failure-test.md: every drill's fields plus the checks across them."""
    ran = [r for r in reports if not r.get("skipped")]
    plan = next((r for r in reports if r.get("scope") == "plan"), None)
    # Live drills run on the host's monotonic clock, virtual ones on the engine model's: one
    # clock is named only when every drill that ran used it.
    clocks = {r["drill"]: r["clock"] for r in ran}
    distinct = set(clocks.values())
    return {
        "pack": pack,
        "clock": distinct.pop() if len(distinct) == 1 else None,
        "clocks": clocks,
        "drills": reports,
        "plan_drill": plan_answer(plan),
        "summary": {
            "drills_run": [r["drill"] for r in ran],
            "drills_skipped": {r["drill"]: r["skipped"] for r in reports if r.get("skipped")},
            "any_alert_fired": any(r["alerts_fired"] for r in ran),
            "expected_alerts_fired": {r["drill"]: r["expected_alert_fired"] for r in ran},
            "alerts_not_evaluated": {
                r["drill"]: r.get("alert_evaluation") for r in ran if not alerts_evaluated(r)
            },
            "unexpected_mechanisms": {r["drill"]: r["unexpected_mechanisms_fired"] for r in ran},
            # One line per mechanism drill, in words (the pack README lists them).
            "mechanism_lines": [drill_line(r) for r in reports if r.get("scope") != "plan"],
        },
    }


def plan_answer(r: dict[str, Any] | None) -> dict[str, Any] | None:
    """The plan drill's answer to "what happens when one fails" (None: no plan drill)."""
    if r is None:
        return None
    if r.get("skipped"):
        return {"verdict": "NOT RUN", "sentence": f"Plan drill not run: {r['skipped']}"}
    n = r["n_plus_one"]
    return {
        "verdict": n["verdict"],
        "sentence": n["sentence"],
        "why_fail": n["why_fail"],
        "execution": r["execution"],
        "execution_reason": r.get("execution_reason"),
        "replicas": n["replicas"],
        "peak_rps": n["peak_rps"],
        "recovery_after_injection_s": n["recovery_after_injection_s"],
        "requests_rejected": n["requests_rejected"],
        "requests_lost": n["requests_lost"],
    }


def drill_line(r: dict[str, Any]) -> str:
    """One mechanism drill in one line (README and failure-test.md summary)."""
    if r.get("skipped"):
        return f"`{r['drill']}` ({r['kind']}): skipped: {r['skipped']}"
    inj = r["injection_time_s"]
    det, rec = r["detection_time_s"], r["recovery_time_s"]
    during = r["phases"]["during"]
    if not alerts_evaluated(r):
        detected = f"alerts not evaluated ({r.get('alert_evaluation')})"
    elif det is None:
        detected = f"not detected ({alerts_fired_text(r, 'no alert')})"
    else:
        detected = f"detected in {det - inj:.1f} s ({alerts_fired_text(r, 'no alert')})"
    return (
        f"`{r['drill']}` ({r['kind']}, {r['replicas']} replicas at {r['rate_rps']:.1f} RPS): "
        + f"{detected}, "
        + (f"recovered in {rec - inj:.1f} s" if rec is not None else "not recovered")
        + f", {r['requests_rejected']} rejected, {r['requests_lost']} lost; during the incident "
        f"attainment {_fmt(during['all_attempt_attainment'], '', 3)} over all attempts "
        f"({_fmt(during['attainment'], '', 3)} among successful requests)"
    )


def failure_test_markdown(doc: dict[str, Any]) -> str:
    """failure-test.md: every drill's failure-test fields, measured, with the clock named."""
    pack = doc["pack"]
    lines = [
        f"# Failure test: {pack.get('title') or pack.get('name')}",
        "",
        f"> {pack['label']}" if pack.get("label") else "",
        "",
        "Each drill is its own experiment with one failure mechanism (no combined chaos score). "
        + _clock_sentence(doc)
        + " Fields come from the per-request records, the scraped "
        "`/metrics` series and the router's event log of each drill.",
        "",
    ]
    s = doc["summary"]
    plan = doc.get("plan_drill")
    plan_report = next((r for r in doc["drills"] if r.get("scope") == "plan"), None)
    if plan is not None:
        lines += ["## The plan, one replica down", "", f"**{plan['sentence']}.**", ""]
        if plan_report is not None and not plan_report.get("skipped"):
            lines += _plan_section(plan_report)
    lines += [
        "## Summary",
        "",
        "| drill | mechanism | expected alert fired | alerts fired | detection | recovery | "
        "capacity returned |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["drills"]:
        if r.get("skipped"):
            lines.append(f"| {r['drill']} | {r['mechanism']} | skipped | | | | |")
            continue
        if r.get("scope") == "plan":
            continue
        inj = r["injection_time_s"]
        det = r["detection_time_s"]
        rec = r["recovery_time_s"]
        lines.append(
            f"| {r['drill']} | {r['mechanism']} | {expected_alert_text(r)}"
            f" | {alerts_fired_text(r)} | "
            f"{_fmt(det - inj if det is not None else None, ' s')} after injection | "
            f"{_fmt(rec - inj if rec is not None else None, ' s')} after injection | "
            f"{'yes' if r['capacity_returned_without_manual_repair']['value'] else 'no'} |"
        )
    lines += [
        "",
        "The drills above are mechanism tests: each runs "
        "replicas behind the router at the selected capacity per replica (every replica at "
        "its capacity point), not the recommended plan; the plan drill answers for the plan.",
        "",
    ]
    for name, why in s["drills_skipped"].items():
        lines += [f"- `{name}` skipped: {why}"]
    for r in doc["drills"]:
        if r.get("skipped"):
            continue
        lines += _drill_section(r)
    return "\n".join(lines).rstrip() + "\n"


def _clock_sentence(doc: dict[str, Any]) -> str:
    if doc.get("clock"):
        return f"Every time below is in seconds on one clock: {doc['clock']}."
    if doc.get("clocks"):
        return (
            "Times below are in seconds on each drill's own clock, named in its section (live "
            "and virtual drills do not share one): compare times within a drill, not across."
        )
    return "No drill ran, so no clock."


def _drill_section(r: dict[str, Any]) -> list[str]:
    inj = r["injection_time_s"]
    p = r["plan"]
    q = r["queue"]
    role = (
        "the plan drill" if r.get("scope") == "plan" else "a mechanism test at the capacity point"
    )
    how = r.get("execution_reason") or "processes on this host"
    lines = [
        "",
        f"## Drill `{r['drill']}` ({r['kind']}, mechanism `{r['mechanism']}`; {role})",
        "",
        f"- Run: {r.get('execution', 'live')} ({how}); timeline picture: "
        f"`failure-timeline-{r['drill']}.png`.",
        f"- Load: {r['rate_rps']:.1f} RPS open loop against {r['replicas']} replicas "
        f"({p['rate_source']}); from the injection on {r['rate_after_rps']:.1f} RPS.",
        f"- Router admission limit: {r['admission_max_outstanding'] or 'off'} requests per "
        f"healthy replica ({p['admission_source']}).",
        f"- Schedule completeness: {r['schedule_completeness']}; terminal statuses: "
        f"{r['terminal_statuses']} (no request without a terminal status).",
        f"- Clock: {r['clock']}.",
        f"- Clock check: monotonic vs realtime divergence over the run "
        f"{_fmt(r['clock_check'].get('max_divergence_us'), ' us', 1)}.",
        "",
        "| field | value |",
        "|---|---|",
        f"| injection_time | {_rel(inj, None)} ({r['injection_source']}) |",
        f"| detection_time | {_rel(r['detection_time_s'], inj)} ({r['detection_source']}) |",
        f"| router_removal_time | {_rel(r['router_removal_time_s'], inj)} |",
        f"| fault cleared | {_rel(r['fault_cleared_time_s'], inj)} ({r['fault_cleared_by']}) |",
        f"| first_error_time | {_rel(r['first_error_time_s'], inj)} |",
        f"| last_error_time | {_rel(r['last_error_time_s'], inj)} |",
        f"| queue peak | {_fmt(q.get('peak_server_waiting'), '', 0)} waiting in the engines, "
        f"{_fmt(q.get('peak_client_in_flight'), '', 0)} in flight at the client (baseline max "
        f"{_fmt(q.get('baseline_server_waiting_max'), '', 0)} / "
        f"{_fmt(q.get('baseline_client_in_flight_max'), '', 0)}) |",
        f"| queue recovery time | {_rel(q.get('recovered_t_s'), inj)} |",
        f"| recovery_time | {_rel(r['recovery_time_s'], inj)} |",
        f"| requests retried | {_fmt(r['requests_retried'], '', 0)} ({r['retried_source']}) |",
        f"| requests rejected | {r['requests_rejected']} (429/503 answers; router admission "
        f"control shed {_fmt(r['admission_rejected'], '', 0)}) |",
        f"| requests lost | {r['requests_lost']} (errors and timeouts after the injection) |",
        f"| requests cancelled | {r['requests_cancelled']} (client policy) |",
        f"| alerts fired | {alerts_fired_text(r)} |",
        f"| capacity returned without manual repair | "
        f"{'yes' if r['capacity_returned_without_manual_repair']['value'] else 'no'}: "
        f"{'; '.join(r['capacity_returned_without_manual_repair']['evidence'])} |",
        "",
        "TTFT, TPOT and SLO attainment by phase (requests binned by when they ended). Two "
        "attainments, never to be read as one another: **among successful** = successful "
        "requests meeting both class cutoffs / successful requests (the SLO report's "
        "definition); **over all attempts** = requests meeting both cutoffs / attempted "
        "requests (failed, rejected, lost and timed-out ones count as misses):",
        "",
        "| phase | window | attempted | ok | failed | error rate | attainment among "
        "successful | attainment over all attempts | goodput | worst-class p95 TTFT | "
        "worst-class p95 TPOT |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    return lines + _phase_rows(r) + _alert_lines(r, inj)


def _phase_rows(r: dict[str, Any]) -> list[str]:
    """The phase table's rows: before, during, after the incident."""
    lines = []
    for phase in ("before", "during", "after"):
        st = r["phases"].get(phase)
        if not st:
            lines.append(f"| {phase} | not reached | | | | | | | | | |")
            continue
        cls = st["classes"].values()
        ttft = max((c["ttft_p95_ms"] for c in cls if c["ttft_p95_ms"] is not None), default=None)
        tpot = max((c["tpot_p95_ms"] for c in cls if c["tpot_p95_ms"] is not None), default=None)
        lines.append(
            f"| {phase} | {st['from_s']:.1f}-{st['to_s']:.1f} s | {st['attempted']} | {st['ok']}"
            f" | {st['failed']} | {_fmt(st['error_rate'], '', 3)} | "
            f"{_fmt(st['attainment'], '', 3)} | "
            f"{_fmt(st.get('all_attempt_attainment'), '', 3)} | "
            f"{_fmt(st['goodput_rps'], ' RPS', 1)} | "
            f"{_fmt(ttft, ' ms', 1)} | {_fmt(tpot, ' ms', 1)} |"
        )
    return lines


def _alert_lines(r: dict[str, Any], inj: float) -> list[str]:
    """The alerts that fired, their times relative to the injection, and the verdict."""
    lines: list[str] = []
    if not alerts_evaluated(r):
        lines += ["", f"Alerts: not evaluated ({r.get('alert_evaluation')}).", ""]
    else:
        lines += ["", f"Alerts ({r.get('alert_evaluation') or 'evaluated'}, with the pack's "
                  "rule file; times on the drill clock):", ""]  # fmt: skip
    if not r["alerts"] and alerts_evaluated(r):
        lines.append("- none fired")
    for a in r["alerts"]:
        lines.append(
            f"- `{a['alert']}` ({a['mechanism']}) {a['labels']}: pending "
            f"{_rel(a['pending_t_s'], inj)}, firing {_rel(a['firing_t_s'], inj)}, resolved "
            f"{_rel(a['resolved_t_s'], inj)}"
        )
    verdict = expected_alert_text(r)
    lines += [
        "",
        f"Expected mechanism alert fired: {verdict}. Other mechanisms' alerts fired: "
        f"{', '.join(r['unexpected_mechanisms_fired']) or 'none'} (allowed consequences of "
        f"this drill: {', '.join(sorted(kind(r['kind']).consequences)) or 'none'}).",
    ]
    return lines


def _plan_section(r: dict[str, Any]) -> list[str]:
    """The plan drill's verdict: its checks with their numbers."""
    n = r["n_plus_one"]
    w, g = n["window"], n["gates"]
    planned = n.get("planned") or {}
    lines = [
        f"The recommended fleet ({n['replicas']} replicas: {planned.get('replicas_for_load')} "
        f"for the load at {planned.get('target_utilization')} target utilization + "
        f"{planned.get('redundancy_replicas')} redundancy + "
        f"{planned.get('warm_pool_replicas')} warm pool) at the planned peak of "
        f"{n['peak_rps']:g} RPS; replica {r['plan']['drill']['replica']} killed at "
        f"{r['injection_time_s']:.2f} s, the supervisor restarting it. Run "
        f"{n['execution']}: {r.get('execution_reason') or ''}.",
        "",
        "| check | holds | evidence |",
        "|---|---|---|",
    ]
    ok = {k: _holds(v) for k, v in n["checks"].items()}
    per_class = "; ".join(
        f"{name} {_fmt(c['all_attempt_attainment'], '', 3)} ({c['met_slo']}/{c['attempted']})"
        for name, c in n["classes"].items()
    )
    b = n["before_the_failure"]
    before = "; ".join(
        f"{name} {_fmt(c['all_attempt_attainment'], '', 3)} ({c['met_slo']}/{c['attempted']})"
        for name, c in b["classes"].items()
    )
    lines += [
        f"| the plan holds before the failure | "
        f"{ok['plan_holds_before_the_failure']} | requests ended "
        f"{b['from_s']:.1f}-{b['to_s']:.1f} s: attainment over all attempts {before}; failure "
        f"share {_fmt(b['failure_share'], '', 3)} ({b['failed']} of {b['requests_sent']}) |",
        f"| survivors carry the peak | {ok['survivors_carry_the_peak']} | "
        f"requests sent {w['from_s']:.1f}-{w['to_s']:.1f} s (until {w['to']}): attainment over "
        f"all attempts {per_class} against {g['class_slo_attainment_min']:g}; failure share "
        f"{_fmt(n['failure_share'], '', 3)} ({n['failed']} of {w['requests_sent']}) against "
        f"{g['error_rate_max']:g} |",
        f"| blast radius is the failed replica's | "
        f"{ok['blast_radius_is_the_failed_replica']} | "
        f"{n['requests_lost']} requests lost (in flight on the killed replica); lost after the "
        f"router removed it: {n['lost_sent_after_removal']} |",
        f"| recovered | {ok['recovered']} | "
        + (
            f"back to passing windows {n['recovery_after_injection_s']:.1f} s after the injection"
            if n["recovery_after_injection_s"] is not None
            else "not during the run"
        )
        + " |",
        "",
    ]
    if n["why_fail"]:
        why = "Why it fails: " if n["verdict"] == "FAIL" else "Why it is undecided: "
        lines += [why + "; ".join(n["why_fail"]) + ".", ""]
    return lines


def _holds(check: bool | None) -> str:
    return "n/a (no request to judge)" if check is None else ("yes" if check else "NO")
