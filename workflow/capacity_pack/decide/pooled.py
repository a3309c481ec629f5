"""A rate's evidence: its repeats pooled (:func:`deciding_reports`, :func:`pooled_attainment`,
or the engine model's control variate), its status (:func:`rate_status`) and the evidence in
words (:func:`rate_evidence`). Method: docs/metrics.md, "Capacity and repeats".
"""

from __future__ import annotations

from typing import Any

from capacity_pack.artifacts import SloReport
from capacity_pack.binomial import (
    cluster_design_effect,
    confidence_sequence,
    control_variate_interval,
)
from capacity_pack.vocab.words import SHOWN_FAIL, SHOWN_PASS, UNDECIDED


def deciding_reports(reports: list[SloReport]) -> list[SloReport]:
    """The repeats of one rate that decide it: a client-bound, disturbed or superseded one
    (:func:`void`) is set aside whenever another repeat decides; with none deciding all are
    kept, and the rate is not shown to pass (docs/search.md, "A point that decides nothing is
    measured again")."""
    valid = [r for r in reports if not void(r)]
    return valid or list(reports)


def void(report: SloReport) -> str | None:
    """Why a repeat decides nothing (``client-bound``, ``disturbed`` or ``superseded``), None
    if it does."""
    # Disturbed first: a host busy with other work also makes the client fall behind.
    if report.disturbed:
        return "disturbed"
    if report.client_bound:
        return "client-bound"
    return "superseded" if report.superseded else None


def poolable(report: SloReport) -> bool:
    """Whether a report carries what pooling needs (its gate, its other gates' outcome and each
    class's time blocks); a report analyzed before 2026-12-05 does not."""
    return (
        report.attainment_gate is not None
        and report.besides_attainment is not None
        and all(c.attainment_blocks is not None for c in report.classes.values())
    )


def pooled_attainment(reports: list[SloReport]) -> dict[str, dict[str, Any]]:
    """Per class, the attainment of a rate's repeats pooled into one sample (every report
    :func:`poolable`): k = sum of passing_c, n = sum of successful_c, the design effect of all
    the repeats' time blocks together (:func:`capacity_pack.binomial.cluster_design_effect`),
    the confidence sequence at the effective sample k / deff of n / deff against the gate, each
    repeat's own attainment, and the evidence in words: ``shown to pass`` (lower bound >=
    gate), ``shown to fail`` (upper bound < gate), else ``cannot decide at this sample size``."""
    gate = float(reports[0].attainment_gate.min)
    sample_gate = reports[0].attainment_gate.min_successful
    out: dict[str, dict[str, Any]] = {}
    for name in reports[0].classes:
        entries = [r.classes[name] for r in reports]
        k = sum(e.passing_count for e in entries)
        n = sum(e.successful_count for e in entries)
        n_j = [v for e in entries for v in e.attainment_blocks.successful]
        k_j = [v for e in entries for v in e.attainment_blocks.passing]
        confidence = float(entries[0].attainment_ci_confidence or 0.95)
        deff = cluster_design_effect(n_j, k_j)
        ci = confidence_sequence(k / deff, n / deff, confidence, gate) if n else None
        low, high = ci if ci is not None else (0.0, 1.0)
        estimate = k / n if n else None
        method = "pooled"
        cv = [e.control_variate for e in entries]
        if n and all(cv):
            # The engine model as a control variate (capacity_pack.twin.control): the estimate
            # and its interval come from the live - model differences on the same requests.
            estimate, (low, high) = control_variate_interval(
                n_j,
                [v for c in cv for v in c.diff_blocks],
                sum(c.disagreements for c in cv),
                float(cv[0].long_run),
                float(cv[0].long_run_var),
                confidence,
            )
            method = "control variate"
        per_repeat = [e.attainment for e in entries]
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
                "long_run": float(cv[0].long_run),
                "model_attainment": sum(c.model_passing for c in cv) / n,
                "disagreements": sum(c.disagreements for c in cv),
            }
    return out


def rate_status(reports: list[SloReport]) -> str:
    """A rate's status from the repeats that decide it, pooled: the first of ``inconclusive``,
    ``fail``, ``misses``, ``inconclusive``, ``pass``, ``marginal`` that holds (docs/metrics.md,
    "Capacity and repeats", states each)."""
    if not reports:
        return "inconclusive"
    # The twin's virtual point (capacity_pack.twin.virtual_point) judges the analyzer's own
    # dict, which names no point: read it as a report of no point.
    reports = [r if isinstance(r, SloReport) else _unnamed(r) for r in reports]
    if not all(poolable(r) for r in reports):
        return _status_by_repeats(reports)
    if any(void(r) for r in reports):
        return "inconclusive"  # no repeat of the rate decides (deciding_reports kept them all)
    others = [r.besides_attainment.outcome for r in reports]
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


def _unnamed(doc: dict[str, Any]) -> SloReport:
    identity = {"point": "", "key": "", "cache_state": "", "repeat": 0, "mode": "open"}
    return SloReport.parse(identity | doc, "the analyzer's report")


def _status_by_repeats(reports: list[SloReport]) -> str:
    """The status of reports that cannot be pooled (analyzed before pooling existed): every
    repeat must pass."""
    verdicts = [r.verdict for r in reports]
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
