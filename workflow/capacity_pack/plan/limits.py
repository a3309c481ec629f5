"""Limits of a pack's values: the bound of every number, and which revisions are mutable.

Bounds. Every number of a pack is finite (no inf or nan) and within a bound a demanding user
can accept, checked on every field by the unit its name ends in (:func:`bound_of`):

- ``*_seconds``/``*_s`` durations: at most 30 days (2,592,000 s); ``*_ms``: the same in ms
  (a name ending ``*_per_s`` is a bandwidth, not a duration);
- ``*_rps`` rates: at most 1,000,000 requests per second;
- ``*_requests`` and ``*_per_worker`` counts: at most 100,000,000 requests;
- ``*_tokens``: at most 10,000,000 tokens (the longest context windows published);
- ``repeats``: at most 1,000;
- any other number: an integer fits int64 (|n| <= 2^63 - 1, as numpy and parquet store it),
  a float has |x| <= 1e12 (so no sum or product of two overflows to inf).

Fields with a bound of their own (``Field(le=...)`` in the section models that
:mod:`capacity_pack.plan.manifest` gathers): an open-loop rate at least 0.001 RPS (point ids print
rates to 6 decimals), closed-loop concurrency at most 100,000, shared prefixes at most 1,000,000 (an
array of that many weights), length-distribution parameters at most 10,000,000 tokens, an arrival CV
at most 10, a drill's rate multiplier at most 100, the schedule seed below 2^63. Per point, the
manifest also bounds the requests a schedule holds (``MAX_REQUESTS``) and how long an open-loop
point's initial requests take to arrive (``MAX_DURATION_S``).

Mutable revisions. A revision-like field names a moving target when, lower-cased and split at
``- _ . / : ~ ^ @ + { }`` and white space, one of its words is ``latest``, ``main``, ``master``,
``head``, ``stable``, ``nightly``, ``dev`` or ``current``, or it is empty or holds a glob
character (``* ? [``): ``v2-latest``, ``nightly-2026``, ``origin/main``, ``HEAD~1`` and
``1.0.dev`` are mutable. Whole words only, so ``development-free``, ``mainline``, ``v2.1``,
``nightly2026`` and ``1.0.dev3`` (a published pre-release) are not.
"""

from __future__ import annotations

import re
from typing import Any

DAY_S = 86_400
MAX_DURATION_S = 30 * DAY_S
MAX_RATE_RPS = 1_000_000
MIN_OPEN_LOOP_RPS = 0.001
MAX_REQUESTS = 100_000_000
MAX_TOKENS = 10_000_000
MAX_REPEATS = 1_000
MAX_CONCURRENCY = 100_000
MAX_SHARED_PREFIXES = 1_000_000
MAX_ARRIVAL_CV = 10.0
MAX_INT = 2**63 - 1
MAX_FLOAT = 1e12

MUTABLE_REVISIONS = frozenset(
    {"latest", "main", "master", "head", "stable", "nightly", "dev", "current", "*"}
)
REVISION_WORD_SEPARATORS = re.compile(r"[-_./:~^@+{}\s]+")


def bound_of(field: str) -> tuple[float, str]:
    """The largest magnitude field ``field`` may hold and its unit, by its name's ending; the
    unit is empty for a field with the generic bound (int64, or 1e12 for a float)."""
    if field.endswith("_per_s"):
        return MAX_FLOAT, ""
    if field.endswith(("_seconds", "_s")):
        return MAX_DURATION_S, "seconds (30 days)"
    if field.endswith("_ms"):
        return MAX_DURATION_S * 1000, "ms (30 days)"
    if field.endswith("_rps"):
        return MAX_RATE_RPS, "requests per second"
    if field.endswith(("_requests", "_per_worker")):
        return MAX_REQUESTS, "requests"
    if field.endswith("_tokens"):
        return MAX_TOKENS, "tokens"
    if field == "repeats":
        return MAX_REPEATS, "repeats"
    return MAX_FLOAT, ""


def check_bound(field: str, value: Any) -> None:
    """Raise ValueError, stating the bound, when number ``value`` of ``field`` exceeds it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    limit, unit = bound_of(field)
    if unit:
        if abs(value) > limit:
            raise ValueError(f"must be at most {limit:,} {unit}")
    elif isinstance(value, int):
        if abs(value) > MAX_INT:
            raise ValueError("must fit a 64-bit integer (|n| <= 2^63 - 1)")
    elif abs(value) > MAX_FLOAT:
        raise ValueError(f"must be at most {MAX_FLOAT:g} in magnitude")


def is_mutable_revision(value: str) -> bool:
    """Whether ``value`` names a moving target (rule in the module docstring)."""
    v = value.strip().lower()
    if not v or any(ch in v for ch in "*?["):
        return True
    return any(word in MUTABLE_REVISIONS for word in REVISION_WORD_SEPARATORS.split(v))
