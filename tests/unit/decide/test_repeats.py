"""Statistics across repeats: a range below five repeats, a t-interval from five, and bounded
quantities kept inside [0, 1] by a pooled binomial interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from capacity_pack.artifacts import SloReport
from capacity_pack.binomial import wilson_interval
from capacity_pack.decide.repeats import (
    MIN_REPEATS_FOR_T_INTERVAL,
    pooled_proportion,
    t_interval,
    variation,
)


def report(attainment, passing, successful, *, goodput, p95_e2e, attempted=None, failed=0):
    attempted = successful + failed if attempted is None else attempted
    return SloReport.model_validate(
        {
            "point": "open-r1",
            "key": "open-r1/cold/rep0",
            "cache_state": "cold",
            "repeat": 0,
            "mode": "open",
            "verdict": "pass",
            "observed_goodput_rps": goodput,
            "request_throughput_rps": goodput + 1.0,
            "output_throughput_tps": goodput * 100,
            "error_rate": failed / attempted,
            "attempted": attempted,
            "successful": successful,
            "classes": {
                "chat": {
                    "attainment": attainment,
                    "passing_count": passing,
                    "successful_count": successful,
                    "p95_ttft_ms": 100.0,
                    "p95_tpot_ms": 20.0,
                    "p95_e2e_ms": p95_e2e,
                }
            },
        }
    )


def test_two_repeats_give_the_range_and_no_interval():
    """The issue's case: two repeats made a t-interval with attainment up to 1.569 and a
    negative P95 E2E; now the range, n and a note saying why, and attainment inside [0, 1]."""
    reps = [
        report(1.0, 100, 100, goodput=28.3, p95_e2e=100.0),
        report(0.5, 50, 100, goodput=30.0, p95_e2e=1500.0),
    ]
    var = variation(reps, ["chat"])
    e2e = var["classes"]["chat"]["p95_e2e_ms"]
    assert (e2e["n"], e2e["mean"], e2e["min"], e2e["max"]) == (2, 800.0, 100.0, 1500.0)
    assert e2e["interval"] is None
    assert e2e["interval_note"] == "range of 2 repeats; no interval below 5 repeats"
    g = var["observed_goodput_rps"]
    assert g["interval"] is None and (g["min"], g["max"]) == (28.3, 30.0)
    att = var["classes"]["chat"]["attainment"]
    assert att["interval_method"] == "wilson-pooled"
    assert att["pooled"] == {"count": 150, "trials": 200, "value": 0.75}
    assert att["interval"] == pytest.approx(list(wilson_interval(150, 200)))
    assert 0.0 <= att["interval"][0] <= att["interval"][1] <= 1.0
    assert "pooled over 2 repeat(s)" in att["interval_note"]
    assert (att["min"], att["max"]) == (0.5, 1.0)


def test_attainment_never_leaves_the_unit_interval():
    for passing in ([100, 100], [0, 0], [100, 99], [3, 97]):
        reps = [report(p / 100, p, 100, goodput=10.0, p95_e2e=500.0) for p in passing]
        lo, hi = variation(reps, ["chat"])["classes"]["chat"]["attainment"]["interval"]
        assert 0.0 <= lo <= hi <= 1.0
    # Without the counts: the per-repeat values, clipped to [0, 1] (and only from 5 repeats).
    out = pooled_proportion([1.0, 0.2, 1.0, 1.0, 0.3], [None] * 5, [None] * 5)
    assert out["interval_method"] == "student-t" and out["pooled"] is None
    assert out["interval"][0] >= 0.0 and out["interval"][1] == 1.0
    assert "intersected with the quantity's range [0, 1]" in out["interval_note"]
    assert pooled_proportion([1.0, 0.2], [None] * 2, [None] * 2)["interval"] is None


def test_the_error_rate_pools_failed_over_attempted():
    reps = [report(1.0, 95, 95, goodput=9.0, p95_e2e=1.0, failed=5),
            report(1.0, 100, 100, goodput=9.5, p95_e2e=1.0, failed=0)]  # fmt: skip
    err = variation(reps, ["chat"])["error_rate"]
    assert err["pooled"] == {"count": 5, "trials": 200, "value": 0.025}
    assert err["interval"] == pytest.approx(list(wilson_interval(5, 200)))


def test_five_repeats_give_the_student_t_interval_that_scipy_gives():
    assert MIN_REPEATS_FOR_T_INTERVAL == 5
    goodput = [27.1, 28.3, 29.0, 28.6, 27.9]
    e2e = [610.0, 655.0, 700.0, 640.0, 690.0]
    reps = [report(0.97, 97, 100, goodput=g, p95_e2e=e) for g, e in zip(goodput, e2e, strict=True)]
    var = variation(reps, ["chat"])
    for got, values in ((var["observed_goodput_rps"], goodput),
                        (var["classes"]["chat"]["p95_e2e_ms"], e2e)):  # fmt: skip
        x = np.asarray(values)
        want = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
        assert got["interval"] == pytest.approx(list(want))
        assert got["interval_method"] == "student-t" and got["n"] == 5
        assert got["interval_note"] == "Student-t interval of the mean of 5 repeats"
    # Attainment stays a pooled binomial interval at any number of repeats.
    att = var["classes"]["chat"]["attainment"]
    assert att["interval_method"] == "wilson-pooled"
    assert att["interval"] == pytest.approx(list(wilson_interval(485, 500)))


def test_a_non_negative_quantity_is_clipped_at_zero_and_says_so():
    out = t_interval([0.0, 0.0, 0.0, 0.0, 100.0])
    assert out["interval"][0] == 0.0 and out["interval"][1] > 20.0
    assert "intersected" in out["interval_note"]
    assert t_interval([1.0])["interval_note"] == "one repeat; no interval below 5 repeats"
    empty = t_interval([None, math.nan])
    assert empty["n"] == 0 and empty["mean"] is None and empty["interval_note"] == "no values"
