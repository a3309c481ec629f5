"""Sizing formulas with the seeds' numbers and hand-computed cases, and their CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from capacity_pack.decide.sizing import (
    bandwidth,
    combine,
    cost,
    fit_probe,
    gpus_from_gpu_seconds,
    kv_bytes_per_token,
    plan_memory,
    plan_replicas,
)
from capacity_pack.evidence.statistics import little_in_flight


def test_seed_worked_capacity_plan():
    plan = plan_replicas(36, 6, 0.75, 2)
    assert (plan.required_replicas, plan.required_gpus) == (8, 16)
    assert plan.planned_utilization == pytest.approx(0.75)
    # The current four replicas carry 18 RPS under the 75% policy (the seed's remark).
    assert 4 * 6 * 0.75 == 18


def test_seed_failure_drill_arithmetic():
    # One of four replicas lost: 18 RPS raw, 13.5 RPS under the policy.
    assert 3 * 6 == 18 and 3 * 6 * 0.75 == 13.5


def test_redundancy_and_warm_pool():
    plan = plan_replicas(36, 6, 0.75, 2, redundancy_replicas=1, warm_pool_replicas=1)
    assert (plan.replicas_for_load, plan.required_replicas, plan.required_gpus) == (8, 10, 20)
    assert plan_replicas(0, 6, 0.75, 2).required_replicas == 1
    assert plan_replicas(36.1, 6, 0.75, 2).required_replicas == 9


def test_seed_001_gpu_seconds():
    assert gpus_from_gpu_seconds(50, 0.2, 0.6) == 17


def test_little():
    assert little_in_flight(20, 2) == 40
    assert little_in_flight(23.9, 1.8) == pytest.approx(43.02)


@pytest.mark.parametrize(
    ("kv", "verdict", "headroom"),
    [(4, "fits", 4.0), (8, "zero-headroom", 0.0), (12, "does-not-fit", -4.0)],
)
def test_seed_fit_examples(kv, verdict, headroom):
    result = fit_probe(24, 2, 12, kv, 2)
    assert result.verdict == verdict and result.headroom_gb == headroom
    assert result.fits is (verdict != "does-not-fit")


def test_seed_bandwidth_example():
    result = bandwidth(20, 600, 900)
    assert result.tokens_per_second == 30 and result.mbu == pytest.approx(0.6667, abs=1e-4)


def test_memory_plan_and_which_bound_wins():
    # Llama-3.1-8B-like: 32 layers, 8 KV heads, head dim 128, bf16 -> 131,072 bytes/token.
    per_token = kv_bytes_per_token(32, 8, 128, 2)
    assert per_token == 131_072
    # 20 RPS at 2 s p95 -> 40 in flight; 8K context -> 1.07 GB per request;
    # 80 GB x 0.9 - 16 - 4 = 52 GB -> 48 requests per replica -> 1 replica from memory.
    mem = plan_memory(20, 2, per_token, 8192, 80, 16, 4)
    assert mem.in_flight_at_peak == 40 and mem.requests_per_replica == 48
    assert mem.replicas_for_memory == 1
    thr = plan_replicas(20, 6, 0.75, 1)
    assert combine(thr, mem)["bound_by"] == "throughput"
    # A 32K context needs 4.3 GB each: 12 per replica; 40 in flight -> 4 replicas.
    mem32 = plan_memory(20, 2, per_token, 32768, 80, 16, 4)
    assert mem32.requests_per_replica == 12 and mem32.replicas_for_memory == 4
    thr_small = plan_replicas(20, 20, 0.75, 1)
    plan = combine(thr_small, mem32)
    assert plan["bound_by"] == "memory" and plan["required_replicas"] == 4


def test_cost_counts_only_successes():
    c = cost(16, 2.5, 24.0)
    assert c["cost_per_hour"] == 40 and c["cost_per_request"] == pytest.approx(40 / 86400)
    assert cost(16, 2.5, 0.0)["cost_per_request"] is None


def cli(*args: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "capacity_pack", *args], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_cli_commands():
    out = cli("plan", "--peak-rps", "36", "--capacity-per-replica", "6",
              "--target-utilization", "0.75", "--gpus-per-replica", "2")  # fmt: skip
    assert (out["required_replicas"], out["required_gpus"]) == (8, 16)
    out = cli("fit", "--memory-gb", "24", "--margin-gb", "2", "--weights-gb", "12",
              "--kv-gb", "8", "--overhead-gb", "2")  # fmt: skip
    assert out["verdict"] == "zero-headroom" and out["fits"] is True and out["headroom_gb"] == 0
    out = cli("bandwidth", "--bytes-per-token-gb", "20", "--effective-bandwidth-gbps", "600",
              "--spec-bandwidth-gbps", "900")  # fmt: skip
    assert out["tokens_per_second"] == 30 and round(out["mbu"], 2) == 0.67
    assert cli("little", "--rate", "23.9", "--mean-seconds", "1.8")[
        "average_in_flight"
    ] == pytest.approx(43.02)


def test_cli_refuses_bad_input():
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "capacity_pack",
            "plan",
            "--peak-rps",
            "36",
            "--capacity-per-replica",
            "6",
            "--target-utilization",
            "1.5",
            "--gpus-per-replica",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "target_utilization must be in (0, 1]" in res.stderr
