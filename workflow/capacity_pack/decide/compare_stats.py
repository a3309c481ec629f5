"""``capacity-pack compare``'s statistics: Newcombe's interval for a difference of attainments,
and the pooled between-repeat variation of log P95 latencies (method: docs/metrics.md,
"Comparing two packs").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from capacity_pack.binomial import wilson_interval

#: The latency percentiles compared at matched rates, and their names.
LATENCY_METRICS = {"p95_ttft_ms": "P95 TTFT", "p95_tpot_ms": "P95 TPOT", "p95_e2e_ms": "P95 E2E"}


def newcombe_interval(
    k_a: float, n_a: float, k_b: float, n_b: float, confidence: float
) -> tuple[float, float] | None:
    """Newcombe's hybrid score interval for p_B - p_A (module docstring); None without trials
    on either side. Counts may be fractional (effective samples)."""
    wa, wb = wilson_interval(k_a, n_a, confidence), wilson_interval(k_b, n_b, confidence)
    if wa is None or wb is None:
        return None
    pa, pb = k_a / n_a, k_b / n_b
    d = pb - pa
    low = d - math.sqrt((pb - wb[0]) ** 2 + (wa[1] - pa) ** 2)
    high = d + math.sqrt((wb[1] - pb) ** 2 + (pa - wa[0]) ** 2)
    return max(-1.0, low), min(1.0, high)


def excludes_zero(interval: tuple[float, float] | None) -> bool:
    return interval is not None and (interval[0] > 0 or interval[1] < 0)


_D2: dict[int, float] = {}


def d2(n: int) -> float:
    """The expected range of n independent standard normal values (Tippett's d2):
    integral of 1 - Phi(x)^n - (1 - Phi(x))^n over the real line."""
    if n < 2:
        raise ValueError(f"d2 needs n >= 2, got {n}")
    if n not in _D2:
        from scipy.integrate import quad
        from scipy.stats import norm

        value, _ = quad(lambda x: 1 - norm.cdf(x) ** n - norm.sf(x) ** n, -12, 12, limit=200)
        _D2[n] = float(value)
    return _D2[n]


@dataclass(frozen=True)
class LogSample:
    """One pack's P95 at one rate and class: its repeats on the log scale."""

    n: int
    mean_log: float
    #: Variance of the log values (None below two repeats).
    var_log: float | None
    mean: float
    low: float
    high: float
    basis: str  # "repeats" (per-point reports) or "range" (capacity.json min / max / mean)


def log_sample(values: list[float] | None, summary: dict[str, Any] | None) -> LogSample | None:
    """From the repeats' values when given, else from capacity.json's n / mean / min / max."""
    import numpy as np

    vals = [float(v) for v in values or [] if v is not None and float(v) > 0]
    if vals:
        x = np.log(np.asarray(vals))
        var = float(x.var(ddof=1)) if x.size >= 2 else None
        return LogSample(len(vals), float(x.mean()), var, float(np.mean(vals)), min(vals),
                         max(vals), "repeats")  # fmt: skip
    s = summary or {}
    n, mean, lo, hi = s.get("n") or 0, s.get("mean"), s.get("min"), s.get("max")
    if not n or mean is None or lo is None or hi is None or min(mean, lo, hi) <= 0:
        return None
    var = (math.log(hi / lo) / d2(n)) ** 2 if n >= 2 else None
    return LogSample(int(n), math.log(mean), var, float(mean), float(lo), float(hi), "range")


def pooled_log_variance(samples: list[LogSample]) -> tuple[float | None, int]:
    """s^2 = sum (n_i - 1) v_i / sum (n_i - 1) over the samples with a variance, and its df."""
    df = sum(s.n - 1 for s in samples if s.var_log is not None)
    if df == 0:
        return None, 0
    return sum((s.n - 1) * s.var_log for s in samples if s.var_log is not None) / df, df


def log_difference(a: LogSample, b: LogSample) -> float:
    """m_B - m_A: mean log P95s when both sides have their repeats, else the logs of the means
    (one kind on both sides: the mean of logs sits below the log of the mean)."""
    if a.basis == b.basis == "repeats":
        return b.mean_log - a.mean_log
    return math.log(b.mean) - math.log(a.mean)


def log_ratio_test(
    a: LogSample, b: LogSample, var: float | None, df: int, confidence: float
) -> dict[str, Any]:
    """B / A of a P95 and whether it exceeds the pooled variation (module docstring)."""
    d = log_difference(a, b)
    ratio = math.exp(d)
    if var is None or df == 0:
        return {"ratio": ratio, "interval": None, "t": None, "beyond": False,
                "why": "no repeated point: no estimate of run-to-run variation"}  # fmt: skip
    from scipy.stats import t as student

    se = math.sqrt(var * (1 / a.n + 1 / b.n))
    q = float(student.ppf(0.5 + confidence / 2, df))
    stat = d / se if se > 0 else (math.inf if d else 0.0)
    return {
        "ratio": ratio,
        "interval": [math.exp(d - q * se), math.exp(d + q * se)],
        "t": stat,
        "beyond": abs(stat) > q,
        "why": None,
    }
