"""Capacity selection: from per-point SLO reports to the capacity a pack can defend.

Open-loop sweep, per cache state:

- **a rate's evidence is its repeats pooled** (each repeat a different schedule seed): per
  class k = sum of passing_c and n = sum of successful_c over the repeats that decide the
  rate, the design effect of all their time blocks together
  (:func:`capacity_pack.binomial.cluster_design_effect`: repeats that disagree widen it), and
  the confidence sequence at the effective sample k / deff of n / deff
  (:func:`pooled_attainment`), each class ``shown to pass``, ``shown to fail`` or ``cannot
  decide at this sample size``. Its status (:func:`rate_status`, the first that holds):
  ``inconclusive`` (no repeat is a server result), ``fail`` (a class shown to fail pooled, or
  another gate failed in a repeat: the error rate, a growing queue, an optional gate),
  ``misses`` (some class under the gate on the pooled estimate, not shown to fail),
  ``inconclusive`` (an undecided queue trend, or a class under its sample gate pooled),
  ``pass`` (every class shown to pass), ``marginal`` (every class meets the gate on the pooled
  estimate, some not shown). A repeat that decides nothing is set aside when another repeat
  of the rate decides (``set_aside_repeats`` and why; the search measures such a rate again,
  ``capacity_pack.decide.search``): a client-bound one (dispatch lateness p99 over its bound:
  the client, not the target, was measured), a disturbed one (other processes' CPU or the
  simulated engine's step lateness beyond their bounds: the host was measured) or a
  superseded one (decided in run under another attainment gate, undecided at the pack's).
  Reports analyzed before pooling (no time blocks) keep the old rule: every repeat must
  pass (``inconsistent`` when some do);
- the SLO-compliant capacity is the highest tested rate that **meets every gate on its pooled
  estimate** (``pass`` or ``marginal``: :func:`meets_gates`) with every lower tested rate
  meeting them too (one meeting them above a rate that does not is reported as non-monotonic
  and not selected); ``shown_to_pass_rps`` is the highest such rate shown to pass at the
  confidence. The estimate decides, the interval says how sure (docs/metrics.md, "Capacity and
  repeats", says why: a rate shown to pass in a few minutes of load lies under the boundary by
  a band the sample size sets, not the target);
- **the bracket**: ``pass_rps`` = that capacity (``capacity_rps`` keeps the same value),
  ``fail_rps`` = the lowest tested rate above it (None when the highest rate tested meets the
  gates: the true capacity may be higher), ``width_rps`` = fail_rps - pass_rps,
  ``resolution_rps`` = the pack's ``sweep.search`` resolution (``resolution_rps``, or
  ``resolution_rel`` x pass_rps; None without a search), ``reached`` = width_rps <=
  resolution_rps, and ``confidence`` = the confidence of the attainment intervals. With no
  rate meeting the gates, pass_rps is None and the capacity lies below the lowest rate tested;
- every rate that does not pass names, per repeat that did not pass, each class the report names
  (its reasons in the gates' words) with the **binding metric**: of the class's successful
  requests, whether more were over the TTFT cutoff or over the TPOT cutoff (the report's
  per-cutoff counts; see :func:`binding_metric`), and the point-level reasons (error rate, queue
  trend, client-bound), with each class's ``attribution``: the causes of its misses (queueing,
  prefill, decode, preemption, client scheduling) as the analyze stage estimated them from the
  scraped series (the request autopsy's ``server_series`` method), None without misses;
- **offered and achieved**, per repeat, over the report's measured window T (first measured
  send to last measured terminal event, the drain included): ``nominal_rps`` = the rate the
  schedule was drawn at; ``offered_measured_rps`` = the rate the schedule's measured requests
  actually arrived at, (n - 1) / (last - first measured scheduled arrival), from the report's
  ``offered_rate_rps`` (a seeded Poisson schedule realises a rate near, not at, the nominal
  one); for a report without it, attempted / T, which reads low by the drain's share of T;
  ``achieved_rps`` = successful / T (the report's request throughput); ``goodput_rps`` =
  requests meeting their SLO / T (the observed goodput);
- run-to-run variation across repeats (:mod:`capacity_pack.decide.repeats`): n, mean, min, max
  of every quantity, a pooled binomial interval for bounded ones (attainment, error rate) and a
  Student-t interval for unbounded ones only from five repeats on; never only the best run;
- per-replica capacity = capacity / replicas under test (valid only for the same workload, cache
  state, placement and engine configuration); it is what the replica plan sizes with;
- goodput per GPU = the measured goodput at the capacity rate, the least over its repeats (the
  capacity must hold in every repeat), / GPUs under test: DistServe's per-GPU goodput (Zhong et
  al., OSDI 2024: the highest request rate per provisioned GPU meeting the SLO attainment goal)
  as measured, not as scheduled; ``capacity_per_gpu_nominal_rps`` = capacity / GPUs is the
  nominal figure.

Closed-loop sweep: the latency-throughput curve (output tokens/s against P95 TTFT/TPOT per
concurrency) and the operating point = the highest throughput whose point still passes the
latency gates (every class's attainment), with its status (a point can meet the latency gates
yet be ``inconclusive``, e.g. under-sampled) and whether it is the largest concurrency tested
(then the frontier may lie beyond it); concurrency 1 (the single-user regime) is reported on
its own.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from capacity_pack.binomial import (
    cluster_design_effect,
    confidence_sequence,
    control_variate_interval,
)
from capacity_pack.decide.contexts import sent_contexts
from capacity_pack.decide.repeats import variation
from capacity_pack.evidence.gates import CLASS_ATTAINMENT


def deciding_reports(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The repeats of one rate that decide it. Two kinds of repeat decide nothing and are set
    aside whenever another repeat of the rate decides: a client-bound one (the load generator's
    dispatch lateness p99 over ``client.lateness_bound_ms``: it measured the client falling
    behind its schedule, not the target), a disturbed one (other processes' CPU or the
    simulated engine's step lateness beyond their bounds: :mod:`capacity_pack.measure.host`)
    and a superseded one (decided in run under another
    attainment gate and undecided at the pack's: ``capacity_pack.evidence.analysis``). With
    no deciding repeat they are all kept, and the rate is not shown to pass."""
    valid = [r for r in reports if not void(r)]
    return valid or list(reports)


def void(report: dict[str, Any]) -> str | None:
    """Why a repeat decides nothing (``client-bound``, ``disturbed`` or ``superseded``), None
    if it does."""
    # Disturbed first: a host busy with other work also makes the client fall behind.
    if report.get("disturbed"):
        return "disturbed"
    if report.get("client_bound"):
        return "client-bound"
    if report.get("superseded"):
        return "superseded"
    return None


#: Rate statuses that meet every gate on the rate's pooled estimate: a capacity is selected
#: among them. ``pass``: shown at the stated confidence; ``marginal``: on the estimate only.
MEETS = ("pass", "marginal")
#: The words of a class's pooled attainment against its gate.
SHOWN_PASS, SHOWN_FAIL, UNDECIDED = (
    "shown to pass",
    "shown to fail",
    "cannot decide at this sample size",
)


def meets_gates(status: str | None) -> bool:
    """Whether a rate status meets every gate on the pooled estimate (:data:`MEETS`)."""
    return status in MEETS


def poolable(report: dict[str, Any]) -> bool:
    """Whether a report carries what pooling needs (its gate, its other gates' outcome and each
    class's time blocks); a report analyzed before 2026-12-05 does not."""
    return (
        "attainment_gate" in report
        and "besides_attainment" in report
        and all("attainment_blocks" in c for c in report.get("classes", {}).values())
    )


def pooled_attainment(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per class, the attainment of a rate's repeats pooled into one sample (the module
    docstring's method; every report :func:`poolable`): k = sum of passing_c, n = sum of
    successful_c, the design effect of all the repeats' time blocks together
    (:func:`capacity_pack.binomial.cluster_design_effect`), the confidence sequence at the
    effective sample k / deff of n / deff against the gate, each repeat's own attainment, and
    the evidence in words: ``shown to pass`` (lower bound >= gate), ``shown to fail`` (upper
    bound < gate), else ``cannot decide at this sample size``."""
    gate = float(reports[0]["attainment_gate"]["min"])
    sample_gate = reports[0]["attainment_gate"].get("min_successful")
    out: dict[str, dict[str, Any]] = {}
    for name in reports[0]["classes"]:
        entries = [r["classes"][name] for r in reports]
        k = sum(int(e["passing_count"]) for e in entries)
        n = sum(int(e["successful_count"]) for e in entries)
        n_j = [v for e in entries for v in e["attainment_blocks"]["successful"]]
        k_j = [v for e in entries for v in e["attainment_blocks"]["passing"]]
        confidence = float(entries[0].get("attainment_ci_confidence") or 0.95)
        deff = cluster_design_effect(n_j, k_j)
        ci = confidence_sequence(k / deff, n / deff, confidence, gate) if n else None
        low, high = ci if ci is not None else (0.0, 1.0)
        estimate = k / n if n else None
        method = "pooled"
        cv = [e.get("control_variate") for e in entries]
        if n and all(cv):
            # The engine model as a control variate (capacity_pack.twin.control): the estimate
            # and its interval come from the live - model differences on the same requests.
            estimate, (low, high) = control_variate_interval(
                n_j,
                [v for c in cv for v in c["diff_blocks"]],
                sum(int(c["disagreements"]) for c in cv),
                float(cv[0]["long_run"]),
                float(cv[0]["long_run_var"]),
                confidence,
            )
            method = "control variate"
        per_repeat = [e.get("attainment") for e in entries]
        known = [a for a in per_repeat if a is not None]
        out[name] = {
            "passing": k,
            "successful": n,
            "attainment": estimate,
            "measured_attainment": k / n if n else None,
            "method": method,
            "design_effect": deff,
            "blocks": len(n_j),
            "ci": [low, high],
            "confidence": confidence,
            "gate": gate,
            "sample_gate": sample_gate,
            "meets": bool(n and estimate >= gate),
            "evidence": SHOWN_PASS if low >= gate else SHOWN_FAIL if high < gate else UNDECIDED,
            "per_repeat": per_repeat,
            "between_repeats": (max(known) - min(known)) if len(known) > 1 else None,
        }
        if method == "control variate":
            out[name]["control_variate"] = {
                "long_run": float(cv[0]["long_run"]),
                "model_attainment": sum(int(c["model_passing"]) for c in cv) / n,
                "disagreements": sum(int(c["disagreements"]) for c in cv),
            }
    return out


def rate_status(reports: list[dict[str, Any]]) -> str:
    """A rate's status from the repeats that decide it, pooled (module docstring), the first
    that holds: ``inconclusive`` (no repeat is a server result), ``fail`` (a class shown to
    fail on the pooled evidence, or another gate failed in a repeat), ``misses`` (some class
    under the gate on the pooled estimate, not shown to fail: cannot decide at this sample
    size), ``inconclusive`` (an undecided queue trend, or a class under its sample gate
    pooled), ``pass`` (every class shown to pass), ``marginal`` (every class meets the gate on
    the pooled estimate, some not shown at the confidence)."""
    if not reports:
        return "inconclusive"
    if not all(poolable(r) for r in reports):
        return _status_by_repeats(reports)
    if any(void(r) for r in reports):
        return "inconclusive"  # no repeat of the rate decides (deciding_reports kept them all)
    others = [r["besides_attainment"]["outcome"] for r in reports]
    pooled = pooled_attainment(reports)
    if "fail" in others or any(e["evidence"] == SHOWN_FAIL for e in pooled.values()):
        return "fail"
    if not all(e["meets"] for e in pooled.values()):
        return "misses"
    if "inconclusive" in others or any(
        e["sample_gate"] is not None and e["successful"] < e["sample_gate"] for e in pooled.values()
    ):
        return "inconclusive"
    if all(e["evidence"] == SHOWN_PASS for e in pooled.values()):
        return "pass"
    return "marginal"


def _status_by_repeats(reports: list[dict[str, Any]]) -> str:
    """The status of reports that cannot be pooled (analyzed before pooling existed): every
    repeat must pass."""
    verdicts = [r["verdict"] for r in reports]
    if all(v == "pass" for v in verdicts):
        return "pass"
    if any(v == "inconclusive" for v in verdicts):
        return "inconclusive"
    if any(v == "pass" for v in verdicts) or (
        any(v == "marginal" for v in verdicts) and any(v == "fail" for v in verdicts)
    ):
        return "inconsistent"
    if all(v == "marginal" for v in verdicts):
        return "marginal"
    return "fail"


# ---------------------------------------------------------------------------------------------
# One repeat of a rate: offered and achieved, and what failed
# ---------------------------------------------------------------------------------------------


def _per_second(count: Any, window_s: Any) -> float | None:
    if count is None or not window_s:
        return None
    return float(count) / float(window_s)


def repeat_rates(report: dict[str, Any]) -> dict[str, Any]:
    """The nominal, offered and achieved rates of one repeat (see the module docstring)."""
    window = report.get("measured_window_s")
    return {
        "repeat": report["repeat"],
        "verdict": report["verdict"],
        "nominal_rps": float(report["offered_rps"]),
        # The analysis's own figure when it has one (no drain in it), else attempted / T.
        "offered_measured_rps": report.get("offered_rate_rps")
        or _per_second(report.get("attempted"), window),
        "achieved_rps": report.get("request_throughput_rps"),
        "goodput_rps": report.get("observed_goodput_rps"),
        "measured_window_s": window,
        "attempted": report.get("attempted"),
        "successful": report.get("successful"),
        # The cache state made visible: the server's prefix-cache hit rate and the client's
        # cached share of prompt tokens, with where each came from.
        "prefix_cache_hit_rate": report.get("prefix_cache_hit_rate"),
        "client_cached_token_fraction": report.get("client_cached_token_fraction"),
        "prefix_cache_sources": report.get("prefix_cache_sources"),
    }


def binding_metric(entry: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Which cutoff excluded more of a class's successful requests: ``ttft``, ``tpot``,
    ``ttft+tpot`` (as many) or None (no request over either), and the evidence.

    From the counts over each cutoff when the report has them (``p99_*_early_stopping.
    over_cutoff``: ok requests over the TTFT, resp. TPOT cutoff; a request over both counts in
    both); else from P95 / cutoff of each metric, the larger ratio binding (``basis`` says
    which)."""
    ttft = (entry.get("p99_ttft_early_stopping") or {}).get("over_cutoff")
    tpot = (entry.get("p99_tpot_early_stopping") or {}).get("over_cutoff")
    if ttft is not None and tpot is not None:
        evidence = {"basis": "requests over each cutoff", "over_ttft_cutoff": ttft,
                    "over_tpot_cutoff": tpot}  # fmt: skip
        a, b = float(ttft), float(tpot)
    else:
        ratios = []
        for metric in ("ttft", "tpot"):
            p95, cut = entry.get(f"p95_{metric}_ms"), entry.get(f"request_{metric}_cutoff_ms")
            ratios.append(p95 / cut if p95 is not None and cut else None)
        evidence = {
            "basis": "P95 / cutoff (no per-cutoff counts in the report)",
            "p95_ttft_over_cutoff": ratios[0],
            "p95_tpot_over_cutoff": ratios[1],
        }
        if None in ratios:
            return None, evidence
        a, b = ratios[0], ratios[1]
        if max(a, b) <= 1.0:  # both P95s inside their cutoffs: the misses sit above P95
            evidence["note"] = "both P95s within their cutoffs"
    if a == b:
        return ("ttft+tpot" if a > 0 else None), evidence
    return ("ttft" if a > b else "tpot"), evidence


def repeat_failures(report: dict[str, Any], classes: list[str]) -> dict[str, Any]:
    """What stopped one repeat from passing: each class it names with its reasons and binding
    metric, and the point-level reasons (error rate, queue trend, client-bound...)."""
    reasons = list(report.get("verdict_reasons", []))
    under = set(report.get("under_sampled_classes") or [])
    named: list[dict[str, Any]] = []
    for c in classes:
        own = [r for r in reasons if r.startswith(f"{c}: ")]
        entry = report["classes"][c]
        if c in under and not own:
            own = [f"{c}: under-sampled"]
        if not own and entry.get(CLASS_ATTAINMENT.passes_key) is not False:
            continue
        metric, evidence = binding_metric(entry) if _about_attainment(own, entry) else (None, {})
        named.append(
            {
                "class": c,
                "reasons": own or [f"{c}: class SLO gate not passed"],
                "attainment": entry.get("attainment"),
                "binding_metric": metric,
                "binding_evidence": evidence,
                # What the class's misses were made of (the analyze stage's autopsy estimate).
                "attribution": entry.get("attribution"),
            }
        )
    prefixes = tuple(f"{c}: " for c in classes)
    # dict.fromkeys: a reason can be both a label and a failed gate ("queue trend inconclusive").
    point = list(dict.fromkeys(
        r for r in reasons if not r.startswith(prefixes) and not r.startswith("under-sampled")
    ))  # fmt: skip
    return {"repeat": report["repeat"], "verdict": report["verdict"], "key": report.get("key"),
            "classes": named, "point_reasons": point}  # fmt: skip


def _about_attainment(reasons: list[str], entry: dict[str, Any]) -> bool:
    """The class missed on latency (an attainment reason), not only on samples or errors."""
    if any("attainment" in r for r in reasons):
        return True
    return not reasons and entry.get(CLASS_ATTAINMENT.passes_key) is False


def failure_summary(failures: list[dict[str, Any]]) -> str:
    """'interactive TTFT (repeat 0); error rate 0.0200 > 0.01 (repeat 1)': each failing class
    with its binding metric, or its reason, and the repeats it failed in."""
    seen: dict[str, list[int]] = {}
    for f in failures:
        for c in f["classes"]:
            metric = c["binding_metric"]
            text = f"{c['class']} {metric.upper()}" if metric else "; ".join(c["reasons"])
            cause = (c.get("attribution") or {}).get("primary_cause")
            if metric and cause:
                share = c["attribution"]["cause_share"][cause]
                text += f" ({cause} {share:.0%} of misses)"
            seen.setdefault(text, []).append(f["repeat"])
        for r in f["point_reasons"]:
            seen.setdefault(r, []).append(f["repeat"])
    parts = []
    for text, reps in seen.items():
        distinct = sorted(set(reps))
        word = "repeat" if len(distinct) == 1 else "repeats"
        parts.append(f"{text} ({word} {', '.join(str(k) for k in distinct)})")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# The open loop: rates, the bracket and the decision
# ---------------------------------------------------------------------------------------------


def _rate_row(rate: float, every: list[dict[str, Any]], classes: list[str], confidence: float):
    reps = deciding_reports(every)
    status = rate_status(reps)
    failures = (
        [repeat_failures(r, classes) for r in reps if r["verdict"] != "pass"]
        if not meets_gates(status)
        else []
    )
    pooled = pooled_attainment(reps) if all(poolable(r) for r in reps) else None
    return {
        "offered_rps": rate,
        "status": status,
        # The rate's evidence: every deciding repeat's requests pooled per class.
        "pooled": pooled,
        "evidence": rate_evidence(status, pooled),
        "repeats": len(reps),
        "verdicts": [r["verdict"] for r in reps],
        # Repeats that decide nothing, set aside: another repeat of the rate decides.
        "set_aside_repeats": [r["repeat"] for r in every if r not in reps],
        "set_aside_why": {str(r["repeat"]): void(r) for r in every if r not in reps},
        "reasons": sorted({reason for r in reps for reason in r["verdict_reasons"]}),
        "per_repeat": [repeat_rates(r) for r in reps],
        "failures": failures,
        "failure_summary": failure_summary(failures) if failures else None,
        "variation": variation(reps, classes, confidence),
    }


def search_resolution(search: Any, pass_rps: float | None) -> float | None:
    """The pack's ``sweep.search`` resolution in RPS: ``resolution_rps``, else
    ``resolution_rel`` x the passing rate; None without a search (a model or a mapping)."""
    if search is None:
        return None

    def get(name: str) -> Any:
        return search.get(name) if isinstance(search, dict) else getattr(search, name, None)

    if get("resolution_rps") is not None:
        return float(get("resolution_rps"))
    if get("resolution_rel") is not None and pass_rps is not None:
        return float(get("resolution_rel")) * pass_rps
    return None


def bracket(
    rows: list[dict[str, Any]], capacity: float | None, resolution: float | None,
    confidence: float,
) -> dict[str, Any]:  # fmt: skip
    """The capacity as a bracket: the highest passing rate (every lower one passing), the
    lowest tested rate above it, the width between them and whether the resolution is met."""
    fail = next((r for r in rows if capacity is None or r["offered_rps"] > capacity), None)
    at = next((r for r in rows if r["offered_rps"] == capacity), None)
    fail_rps = fail["offered_rps"] if fail is not None else None
    width = fail_rps - capacity if capacity is not None and fail_rps is not None else None
    if capacity is None:
        note = (
            f"no tested rate passes: the capacity is below {fail_rps:g} RPS"
            if fail_rps is not None else "no open-loop points"
        )  # fmt: skip
    elif fail_rps is None:
        note = "the highest rate tested meets the gates: the true capacity may be higher"
    else:
        note = f"the capacity lies in [{capacity:g}, {fail_rps:g}) RPS"
    return {
        "pass_rps": capacity,
        "fail_rps": fail_rps,
        "pass_status": at["status"] if at is not None else None,
        "pass_evidence": at.get("evidence") if at is not None else None,
        "fail_status": fail["status"] if fail is not None else None,
        "fail_summary": fail["failure_summary"] if fail is not None else None,
        "fail_evidence": fail.get("evidence") if fail is not None else None,
        "width_rps": width,
        "resolution_rps": resolution,
        "reached": (
            width <= resolution + 1e-9 if width is not None and resolution is not None else None
        ),
        "confidence": confidence,
        "note": note,
    }


def _confidence(reports: list[dict[str, Any]]) -> float:
    """The confidence of the reports' attainment bounds (0.95 when they do not say)."""
    for r in reports:
        for c in r.get("classes", {}).values():
            if c.get("attainment_ci_confidence") is not None:
                return float(c["attainment_ci_confidence"])
    return 0.95


def select_open_loop(
    reports: list[dict[str, Any]], classes: list[str], replicas: int, gpus: int,
    search: Any = None, confidence: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Capacity per cache state from the open-loop reports (see the module docstring);
    ``search`` is the pack's ``sweep.search`` (its resolution), None without one;
    ``confidence`` the pack's attainment confidence (None: the one the reports state)."""
    by_state: dict[str, dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in reports:
        if r.get("mode") == "open":
            by_state[r["cache_state"]][float(r["offered_rps"])].append(r)
    confidence = confidence if confidence is not None else _confidence(reports)
    result: dict[str, Any] = {}
    for state, rates in sorted(by_state.items()):
        rows = [
            _rate_row(rate, sorted(rates[rate], key=lambda r: r["repeat"]), classes, confidence)
            for rate in sorted(rates)
        ]
        capacity = shown = None
        for row in rows:
            if not meets_gates(row["status"]):
                break
            capacity = row["offered_rps"]
            if row["status"] == "pass":
                shown = row["offered_rps"]
        passing_above = [
            row["offered_rps"]
            for row in rows
            if meets_gates(row["status"]) and (capacity is None or row["offered_rps"] > capacity)
        ]
        next_up = next(
            (row for row in rows if capacity is None or row["offered_rps"] > capacity), None
        )
        at = next((row for row in rows if row["offered_rps"] == capacity), None)
        goodputs = [p["goodput_rps"] for p in (at["per_repeat"] if at else [])
                    if p["goodput_rps"] is not None]  # fmt: skip
        # The least goodput over the repeats: the capacity must hold in every one of them.
        goodput = min(goodputs) if goodputs else None
        result[state] = {
            "rates": rows,
            "capacity_rps": capacity,
            "bracket": bracket(rows, capacity, search_resolution(search, capacity), confidence),
            # The highest rate shown to pass at the confidence, every lower one meeting the
            # gates: at or under the capacity, which is the pooled estimate's.
            "shown_to_pass_rps": shown,
            "capacity_per_replica_rps": capacity / replicas if capacity is not None else None,
            "capacity_per_gpu_nominal_rps": capacity / gpus if capacity is not None else None,
            "goodput_at_capacity_rps": goodput,
            "goodput_per_gpu_rps": goodput / gpus if goodput is not None else None,
            "non_monotonic_passes_rps": passing_above,
            "next_rate_up": (
                {
                    "offered_rps": next_up["offered_rps"],
                    "status": next_up["status"],
                    "limited_by": next_up["reasons"],
                    "failure_summary": next_up["failure_summary"],
                }
                if next_up is not None
                else None
            ),  # fmt: skip
            "decision": _decision(capacity, rows, next_up, state),
        }
    return result


def rate_evidence(status: str, pooled: dict[str, dict[str, Any]] | None) -> str | None:
    """A rate's evidence in words: each class that decides it, its pooled attainment, interval
    and whether it is shown at the confidence (``interactive 0.9612 [0.9431, 0.9750] at 95 %
    over 2,310 requests: cannot decide at this sample size``); None without pooled evidence."""
    if not pooled:
        return None
    if status in ("pass", "marginal"):
        # The weakest class: the lowest lower bound.
        names = [min(pooled, key=lambda c: pooled[c]["ci"][0])]
    elif status == "fail" and any(e["evidence"] == SHOWN_FAIL for e in pooled.values()):
        names = [c for c, e in pooled.items() if e["evidence"] == SHOWN_FAIL]
    else:
        names = [c for c, e in pooled.items() if not e["meets"]] or [
            min(pooled, key=lambda c: pooled[c]["ci"][0])
        ]
    return "; ".join(_class_evidence(name, pooled[name]) for name in names)


def _class_evidence(name: str, e: dict[str, Any]) -> str:
    low, high = e["ci"]
    att = e["attainment"]
    spread = (
        f", repeats {', '.join(f'{a:.4f}' for a in e['per_repeat'] if a is not None)}"
        if len(e["per_repeat"]) > 1
        else ""
    )
    cv = e.get("control_variate")
    if cv:
        # measured, model on the same requests, model's long run: the estimate is
        # long run + (measured - model).
        return (
            f"{name} {att:.4f} [{low:.4f}, {high:.4f}] at {e['confidence']:.0%} by the engine "
            f"model as control variate (measured {e['measured_attainment']:.4f}, model on the "
            f"same {e['successful']:,} requests {cv['model_attainment']:.4f}, model's long run "
            f"{cv['long_run']:.4f}{spread}): {e['evidence']}"
        )
    return (
        f"{name} {att if att is None else f'{att:.4f}'} [{low:.4f}, {high:.4f}] at "
        f"{e['confidence']:.0%} over {e['successful']:,} requests (design effect "
        f"{e['design_effect']:.1f}{spread}): {e['evidence']}"
    )


def _why(row: dict[str, Any]) -> str:
    if row.get("evidence") and row["status"] in ("misses", "marginal"):
        return row["evidence"]
    return row["failure_summary"] or "; ".join(row["reasons"]) or "see its reports"


#: A rate status in the decision's words.
STATUS_WORDS = {
    "pass": "shown to pass",
    "marginal": "meets every gate on the pooled estimate",
    "misses": "misses the attainment gate on the pooled estimate",
    "fail": "fails",
    "inconclusive": "inconclusive",
    "inconsistent": "inconsistent between its repeats",
}


def _decision(capacity, rows, next_up, state) -> str:
    if not rows:
        return f"{state}: no open-loop points"
    if capacity is None:
        first = rows[0]
        return (
            f"{state}: no tested rate meets every gate; the lowest ({first['offered_rps']:g} "
            f"RPS) {STATUS_WORDS.get(first['status'], first['status'])}: {_why(first)}"
        )
    at = next(r for r in rows if r["offered_rps"] == capacity)
    text = (
        f"{state}: {capacity:g} RPS is the highest tested rate meeting every gate on the "
        f"pooled evidence of its repeats" + (f" ({at['evidence']})" if at.get("evidence") else "")
    )
    if next_up is not None:
        text += (
            f"; the next rate up ({next_up['offered_rps']:g} RPS) "
            f"{STATUS_WORDS.get(next_up['status'], next_up['status'])}: {_why(next_up)}"
        )
    else:
        text += "; it is the highest rate tested, so the true capacity may be higher"
    return text


def closed_loop_curve(
    reports: list[dict[str, Any]], classes: list[str], attainment_min: float
) -> dict[str, Any]:
    """Latency-throughput curve per cache state and its operating point."""
    by_state: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in reports:
        if r.get("mode") == "closed":
            by_state[r["cache_state"]][int(r["concurrency"])].append(r)
    out: dict[str, Any] = {}
    for state, levels in sorted(by_state.items()):
        curve = []
        for n in sorted(levels):
            reps = levels[n]
            var = variation(reps, classes)
            curve.append(
                {
                    "concurrency": n,
                    "status": rate_status(reps),
                    "output_throughput_tps": var["output_throughput_tps"]["mean"],
                    "request_throughput_rps": float(
                        np.mean([r["request_throughput_rps"] for r in reps])
                    ),
                    "p95_ttft_ms": {c: var["classes"][c]["p95_ttft_ms"]["mean"] for c in classes},
                    "p95_tpot_ms": {c: var["classes"][c]["p95_tpot_ms"]["mean"] for c in classes},
                    "attainment": {c: var["classes"][c]["attainment"]["mean"] for c in classes},
                    "meets_latency_gates": all(
                        meets_latency_gates(r, attainment_min) for r in reps
                    ),
                    "reasons": sorted({x for r in reps for x in r.get("verdict_reasons", [])}),
                }
            )
        inside = [p for p in curve if p["meets_latency_gates"]]
        best = max(inside, key=lambda p: p["output_throughput_tps"] or 0.0, default=None)
        single = next((p for p in curve if p["concurrency"] == 1), None)
        out[state] = {
            "curve": curve,
            "operating_point": best,
            "operating_point_status": best["status"] if best else None,
            "operating_point_is_largest_tested": (
                best is not None and best["concurrency"] == max(levels)
            ),
            "operating_point_note": _operating_note(best, max(levels)),
            "single_user": single,
            "saturation_tps": max((p["output_throughput_tps"] or 0.0 for p in curve), default=None),
        }
    return out


def _operating_note(best: dict[str, Any] | None, largest: int) -> str:
    """The operating point's status in words: passed, or met only the latency gates."""
    if best is None:
        return "no concurrency level met the latency gates"
    if best["status"] == "pass":
        text = "it passes every gate in every repeat"
    else:
        why = "; ".join(best["reasons"][:3]) or "see its reports"
        text = f"it meets the latency gates but its status is {best['status']} ({why})"
    if best["concurrency"] == largest:
        text += "; it is the largest concurrency tested, so the frontier may lie beyond it"
    return text


def meets_latency_gates(report: dict[str, Any], attainment_min: float) -> bool:
    """The latency constraint of the curve: every class's attainment (the closed-loop sweep is
    for the frontier; its sample sizes are not a capacity decision)."""
    return all(
        CLASS_ATTAINMENT.holds(c["attainment"], attainment_min) for c in report["classes"].values()
    )


# ---------------------------------------------------------------------------------------------
# From reports to the decision and the plan
# ---------------------------------------------------------------------------------------------


def primary_cache_state(states: list[str]) -> str:
    """The state the headline decision uses: cold when measured (it is the conservative one)."""
    return "cold" if "cold" in states else states[0]


def build_capacity(reports: list[dict[str, Any]], pack) -> dict[str, Any]:
    classes = pack.class_names
    placement = pack.engine.placement
    open_loop = select_open_loop(
        reports, classes, placement.replicas, placement.gpus,
        search=getattr(pack.sweep, "search", None),
        confidence=pack.acceptance.attainment_confidence,
    )  # fmt: skip
    closed = closed_loop_curve(reports, classes, pack.acceptance.class_slo_attainment_min)
    states = sorted({r["cache_state"] for r in reports}) or list(pack.sweep.cache_states)
    primary = primary_cache_state([s for s in pack.sweep.cache_states if s in states] or states)
    return {
        "pack": pack.pack.name,
        "pack_label": pack.pack.label,
        "primary_cache_state": primary,
        "holds_for": {
            "workload": [c.name for c in pack.workload],
            "placement": placement.model_dump(),
            "engine": {"name": pack.engine.name, "version": pack.engine.version},
            "model": {"id": pack.model.id, "revision": pack.model.revision},
        },
        "open_loop": open_loop,
        "closed_loop": closed,
        # Physical sanity: results that contradict how a server works (measurement_faults);
        # a check the brackets are too wide to settle is a note, not a fault.
        "measurement_faults": measurement_faults(open_loop, closed),
        "measurement_notes": measurement_notes(open_loop),
        "experiments": sorted(
            {r["point"]: r["verdict"] for r in reports if r.get("mode") == "exp"}.items()
        ),
    }


#: Warm capacity under this share of cold is a measurement fault: a prefix cache that hits
#: does not make a server slower (measured: 0.41 RPS warm against 2.8 cold with an analysis job
#: beside the warm points).
WARM_FLOOR = 0.8
#: An open-loop capacity above the closed loop's highest request throughput by more than this
#: share is a measurement fault: no load pattern carries more than the server's saturation.
SATURATION_SLACK = 0.05


def warm_floor_check(open_loop: dict[str, Any]) -> tuple[str, str] | None:
    """Warm against :data:`WARM_FLOOR` x cold, on the brackets' evidence.

    Each capacity is a bracket [pass_rps, fail_rps): the capacity is at least pass_rps and under
    fail_rps. Warm is *shown* under WARM_FLOOR x cold when warm's lowest failing rate is at most
    WARM_FLOOR x cold's highest passing one (warm capacity < warm fail_rps <= WARM_FLOOR x cold
    pass_rps <= WARM_FLOOR x cold capacity): ``("fault", message)``. When only the passing
    ends say so (warm pass_rps < WARM_FLOOR x cold pass_rps, brackets that still allow a ratio
    of WARM_FLOOR or more) the search's resolution cannot tell: ``("unresolved", message)``,
    a note, not a fault (a bracket w x its passing rate wide puts the passing end anywhere in
    1/(1 + w)-1 x the boundary: at w = 0.5, 0.67-1, so two equal capacities can read under 0.8
    on their passing ends; measured: 0.78 on the real-engine pack). None when
    warm is not under the floor on either reading, or a state was not measured.
    """
    cold_sel, warm_sel = open_loop.get("cold") or {}, open_loop.get("warm") or {}
    cold, warm = cold_sel.get("capacity_rps"), warm_sel.get("capacity_rps")
    warm_fail = (warm_sel.get("bracket") or {}).get("fail_rps")
    if not cold:
        return None
    floor = WARM_FLOOR * cold
    if warm_fail is not None and warm_fail <= floor:
        return "fault", (
            f"warm capacity is under {WARM_FLOOR:g} x cold: warm did not meet the gates at "
            f"{warm_fail:g} RPS, at most {WARM_FLOOR:g} x the {cold:g} RPS cold met: a prefix "
            "cache that hits does not make a server slower; the warm points measured something "
            "else (the host, the client, a cache that did not hold)"
        )
    if warm_sel and (warm is not None or warm_fail is not None) and (warm or 0.0) < floor:
        cold_fail = (cold_sel.get("bracket") or {}).get("fail_rps")

        def end(rps: float | None) -> str:
            return f"{rps:g}" if rps is not None else "-"

        warm_words = (
            f"warm's passing rate {warm:g} RPS is under {WARM_FLOOR:g} x cold's {cold:g}"
            if warm is not None else f"no warm rate met the gates (the lowest, {warm_fail:g} RPS)"
        )  # fmt: skip
        return "unresolved", (
            f"{warm_words}, but the brackets (warm [{end(warm)}, {end(warm_fail)}), cold "
            f"[{cold:g}, {end(cold_fail)})) allow warm at {WARM_FLOOR:g} x cold or more: at "
            "this resolution the pack cannot tell warm from cold, a note, not a fault"
        )
    return None


def measurement_notes(open_loop: dict[str, Any]) -> list[dict[str, Any]]:
    """Sanity checks the brackets are too wide to settle (:func:`warm_floor_check`'s
    ``unresolved``): what the reader would otherwise take for a fault."""
    check = warm_floor_check(open_loop)
    if check is None or check[0] != "unresolved":
        return []
    return [{"kind": "warm-below-cold-unresolved", "cache_state": "warm", "message": check[1]}]


def measurement_faults(open_loop: dict[str, Any], closed: dict[str, Any]) -> list[dict[str, Any]]:
    """Results that contradict how a server works: each a measurement fault, not a finding.

    - ``warm-below-cold``: the warm capacity shown under :data:`WARM_FLOOR` x the cold one on
      the brackets' evidence (:func:`warm_floor_check`);
    - ``above-saturation``: a state's capacity above its closed loop's highest request
      throughput (1 + :data:`SATURATION_SLACK`) when the closed loop was pushed past its
      latency gates (its largest level misses them), so that throughput is the server's most;
    - ``pass-above-failure``: a rate meeting the gates above one that does not (non-monotonic).
    """
    faults: list[dict[str, Any]] = []
    warm_check = warm_floor_check(open_loop)
    if warm_check is not None and warm_check[0] == "fault":
        faults.append({"kind": "warm-below-cold", "cache_state": "warm", "message": warm_check[1]})
    for state, sel in sorted(open_loop.items()):
        cap = sel.get("capacity_rps")
        curve = (closed.get(state) or {}).get("curve") or []
        if cap is not None and curve and not curve[-1]["meets_latency_gates"]:
            top = max(p["request_throughput_rps"] or 0.0 for p in curve)
            if top > 0 and cap > (1 + SATURATION_SLACK) * top:
                faults.append({
                    "kind": "above-saturation",
                    "cache_state": state,
                    "message": f"{state} capacity {cap:g} RPS is above the closed loop's highest "
                    f"request throughput {top:.3g} RPS (concurrency pushed past the latency "
                    "gates): no load carries more than the server's saturation",
                })  # fmt: skip
        if sel.get("non_monotonic_passes_rps"):
            above = ", ".join(f"{r:g}" for r in sel["non_monotonic_passes_rps"])
            below = (sel.get("next_rate_up") or {}).get("offered_rps")
            faults.append({
                "kind": "pass-above-failure",
                "cache_state": state,
                "message": f"{state}: {above} RPS met the gates above "
                + (f"{below:g} RPS" if below is not None else "a rate")
                + ", which did not: capacity does not come back at a higher load; the evidence "
                "at these rates is noise or a disturbed host",
            })  # fmt: skip
    return faults


def mix_p95_context(pack) -> float:
    """P95 of prompt + output tokens over the manifest's class mix: the nearest-rank P95 of
    contexts drawn from its distributions (:func:`capacity_pack.decide.contexts.
    manifest_contexts`), the mix's own P95, not a mix of the classes' P95s."""
    from capacity_pack.decide.contexts import manifest_contexts
    from capacity_pack.decide.sizing import context_tail

    return float(context_tail(manifest_contexts(pack), 1.0).p95_tokens)


def memory_inputs(pack) -> dict[str, float] | None:
    """Memory sizing inputs: the plan's ``memory`` block, or the simulator profile's shape."""
    if pack.plan.memory is not None:
        return pack.plan.memory.model_dump()
    if pack.target.kind != "sim":
        return None
    from capacity_pack.sim.profile import load_profile

    prof = load_profile(pack.target.profile)
    gib = 1024**3 / 1e9
    tp = prof.engine.tensor_parallel
    return {
        "accelerator_memory_gb": prof.hardware.hbm_gib * gib * tp,
        "weights_gb": prof.model.weight_bytes / 1e9,
        "overhead_gb": prof.engine.non_kv_memory_gib * gib * tp,
        "kv_bytes_per_token": prof.model.kv_bytes_per_token,
        "memory_utilization": prof.engine.gpu_memory_utilization,
        "margin_gb": 0.0,
    }


def build_plan(
    capacity: dict[str, Any], reports: list[dict[str, Any]], pack,
    tables: list[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Replicas and GPUs for the pack's peak, from throughput and from memory; cost; the fit
    at the planned concurrency. ``tables``: the points' requests tables (the contexts sent at
    the capacity point are read from them; without them, drawn from the manifest)."""
    from capacity_pack.decide import sizing

    state = capacity["primary_cache_state"]
    sel = capacity["open_loop"].get(state, {})
    per_replica = sel.get("capacity_per_replica_rps")
    if per_replica is None:
        return {
            "required_replicas": None,
            "required_gpus": None,
            "reason": f"no SLO-compliant capacity was found ({state} cache): no plan can be "
            "derived from this pack; see the decision and the failing gates",
        }
    thr = sizing.plan_replicas(
        pack.plan.peak_rps,
        per_replica,
        pack.effective_target_utilization,
        pack.plan.gpus_per_replica,
        redundancy_replicas=pack.plan.redundancy_replicas,
        warm_pool_replicas=pack.plan.warm_pool_replicas,
    )
    mem_plan = None
    mem = memory_inputs(pack)
    at_capacity = [
        r for r in reports
        if r.get("mode") == "open" and r["cache_state"] == state
        and float(r["offered_rps"]) == float(sel["capacity_rps"])
    ]  # fmt: skip
    p95_e2e_s = max(
        (c["p95_e2e_ms"] or 0.0) for r in at_capacity for c in r["classes"].values()
    ) / 1e3 if at_capacity else None  # fmt: skip
    sent = sent_contexts(at_capacity, tables, pack)
    tail = sizing.context_tail(sent.contexts, mem["kv_bytes_per_token"] if mem else 0.0)
    if mem is not None and p95_e2e_s:
        try:
            mem_plan = sizing.plan_memory(
                pack.plan.peak_rps,
                p95_e2e_s,
                mem["kv_bytes_per_token"],
                tail.p95_tokens,
                mem["accelerator_memory_gb"],
                mem["weights_gb"],
                mem["overhead_gb"],
                mem["memory_utilization"],
            )
        except ValueError as err:
            mem_plan = None
            memory_error = str(err)
        else:
            memory_error = None
    else:
        memory_error = (
            "no memory inputs (plan.memory): declare the model shape and the device memory to "
            "size by KV memory"
        )
    plan = sizing.combine(thr, mem_plan)
    plan["capacity_cache_state"] = state
    plan["p95_e2e_s_at_capacity"] = p95_e2e_s
    plan["p95_context_tokens"] = tail.p95_tokens
    plan["max_context_tokens"] = tail.max_tokens
    plan["contexts"] = {**sent.describe(), **tail.model_dump()}
    if memory_error:
        plan["memory_note"] = memory_error
    if mem is not None:
        plan.update(tail_fit(plan, mem, sent, tail, p95_e2e_s))
    if pack.plan.price_per_gpu_hour is not None:
        # Only successes divide the bill: failures at the capacity point raise the unit cost.
        error_rate = max((r["error_rate"] or 0.0) for r in at_capacity) if at_capacity else 0.0
        plan["cost"] = sizing.cost(
            plan["required_gpus"],
            pack.plan.price_per_gpu_hour,
            pack.plan.peak_rps * (1 - error_rate),
            pack.plan.requests_per_task,
        )
        plan["cost"]["error_rate_at_capacity"] = error_rate
    bw = effective_bandwidth(capacity, pack)
    if bw is not None:
        plan["effective_bandwidth"] = bw
    return plan


def tail_fit(
    plan: dict[str, Any], mem: dict[str, float], sent, tail, p95_e2e_s: float | None
) -> dict[str, Any]:
    """The two fit probes of a plan, against one replica's budget (memory x memory
    utilization - margin, as the memory plan and the preflight probe count it): one request
    at the maximum context sent, and the requests in flight at the planned load
    (:func:`capacity_pack.decide.sizing.kv_at_concurrency`): the peak over the replicas
    carrying the load (the plan's, redundancy and warm pool left out: they are what survives
    a failure, not extra room), each request in flight for its measured time in system."""
    from capacity_pack.decide import sizing

    budget = mem["accelerator_memory_gb"] * mem["memory_utilization"]

    def probe(kv_gb: float) -> dict[str, Any]:
        result = sizing.fit_probe(
            budget, mem["margin_gb"], mem["weights_gb"], kv_gb, mem["overhead_gb"]
        ).model_dump()
        return {"weights_gb": mem["weights_gb"], "kv_gb": kv_gb,
                "overhead_gb": mem["overhead_gb"], **result}  # fmt: skip

    out: dict[str, Any] = {
        "fit_probe_one_request_at_max_context": {
            "context_tokens": tail.max_tokens,
            **probe(tail.kv_bytes_per_request_max / 1e9),
        }
    }
    load_replicas = (
        plan["required_replicas"] - plan["throughput"]["redundancy_replicas"]
        - plan["throughput"]["warm_pool_replicas"]
    )  # fmt: skip
    rate = plan["throughput"]["peak_rps"] / load_replicas
    if sent.durations_s is None and not p95_e2e_s:
        out["fit_probe_at_planned_concurrency"] = {
            "verdict": None,
            "reason": "no time in system measured at the capacity point",
        }
        return out
    held = sizing.kv_at_concurrency(
        rate, sent.contexts, mem["kv_bytes_per_token"], durations_s=sent.durations_s,
        # Without per-request times, the largest class P95 E2E stands in for E[S]: a P95 lies
        # above the mean unless the top 5 % dominate it, so the in-flight count errs high.
        mean_time_in_system_s=None if sent.durations_s is not None else p95_e2e_s,
    )  # fmt: skip
    out["fit_probe_at_planned_concurrency"] = {
        "load_replicas": load_replicas,
        "time_in_system_source": (
            "the sent requests' send-to-last-event times at the capacity point"
            if sent.durations_s is not None
            else "the largest class P95 E2E at the capacity point, no requests table"
        ),
        "contexts_source": sent.source,
        **held.model_dump(),
        **probe(held.kv_gb),
    }
    return out


def tail_fit_sentences(plan: dict[str, Any]) -> list[str]:
    """The plan's contexts and fit probes in words (README and pack page), paragraph by
    paragraph; empty for a plan without them."""
    ctx = plan.get("contexts")
    if not ctx:
        return []

    def g(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3g}" if abs(v) < 1e3 else f"{v:,.0f}"

    def fit(f: dict[str, Any]) -> str:
        return (f"weights {g(f['weights_gb'])} + KV {g(f['kv_gb'])} + overhead "
                f"{g(f['overhead_gb'])} = {g(f['need_gb'])} GB against a budget of "
                f"{g(f['budget_gb'])} GB (memory x utilization - margin): **{f['verdict']}** "
                f"(headroom {g(f['headroom_gb'])} GB)")  # fmt: skip

    out = [
        f"Contexts (prompt + output tokens) {ctx['label']}: P50 {ctx['p50_tokens']}, "
        f"**P95 {ctx['p95_tokens']}**, P99 {ctx['p99_tokens']}, **max {ctx['max_tokens']}** "
        f"(mean {g(ctx['mean_tokens'])}); KV per request "
        f"{g(ctx['kv_bytes_per_request_p95'] / 1e9)} GB at the P95 (what the memory plan sizes "
        f"with), {g(ctx['kv_bytes_per_request_max'] / 1e9)} GB at the max.",
        "",
    ]
    one = plan.get("fit_probe_one_request_at_max_context")
    if one:
        out += [f"One request at the max context ({one['context_tokens']} tokens, "
                f"{g(one['kv_gb'])} GB of KV) next to the weights and overhead: {fit(one)}.",
                ""]  # fmt: skip
    conc = plan.get("fit_probe_at_planned_concurrency")
    if conc and conc.get("verdict"):
        out += [
            f"Fit probe at the planned concurrency: {g(conc['rate_per_replica_rps'])} RPS per "
            f"replica ({conc['load_replicas']} replicas carry the peak) x "
            f"{g(conc['mean_time_in_system_s'])} s time in system ("
            f"{'mean of ' if conc['duration_weighted'] else ''}"
            f"{conc['time_in_system_source']}) = "
            f"{g(conc['in_flight_mean'])} requests in flight (Little's law; P95 "
            f"{conc['in_flight_p95']} as a Poisson count), holding {g(conc['kv_mean_gb'])} GB "
            f"of KV on average and **{g(conc['kv_gb'])} GB at P95** (the sum over a Poisson "
            "count of contexts drawn "
            + (
                "in proportion to their time in system"
                if conc["duration_weighted"]
                else "uniformly"
            )
            + f", {conc['resamples']} resamples, seed {conc['seed']}); weights + that KV + "
            f"overhead: {fit(conc)}."
            + (
                " The requests in flight at the planned load would not fit on a replica: the "
                "plan needs more replicas, or more memory per replica, than its replica count "
                "says."
                if conc["verdict"] == "does-not-fit"
                else ""
            ),
            "",
        ]
    elif conc:
        out += [f"Fit probe at the planned concurrency: not run ({conc['reason']}).", ""]
    return out


def effective_bandwidth(capacity: dict[str, Any], pack) -> dict[str, Any] | None:
    """Decode-bound effective bandwidth from the measured single-user TPOT (the formula in
    :mod:`capacity_pack.decide.sizing`): tokens/s = 1000 / the lowest class P95 TPOT at
    concurrency 1 (a conservative decode rate),
    bytes moved per token = the replica's weights, effective bandwidth = tokens/s x bytes per
    token, MBU = effective / spec bandwidth."""
    from capacity_pack.decide import sizing

    mem = memory_inputs(pack)
    single = None
    for cur in capacity["closed_loop"].values():
        single = single or cur.get("single_user")
    if mem is None or single is None:
        return None
    tpots = [v for v in single["p95_tpot_ms"].values() if v]
    if not tpots:
        return None
    tokens_per_s = 1000.0 / min(tpots)
    bytes_gb = mem["weights_gb"]
    spec = None
    if pack.target.kind == "sim":
        from capacity_pack.sim.profile import load_profile

        prof = load_profile(pack.target.profile)
        spec = prof.hardware.bandwidth_tb_s * 1000 * prof.engine.tensor_parallel
    result = sizing.bandwidth(bytes_gb, tokens_per_s * bytes_gb, spec).model_dump()
    result["measured_from"] = "single-user P95 TPOT (closed loop, concurrency 1)"
    return result


def decision_metrics(capacity: dict[str, Any], plan: dict[str, Any]) -> dict[str, float | None]:
    """The decision and its run-to-run variation as flat metrics for the MLflow parent run."""
    out: dict[str, float | None] = {
        "required_replicas": plan.get("required_replicas"),
        "required_gpus": plan.get("required_gpus"),
    }
    for state, sel in capacity["open_loop"].items():
        out[f"{state}.capacity_rps"] = sel["capacity_rps"]
        out[f"{state}.capacity_per_replica_rps"] = sel["capacity_per_replica_rps"]
        out[f"{state}.goodput_per_gpu_rps"] = sel["goodput_per_gpu_rps"]
        out[f"{state}.capacity_per_gpu_nominal_rps"] = sel["capacity_per_gpu_nominal_rps"]
        b = sel["bracket"]
        out[f"{state}.bracket_pass_rps"] = b["pass_rps"]
        out[f"{state}.bracket_fail_rps"] = b["fail_rps"]
        out[f"{state}.bracket_width_rps"] = b["width_rps"]
        out[f"{state}.bracket_resolution_rps"] = b["resolution_rps"]
        out[f"{state}.bracket_reached"] = None if b["reached"] is None else float(b["reached"])
        at = next((r for r in sel["rates"] if r["offered_rps"] == sel["capacity_rps"]), None)
        if at is None:
            continue
        g = at["variation"]["observed_goodput_rps"]
        out[f"{state}.goodput_rps_mean"] = g["mean"]
        out[f"{state}.goodput_rps_min"] = g["min"]
        out[f"{state}.goodput_rps_max"] = g["max"]
        for name, c in at["variation"]["classes"].items():
            out[f"{state}.{name}.attainment_min"] = c["attainment"]["min"]
            out[f"{state}.{name}.p95_ttft_ms_mean"] = c["p95_ttft_ms"]["mean"]
            out[f"{state}.{name}.p95_tpot_ms_mean"] = c["p95_tpot_ms"]["mean"]
    for state, cur in capacity["closed_loop"].items():
        op = cur["operating_point"]
        out[f"{state}.operating_point_concurrency"] = op["concurrency"] if op else None
        out[f"{state}.operating_point_output_tps"] = op["output_throughput_tps"] if op else None
        out[f"{state}.saturation_output_tps"] = cur["saturation_tps"]
    return out


def max_context_tokens(pack) -> int:
    """The longest request the pack can send: max prompt + max output over its classes."""
    from capacity_pack.plan.manifest import length_stats

    return max(length_stats(c.input_tokens).max + length_stats(c.output_tokens).max
               for c in pack.workload)  # fmt: skip


def preflight_fit(pack) -> dict[str, Any]:
    """Fit probe before any measurement: does one request at the pack's longest context fit
    next to the weights and overhead (``does-not-fit`` stops the pack), and is the context
    within the simulated model's limit?"""
    from capacity_pack.decide import sizing

    mem = memory_inputs(pack)
    context = max_context_tokens(pack)
    if mem is None:
        return {"checked": False, "context_tokens": context,
                "reason": "no model shape or device memory declared (plan.memory)"}  # fmt: skip
    kv_gb = mem["kv_bytes_per_token"] * context / 1e9
    result = sizing.fit_probe(
        mem["accelerator_memory_gb"] * mem["memory_utilization"],
        mem["margin_gb"],
        mem["weights_gb"],
        kv_gb,
        mem["overhead_gb"],
    ).model_dump()
    out: dict[str, Any] = {"checked": True, "context_tokens": context, "kv_gb": kv_gb, **result}
    if pack.target.kind == "sim":
        from capacity_pack.sim.profile import load_profile

        limit = load_profile(pack.target.profile).model.max_model_len
        out["max_model_len"] = limit
        if context > limit:
            reason = f"context {context} exceeds the model's max_model_len {limit}"
            out.update(fits=False, verdict="does-not-fit", reason=reason)
    return out
