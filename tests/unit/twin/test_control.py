"""The engine model as a control variate: where it applies, what it computes, and how a rate's
pooled attainment reads it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from capacity_pack.artifacts import SloReport
from capacity_pack.binomial import control_variate_interval
from capacity_pack.decide.pooled import pooled_attainment, rate_evidence
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.plan.schedule import Point, build_schedule
from capacity_pack.sim.profile import load_profile
from capacity_pack.twin.control import (
    ControlInputs,
    annotate,
    long_run,
    long_run_bracket,
    model_outcomes,
    worst_long_run,
)
from tests.conftest import pack_data

POINT = Point(mode="open", rate_rps=30.0, cache_state="cold", repeat=0)


@pytest.fixture(scope="module")
def inputs() -> ControlInputs:
    data = pack_data()
    data["client"]["minimum_duration_seconds"] = 5
    data["client"]["initial_scheduled_requests"] = 150
    data["client"].pop("class_schedule_counts")
    found = ControlInputs.for_point(validate_pack(data, "pack.yaml"), POINT)
    assert found is not None
    return found


def test_it_applies_to_a_simulated_targets_open_loop_points_only():
    pack = validate_pack(pack_data(), "pack.yaml")
    closed = Point(mode="closed", concurrency=4, cache_state="cold", repeat=0)
    assert ControlInputs.for_point(pack, closed) is None
    data = pack_data()
    data["target"] = {"kind": "openai", "base_url": "http://127.0.0.1:9", "cache_reset": "none"}
    assert ControlInputs.for_point(validate_pack(data, "pack.yaml"), POINT) is None
    # The long run is computed for one engine.
    two = pack.model_copy(update={"target": pack.target.model_copy(update={"replicas": 2})})
    assert ControlInputs.for_point(two, POINT) is None
    assert ControlInputs.for_point(pack, POINT) is not None


def test_the_model_runs_the_points_own_schedule(inputs):
    schedule = build_schedule(inputs.schedule, POINT)
    model = model_outcomes(inputs, POINT)
    assert set(model["request_id"]) == set(schedule["request_id"].astype(str))
    assert model["ttft_ms"].notna().all() and (model["ttft_ms"] > 0).all()


def test_the_long_run_is_a_fixed_function_of_the_rate(inputs):
    first = long_run(inputs, 30.0, "cold")
    assert set(first) == {c.name for c in inputs.schedule.workload}
    for entry in first.values():
        assert 0 <= entry["mean"] <= 1 and entry["var"] >= 0 and entry["requests"] > 3000
    assert long_run(inputs, 30.0, "cold") == first  # the same mu wherever it is computed


def test_a_long_run_is_kept_on_disk_and_read_back(inputs, tmp_path, monkeypatch):
    from capacity_pack.twin import control

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    control._long_run.cache_clear()
    first = long_run(inputs, 30.0, "cold")
    (kept,) = (tmp_path / "capacity-pack" / "long-run").glob("*.json")
    control._long_run.cache_clear()
    assert long_run(inputs, 30.0, "cold") == first  # read back, bit for bit
    # A damaged file is computed again, and written again.
    kept.write_text("{not json")
    control._long_run.cache_clear()
    assert long_run(inputs, 30.0, "cold") == first
    assert len(list(kept.parent.glob("*.json"))) == 1
    control._long_run.cache_clear()


def _report_of(model: pd.DataFrame, inputs: ControlInputs) -> tuple[dict, pd.DataFrame]:
    """A point whose live outcomes are the model's own (the target is its model)."""
    schedule = build_schedule(inputs.schedule, POINT).set_index("request_id")
    table = model.assign(
        phase=schedule.loc[model["request_id"], "phase"].to_numpy(),
        status="ok",
        sent_ns=schedule.loc[model["request_id"], "scheduled_offset_ns"].to_numpy(np.int64),
    )
    from capacity_pack.binomial import block_counts
    from capacity_pack.vocab.slo import cutoff_checks

    doc = {"classes": {}, "attainment_gate": {"min": 0.95}, "besides_attainment": {}}
    measured = table[table["phase"] != "warmup"]
    for c in inputs.schedule.workload:
        okc = measured[measured["class"] == c.name]
        met = cutoff_checks(
            okc["ttft_ms"], okc["tpot_ms"], c.request_ttft_cutoff_ms, c.request_tpot_cutoff_ms
        ).met
        block_s, n_j, k_j = block_counts(met, okc["sent_ns"].to_numpy(np.int64))
        doc["classes"][c.name] = {
            "passing_count": int(met.sum()),
            "successful_count": int(met.size),
            "attainment": float(met.mean()),
            "attainment_ci_confidence": 0.95,
            "attainment_blocks": {
                "block_s": block_s,
                "successful": n_j.tolist(),
                "passing": k_j.tolist(),
            },
        }
    return doc, table


def test_a_target_that_is_its_model_gets_the_models_long_run(inputs):
    doc, table = _report_of(model_outcomes(inputs, POINT), inputs)
    annotate(doc, table, inputs, POINT)
    runs = long_run(inputs, 30.0, "cold")
    for name, entry in doc["classes"].items():
        cv = entry["control_variate"]
        assert cv["disagreements"] == 0 and not any(cv["diff_blocks"])
        assert cv["model_passing"] == entry["passing_count"]
        assert len(cv["diff_blocks"]) == len(entry["attainment_blocks"]["successful"])
        assert cv["long_run"] == runs[name]["mean"]
    identity = {"point": "p", "key": "k", "cache_state": "cold", "repeat": 0, "mode": "open",
                "verdict": "pass", "attempted": 0, "successful": 0}  # fmt: skip
    doc["besides_attainment"] = {"outcome": "pass"}
    pooled = pooled_attainment([SloReport.model_validate(identity | doc)] * 2)
    for name, e in pooled.items():
        assert e["method"] == "control variate"
        assert e["attainment"] == pytest.approx(runs[name]["mean"])
        assert e["measured_attainment"] == doc["classes"][name]["attainment"]
        low, high = e["ci"]
        assert low <= e["attainment"] <= high
    assert "control variate" in rate_evidence("marginal", pooled)


def test_the_interval_is_the_long_runs_when_live_and_model_agree():
    est, (low, high) = control_variate_interval([10] * 6, [0.0] * 6, 0, 0.96, 1e-4, 0.95)
    assert est == 0.96
    assert (high - low) / 2 == pytest.approx(1.959964 * 0.01, rel=1e-5)


def test_differences_move_the_estimate_and_widen_the_interval():
    n_j, d_j = [20] * 8, [-2.0, 0, -1, 0, 0, -3, 0, 0]
    est, (low, high) = control_variate_interval(n_j, d_j, 6, 0.96, 0.0, 0.95)
    assert est == pytest.approx(0.96 - 6 / 160)
    # At least the independent-outcomes variance: (D2/N - dbar^2) / (N - 1).
    dbar = -6 / 160
    iid = (6 / 160 - dbar**2) / 159
    assert (high - low) / 2 >= 1.959964 * math.sqrt(iid) - 1e-9
    assert 0 <= low < est < high <= 1


@pytest.mark.slow
def test_the_first_bracket_is_centred_on_the_models_long_run_boundary():
    pack = validate_pack(pack_data(), "pack.yaml")
    profile = load_profile(pack.target.profile)
    gate = pack.acceptance.class_slo_attainment_min
    # From a short-window bracket wholly below the boundary: step up, then narrow.
    found = long_run_bracket(pack, profile, "cold", 30.0, 32.0, 2.0)
    assert found is not None
    assert found.fail_rps - found.pass_rps == pytest.approx(2.0)
    assert found.pass_rps < found.boundary_rps < found.fail_rps
    assert found.pass_rps + 1.0 == pytest.approx(round(found.boundary_rps * 2) / 2)
    seen = dict(found.attainment)
    below = [a for r, a in seen.items() if r <= found.boundary_rps]
    above = [a for r, a in seen.items() if r > found.boundary_rps]
    assert below and above and min(below) >= gate > max(above)
    # Both ends are clear of the gate on the model's long run, each on its side.
    inputs = ControlInputs.for_point(pack, POINT)
    assert worst_long_run(inputs, found.pass_rps, "cold") > gate + 0.005
    assert worst_long_run(inputs, found.fail_rps, "cold") < gate - 0.005
    # A relative resolution: the width is rel x pass_rps at most.
    rel = long_run_bracket(pack, profile, "cold", found.pass_rps, found.fail_rps, None, 0.05)
    assert rel is not None and rel.pass_rps < rel.boundary_rps < rel.fail_rps
    assert rel.fail_rps - rel.pass_rps <= 0.05 * rel.pass_rps


def test_no_centred_bracket_where_the_control_variate_does_not_apply():
    data = pack_data()
    data["target"] = {"kind": "openai", "base_url": "http://127.0.0.1:9", "cache_reset": "none"}
    pack = validate_pack(data, "pack.yaml")
    assert long_run_bracket(pack, load_profile("small-fast"), "cold", 30.0, 32.0, 2.0) is None
