"""The capacity bracket, defined once: the search's, the capacity decision's and the twin's.

**The bracket** (:func:`bracket`) of tested values (rates, or closed-loop levels) in increasing
order, each with its status: low = the highest value meeting the gates (:func:`meets_gates`)
with every lower tested value meeting them, high = the lowest tested value above low. A value
meeting them above one that does not never moves it (non-monotonic); low is None when the
lowest value does not meet the gates, high is None when every value does.
**The resolution** (:func:`resolution_of`, :func:`centred_resolution`, :func:`within`).
**The evidence bracket** (:func:`evidence_bracket`) is compare's, a different statistic on
purpose: its upper end must be shown to ``fail``, since a rate merely not passing differs
between two runs of one pack by chance.

Method: docs/search.md, "A rate's status and the bracket"; docs/metrics.md, "Comparing two
packs". The module imports nothing of the project: the per-point analysis reaches it through
the twin's control variate, and what it imports reruns every analysis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: Rate statuses that meet every gate on the rate's pooled estimate: a capacity is selected
#: among them. ``pass``: shown at the stated confidence; ``marginal``: on the estimate only.
MEETS = ("pass", "marginal")
#: Slack of the width comparison: a width equal to the resolution in decimal is within it.
WITHIN_SLACK = 1e-9


def meets_gates(status: str | None) -> bool:
    """Whether a rate status meets every gate on the pooled estimate (:data:`MEETS`)."""
    return status in MEETS


def bracket(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[float | None, float | None]:
    """(low, high) of ``rows`` (sorted by ``key``, each with a ``status``): the module
    docstring's walk."""
    low = None
    for row in rows:
        if not meets_gates(row["status"]):
            return low, row[key]
        low = row[key]
    return low, None


def _setting(settings: Any, name: str) -> Any:
    if settings is None:
        return None
    if isinstance(settings, Mapping):
        return settings.get(name)
    return getattr(settings, name, None)


def resolution_of(settings: Any, pass_rps: float | None) -> float | None:
    """The search's resolution in RPS at the passing rate ``pass_rps``: ``resolution_rps``,
    else ``resolution_rel`` x ``pass_rps``; None without either, or relative with no passing
    rate. ``settings``: anything with those two fields (the pack's ``sweep.search``, the
    search's inputs, a mapping), None without a search."""
    fixed, rel = _setting(settings, "resolution_rps"), _setting(settings, "resolution_rel")
    if fixed is not None:
        return float(fixed)
    if rel is not None and pass_rps is not None:
        return float(rel) * pass_rps
    return None


def centred_resolution(settings: Any, centre: float) -> float | None:
    """The width w of a bracket centred on ``centre`` whose resolution is :func:`resolution_of`
    at its passing end centre - w/2: ``resolution_rps``, else rel x centre / (1 + rel / 2)."""
    fixed = resolution_of(settings, None)
    if fixed is not None:
        return fixed
    rel = _setting(settings, "resolution_rel")
    return float(rel) * centre / (1 + float(rel) / 2) if rel is not None else None


def within(width: float | None, resolution: float | None) -> bool | None:
    """Whether a bracket ``width`` wide is within ``resolution`` (None: either is unknown)."""
    if width is None or resolution is None:
        return None
    return width <= resolution + WITHIN_SLACK


def evidence_bracket(sel: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Compare's [L, U) of one pack's cache state (``capacity.json``'s ``open_loop[state]``):
    L the capacity (0 when none), U the lowest tested rate above it whose status is ``fail``
    (infinity when none); the module docstring says why it is not :func:`bracket`."""
    if not sel:
        return None
    low = sel.get("capacity_rps")
    fails = [
        float(r["offered_rps"]) for r in sel.get("rates", [])
        if r.get("status") == "fail" and (low is None or float(r["offered_rps"]) > low)
    ]  # fmt: skip
    return {"low": float(low) if low is not None else 0.0, "high": min(fails, default=math.inf),
            "capacity_rps": low}  # fmt: skip


def evidence_disjoint(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Whether two evidence brackets are disjoint: one pack fails a rate at or below one the
    other passes (U_B <= L_A or U_A <= L_B)."""
    if a is None or b is None:
        return False
    return b["high"] <= a["low"] or a["high"] <= b["low"]
