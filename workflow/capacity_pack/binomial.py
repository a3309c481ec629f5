"""Bounds on a binomial proportion (an SLO attainment): fixed-sample and sequential.

- Wilson score interval (one look at a fixed sample), z = Phi^-1(1/2 + c/2):
  centre = (p + z^2/2n) / (1 + z^2/n), half-width = z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n).
- Confidence sequence (any number of looks): the beta-binomial mixture of Robbins (1970),
  M_n(p) = B(a + k, b + n - k) / B(a, b) / (p^k (1 - p)^(n - k)), CS_n = {p : M_n(p) < 1/alpha},
  centred on the gate g (a = g m, b = (1 - g) m, m = :data:`PRIOR_WEIGHT`); the sequential
  outcome is ``pass`` when its lower end >= g, ``fail`` when its upper end < g.
  :func:`quick_outcome` settles it from the mixture at g -/+ 1e-6 (log M_n is convex in p).
- Serially correlated outcomes: the time-block design effect (batch means over blocks of
  send time), deff = max(1, var(p) / (p (1 - p) / N)), the bounds taken at k / deff of n / deff.

- The binomial CDF and its quantile (:func:`binomial_cdf`, :func:`binomial_quantile`), for the
  early-stopping sample size and the order-statistic interval of a quantile.

Method: docs/metrics.md, 'Point statistics' and 'In-run decisions' (the effective sample).
Why not scipy.stats: it has the Wilson interval but no confidence sequence, and importing it
costs every Snakemake job that analyses a point about 0.5 s; the binomial CDF comes from
scipy.special's ``bdtr`` (the regularized incomplete beta; scipy.stats' ``binom``, which uses
Boost's, agrees to 4e-12: tests/unit/base/test_binomial.py).
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

#: The weight, in observations, of the gate-centred Beta mixing density.
PRIOR_WEIGHT = 10.0
Outcome = Literal["pass", "fail", "undecided"]
_EPS = 1e-12


#: The fewest blocks :func:`design_effect` estimates from.
MIN_BATCHES = 5
#: Seconds of send time per block of the design effect (module docstring).
BLOCK_S = 5.0


def block_seconds(span_s: float) -> float:
    """The block length for outcomes sent over ``span_s`` seconds: :data:`BLOCK_S`, or a
    fifth of the span when that is shorter (one block, of any length, for a span of 0)."""
    return min(BLOCK_S, span_s / MIN_BATCHES) if span_s > 0 else BLOCK_S


def block_counts(outcomes, sent_ns, block_s: float | None = None):
    """(block length s, outcomes per block n_j, met per block k_j) of outcomes sent at
    ``sent_ns`` (any order), blocks of ``block_s`` seconds from the first send
    (:func:`block_seconds` of the span when None); empty blocks are left out."""
    import numpy as np

    met = np.asarray(outcomes, dtype=bool)
    sent = np.asarray(sent_ns, dtype=np.int64)
    if met.size == 0:
        return block_s or BLOCK_S, np.zeros(0, np.int64), np.zeros(0, np.int64)
    offset = (sent - sent.min()) / 1e9
    if block_s is None:
        block_s = block_seconds(float(offset.max()))
    block = (offset // block_s).astype(np.int64)
    n_j = np.bincount(block)
    k_j = np.bincount(block, weights=met).astype(np.int64)
    keep = n_j > 0
    return block_s, n_j[keep], k_j[keep]


def cluster_design_effect(n_j, k_j) -> float:
    """The design effect of blocks with n_j outcomes of which k_j met (module docstring): the
    blocks of one run, or of several independent runs together."""
    import numpy as np

    n = np.asarray(n_j, dtype=float)
    k = np.asarray(k_j, dtype=float)
    m, total = int(n.size), float(n.sum())
    if m < MIN_BATCHES or total <= 0:
        return 1.0
    p = float(k.sum()) / total
    if p <= 0.0 or p >= 1.0:
        return 1.0
    var = m / (m - 1) * float(((k - p * n) ** 2).sum()) / total**2
    return max(1.0, var / (p * (1.0 - p) / total))


def design_effect(outcomes, sent_ns) -> float:
    """The time-block variance inflation of a proportion from outcomes (booleans) sent at
    ``sent_ns`` (see the module docstring); 1 with fewer than :data:`MIN_BATCHES` blocks."""
    _, n_j, k_j = block_counts(outcomes, sent_ns)
    return cluster_design_effect(n_j, k_j)


def control_variate_interval(
    n_j,
    d_j,
    disagreements: int,
    long_run: float,
    long_run_var: float,
    confidence: float = 0.95,
) -> tuple[float, tuple[float, float]]:
    """(estimate, interval) of an attainment by a control variate (capacity_pack.twin.control):
    mu + dbar, dbar = sum d_j / N the mean difference live - model over N = sum n_j requests in
    blocks of n_j holding differences summing to d_j, mu = ``long_run`` known with variance
    ``long_run_var``.

    var(dbar) is the larger of the blocks' batch-means variance,
    m / (m - 1) sum_j (d_j - dbar n_j)^2 / N^2 (m blocks, as :func:`cluster_design_effect`),
    and the independent-outcomes one, (D2 / N - dbar^2) / (N - 1) with D2 = ``disagreements``
    (each d_i is -1, 0 or 1, so sum d_i^2 counts the requests the two disagree on): a few
    blocks under-state a variance, never the other way. The interval is the normal one,
    estimate +- z sqrt(var(dbar) + long_run_var), z = Phi^-1(1/2 + c/2), intersected with
    [0, 1]: a fixed-sample interval at one look (the rate's decision), not a confidence
    sequence."""
    import numpy as np

    n = np.asarray(n_j, dtype=float)
    d = np.asarray(d_j, dtype=float)
    total = float(n.sum())
    if total <= 0:
        raise ValueError("no requests")
    dbar = float(d.sum()) / total
    m = int(n.size)
    batch = m / (m - 1) * float(((d - dbar * n) ** 2).sum()) / total**2 if m > 1 else 0.0
    iid = max(0.0, (disagreements / total - dbar * dbar) / (total - 1)) if total > 1 else 0.0
    var = max(batch, iid) + max(0.0, long_run_var)
    estimate = long_run + dbar
    half = NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(var)
    return estimate, (max(0.0, estimate - half), min(1.0, estimate + half))


def effective_counts(passed: int, n: int, deff: float) -> tuple[float, float]:
    """(passed / deff, n / deff): the sample the bounds are taken at (module docstring)."""
    return passed / deff, n / deff


def wilson_interval(passed: int, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval of a binomial proportion (None without trials)."""
    if n <= 0:
        return None
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = passed / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # Rounded so the ends are exact: at p = 0 (or 1) centre and half are equal mathematically
    # and differ by ~1e-17 in floating point.
    return max(0.0, round(centre - half, 12)), min(1.0, round(centre + half, 12))


def _log_mixture(k: float, n: float, p: float, a: float, b: float) -> float:
    """log M_n(p) (see the module docstring).

    The log-Beta from ``math.lgamma``, not scipy's ``betaln``: the same to ~1e-8 at n = 1e7
    (far inside the 1e-6 margins below), and the Snakefile's lint reaches this function, so
    every ``snakemake`` invocation would otherwise pay scipy's import (~0.9 s)."""
    return (
        _log_beta(a + k, b + n - k) - _log_beta(a, b) - k * math.log(p) - (n - k) * math.log1p(-p)
    )


def _log_beta(x: float, y: float) -> float:
    return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)


def _prior(gate: float) -> tuple[float, float]:
    g = min(max(gate, 0.01), 0.99)
    return g * PRIOR_WEIGHT, (1 - g) * PRIOR_WEIGHT


@lru_cache(maxsize=4096)
def confidence_sequence(
    passed: float, n: float, confidence: float = 0.95, gate: float = 0.5
) -> tuple[float, float] | None:
    """The time-uniform interval for p after ``passed`` of ``n`` (None without trials).

    ``gate`` centres the mixing density (see the module docstring); any value chosen before
    the data keeps the coverage."""
    if n <= 0:
        return None
    if not 0 <= passed <= n:
        raise ValueError(f"passed must lie in [0, n]: {passed} of {n}")
    a, b = _prior(gate)
    level = math.log(1.0 / (1.0 - confidence))
    p_hat = passed / n

    # log M_n(p) - level with its p-free part (the two log-Betas) taken once: the root search
    # evaluates it ~35 times a side, at every in-run look.
    const = _log_beta(a + passed, b + n - passed) - _log_beta(a, b) - level
    failed = n - passed

    def excess(p: float) -> float:
        return const - passed * math.log(p) - failed * math.log1p(-p)

    low = 0.0
    if passed > 0 and excess(_EPS) > 0:
        low = _root(excess, _EPS, max(p_hat, _EPS) if p_hat < 1 else 1 - _EPS)
    high = 1.0
    if passed < n and excess(1 - _EPS) > 0:
        high = _root(excess, min(p_hat, 1 - _EPS) if p_hat > 0 else _EPS, 1 - _EPS)
    # Rounded outwards to 1e-9, so the reported ends never claim more than the roots do.
    return math.floor(low * 1e9) / 1e9, min(1.0, math.ceil(high * 1e9) / 1e9)


def _root(f, lo: float, hi: float, xtol: float = 1e-10) -> float:
    """The root of ``f`` in [lo, hi], where f changes sign once, to within ``xtol``.

    Bisection, not scipy's ``brentq``: each side of log M_n - level is monotone, so halving
    the bracket is exact to the tolerance in at most 40 steps of a few microseconds, and
    importing ``scipy.optimize`` costs a measuring process about 1 s before its clock starts
    (and the Snakefile's lint, every ``snakemake`` invocation, as much again)."""
    f_lo = f(lo)
    while hi - lo > xtol:
        mid = 0.5 * (lo + hi)
        f_mid = f(mid)
        if (f_mid > 0) == (f_lo > 0):
            lo, f_lo = mid, f_mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def sequential_outcome(passed: float, n: float, gate: float, confidence: float = 0.95) -> Outcome:
    """``pass`` / ``fail`` / ``undecided`` of attainment against ``gate`` (see the docstring)."""
    cs = confidence_sequence(passed, n, confidence, gate)
    if cs is None:
        return "undecided"
    low, high = cs
    if low >= gate:
        return "pass"
    if high < gate:
        return "fail"
    return "undecided"


@lru_cache(maxsize=256)
def min_samples_to_pass(gate: float, confidence: float = 0.95, limit: int = 10**7) -> int | None:
    """The least n at which n successes out of n pass ``gate`` (None beyond ``limit``).

    No class can pass on fewer successful requests, whatever its attainment: a sample gate
    below this number cannot decide a point by itself."""
    if gate <= 0:
        return 1
    if gate >= 1:
        return None

    def passes(n: int) -> bool:
        return quick_outcome(n, n, gate, confidence) == "pass"

    return least_n(passes, 1, limit)


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p).

    Formula: I_{1-p}(n - k, k + 1), the regularized incomplete beta (scipy.special.bdtr)."""
    from scipy.special import bdtr

    return float(bdtr(k, n, p))


def binomial_quantile(prob: float, n: int, p: float) -> int:
    """The least k in [0, n] with P(X <= k) >= ``prob``, X ~ Binomial(n, p) (scipy.stats'
    ``binom.ppf``), by bisection on :func:`binomial_cdf`."""
    if binomial_cdf(0, n, p) >= prob:
        return 0
    lo, hi = 0, n  # cdf(lo) < prob <= cdf(hi) = 1
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if binomial_cdf(mid, n, p) >= prob:
            hi = mid
        else:
            lo = mid
    return hi


def least_n(holds, start: int, limit: int) -> int | None:
    """The least n >= ``start`` where ``holds(n)``, for a predicate false below some n and true
    from it on (doubling, then bisection); None beyond ``limit``."""
    if holds(start):
        return start
    lo, hi = start, start
    while not holds(hi):
        lo, hi = hi, hi * 2
        if hi > limit:
            return None
    while lo + 1 < hi:  # holds(hi), not holds(lo)
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    return hi


#: Half-width around the gate inside which :func:`quick_outcome` defers to the root search.
QUICK_MARGIN = 1e-6


def quick_outcome(passed: float, n: float, gate: float, confidence: float = 0.95) -> Outcome:
    """:func:`sequential_outcome`, from two evaluations of the mixture (see the docstring).

    Equal to it everywhere: away from the boundary the roots lie more than ``QUICK_MARGIN``
    from the gate, far beyond the root search's tolerance (1e-10) and rounding (1e-9)."""
    d = QUICK_MARGIN
    if n <= 0 or not 2 * d < gate < 1 - 2 * d:
        return sequential_outcome(passed, n, gate, confidence)
    a, b = _prior(gate)
    level = math.log(1.0 / (1.0 - confidence))
    p_hat = passed / n
    below = _log_mixture(passed, n, gate - d, a, b) - level
    above = _log_mixture(passed, n, gate + d, a, b) - level
    if below < 0 and above < 0:
        return "undecided"  # [g - d, g + d] lies inside the sequence
    if p_hat > gate + d and above > 0:
        return "pass"  # log M_n decreases up to k/n: every p <= g + d is outside
    if p_hat < gate - d and below > 0:
        return "fail"
    return sequential_outcome(passed, n, gate, confidence)
