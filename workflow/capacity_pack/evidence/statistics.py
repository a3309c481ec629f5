"""The statistics of the SLO analysis: percentiles, intervals, early stopping, trend, Little's Law.

- Percentiles are the nearest rank of :mod:`capacity_pack.vocab.percentile`.
- Bounds on an attainment (Wilson's interval, the confidence sequence) are in
  :mod:`capacity_pack.binomial`.
- **Early stopping** (MLPerf LoadGen's rule for tail-latency percentiles): with h of n requests
  over the latency cutoff, the p-th percentile is proven at or under the cutoff with confidence c
  when BinomCDF(h; n, 1 - p) <= 1 - c; :func:`early_stopping_min_samples` gives the least such n.
- **Mann-Kendall trend test** over a series x_1..x_n: S = sum_{i<j} sign(x_j - x_i), with the
  tie-corrected Var(S) = [n(n-1)(2n+5) - sum_t t(t-1)(2t+5)] / 18 (t: sizes of tied groups),
  Z = (S - sign(S)) / sqrt(Var S), one-sided p of an increase = 1 - Phi(Z); the Theil-Sen slope
  is the median of (x_j - x_i) / (j - i). A queue is ``growing`` when Z > z_0.95 and the slope
  times the window (in samples) reaches one request, ``flat`` otherwise, ``inconclusive`` with
  fewer than 8 samples.
- **Little's Law** L = lambda W, checked over the population of all terminal requests in a
  window: L_obs = the time-average of requests in flight (their intervals clipped to the window),
  lambda = completions in the window / its length, W = their mean time to terminal status; the
  relative gap |L_obs - lambda W| / L_obs is flagged above 10%.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

from capacity_pack.binomial import binomial_cdf, least_n

if TYPE_CHECKING:
    import pandas as pd  # annotations only: the analyzer's import path stays free of pandas


def early_stopping_min_samples(
    overlatency: int, percentile: float = 0.99, confidence: float = 0.99, limit: int = 10**9
) -> int | None:
    """MLPerf LoadGen early stopping: the smallest n proving the percentile with ``overlatency``
    requests over the cutoff, i.e. the least n with BinomCDF(h; n, 1 - percentile) <= 1 - c."""
    q = 1.0 - percentile
    alpha = 1.0 - confidence

    def proven(n: int) -> bool:
        return binomial_cdf(overlatency, n, q) <= alpha

    # The CDF falls as n grows: proven(n) is false below some n and true from it on.
    return least_n(proven, max(1, overlatency + 1), limit)


def mann_kendall(values: np.ndarray) -> dict[str, float | int | None]:
    """Mann-Kendall trend test: S, Z (tie-corrected variance), one-sided p of an increase."""
    x = np.asarray(values, dtype=float)
    n = x.size
    if n < 3:
        return {"n": int(n), "s": None, "z": None, "p_increasing": None, "sen_slope": None}
    diff = x[None, :] - x[:, None]
    s = float(np.sign(diff[np.triu_indices(n, 1)]).sum())
    _, counts = np.unique(x, return_counts=True)
    var = (n * (n - 1) * (2 * n + 5) - float((counts * (counts - 1) * (2 * counts + 5)).sum())) / 18
    z = 0.0 if s == 0 or var <= 0 else (s - math.copysign(1, s)) / math.sqrt(var)
    i, j = np.triu_indices(n, 1)
    slopes = (x[j] - x[i]) / (j - i)
    return {
        "n": int(n),
        "s": s,
        "z": float(z),
        "p_increasing": float(1 - NormalDist().cdf(z)),
        "sen_slope": float(np.median(slopes)),
    }


def trend_of(
    series: pd.DataFrame, t_start_ns: int, t_end_ns: int, *, min_samples: int = 8
) -> dict[str, Any]:
    """Queue trend over [t_start, t_end] from a series with columns t_offset_ns and value."""
    window = series[(series["t_offset_ns"] >= t_start_ns) & (series["t_offset_ns"] <= t_end_ns)]
    window = window.sort_values("t_offset_ns")
    values = window["value"].to_numpy(dtype=float)
    mk = mann_kendall(values)
    result: dict[str, Any] = {
        "samples": int(values.size),
        **mk,
        # The evidence itself, so a reader can redo the test.
        "series": {
            "t_offset_s": (window["t_offset_ns"].to_numpy() / 1e9).round(3).tolist(),
            "value": values.tolist(),
        },
    }
    if values.size < min_samples:
        result["trend"] = "inconclusive"
        return result
    span_samples = values.size - 1
    growth = (mk["sen_slope"] or 0.0) * span_samples
    result["growth_over_window"] = growth
    significant = mk["z"] is not None and mk["z"] > NormalDist().inv_cdf(0.95)
    result["trend"] = "growing" if significant and growth >= 1.0 else "flat"
    return result


def littles_law(
    sent_ns: np.ndarray, end_ns: np.ndarray, t_start_ns: int, t_end_ns: int, tolerance: float = 0.1
) -> dict[str, Any]:
    """Little's Law check over all terminal requests in the window (see the module docstring)."""
    span = t_end_ns - t_start_ns
    if span <= 0 or sent_ns.size == 0:
        return {"checked": False}
    overlap = np.clip(np.minimum(end_ns, t_end_ns) - np.maximum(sent_ns, t_start_ns), 0, None)
    l_obs = float(overlap.sum() / span)
    done = (end_ns >= t_start_ns) & (end_ns <= t_end_ns)
    lam = float(done.sum() / (span / 1e9))
    w = float(((end_ns - sent_ns)[done]).mean() / 1e9) if done.any() else 0.0
    l_est = little_in_flight(lam, w)
    gap = abs(l_obs - l_est) / l_obs if l_obs > 0 else None
    return {
        "checked": True,
        "average_in_flight": l_obs,
        "completion_rate_rps": lam,
        "mean_time_to_terminal_s": w,
        "little_estimate": l_est,
        "relative_gap": gap,
        "flagged": bool(gap is not None and gap > tolerance),
    }


def little_in_flight(rate_rps: float, mean_seconds: float) -> float:
    """Little's law, L = lambda W: the average number in flight at ``rate_rps`` arrivals a
    second each staying ``mean_seconds`` (23.9 requests/s x 1.8 s = 43.02 in flight)."""
    if rate_rps < 0 or mean_seconds < 0:
        raise ValueError("rate and time must be non-negative")
    return rate_rps * mean_seconds
