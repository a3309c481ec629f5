"""The pack's vocabulary: one percentile, the latency formulas, the SLO predicate."""

from __future__ import annotations

import math
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from capacity_pack.vocab import latency
from capacity_pack.vocab.percentile import nearest_rank, nearest_ranks, percentiles, rank_index
from capacity_pack.vocab.slo import (
    class_cutoffs,
    cutoff_checks,
    meets_slo,
    requests_meeting_slo,
)

DECIMAL_PS = st.sampled_from([0.01, 0.05, 0.07, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999])


@given(p=DECIMAL_PS, n=st.integers(1, 5000))
def test_the_rank_is_the_ceiling_of_p_n_in_decimal_not_in_binary_floating_point(p, n):
    # The exact rank of the decimal p the pack states: ceil(p n) in rational arithmetic.
    exact = max(1, math.ceil(Fraction(str(p)) * n))
    assert rank_index(p, n) == exact - 1


@given(
    values=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=300),
    p=st.sampled_from([0.5, 0.9, 0.95, 0.99]),
)
def test_the_nearest_rank_is_numpys_inverted_cdf_and_the_partition_agrees(values, p):
    a = np.array(values)
    want = float(np.quantile(a, p, method="inverted_cdf"))
    assert nearest_rank(np.sort(a), p) == want
    assert nearest_ranks(a.copy(), (p,)) == [want]


def test_percentiles_skip_non_finite_values_and_withhold_p99():
    v = np.array([np.nan, *range(1, 21), np.inf])
    out = percentiles(v.astype(float), withhold_p99=True)
    assert out == {"p50": 10.0, "p95": 19.0, "p99": None, "max": 20.0}
    assert nearest_rank(np.array([]), 0.5) is None


def test_the_latency_formulas_from_nanosecond_stamps():
    sent, first, last = 1_000_000_000, 1_250_000_000, 1_950_000_000
    ttft = latency.ttft_ms(sent, first)
    e2e = latency.e2e_ms(sent, last)
    assert (ttft, e2e) == (250.0, 950.0)
    assert latency.tpot_ms(e2e, ttft, 8) == 100.0  # (950 - 250) / 7
    # One output token has no time between tokens: 0, not NaN.
    assert latency.tpot_ms(e2e, ttft, 1) == 0.0
    arr = latency.tpot_ms(np.array([950.0, 300.0]), np.array([250.0, 300.0]), np.array([8, 0]))
    assert arr.tolist() == [100.0, 0.0]


def test_the_slo_predicate_is_joint_and_a_missing_latency_meets_nothing():
    checks = cutoff_checks([100, 300, np.nan], [10, 10, 10], 200, [20, 5, np.nan])
    assert checks.ttft.tolist() == [True, False, False]
    assert checks.tpot.tolist() == [True, False, False]
    assert meets_slo([100, 100], [10, 10], 200, 20, ok=[True, False]).tolist() == [True, False]
    workload = [
        SimpleNamespace(name="chat", request_ttft_cutoff_ms=2000, request_tpot_cutoff_ms=50)
    ]
    assert class_cutoffs(workload) == {"chat": (2000.0, 50.0)}


def test_meets_slo_is_joint_inclusive_and_nan_meets_nothing():
    ttft = np.array([100.0, 250.0, 251.0, 100.0, math.nan, 10.0])
    tpot = np.array([10.0, 25.0, 10.0, 25.5, 10.0, math.nan])
    assert meets_slo(ttft, tpot, 250.0, 25.0).tolist() == [True, True, False, False, False, False]
    ok = np.array([True, False, True, True, True, True])
    assert meets_slo(ttft, tpot, 250.0, 25.0, ok).tolist() == [True, False] + [False] * 4
    within = cutoff_checks(ttft, tpot, 250.0, 25.0)
    assert within.ttft.tolist() == [True, True, False, True, False, True]
    assert within.tpot.tolist() == [True, True, True, False, True, False]
    assert (within.met == meets_slo(ttft, tpot, 250.0, 25.0)).all()


def test_requests_meeting_slo_uses_each_class_cutoffs():
    req = pd.DataFrame(
        {
            "class": ["chat", "chat", "long", "long", "other", "chat"],
            "status": ["ok", "ok", "ok", "ok", "ok", "timeout"],
            "ttft_ms": [200.0, 300.0, 900.0, 1100.0, 1.0, 1.0],
            "tpot_ms": [20.0, 20.0, 40.0, 40.0, 1.0, 1.0],
        }
    )
    cutoffs = {"chat": (250.0, 25.0), "long": (1000.0, 50.0)}
    met = requests_meeting_slo(req, cutoffs)
    assert met.dtype == bool
    # A class without cutoffs meets none; a failed request meets none.
    assert met.tolist() == [True, False, True, False, False, False]


def test_one_requests_numbers_take_the_same_formulas_and_predicate_as_a_table():
    from capacity_pack.vocab.slo import within_cutoffs

    sent, first, last = 1_000_000_000, 1_250_000_000, 1_950_000_000
    ttft, e2e = latency.ttft_ms(sent, first), latency.e2e_ms(sent, last)
    tpot = latency.tpot_ms(e2e, ttft, 8)
    assert isinstance(tpot, float) and (ttft, e2e, tpot) == (250.0, 950.0, 100.0)
    assert latency.tpot_ms(e2e, ttft, 1) == 0.0
    for cut in ((250.0, 100.0), (249.0, 100.0), (250.0, 99.0), (float("nan"), 100.0)):
        assert within_cutoffs(ttft, tpot, cut) == bool(cutoff_checks(ttft, tpot, *cut).met)
    assert not within_cutoffs(float("nan"), tpot, (250.0, 100.0))
