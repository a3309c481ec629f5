"""Statistics across the repeats of one point: what varies from run to run, stated honestly.

Every quantity gets n (the repeats with a value), mean, min and max. Its interval depends on
what the quantity is:

- **Unbounded** (goodput, throughput, P95 latencies): the Student-t interval of the mean,
  mean +- t(1/2 + c/2, n - 1) s / sqrt(n) with s the sample standard deviation (ddof = 1), only
  from :data:`MIN_REPEATS_FOR_T_INTERVAL` (5) repeats on. Below that the interval is ``None``
  and ``interval_note`` says so ("range of 2 repeats; no interval below 5 repeats"): with 1 to
  3 degrees of freedom the t quantile (12.71, 4.30, 3.18 at 95 %) multiplies a standard
  deviation itself estimated from two to four values, so the "interval" is mostly the noise of
  s (at n = 2, s / sqrt(2) is half the range, so it reaches 12.7 half-ranges either side of the
  mean) and the normality it assumes cannot be checked; the range says what was seen without
  claiming more. Latencies and rates are non-negative, so their interval is intersected with
  [0, inf): the true mean lies there, so the intersection keeps the interval's coverage.
- **Bounded in [0, 1]** (attainment, error rate): a binomial interval of the counts pooled over
  the repeats, never a t-interval. Attainment: k = sum of passing_c, n = sum of successful_c;
  error rate: k = sum of failed, n = sum of attempted; Wilson's score interval of k / n at the
  confidence c, which lies inside [0, 1] by construction (Wilson, JASA 1927; Brown, Cai and
  DasGupta, Statist. Sci. 2001, for its coverage). Pooling treats the repeats as one sample with
  one true proportion; the per-repeat min and max show whether they agree. It describes the
  pooled evidence and decides nothing: each repeat's verdict is taken on its own report's
  bound (a confidence sequence, valid under the sweep's early stopping and extension, which a
  fixed-sample Wilson interval of counts so gathered is not).
  Without the counts (a report that lacks them) the mean of the per-repeat values is given with
  a t-interval clipped to [0, 1] under the same repeat rule.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from capacity_pack.binomial import wilson_interval

#: The fewest repeats from which a Student-t interval of a mean is reported.
MIN_REPEATS_FOR_T_INTERVAL = 5
UNIT = (0.0, 1.0)
NON_NEGATIVE = (0.0, math.inf)


def _finite(values: list[Any]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and math.isfinite(float(v))], dtype=float)


def _summary(x: np.ndarray, confidence: float) -> dict[str, Any]:
    empty = x.size == 0
    return {
        "n": int(x.size),
        "mean": None if empty else float(x.mean()),
        "min": None if empty else float(x.min()),
        "max": None if empty else float(x.max()),
        "interval": None,
        "interval_method": None,
        "interval_note": "no values" if empty else None,
        "confidence": confidence,
    }


def t_interval(
    values: list[Any],
    confidence: float = 0.95,
    bounds: tuple[float, float] | None = NON_NEGATIVE,
    min_repeats: int = MIN_REPEATS_FOR_T_INTERVAL,
) -> dict[str, Any]:
    """n, mean, min, max and, from ``min_repeats`` values on, the Student-t interval of the
    mean intersected with ``bounds`` (see the module docstring); below, the range only."""
    x = _finite(values)
    out = _summary(x, confidence)
    if x.size == 0:
        return out
    if x.size < min_repeats:
        what = "one repeat" if x.size == 1 else f"range of {x.size} repeats"
        out["interval_note"] = f"{what}; no interval below {min_repeats} repeats"
        return out
    from scipy.stats import t

    half = float(t.ppf(0.5 + confidence / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    low, high = out["mean"] - half, out["mean"] + half
    note = f"Student-t interval of the mean of {x.size} repeats"
    if bounds is not None and (low < bounds[0] or high > bounds[1]):
        low, high = max(low, bounds[0]), min(high, bounds[1])
        note += f", intersected with the quantity's range [{bounds[0]:g}, {bounds[1]:g}]"
    out.update(interval=[low, high], interval_method="student-t", interval_note=note)
    return out


def pooled_proportion(
    values: list[Any],
    successes: list[Any],
    trials: list[Any],
    confidence: float = 0.95,
    what: str = "proportion",
) -> dict[str, Any]:
    """A [0, 1] quantity over repeats: the per-repeat n, mean, min, max of ``values`` and the
    Wilson interval of the pooled counts sum(successes) / sum(trials)."""
    if any(v is None for v in (*successes, *trials)) or not trials:
        out = t_interval(values, confidence, bounds=UNIT)
        out["pooled"] = None
        return out
    out = _summary(_finite(values), confidence)
    k, n = int(sum(successes)), int(sum(trials))
    out["pooled"] = {"count": k, "trials": n, "value": k / n if n else None}
    ci = wilson_interval(k, n, confidence)
    if ci is None:
        out["interval_note"] = f"no trials pooled over {len(trials)} repeat(s)"
        return out
    out.update(
        interval=list(ci),
        interval_method="wilson-pooled",
        interval_note=f"Wilson interval of the {what} pooled over {len(trials)} repeat(s): "
        f"{k} / {n}",
    )
    return out


def _counts(reports: list[dict[str, Any]], key: str) -> list[Any]:
    return [r.get(key) for r in reports]


def variation(
    reports: list[dict[str, Any]], classes: list[str], confidence: float = 0.95
) -> dict[str, Any]:
    """Run-to-run variation of a point's repeats: rates and P95 latencies (t or range),
    error rate and every class's attainment (pooled binomial)."""
    failed = [
        (r["attempted"] - r["successful"]) if r.get("attempted") is not None
        and r.get("successful") is not None else None
        for r in reports
    ]  # fmt: skip
    out: dict[str, Any] = {
        "observed_goodput_rps": t_interval(_counts(reports, "observed_goodput_rps"), confidence),
        "request_throughput_rps": t_interval(
            _counts(reports, "request_throughput_rps"), confidence
        ),
        "output_throughput_tps": t_interval(_counts(reports, "output_throughput_tps"), confidence),
        "error_rate": pooled_proportion(
            _counts(reports, "error_rate"),
            failed,
            _counts(reports, "attempted"),
            confidence,
            "error rate",
        ),  # fmt: skip
        "classes": {},
    }
    for c in classes:
        rows = [r["classes"][c] for r in reports]
        entry = {
            "attainment": pooled_proportion(
                [row.get("attainment") for row in rows],
                [row.get("passing_count") for row in rows],
                [row.get("successful_count") for row in rows],
                confidence,
                "attainment",
            )
        }
        for key in ("p95_ttft_ms", "p95_tpot_ms", "p95_e2e_ms"):
            entry[key] = t_interval([row.get(key) for row in rows], confidence)
        out["classes"][c] = entry
    return out
