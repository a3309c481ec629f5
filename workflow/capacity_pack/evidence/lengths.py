"""The token lengths a point sent and received per class, and whether they match the manifest.

Per class, over the point's measured requests (phases ``measure`` and ``extension``):

- **sent input**: the scheduled input tokens of every attempted request (the prompt the client
  built has exactly that many tokens of the pack's tokenizer);
- **server prompt tokens**: ``usage.prompt_tokens`` of the successful requests whose responses
  carried usage, with how many differ from the scheduled input (a server tokenizer other than the
  pack's counts differently); reported, not tested against the manifest;
- **requested output**: the scheduled output length (``max_tokens`` with EOS ignored) of every
  attempted request;
- **received output**: the output tokens of the successful requests.

Each sample is summarised by its count, mean and nearest-rank P50, P95 and max
(:mod:`.statistics`), beside the manifest's mean, P50, P95, P99 and max
(:func:`capacity_pack.plan.manifest.length_stats`).

**The match check** (reported, not a capacity gate), per class and sample (sent input, requested
output, received output):

- a fixed-length class: every value equals the fixed length (exact equality);
- a distribution (lognormal or empirical): (i) every value lies in the distribution's support
  [min, max] (the clip bounds of a lognormal, the extremes of an empirical file); and (ii) for
  each q in {0.50, 0.95, 0.99} the manifest's q-quantile lies in the distribution-free
  confidence interval of the population q-quantile from order statistics: with the n values
  sorted x_(1) <= ... <= x_(n) and B ~ Binomial(n, q),

      l = F_B^-1(a / 2),  u = F_B^-1(1 - a / 2) + 1,   interval [x_(l), x_(u)],

  x_(l) read as the support's minimum when l < 1 and x_(u) as its maximum when u > n. For any
  distribution, discrete ones included, P(x_(l) <= xi_q <= x_(u)) >= 1 - a, xi_q = inf{x :
  F(x) >= q} (the count of values <= xi_q is binomial with success probability >= q, the count
  below it with probability <= q; Hahn and Meeker, *Statistical Intervals*, 1991, ch. 5). The
  manifest's quantiles are exactly these xi_q: the rounded, clipped lognormal quantile
  round(exp(mu + sigma z_q)) (rounding and clipping are monotone), the nearest-rank quantile of an
  empirical file. Multiple comparisons: Bonferroni over every quantile test of the point
  (classes x samples x quantiles), a = ``FAMILY_ALPHA`` / m, so a point whose lengths all follow
  the manifest fails the check with probability at most ``FAMILY_ALPHA``.

Why it can fail: a schedule not drawn from the manifest (sent, requested), or successes that are
not a random subset of the attempts (received: long outputs timing out or erroring shift the
received quantiles down). ``lengths_match_manifest`` is None for a class with nothing to test.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.plan.manifest import (
    EmpiricalLength,
    LengthSpec,
    LognormalLength,
    length_stats,
)
from capacity_pack.vocab.percentile import nearest_rank

FAMILY_ALPHA = 0.01
QUANTILES = (0.50, 0.95, 0.99)
MEASURED = ("measure", "extension")
# (report key, manifest field) of each tested sample.
SAMPLES = (("sent", "input_tokens"), ("requested", "output_tokens"), ("received", "output_tokens"))
METHOD = (
    "fixed lengths: exact equality; distributions: every value within the support, and the "
    "manifest's P50/P95/P99 inside the distribution-free order-statistic confidence interval "
    f"of each quantile, Bonferroni-corrected over the point's tests (family alpha {FAMILY_ALPHA})"
)


def support(spec: LengthSpec) -> tuple[int, int]:
    """The smallest and largest length ``spec`` can produce."""
    if isinstance(spec, int):
        return spec, spec
    if isinstance(spec, LognormalLength):
        return spec.min, spec.max
    assert isinstance(spec, EmpiricalLength)
    return int(spec.values.min()), int(spec.values.max())


def summary(values: np.ndarray) -> dict[str, Any]:
    """Count, mean and nearest-rank P50, P95 and max of a length sample."""
    s = np.sort(values.astype(np.int64))
    return {
        "count": int(s.size),
        "mean": float(s.mean()) if s.size else None,
        "p50": _int(nearest_rank(s, 0.50)),
        "p95": _int(nearest_rank(s, 0.95)),
        "max": int(s[-1]) if s.size else None,
    }


def quantile_interval(
    sorted_values: np.ndarray, q: float, alpha: float, lo: int, hi: int
) -> tuple[int, int]:
    """The distribution-free (1 - alpha) interval [x_(l), x_(u)] of the population q-quantile
    (module docstring), ``lo`` / ``hi`` standing in for an order statistic beyond the sample."""
    from scipy.stats import binom

    n = sorted_values.size
    l = int(binom.ppf(alpha / 2, n, q))  # noqa: E741 (the order statistic's usual name)
    u = int(binom.ppf(1 - alpha / 2, n, q)) + 1
    lower = int(sorted_values[l - 1]) if l >= 1 else lo
    upper = int(sorted_values[u - 1]) if u <= n else hi
    return lower, upper


def check_sample(
    values: np.ndarray, spec: LengthSpec, alpha: float, label: str
) -> tuple[bool | None, list[dict[str, Any]], list[str]]:
    """Whether ``values`` match ``spec`` (None: no values), the quantile tests and why not."""
    if values.size == 0:
        return None, [], []
    s = np.sort(values.astype(np.int64))
    lo, hi = support(spec)
    if isinstance(spec, int):
        off = int(np.count_nonzero(s != spec))
        why = [f"{label}: {off} of {s.size} differ from the fixed length {spec}"] if off else []
        return not off, [], why
    why = []
    outside = int(np.count_nonzero((s < lo) | (s > hi)))
    if outside:
        why.append(f"{label}: {outside} of {s.size} outside the support [{lo}, {hi}]")
    stats = length_stats(spec)
    tests = []
    for q in QUANTILES:
        want = getattr(stats, f"p{round(q * 100)}")
        lower, upper = quantile_interval(s, q, alpha, lo, hi)
        ok = lower <= want <= upper
        tests.append({"quantile": q, "manifest": want, "interval": [lower, upper], "pass": ok})
        if not ok:
            why.append(
                f"{label}: manifest P{round(q * 100)} {want} outside [{lower}, {upper}], the "
                f"{1 - alpha:.4g} order-statistic interval of n = {s.size}"
            )
    return not why, tests, why


def length_report(requests: pd.DataFrame, workload: list) -> dict[str, Any]:
    """Per class name, the lengths block of its SLO-report entry (module docstring), and the
    point-level summary: ``{"classes": {...}, "lengths_match_manifest": ..., ...}``."""
    m = requests[requests["phase"].isin(MEASURED)]
    dist = [c for c in workload if not isinstance(c.input_tokens, int)]
    dist_out = [c for c in workload if not isinstance(c.output_tokens, int)]
    tests = len(QUANTILES) * (len(dist) + 2 * len(dist_out))
    alpha = FAMILY_ALPHA / tests if tests else FAMILY_ALPHA
    classes: dict[str, Any] = {}
    for c in workload:
        rows = m[m["class"] == c.name]
        ok = rows[rows["status"] == "ok"]
        columns = {
            "sent": rows["input_tokens"],
            "requested": rows["output_tokens_expected"],
            "received": ok["output_tokens"],
        }
        entry: dict[str, Any] = {}
        verdicts, why = [], []
        for key, field in SAMPLES:
            spec = getattr(c, field)
            values = columns[key].to_numpy(np.int64)
            passed, q_tests, reasons = check_sample(values, spec, alpha, f"{key} {field}")
            entry[key] = {**summary(values), "quantile_tests": q_tests, "match": passed}
            verdicts.append(passed)
            why += reasons
        entry["manifest"] = {
            "input_tokens": length_stats(c.input_tokens).model_dump(),
            "output_tokens": length_stats(c.output_tokens).model_dump(),
        }
        entry["server_prompt_tokens"] = _server_prompt(ok)
        decided = [v for v in verdicts if v is not None]
        classes[c.name] = {
            "lengths": entry,
            "lengths_match_manifest": all(decided) if decided else None,
            "lengths_match_why": why,
        }
    decided = [v["lengths_match_manifest"] for v in classes.values()]
    decided = [v for v in decided if v is not None]
    return {
        "classes": classes,
        "lengths_match_manifest": all(decided) if decided else None,
        "lengths_check": {
            "method": METHOD,
            "family_alpha": FAMILY_ALPHA,
            "quantile_tests": tests,
            "per_test_alpha": alpha if tests else None,
        },
    }


def _server_prompt(ok: pd.DataFrame) -> dict[str, Any] | None:
    """The server-reported prompt tokens of successful requests with usage, or None."""
    reported = ok[ok["prompt_tokens"].notna()]
    if reported.empty:
        return None
    values = reported["prompt_tokens"].to_numpy(np.int64)
    differ = int(np.count_nonzero(values != reported["input_tokens"].to_numpy(np.int64)))
    return {**summary(values), "differs_from_sent": differ}


def _int(v: float | None) -> int | None:
    return None if v is None or math.isnan(v) else int(v)
