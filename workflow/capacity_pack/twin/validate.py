"""The twin's prediction against the measurement: capacity and per-class attainment errors.

The twin's prediction file is made from the calibration and the manifest alone, before the
open-loop points are read; this module compares it with the pack's measured ``capacity.json``.
Per cache state, measured bracket [p_m, f_m), predicted [p_t, f_t): predicted capacity
c_t = (p_t + f_t) / 2 (one end when the other is missing), capacity error
e = d(c_t, [p_m, f_m]) / p_m (else f_m), signed error (c_t - mid_m) / mid_m, per-class
attainment errors, trusted when e <= ``twin.tolerance_rel`` in every state both sides have, and
where untrusted the calibration's largest misfit. A state without a measured bracket is listed,
never counted as agreement.

Method: docs/twin.md, "Prediction, then validation".
"""

from __future__ import annotations

import math
from typing import Any

from capacity_pack.vocab.words import bracket_text

DEFAULT_TOLERANCE_REL = 0.15


def predicted_capacity(pass_rps: float | None, fail_rps: float | None) -> float | None:
    """The twin's capacity point from its bracket (see the module docstring)."""
    if pass_rps is not None and fail_rps is not None:
        return (pass_rps + fail_rps) / 2.0
    return pass_rps if pass_rps is not None else fail_rps


def capacity_error(
    predicted: float | None, pass_m: float | None, fail_m: float | None
) -> float | None:
    """``d(predicted, [pass_m, fail_m]) / reference``: 0 inside the measured bracket; None when
    either side has nothing to compare."""
    if predicted is None or (pass_m is None and fail_m is None):
        return None
    lo = pass_m if pass_m is not None else 0.0
    hi = fail_m if fail_m is not None else math.inf
    gap = lo - predicted if predicted < lo else (predicted - hi if predicted > hi else 0.0)
    reference = pass_m if pass_m is not None else fail_m
    return gap / reference if reference else None


def measured_attainment(capacity_state: dict[str, Any]) -> dict[float, dict[str, float]]:
    """Per measured rate, each class's attainment pooled over the rate's deciding repeats
    (``capacity.json``'s ``variation``: passing / successful requests summed over repeats)."""
    out: dict[float, dict[str, float]] = {}
    for row in capacity_state.get("rates", []):
        per_class = {}
        for name, entry in ((row.get("variation") or {}).get("classes") or {}).items():
            pooled = (entry.get("attainment") or {}).get("pooled") or {}
            if pooled.get("value") is not None:
                per_class[name] = float(pooled["value"])
        if per_class:
            out[float(row["offered_rps"])] = per_class
    return out


def compare_state(
    state: str,
    predicted: dict[str, Any],
    measured: dict[str, Any],
    tolerance_rel: float,
    predicted_attainment: dict[float, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """One cache state's comparison. ``predicted``: the prediction file's state entry
    (``pass_rps``, ``fail_rps``); ``measured``: ``capacity.json``'s ``open_loop[state]``;
    ``predicted_attainment``: the twin's per-class attainment at the measured rates."""
    b = measured.get("bracket", {})
    pass_m, fail_m = b.get("pass_rps"), b.get("fail_rps")
    pass_t, fail_t = predicted.get("pass_rps"), predicted.get("fail_rps")
    c_t = predicted_capacity(pass_t, fail_t)
    err = capacity_error(c_t, pass_m, fail_m)
    signed = None
    if c_t is not None and pass_m is not None and fail_m is not None:
        mid = (pass_m + fail_m) / 2.0
        signed = (c_t - mid) / mid
    rows = []
    measured_att = measured_attainment(measured)
    for rate in sorted(measured_att):
        pred = (predicted_attainment or {}).get(rate)
        for name, value in sorted(measured_att[rate].items()):
            p = pred.get(name) if pred else None
            rows.append(
                {
                    "offered_rps": rate,
                    "class": name,
                    "measured": value,
                    "predicted": p,
                    "error": p - value if p is not None else None,
                }
            )
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    within = err is not None and err <= tolerance_rel + 1e-12
    if err is None:
        why = "nothing to compare: " + (
            "the twin predicts no bracket" if c_t is None else "no measured open-loop bracket"
        )
    elif within:
        why = f"capacity error {err:.1%} <= tolerance {tolerance_rel:.0%}"
    else:
        why = f"capacity error {err:.1%} > tolerance {tolerance_rel:.0%}"
    return {
        "cache_state": state,
        "predicted": {"pass_rps": pass_t, "fail_rps": fail_t, "capacity_rps": c_t},
        "measured": {"pass_rps": pass_m, "fail_rps": fail_m},
        "capacity_error_rel": err,
        "signed_error_rel": signed,
        "within_tolerance": within if err is not None else None,
        "why": why,
        "sentence": (
            f"{state}: the twin predicts {c_t:.3g} RPS "
            f"({bracket_text(pass_t, fail_t)}), measured {bracket_text(pass_m, fail_m)}"
            if c_t is not None
            else f"{state}: the twin predicts no bracket; measured " + bracket_text(pass_m, fail_m)
        ),
        "attainment": rows,
        "attainment_error_max_abs": max(errors) if errors else None,
    }


def largest_misfit(residuals: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The calibration's worst replayed closed-loop metric (``calibration.json``'s per-point
    residual summaries): point, concurrency, metric and median relative error; None without
    summaries."""
    worst = None
    for row in residuals or []:
        for metric in ("ttft", "tpot"):
            err = row.get(f"{metric}_median_rel_error")
            if err is not None and (worst is None or err > worst["median_rel_error"]):
                worst = {
                    "point": row.get("point"),
                    "concurrency": row.get("concurrency"),
                    "metric": metric,
                    "median_rel_error": float(err),
                }
    return worst


def misfit_words(misfit: dict[str, Any]) -> str:
    return (
        f"the calibrated model's largest misfit to the closed loop is "
        f"{misfit['metric'].upper()} at concurrency {misfit['concurrency']} "
        f"(median error {misfit['median_rel_error']:.0%})"
    )


def validate(
    prediction: dict[str, Any],
    capacity: dict[str, Any],
    tolerance_rel: float = DEFAULT_TOLERANCE_REL,
    predicted_attainment: dict[str, dict[float, dict[str, float]]] | None = None,
) -> dict[str, Any]:
    """The validation document: every cache state the prediction and the measurement share,
    and the verdict ``trusted`` (every compared state within ``tolerance_rel``; False when no
    state could be compared)."""
    open_loop = capacity.get("open_loop", {})
    states = []
    for state, pred in sorted(prediction.get("cache_states", {}).items()):
        if state not in open_loop:
            continue
        states.append(
            compare_state(
                state,
                pred,
                open_loop[state],
                tolerance_rel,
                (predicted_attainment or {}).get(state),
            )
        )
    compared = [s for s in states if s["capacity_error_rel"] is not None]
    trusted = bool(compared) and all(s["within_tolerance"] for s in compared)
    if not compared:
        why = "no cache state has both a predicted and a measured bracket"
    elif trusted:
        worst = max(compared, key=lambda s: s["capacity_error_rel"])
        why = (
            f"every cache state within {tolerance_rel:.0%} "
            f"(largest error {worst['capacity_error_rel']:.1%}, {worst['cache_state']})"
        )
    else:
        bad = [s for s in compared if not s["within_tolerance"]]
        why = "; ".join(f"{s['cache_state']}: {s['why']}" for s in bad)
    misfit = largest_misfit((prediction.get("calibration") or {}).get("residuals"))
    if not trusted and misfit is not None:
        why += f"; {misfit_words(misfit)}"
    return {
        "tolerance_rel": tolerance_rel,
        "trusted": trusted,
        "why": why,
        "largest_misfit": misfit,
        "states": states,
    }


def readme_lines(validation: dict[str, Any] | None) -> list[str]:
    """The pack README's section: predicted vs measured capacity, per cache state."""
    if validation is None:
        return []
    label = "trusted" if validation["trusted"] else "**untrusted**"
    out = [
        "## The twin: predicted vs measured capacity",
        "",
        "The engine model, calibrated from this pack's closed-loop points, predicted each cache "
        "state's open-loop capacity in virtual time before the open-loop points were read "
        f"(docs/twin.md). The twin is {label}: {validation['why']}.",
        "",
        "| cache state | twin predicts | measured | capacity error | largest attainment error |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for s in validation["states"]:
        p, m = s["predicted"], s["measured"]
        c = p["capacity_rps"]
        err = s["capacity_error_rel"]
        att = s["attainment_error_max_abs"]
        out.append(
            f"| {s['cache_state']} | "
            + (f"{c:.3g} RPS ({bracket_text(p['pass_rps'], p['fail_rps'])})" if c else "none")
            + f" | {bracket_text(m['pass_rps'], m['fail_rps'])} | "
            + (f"{err:.1%}" if err is not None else "n/a")
            + " | "
            + (f"{att:.3f}" if att is not None else "n/a")
            + " |"
        )
    out.append("")
    return out
