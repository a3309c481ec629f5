"""Calibration of the engine model: synthetic closed loops made by the closed-loop runner with a
known profile and multiplicative noise, fitted back; the worker reconstruction from a requests
table; what a fit that cannot run says; the architecture mapping of a real target."""

from __future__ import annotations

import json
import math
import random

import pandas as pd
import pytest
import yaml

from capacity_pack.plan.manifest import validate_pack
from capacity_pack.sim.profile import load_profile
from capacity_pack.sim.virtual import ClosedLoopRequest, simulate_closed_loop
from capacity_pack.twin.architecture import ArchitectureError, base_profile
from capacity_pack.twin.calibrate import (
    PARAMETERS,
    SYSTEMATIC_PREFILL_REL,
    CalibrationError,
    CalibrationInputs,
    MeasuredPoint,
    PointRef,
    fit,
    load_point,
    missing_measurements,
    profile_at,
    report,
    unplanned_reason,
)
from tests.paths import ROOT

TRUTH = {
    "flops_per_s": 80e12,  # small-fast: 160 TFLOP/s x mfu 0.5
    "bytes_per_s": 320e9,  # 0.4 TB/s x mbu 0.8
    "step_overhead_ms": 1.0,
    "per_sequence_overhead_us": 4.0,
}
LATENCY_MS = 1.0  # the client's and server's share of a measured TTFT
NOISE = 0.02  # multiplicative, log-normal


def requests_table(profile, concurrency: int, per_worker: int, rng: random.Random) -> pd.DataFrame:
    """A synthetic normalized requests table: a closed loop run by the closed-loop runner, its
    TTFT and TPOT times exp(N(0, NOISE)), stamps on one clock in send order."""
    lengths = [64, 128, 256, 512, 1024, 2048]
    workers = [
        [
            ClosedLoopRequest(rng.choice(lengths), rng.choice([16, 32, 64]))
            for _ in range(per_worker)
        ]
        for _ in range(concurrency)
    ]
    run = simulate_closed_loop(profile, workers, client_gap_s=0.0003, seed=rng.randrange(1 << 30))
    rows = []
    for r in run.results:
        ttft = (r.ttft_s * 1e3 + LATENCY_MS) * math.exp(rng.gauss(0, NOISE))
        tpot = r.tpot_s * 1e3 * math.exp(rng.gauss(0, NOISE))
        sent = round(r.arrival_s * 1e9)
        rows.append(
            {
                "phase": "warmup" if r.order == 0 else "measure",
                "status": "ok",
                "input_tokens": r.prompt_tokens,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "ttft_ms": ttft,
                "tpot_ms": tpot,
                "sent_ns": sent,
                "end_ns": round((r.arrival_s + r.e2e_s) * 1e9),
                "worker": r.worker,
                "order": r.order,
            }
        )
    # A client sends one request at a time: ties in virtual time go in the engine's order.
    frame = pd.DataFrame(rows).sort_values(["sent_ns", "worker"]).reset_index(drop=True)
    frame.attrs["run"] = run
    return frame


@pytest.fixture(scope="module")
def synthetic():
    base = load_profile("small-fast")
    truth = profile_at(base, **TRUTH)
    rng = random.Random(20261203)
    tables = {c: requests_table(truth, c, n, rng) for c, n in ((1, 24), (8, 4), (32, 3))}
    points = [load_point(t, f"closed-c{c}", c) for c, t in tables.items()]
    return base, tables, points, fit(base, points)


def test_the_closed_loop_runner_keeps_each_worker_busy_back_to_back():
    prof = load_profile("small-fast")
    workers = [[ClosedLoopRequest(100 * (w + 1), 8) for _ in range(3)] for w in range(4)]
    run = simulate_closed_loop(prof, workers, client_gap_s=0.002)
    assert sorted((r.worker, r.order) for r in run.results) == [
        (w, k) for w in range(4) for k in range(3)
    ]
    for w in range(4):
        mine = sorted((r for r in run.results if r.worker == w), key=lambda r: r.order)
        assert [r.prompt_tokens for r in mine] == [100 * (w + 1)] * 3
        for prev, nxt in zip(mine, mine[1:], strict=False):
            # The next request arrives one client gap after the previous one's last token.
            assert nxt.arrival_s == pytest.approx(prev.arrival_s + prev.e2e_s + 0.002, abs=1e-9)


def test_load_point_rebuilds_workers_that_replay_the_same_closed_loop(synthetic):
    """The rebuilt workers (from send and end stamps only) replay to the same arrivals, lengths
    and latencies as the run that made the table: workers freed by one step are
    interchangeable, so their numbering may differ, never the timing."""
    base, tables, points, _ = synthetic
    truth = profile_at(base, **TRUTH)

    def timeline(results):
        return sorted(
            (round(r.arrival_s, 6), r.prompt_tokens, r.output_tokens, round(r.tpot_s, 7))
            for r in results
        )

    for point, table in zip(points, tables.values(), strict=True):
        replay = simulate_closed_loop(truth, point.workers, client_gap_s=point.client_gap_s)
        made = table.attrs["run"]
        assert timeline(replay.results) == timeline(made.results)
        assert point.client_gap_s == pytest.approx(0.0003, abs=2e-6)
        # Warm-up rows are replayed, not fitted.
        assert len(point.measured) == (table["phase"] == "measure").sum()


def test_the_fit_recovers_the_profile_within_its_stated_intervals(synthetic):
    _, _, _, fitted = synthetic
    for name, value in {**TRUTH, "request_latency_ms": LATENCY_MS}.items():
        lo, hi = fitted.intervals[name]
        assert lo <= value <= hi, (name, value, fitted.estimates[name], (lo, hi))
    # The well-identified rates come back within a few per cent.
    assert fitted.estimates["flops_per_s"] == pytest.approx(80e12, rel=0.04)
    assert fitted.estimates["bytes_per_s"] == pytest.approx(320e9, rel=0.06)
    # Residual spread is the noise put in (log-normal, sd 0.02).
    assert 0.01 < fitted.residual_sd < 0.03
    # At 4 us x 32 sequences the per-sequence cost is under 1 % of a step: said, not hidden.
    assert "per_sequence_overhead_us" in fitted.poorly_identified
    pairs = {frozenset(p[:2]) for p in fitted.confounded}
    assert frozenset({"bytes_per_s", "step_overhead_ms"}) in pairs
    # The prefill rate's stated systematic allowance, carried along the covariance, widens
    # every interval and is the whole allowance for F itself.
    f = fitted.estimates["flops_per_s"]
    assert fitted.systematic["flops_per_s"] == pytest.approx(
        f * (math.exp(SYSTEMATIC_PREFILL_REL) - 1)
    )
    for name in PARAMETERS:
        (lo, hi), (wlo, whi) = fitted.intervals[name], fitted.intervals_with_systematic[name]
        assert wlo <= lo <= hi <= whi, (name, (lo, hi), (wlo, whi))
        assert fitted.systematic[name] >= 0


def test_the_report_and_profile_hold_the_fit(synthetic, tmp_path):
    base, _, _, fitted = synthetic
    refs = [PointRef(point=f"closed-c{c}", concurrency=c, cache_state="cold", repeat=0)
            for c in (1, 8, 32)]  # fmt: skip
    inputs = CalibrationInputs(
        base_profile=base.model_dump(mode="json"), peaks_known=True, source="test", points=refs
    )
    doc, text = report(fitted, inputs)
    json.dumps(doc, allow_nan=False)
    eff = doc["efficiency"]
    assert eff["mfu"]["ci95"][0] <= 0.5 <= eff["mfu"]["ci95"][1]
    assert eff["mbu"]["ci95"][0] <= 0.8 <= eff["mbu"]["ci95"][1]
    assert {r["point"] for r in doc["residuals"]} == {"closed-c1", "closed-c8", "closed-c32"}
    c1 = next(r for r in doc["residuals"] if r["concurrency"] == 1)
    assert c1["ttft_fitted"] == 23 and 0 < c1["ttft_median_rel_error"] < 0.05
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    prof = load_profile(path)
    assert prof.efficiency.mfu == pytest.approx(eff["mfu"]["estimate"])
    assert prof.hardware == base.hardware
    # Without known peaks the fitted rates stand as nominal peaks at efficiency 1.0.
    doc2, text2 = report(fitted, inputs.model_copy(update={"peaks_known": False}))
    assert doc2["efficiency"] is None and "nominal peaks" in text2
    path.write_text(text2)
    prof2 = load_profile(path)
    assert prof2.efficiency.mfu == 1.0
    assert prof2.hardware.dense_tflops * 1e12 == pytest.approx(fitted.estimates["flops_per_s"])


def _point(concurrency: int, prompts: list[int], outputs: int = 8) -> MeasuredPoint:
    measured = {(0, k): (10.0, 5.0, p, outputs) for k, p in enumerate(prompts)}
    return MeasuredPoint(f"closed-c{concurrency}", concurrency, [[]], 0.0, measured)


def test_a_fit_that_cannot_run_says_which_measurement_is_missing():
    base = load_profile("small-fast")
    spread = [64, 128, 512, 1024, 2048] * 3
    assert missing_measurements([_point(1, spread), _point(8, spread)]) == []
    no_one = missing_measurements([_point(8, spread), _point(32, spread)])
    assert no_one == [
        "no closed-loop point at concurrency 1: TTFT against prompt length cannot be fitted"
    ]
    one_level = missing_measurements([_point(1, spread)])
    assert one_level == ["only one concurrency level (1): per-sequence cost cannot be separated"]
    narrow = missing_measurements([_point(1, [200, 300] * 8), _point(8, spread)])
    assert narrow[0].startswith("prompt lengths at concurrency 1 span only 200..300 tokens")
    no_tpot = missing_measurements([_point(1, spread, 1), _point(8, spread, 1)])
    assert "TPOT against concurrency cannot be fitted" in no_tpot[0]
    with pytest.raises(CalibrationError, match="^calibration cannot run: no closed-loop point"):
        fit(base, [_point(8, spread), _point(32, spread)])


def test_a_requests_table_without_stamps_is_refused_by_name():
    frame = pd.DataFrame({"phase": ["measure"], "status": ["ok"]})
    with pytest.raises(CalibrationError, match="lacks column"):
        load_point(frame, "closed-c1", 1)


def llamacpp_pack(**architecture):
    data = yaml.safe_load((ROOT / "config/packs/llamacpp-smollm2.yaml").read_text())
    data["model"]["architecture"].update(architecture)
    return validate_pack(data, "llamacpp-smollm2.yaml")


def test_fixed_prompt_lengths_within_4x_are_not_calibrated_and_say_why():
    """Two fixed prompt lengths (32 and 64 tokens) cannot separate prefill from the step; the
    shipped llama.cpp pack's lognormal lengths can be calibrated."""
    assert unplanned_reason(llamacpp_pack()) is None
    data = yaml.safe_load((ROOT / "config/packs/llamacpp-smollm2.yaml").read_text())
    for klass, tokens in zip(data["workload"], (32, 64), strict=True):
        klass["input_tokens"] = tokens
    assert unplanned_reason(validate_pack(data, "fixed.yaml")) == (
        "prompt lengths span only 32..64 tokens (fixed-length classes; need a 4x spread): "
        "prefill FLOP/s cannot be told from the fixed per-step cost"
    )


def test_a_rate_the_data_cannot_see_is_at_its_bound_with_no_correlations():
    """A CPU engine's decode is per-sequence work (llama.cpp's fit: about 9 ms per sequence and
    step) and no step waits on the weight read: B runs to its bound, is listed poorly
    identified, and has no correlations (the rounding in its near-zero variance once gave
    correlations of 5 in a live fit)."""
    base, _, _ = base_profile(llamacpp_pack())
    truth = profile_at(base, flops_per_s=51e9, bytes_per_s=1e15, step_overhead_ms=0.5,
                       per_sequence_overhead_us=9400.0)  # fmt: skip
    rng = random.Random(7)

    def table(concurrency: int, per_worker: int) -> pd.DataFrame:
        workers = [
            [ClosedLoopRequest(rng.choice([25, 40, 60, 100, 155]), 8) for _ in range(per_worker)]
            for _ in range(concurrency)
        ]
        run = simulate_closed_loop(truth, workers, client_gap_s=0.0003, seed=rng.randrange(99))
        rows = [
            {
                "phase": "warmup" if r.order == 0 else "measure",
                "status": "ok",
                "input_tokens": r.prompt_tokens,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "ttft_ms": (r.ttft_s * 1e3 + LATENCY_MS) * math.exp(rng.gauss(0, 0.03)),
                "tpot_ms": r.tpot_s * 1e3 * math.exp(rng.gauss(0, 0.03)),
                "sent_ns": round(r.arrival_s * 1e9),
                "end_ns": round((r.arrival_s + r.e2e_s) * 1e9),
                "worker": r.worker,
                "order": r.order,
            }
            for r in run.results
        ]
        return pd.DataFrame(rows).sort_values(["sent_ns", "worker"]).reset_index(drop=True)

    fitted = fit(base, [load_point(table(c, n), f"closed-c{c}", c) for c, n in ((1, 13), (4, 5))])
    assert fitted.estimates["flops_per_s"] == pytest.approx(51e9, rel=0.1)
    assert fitted.estimates["per_sequence_overhead_us"] == pytest.approx(9400, rel=0.15)
    i = PARAMETERS.index("bytes_per_s")
    assert "bytes_per_s" in fitted.poorly_identified
    assert all(v is None for v in fitted.correlation[i])
    assert all(row[i] is None for row in fitted.correlation)
    assert all("bytes_per_s" not in pair[:2] for pair in fitted.confounded)
    for row in fitted.correlation:
        assert all(v is None or -1.0 <= v <= 1.0 for v in row)


def test_the_smollm2_architecture_maps_to_a_profile_sized_like_llama_server():
    prof, peaks_known, source = base_profile(llamacpp_pack())
    assert not peaks_known and "smollm2-135m.json" in source
    m = prof.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads) == (30, 576, 9, 3)
    assert (m.head_dim, m.intermediate_size, m.vocab_size, m.tie_word_embeddings) == (
        64, 1536, 49152, True,
    )  # fmt: skip
    # The GGUF's own tensor count; its 96,576,768 tensor bytes at 0.718 bytes per parameter.
    assert m.params == 134_515_008
    assert m.weight_bytes == pytest.approx(96_576_768, rel=1e-3)
    # Four slots of a 4096-token context: 1024 tokens each, the KV cache holds all 4096.
    assert prof.engine.max_num_seqs == 4 and m.max_model_len == 1024
    assert 4096 <= prof.num_gpu_blocks * prof.engine.block_size < 4096 + 2 * 16


def test_a_bad_architecture_file_is_one_line_naming_file_and_field(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"num_hidden_layers": 0}))
    with pytest.raises(ArchitectureError, match=r"config.json: num_hidden_layers: expected a pos"):
        base_profile(llamacpp_pack(config=str(bad)))
    with pytest.raises(ArchitectureError, match="cannot read the architecture file"):
        base_profile(llamacpp_pack(config=str(tmp_path / "missing.json")))


def test_sim_targets_calibrate_against_their_own_profile_and_plan_only_what_can_be_fitted():
    data = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    inputs = CalibrationInputs.of(validate_pack(data, "config.yaml"))
    assert inputs is not None and inputs.peaks_known
    assert [p.point for p in inputs.points] == ["closed-c1", "closed-c8", "closed-c32"]
    assert {(p.cache_state, p.repeat) for p in inputs.points} == {("cold", 0)}
    data["sweep"]["closed_loop_concurrency"] = [1]
    pack = validate_pack(data, "config.yaml")
    assert CalibrationInputs.of(pack) is None
    assert unplanned_reason(pack) == (
        "only one concurrency level: per-sequence cost cannot be separated"
    )
    data["sweep"].update(closed_loop_concurrency=[1, 8], cache_states=["warm"])
    assert unplanned_reason(validate_pack(data, "config.yaml")).startswith("no cold cache state")
