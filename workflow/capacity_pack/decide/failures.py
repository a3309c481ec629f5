"""What stopped a rate passing: per repeat, each class that missed and why, and the binding metric.

Every rate that does not meet the gates names, per repeat that did not pass, each class the
report names (its reasons in the gates' words) with the **binding metric**: of the class's
successful requests, whether more were over the TTFT cutoff or over the TPOT cutoff (the
report's per-cutoff counts; see :func:`binding_metric`), and the point-level reasons (error
rate, queue trend, client-bound), with each class's ``attribution``: the causes of its misses
(queueing, prefill, decode, preemption, client scheduling) as the analyze stage estimated them
from the scraped series (the request autopsy's ``server_series`` method), None without misses.
:func:`failure_summary` says it in one line.
"""

from __future__ import annotations

from typing import Any

from capacity_pack.evidence.gates import CLASS_ATTAINMENT


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
