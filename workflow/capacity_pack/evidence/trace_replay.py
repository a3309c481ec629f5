"""Why a verbatim trace point is under-sampled: the words its SLO report gives.

A verbatim trace point (``client.trace.replay: verbatim``, :mod:`capacity_pack.plan.traces`)
sends the trace's requests and no more: no extension block is drawn when a class has fewer
successful requests than ``acceptance.min_successful_samples_per_class``, so such a class stays
under-sampled and the point ``inconclusive`` (the sample-size gate, :mod:`.gates`). Each such
class gets a reason that says so, with its successful count, the gate and the requests of its
class the trace holds (warm-up included): ``short: under-sampled, 41 successful of 50 needed;
a verbatim trace is never extended (it holds 44 short requests)``. The capacity table's
"limited by" column and the pack README quote it.
"""

from __future__ import annotations

from typing import Any


def under_sampled_reasons(
    report: dict[str, Any], trace: dict[str, Any] | None, min_samples: int
) -> list[str]:
    """One reason per under-sampled class of a verbatim trace point; none otherwise."""
    if not trace or trace.get("replay") != "verbatim":
        return []
    rows = trace.get("class_rows") or {}
    return [
        f"{c}: under-sampled, {report['classes'][c]['successful_count']} successful of "
        f"{min_samples} needed; a verbatim trace is never extended (it holds "
        f"{rows.get(c, 0)} {c} requests)"
        for c in report.get("under_sampled_classes") or []
    ]
