"""Statistics across the repeats of one point: what varies from run to run, stated honestly.

Every quantity gets n, mean, min and max. Unbounded ones (goodput, throughput, P95 latencies):
the Student-t interval mean +- t(1/2 + c/2, n - 1) s / sqrt(n), clipped to [0, inf), only from
:data:`MIN_REPEATS_FOR_T_INTERVAL` (5) repeats on, else None with ``interval_note``. Bounded ones
(attainment, error rate): Wilson's score interval of the counts pooled over the repeats
(without counts: the mean with a t-interval clipped to [0, 1], same repeat rule). Describes the
evidence, decides nothing.

Method: docs/metrics.md, "Capacity and repeats" ("Statistics across repeats").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from capacity_pack.artifacts import SloReport
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
    # scipy.special's inverse of Student's t CDF (stdtrit(df, p) = scipy.stats.t.ppf(p, df)):
    # scipy.stats costs the capacity job about 0.5 s of import.
    from scipy.special import stdtrit

    q = float(stdtrit(x.size - 1, 0.5 + confidence / 2))
    half = q * float(x.std(ddof=1)) / math.sqrt(x.size)
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


def variation(reports: list[SloReport], classes: list[str], confidence: float = 0.95) -> dict:
    """Run-to-run variation of a point's repeats: rates and P95 latencies (t or range),
    error rate and every class's attainment (pooled binomial)."""
    out: dict[str, Any] = {
        key: t_interval([getattr(r, key) for r in reports], confidence)
        for key in ("observed_goodput_rps", "request_throughput_rps", "output_throughput_tps")
    }
    out["error_rate"] = pooled_proportion(
        [r.error_rate for r in reports],
        [r.attempted - r.successful for r in reports],
        [r.attempted for r in reports],
        confidence,
        "error rate",
    )
    out["classes"] = {}
    for c in classes:
        rows = [r.classes[c] for r in reports]
        entry = {
            "attainment": pooled_proportion(
                [row.attainment for row in rows],
                [row.passing_count for row in rows],
                [row.successful_count for row in rows],
                confidence,
                "attainment",
            )
        }
        for key in ("p95_ttft_ms", "p95_tpot_ms", "p95_e2e_ms"):
            entry[key] = t_interval([getattr(row, key) for row in rows], confidence)
        out["classes"][c] = entry
    return out
