"""Measurement faults: results that contradict how a server works, and the checks a bracket
is too wide to settle.

A fault is not a finding: it says the pack measured something besides the target (the host,
the client, a cache that did not hold). :func:`measurement_faults` lists them,
:func:`measurement_notes` the checks the brackets cannot settle at their resolution
(:func:`warm_floor_check`'s ``unresolved``).
"""

from __future__ import annotations

from typing import Any

from capacity_pack.vocab.words import bracket_text

#: Warm capacity under this share of cold is a measurement fault: a prefix cache that hits
#: does not make a server slower (measured: 0.41 RPS warm against 2.8 cold with an analysis job
#: beside the warm points).
WARM_FLOOR = 0.8
#: An open-loop capacity above the closed loop's highest request throughput by more than this
#: share is a measurement fault: no load pattern carries more than the server's saturation.
SATURATION_SLACK = 0.05


def warm_floor_check(open_loop: dict[str, Any]) -> tuple[str, str] | None:
    """Warm against :data:`WARM_FLOOR` x cold on the brackets' evidence: ``("fault", message)``
    when warm fail_rps <= WARM_FLOOR x cold pass_rps, ``("unresolved", message)`` when only the
    passing ends are under the floor (measured: 0.78 on the real-engine pack), else None.
    Method: docs/metrics.md, "Capacity and repeats" ("Measurement faults")."""
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
        warm_words = (
            f"warm's passing rate {warm:g} RPS is under {WARM_FLOOR:g} x cold's {cold:g}"
            if warm is not None else f"no warm rate met the gates (the lowest, {warm_fail:g} RPS)"
        )  # fmt: skip
        return "unresolved", (
            f"{warm_words}, but the brackets (warm {bracket_text(warm, warm_fail)}, cold "
            f"{bracket_text(cold, cold_fail)}) allow warm at {WARM_FLOOR:g} x cold or more: at "
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
    """Results that contradict how a server works, each a fault, not a finding:
    ``warm-below-cold`` (:func:`warm_floor_check`), ``above-saturation`` (above the closed
    loop's highest throughput x (1 + :data:`SATURATION_SLACK`) when its largest level misses the
    latency gates) and ``pass-above-failure`` (non-monotonic)."""
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
