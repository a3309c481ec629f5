"""What stopped a rate passing: per repeat, each class that missed and why, and the binding metric.

Per repeat that did not pass: each class the report names, with its :func:`binding_metric` and
its ``attribution`` (the causes of its misses as the analyze stage estimated them), and the
point-level reasons; :func:`failure_summary` says it in one line.

Method: docs/metrics.md, "Capacity and repeats" ("What failed").
"""

from __future__ import annotations

from typing import Any

from capacity_pack.artifacts import SloReport
from capacity_pack.artifacts.slo_report import ClassReport
from capacity_pack.evidence.gates import CLASS_ATTAINMENT


def binding_metric(entry: ClassReport) -> tuple[str | None, dict[str, Any]]:
    """Which cutoff excluded more of a class's successful requests (``ttft``, ``tpot``,
    ``ttft+tpot`` or None) and the evidence: from the report's over-cutoff counts, else from
    P95 / cutoff (``basis`` says which; docs/metrics.md, "What failed")."""
    ttft, tpot = entry.p99_ttft_early_stopping, entry.p99_tpot_early_stopping
    if ttft is not None and tpot is not None:
        evidence = {"basis": "requests over each cutoff", "over_ttft_cutoff": ttft.over_cutoff,
                    "over_tpot_cutoff": tpot.over_cutoff}  # fmt: skip
        a, b = float(ttft.over_cutoff), float(tpot.over_cutoff)
    else:
        ratios = []
        for metric in ("ttft", "tpot"):
            p95 = getattr(entry, f"p95_{metric}_ms")
            cut = getattr(entry, f"request_{metric}_cutoff_ms")
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


def repeat_failures(report: SloReport, classes: list[str]) -> dict[str, Any]:
    """What stopped one repeat from passing: each class it names with its reasons and binding
    metric, and the point-level reasons (error rate, queue trend, client-bound...)."""
    reasons = report.verdict_reasons
    under = set(report.under_sampled_classes or [])
    named: list[dict[str, Any]] = []
    for c in classes:
        own = [r for r in reasons if r.startswith(f"{c}: ")]
        entry = report.classes[c]
        if c in under and not own:
            own = [f"{c}: under-sampled"]
        if not own and getattr(entry, CLASS_ATTAINMENT.passes_key) is not False:
            continue
        metric, evidence = binding_metric(entry) if _about_attainment(own, entry) else (None, {})
        named.append(
            {
                "class": c,
                "reasons": own or [f"{c}: class SLO gate not passed"],
                "attainment": entry.attainment,
                "binding_metric": metric,
                "binding_evidence": evidence,
                # What the class's misses were made of (the analyze stage's autopsy estimate).
                "attribution": entry.attribution,
            }
        )
    prefixes = tuple(f"{c}: " for c in classes)
    # dict.fromkeys: a reason can be both a label and a failed gate ("queue trend inconclusive").
    point = list(dict.fromkeys(
        r for r in reasons if not r.startswith(prefixes) and not r.startswith("under-sampled")
    ))  # fmt: skip
    return {"repeat": report.repeat, "verdict": report.verdict, "key": report.key,
            "classes": named, "point_reasons": point}  # fmt: skip


def _about_attainment(reasons: list[str], entry: ClassReport) -> bool:
    """The class missed on latency (an attainment reason), not only on samples or errors."""
    if any("attainment" in r for r in reasons):
        return True
    return not reasons and getattr(entry, CLASS_ATTAINMENT.passes_key) is False


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
