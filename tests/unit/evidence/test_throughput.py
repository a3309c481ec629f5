"""System and per-user output throughput."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from capacity_pack.evidence.throughput import distribution, per_request_rates, throughput_report


def frame() -> pd.DataFrame:
    return pd.DataFrame({
        "class": ["a", "a", "b", "b", "a"],
        "phase": ["measure", "measure", "extension", "measure", "warmup"],
        "status": ["ok", "ok", "ok", "timeout", "ok"],
        "output_tokens": [100, 1, 50, 0, 999],
        "e2e_ms": [2000.0, 40.0, 500.0, 0.0, 1.0],
        "tpot_ms": [10.0, 0.0, 5.0, 0.0, 0.0],
    })  # fmt: skip


def test_per_user_rates_are_tokens_over_e2e_and_one_over_tpot():
    ok = frame().iloc[:3]
    user, decode = per_request_rates(ok)
    assert user.tolist() == pytest.approx([50.0, 25.0, 100.0])
    assert decode[0] == pytest.approx(100.0) and np.isnan(decode[1]) and decode[2] == 200.0


def test_the_report_separates_system_from_per_user_throughput():
    doc = throughput_report(frame(), 10.0, ["a", "b"])
    # System: the successful measured requests' 151 tokens over the 10 s window (the warm-up
    # row's 999 and the timeout are not measured output).
    assert doc["system_output_tps"] == pytest.approx(15.1)
    assert doc["classes"]["a"]["system_output_tps"] == pytest.approx(10.1)
    assert doc["classes"]["b"]["system_output_tps"] == pytest.approx(5.0)
    u = doc["per_user_output_tps"]
    assert u["count"] == 3 and (u["p5"], u["p50"], u["p95"]) == (25.0, 50.0, 100.0)
    assert doc["per_user_decode_tps"]["count"] == 2
    assert doc["classes"]["b"]["per_user_output_tps"]["p50"] == 100.0


def test_an_empty_distribution_has_no_percentiles():
    assert distribution(np.array([np.nan])) == {
        "count": 0,
        "mean": None,
        "p5": None,
        "p50": None,
        "p95": None,
    }
