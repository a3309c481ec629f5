"""The one percentile estimator of the pack: the nearest rank.

**Formula.** The p-quantile of n values sorted x_(1) <= ... <= x_(n) is x_(k) with
k = max(1, ceil(p n)), index k - 1 from 0: always an observed value, never interpolated
(Hyndman and Fan, "Sample quantiles in statistical packages", 1996: definition 1, the inverse
of the empirical CDF). Not numpy's default (linear interpolation between order statistics, which
vLLM's benchmark reports): a nearest rank is a latency some request had. p n is rounded to 9
decimals before the ceiling, so that a product like 0.07 x 100 = 7.000000000000001 in binary
floating point takes rank 7, not 8.

Every P50/P95/P99 of the pack (a point's latency tails, a drill window's, a trace's lengths, the
memory sizing's context tail) comes from :func:`rank_index`; numpy's and pandas' interpolating
estimators are not used for a reported percentile.
"""

from __future__ import annotations

import math

import numpy as np


def rank_index(p: float, n: int) -> int:
    """The 0-based index of the nearest-rank p-quantile among n sorted values (n >= 1).

    Formula: max(0, ceil(round(p n, 9)) - 1)."""
    return max(0, math.ceil(round(p * n, 9)) - 1)


def nearest_rank(sorted_values: np.ndarray, p: float) -> float | None:
    """The nearest-rank p-quantile of an already sorted array (None when it is empty)."""
    n = sorted_values.size
    if n == 0:
        return None
    return float(sorted_values[rank_index(p, n)])


def nearest_ranks(values: np.ndarray, ps: tuple[float, ...]) -> list[float | None]:
    """:func:`nearest_rank` at each p of an unsorted array, by one partition instead of a sort
    (O(n)); ``values`` is reordered in place."""
    n = values.size
    if n == 0:
        return [None] * len(ps)
    ranks = [rank_index(p, n) for p in ps]
    values.partition(sorted(set(ranks)))
    return [float(values[k]) for k in ranks]


def percentiles(values: np.ndarray, withhold_p99: bool) -> dict[str, float | None]:
    """Nearest-rank P50, P95, P99 (None when withheld) and the maximum of the finite values."""
    s = np.sort(values[np.isfinite(values)])
    return {
        "p50": nearest_rank(s, 0.50),
        "p95": nearest_rank(s, 0.95),
        "p99": None if withhold_p99 else nearest_rank(s, 0.99),
        "max": float(s[-1]) if s.size else None,
    }
