"""The calibrated twin against the live simulated engine: a small pack measured through the real
Snakemake pipeline (the embedded simulator on 127.0.0.1 serving profile small-fast, driven by
the pack's load generator) up to its closed-loop points, then the ``calibrate`` stage.

The fit must recover the profile's identifiable efficiency parameters within its stated 95 %
intervals widened by the fit's stated systematic allowance (3 % of the prefill rate, carried
along the fitted covariance): mfu always; mbu and the step overhead each when the fit calls it
identified; their identified combination (the batch-1 decode step) within a stated 1 %. The
per-sequence overhead (4 us a sequence, under 1 % of a step even at 32 sequences) includes the
live server's own per-sequence work, so only its lower side is asserted."""

from __future__ import annotations

import json

import pytest

from capacity_pack.sim.perf import PerfModel
from capacity_pack.sim.profile import load_profile
from capacity_pack.twin.validate import capacity_error, predicted_capacity
from tests.conftest import run_snakemake as snakemake
from tests.conftest import small_pack_data, write_pack

# Alone: the fit reads latencies measured live, and another test's jobs on the same two cores
# would add their own delays to what the twin is asked to explain.
pytestmark = [pytest.mark.slow, pytest.mark.exclusive]


def calibration_pack() -> dict:
    # Concurrency 1 (TTFT against prompts of 60..3000 tokens, the default pack's lognormal
    # classes), 8 and 32 (TPOT against batch and context), cold cache only.
    data = small_pack_data(
        "calibrate-test",
        requests=60,
        min_samples=10,
        sweep={"open_loop_rps": [20], "closed_loop_concurrency": [1, 8, 32]},
    )
    data["sweep"].update(
        cache_states=["cold"], closed_loop_min_requests=24, closed_loop_requests_per_worker=2
    )
    data["failure"] = None
    return data


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("calibrate")
    write_pack(workdir, calibration_pack())
    # The calibration, the twin's prediction from it, and the exact engine model's preflight:
    # none of them needs an open-loop point.
    snakemake(
        workdir,
        "results/calibrate-test/twin/calibration.json",
        "results/calibrate-test/twin/prediction.json",
        "results/calibrate-test/preflight/preflight.json",
    )
    return workdir / "results" / "calibrate-test"


def test_calibration_recovers_the_profiles_efficiencies_within_their_intervals(calibrated):
    doc = json.loads((calibrated / "twin" / "calibration.json").read_text())
    prof = load_profile("small-fast")
    truth = prof.efficiency
    eff, params = doc["efficiency"], doc["parameters"]
    poor = set(doc["poorly_identified"])
    # Prefill FLOP/s (TTFT against prompt length at concurrency 1): always identified, even
    # where TPOT ties it to B, o and p in one ridge (correlations over 0.99 on a quiet host,
    # 2026-12-03; the less precise members are the ones listed). Its statistical interval
    # alone missed 0.5 by up to 0.8 % (what the live server does per prompt token reads as a
    # slower prefill), so the truth is asked within the interval with the systematic
    # allowance, which the fit states (docs/twin.md).
    assert "flops_per_s" not in poor
    lo, hi = eff["mfu"]["ci95_with_systematic"]
    assert lo <= truth.mfu <= hi, eff["mfu"]
    assert eff["mfu"]["ci95"][0] > lo and eff["mfu"]["ci95"][1] < hi, eff["mfu"]
    # mbu and the step overhead: each within its interval (with the systematic allowance)
    # when identified. The prefill rate's bias moves them along the ridge (the step overhead
    # some 30 % for 1 % of F), so the step overhead is listed in every live run.
    for name, value, got in (
        ("bytes_per_s", truth.mbu, eff["mbu"]),
        ("step_overhead_ms", truth.step_overhead_ms, params["step_overhead_ms"]),
    ):
        if name not in poor:
            wlo, whi = got["ci95_with_systematic"]
            assert wlo <= value <= whi, (name, value, got)
    # The per-sequence cost a live server shows is the modelled 4 us plus the server's own
    # per-sequence work each step (streaming each sequence's chunk): identified in some live
    # runs (5.98 us [3.1, 8.8] and 11.4 us [5.9, 16.9] on 2026-12-03), listed in others (on a
    # quiet host it follows F's bias some 50-fold along the ridge). An identified interval
    # does not lie below the modelled cost.
    p = params["per_sequence_overhead_us"]
    if "per_sequence_overhead_us" not in poor:
        assert p["ci95_with_systematic"][1] >= truth.per_sequence_overhead_us, p
    # What the fit does fix of the pair, the batch-1 decode step at the concurrency-1 requests'
    # median context, within 1 %: its interval is statistical only (0.1-0.2 %), and the live
    # server's own per-step costs on a loaded host move it by up to 0.4 % (docs/twin.md).
    step = doc["derived"]["decode_step_ms_at_batch_1"]
    true_step = PerfModel(prof).decode_step_s(1, round(step["context_tokens"])) * 1e3
    assert step["estimate"] == pytest.approx(true_step, rel=0.01), (true_step, step)
    # Said, not hidden: the collinear pair is listed with its correlation.
    if {"bytes_per_s", "step_overhead_ms"} <= poor:
        pairs = [set(c["pair"]) for c in doc["confounded"]]
        assert {"bytes_per_s", "step_overhead_ms"} in pairs, doc["confounded"]
    # The replay follows the measurement request for request.
    by_point = {r["point"]: r for r in doc["residuals"]}
    assert set(by_point) == {f"closed-c{c}/cold/rep0" for c in (1, 8, 32)}
    # TTFT at concurrency 1 carries the host's scheduling delays, which the robust fit
    # down-weights rather than replays: median error 1.5-3.6 % on a quiet host, 11 % in a CI
    # run with the suite around it (2026-12-03).
    c1 = by_point["closed-c1/cold/rep0"]
    assert c1["ttft_median_rel_error"] < 0.2, c1
    for r in by_point.values():
        assert r["tpot_median_rel_error"] < 0.05, r


def test_the_calibrated_profile_loads_and_no_open_loop_point_was_measured(calibrated):
    prof = load_profile(calibrated / "twin" / "profile.yaml")
    doc = json.loads((calibrated / "twin" / "calibration.json").read_text())
    assert prof.name == "small-fast-calibrated"
    assert prof.efficiency.mfu == pytest.approx(doc["efficiency"]["mfu"]["estimate"])
    assert prof.engine == load_profile("small-fast").engine
    # The calibration saw only the closed loop: no open-loop point ran for it.
    assert sorted(p.name for p in (calibrated / "raw").iterdir()) == [
        "closed-c1", "closed-c32", "closed-c8",
    ]  # fmt: skip
    assert (calibrated / "logs" / "calibrate.log").exists()
    assert (calibrated / "benchmarks" / "calibrate.tsv").exists()


def test_the_calibrated_twin_predicts_the_engine_models_capacity_within_the_resolution(calibrated):
    # The truth is the simulated target's own engine model, run on the same virtual points
    # (preflight.json): the twin, fitted to the live closed loop alone, predicts its bracket.
    exact = json.loads((calibrated / "preflight" / "preflight.json").read_text())
    twin = json.loads((calibrated / "twin" / "prediction.json").read_text())
    assert twin["made_from"].endswith("no open-loop measurement")
    (truth,) = exact["brackets"]
    predicted = twin["cache_states"]["cold"]
    assert truth["pass_rps"] and truth["fail_rps"], truth
    c_twin = predicted_capacity(predicted["pass_rps"], predicted["fail_rps"])
    error = capacity_error(c_twin, truth["pass_rps"], truth["fail_rps"])
    resolution = truth["resolution_rps"]
    assert error * truth["pass_rps"] <= resolution + 1e-9, (predicted, truth)
