"""The token lengths a point sent and received per class, and whether they match the manifest.

Per class, over the measured requests: sent input (scheduled input tokens of every attempt),
server prompt tokens (``usage.prompt_tokens`` of the successes; reported, never tested),
requested output (scheduled ``max_tokens``) and received output (of the successes), each as
count, mean and nearest-rank P50, P95 and max, beside the manifest's
(:func:`capacity_pack.plan.lengths.length_stats`).

**The match check** (reported, not a capacity gate), per class and sample: a fixed-length class
matches when every value equals its length; a distribution when every value lies in its support
and, for q in {0.50, 0.95, 0.99}, the manifest's q-quantile lies in the distribution-free
order-statistic interval [x_(l), x_(u)], l = F_B^-1(a / 2), u = F_B^-1(1 - a / 2) + 1,
B ~ Binomial(n, q) (Hahn and Meeker, 1991, ch. 5), with a = ``FAMILY_ALPHA`` / m (Bonferroni
over the point's m quantile tests). Why it can fail, and the interval's proof: docs/metrics.md,
"Lengths sent and received".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.binomial import binomial_quantile
from capacity_pack.plan.lengths import EmpiricalLength, LengthSpec, LognormalLength, length_stats
from capacity_pack.vocab.percentile import nearest_rank
from capacity_pack.vocab.phases import MEASURED_PHASES

FAMILY_ALPHA = 0.01
QUANTILES = (0.50, 0.95, 0.99)
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
    n = sorted_values.size
    l = binomial_quantile(alpha / 2, n, q)  # noqa: E741 (the order statistic's usual name)
    u = binomial_quantile(1 - alpha / 2, n, q) + 1
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
    m = requests[requests["phase"].isin(MEASURED_PHASES)]
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
