"""Lengths sent and received: the order-statistic intervals, the per-class check, its error rate."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from capacity_pack.evidence.lengths import (
    QUANTILES,
    check_sample,
    length_report,
    quantile_interval,
    summary,
    support,
)
from capacity_pack.plan.lengths import length_stats, sample_lengths
from capacity_pack.plan.workload import WorkloadClass

LOGNORMAL_IN = {"distribution": "lognormal", "p50": 240, "p95": 512, "max": 1024}
LOGNORMAL_OUT = {"distribution": "lognormal", "p50": 30, "p95": 64, "max": 128}


def klass(name: str, inp, out) -> WorkloadClass:
    return WorkloadClass.model_validate(
        {"name": name, "mix": 0.5, "input_tokens": inp, "output_tokens": out,
         "request_ttft_cutoff_ms": 250, "request_tpot_cutoff_ms": 25}
    )  # fmt: skip


WORKLOAD = [klass("chat", LOGNORMAL_IN, LOGNORMAL_OUT), klass("fixed", 128, 16)]


def table(workload, n: int, seed: int, ok_share: float = 1.0) -> pd.DataFrame:
    """Measured attempts drawn from each class's manifest lengths; the first ``ok_share`` of
    each class succeed with their scheduled output length."""
    rng = np.random.default_rng(seed)
    parts = []
    for c in workload:
        inp = sample_lengths(c.input_tokens, rng, n)
        out = sample_lengths(c.output_tokens, rng, n)
        ok = np.arange(n) < round(ok_share * n)
        parts.append(
            pd.DataFrame({
                "class": c.name, "phase": "measure", "status": np.where(ok, "ok", "timeout"),
                "input_tokens": inp, "output_tokens_expected": out,
                "output_tokens": np.where(ok, out, 0),
                "prompt_tokens": pd.array(np.where(ok, inp, 0), dtype="Int64"),
            })
        )  # fmt: skip
    return pd.concat(parts, ignore_index=True)


def test_the_order_statistic_interval_takes_the_binomial_ranks():
    x = np.arange(1, 101)
    # n = 100, q = 0.5, a = 0.05: l = F^-1(0.025) = 40, u = F^-1(0.975) + 1 = 61.
    assert int(binom.ppf(0.025, 100, 0.5)) == 40 and int(binom.ppf(0.975, 100, 0.5)) == 60
    assert quantile_interval(x, 0.5, 0.05, 0, 10**6) == (40, 61)
    # Five values cannot reach the 99th percentile: the upper end is the support's maximum.
    # (l = F^-1(0.025) = 4 for Binomial(5, 0.99): P(B <= 3) = 0.001, P(B <= 4) = 0.049.)
    assert quantile_interval(np.arange(1, 6), 0.99, 0.05, 1, 999) == (4, 999)
    # Nor the 1st's lower end: the support's minimum.
    assert quantile_interval(np.arange(1, 6), 0.01, 0.05, 1, 999)[0] == 1


@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_the_interval_covers_a_discrete_quantile_at_least_as_often_as_stated(q):
    spec = WORKLOAD[0].output_tokens  # rounded, clipped: a discrete law with atoms
    truth = getattr(length_stats(spec), f"p{round(q * 100)}")
    lo, hi = support(spec)
    rng = np.random.default_rng(7)
    alpha, trials = 0.1, 1500
    covered = 0
    for _ in range(trials):
        s = np.sort(sample_lengths(spec, rng, 120))
        a, b = quantile_interval(s, q, alpha, lo, hi)
        covered += a <= truth <= b
    # Coverage >= 0.9 in law; 1500 trials put the estimate within ~0.02 of it.
    assert covered / trials >= 1 - alpha - 0.02


def test_the_manifest_quantiles_are_the_quantiles_of_the_draws():
    spec = WORKLOAD[0].input_tokens
    draws = np.sort(sample_lengths(spec, np.random.default_rng(3), 400_000))
    stats = length_stats(spec)
    for q in QUANTILES:
        got = draws[int(np.ceil(q * draws.size)) - 1]
        assert abs(got - getattr(stats, f"p{round(q * 100)}")) <= 1
    assert draws.min() >= 1 and draws.max() <= 1024


def test_fixed_lengths_are_checked_for_exact_equality():
    assert check_sample(np.full(50, 128), 128, 0.01, "sent") == (True, [], [])
    ok, tests, why = check_sample(np.array([128] * 49 + [127]), 128, 0.01, "sent input_tokens")
    assert ok is False and tests == []
    assert why == ["sent input_tokens: 1 of 50 differ from the fixed length 128"]
    assert check_sample(np.array([], np.int64), 128, 0.01, "sent")[0] is None


def test_a_sample_drawn_from_the_manifest_matches_it():
    doc = length_report(table(WORKLOAD, 300, seed=1), WORKLOAD)
    chat, fixed = doc["classes"]["chat"], doc["classes"]["fixed"]
    assert doc["lengths_match_manifest"] is True
    assert chat["lengths_match_manifest"] is True and chat["lengths_match_why"] == []
    assert fixed["lengths_match_manifest"] is True
    lengths = chat["lengths"]
    assert lengths["sent"]["count"] == 300 and lengths["received"]["count"] == 300
    assert lengths["manifest"]["input_tokens"]["p95"] == 512
    assert [t["quantile"] for t in lengths["received"]["quantile_tests"]] == list(QUANTILES)
    assert lengths["server_prompt_tokens"]["differs_from_sent"] == 0
    assert fixed["lengths"]["sent"] == {
        "count": 300, "mean": 128.0, "p50": 128, "p95": 128, "max": 128, "quantile_tests": [],
        "match": True,
    }  # fmt: skip
    # Bonferroni over 3 quantiles x (1 input + 2 output samples) of the one distribution class.
    check = doc["lengths_check"]
    assert check["quantile_tests"] == 9 and check["per_test_alpha"] == pytest.approx(0.01 / 9)


def test_received_lengths_biased_by_failures_fail_the_check_with_why():
    requests = table(WORKLOAD, 600, seed=2)
    # The longest 15% of the chat class's outputs time out: the successes are no longer a
    # random subset, and the received quantiles fall under the manifest's.
    chat = requests["class"] == "chat"
    long = chat & (
        requests["output_tokens_expected"]
        >= requests.loc[chat, "output_tokens_expected"].quantile(0.85)
    )
    requests.loc[long, ["status", "output_tokens"]] = ["timeout", 0]
    doc = length_report(requests, WORKLOAD)
    entry = doc["classes"]["chat"]
    assert entry["lengths_match_manifest"] is False and doc["lengths_match_manifest"] is False
    assert entry["lengths"]["sent"]["match"] and entry["lengths"]["requested"]["match"]
    assert entry["lengths"]["received"]["match"] is False
    assert any(w.startswith("received output_tokens: manifest P95 64 outside [")
               for w in entry["lengths_match_why"])  # fmt: skip
    assert doc["classes"]["fixed"]["lengths_match_manifest"] is True


def test_a_schedule_from_another_distribution_fails_the_sent_check():
    other = [klass("chat", {**LOGNORMAL_IN, "p50": 200}, LOGNORMAL_OUT), WORKLOAD[1]]
    doc = length_report(table(other, 400, seed=4), WORKLOAD)
    why = doc["classes"]["chat"]["lengths_match_why"]
    assert any(w.startswith("sent input_tokens: manifest P50 240 outside") for w in why), why


def test_values_outside_the_support_fail():
    ok, _, why = check_sample(np.array([10] * 20 + [2000]), WORKLOAD[0].input_tokens, 0.01, "sent")
    assert ok is False and "1 of 21 outside the support [1, 1024]" in why[0]


def test_the_family_error_rate_is_at_most_its_alpha():
    """Data drawn from the manifest: the point's check fails in at most FAMILY_ALPHA of points
    (Bonferroni is conservative), here over 300 seeded points of 200 requests a class."""
    fails = sum(
        length_report(table(WORKLOAD, 200, seed=s), WORKLOAD)["lengths_match_manifest"] is False
        for s in range(300)
    )
    # Expected at most 3 of 300; 8 is beyond the binomial's 99.8th percentile at 0.01.
    assert fails <= 8


def test_nothing_to_test_is_none_not_a_pass():
    requests = table(WORKLOAD, 40, seed=5, ok_share=0.0)
    doc = length_report(requests, WORKLOAD)
    chat = doc["classes"]["chat"]
    assert chat["lengths"]["received"]["match"] is None
    assert chat["lengths"]["received"]["count"] == 0 and chat["lengths"]["received"]["p50"] is None
    assert chat["lengths"]["server_prompt_tokens"] is None
    assert chat["lengths_match_manifest"] is True  # sent and requested still decide


def test_summary_is_nearest_rank():
    assert summary(np.arange(1, 21)) == {"count": 20, "mean": 10.5, "p50": 10, "p95": 19, "max": 20}
