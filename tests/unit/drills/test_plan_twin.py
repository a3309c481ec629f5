"""The plan drill of a real target: live when it fits, else predicted on the pack's calibrated twin
when its validation trusts it, else skipped saying why.

The packs are the default pack with a real target: a managed OpenAI-compatible server (the
project's own engine started as a plain process behind the project's router, as in
tests/integration/test_failure.py), with the model's shape declared so that the pack plans a
calibrated twin. The validations are made by :func:`capacity_pack.twin.validate.validate` from
a prediction and a measured capacity.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from capacity_pack.artifacts import TwinValidation
from capacity_pack.drills.plan import DrillInputs
from capacity_pack.drills.virtual import REAL_TARGET_POLICY, run_virtual_drill
from capacity_pack.plan.manifest import PLAN_DRILL, validate_pack
from capacity_pack.sim.profile import load_profile
from capacity_pack.twin.calibrate import twin_absent_reason
from capacity_pack.twin.trust import ValidatedTwin
from capacity_pack.twin.validate import validate
from tests.conftest import pack_data, real_calibratable
from tests.drills import plan_at

# The plan: 4 replicas (3 for the load at 0.75 + 1 redundancy) at the default pack's 60 RPS
# peak, beyond its live limit of 2 replicas and 40 RPS.
BIG_PLAN = {"required_replicas": 4, "replicas_for_load": 3, "redundancy_replicas": 1}
SMALL_PLAN = {"required_replicas": 2, "replicas_for_load": 2, "redundancy_replicas": 0}


def real_pack(*, architecture: bool = True, peak: float = 60, **plan_drill_settings):
    data = real_calibratable(pack_data(), architecture=architecture)
    data["plan"]["peak_rps"] = peak
    data["failure"]["plan_drill"].update(plan_drill_settings)
    return validate_pack(data, "test pack")


def capacity(pass_rps: float, fail_rps: float) -> dict:
    state = {
        "capacity_per_replica_rps": pass_rps,
        "capacity_rps": pass_rps,
        "bracket": {"pass_rps": pass_rps, "fail_rps": fail_rps},
        "rates": [],
    }
    return {"primary_cache_state": "cold", "open_loop": {"cold": state}, "closed_loop": {}}


def twin(profile: Path, predicted: tuple[float, float], measured: tuple[float, float]):
    pass_rps, fail_rps = predicted
    prediction = {"cache_states": {"cold": {"pass_rps": pass_rps, "fail_rps": fail_rps}}}
    return ValidatedTwin(
        str(profile), TwinValidation.parse(validate(prediction, capacity(*measured)), "test")
    )


@pytest.fixture
def profile(tmp_path) -> Path:
    """A calibrated profile file, as the calibrate stage writes one (a profile YAML)."""
    data = load_profile("small-fast").model_dump(mode="json")
    data["name"] = "small-fast-calibrated"
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_trusted_twin_predicts_a_plan_too_large_to_run_live(profile):
    pack = real_pack()
    inputs = drill_inputs(pack)
    assert inputs.twin_absent is None
    # Predicted [38, 40), measured [36, 38): 1 RPS from the bracket, 1 / 36 = 2.8 %.
    trusted = twin(profile, (38, 40), (36, 38))
    plan = plan_at(inputs, capacity(36, 38), {}, BIG_PLAN, trusted)
    assert plan.runnable and plan.execution == "virtual"
    assert plan.replicas == 4 and plan.rate_rps == 60
    reason = plan.execution_reason
    assert reason.startswith("auto: 4 replicas at 60 RPS")
    assert "predicted by the calibrated twin" in reason
    assert "2.8% from the measured bracket (cold), tolerance 15%" in reason
    assert plan.twin is not None and plan.twin["profile"] == str(profile)
    assert plan.twin["trusted"] and plan.twin["capacity_error_rel"] == pytest.approx(1 / 36)
    # Configured virtual: the same prediction, whatever the size.
    forced = plan_at(
        DrillInputs.for_drill(real_pack(mode="virtual"), PLAN_DRILL),
        capacity(36, 38),
        {},
        SMALL_PLAN,
        trusted,
    )
    assert forced.execution == "virtual" and forced.execution_reason.startswith(
        "configured: mode virtual; predicted by the calibrated twin"
    )


def test_an_untrusted_twin_is_not_used_and_the_drill_says_its_error(profile):
    inputs = DrillInputs.for_drill(real_pack(), PLAN_DRILL)
    # Predicted [50, 60), measured [36, 38): 55 is 17 RPS above 38, 17 / 36 = 47.2 %.
    untrusted = twin(profile, (50, 60), (36, 38))
    plan = plan_at(inputs, capacity(36, 38), {}, BIG_PLAN, untrusted)
    assert not plan.runnable and plan.execution == "live"
    assert "the calibrated twin that could predict it is untrusted" in plan.skip_reason
    assert "47.2% from the measured bracket (cold), tolerance 15%" in plan.skip_reason
    assert plan.twin is not None and not plan.twin["trusted"]


def drill_inputs(pack, name: str = PLAN_DRILL) -> DrillInputs:
    """What the rule gives a drill job: its inputs, with why the pack has no twin."""
    return DrillInputs.for_drill(pack, name, twin_absent_reason(pack))


def test_without_a_twin_the_drill_is_skipped_saying_why_there_is_none():
    inputs = drill_inputs(real_pack(architecture=False))
    assert inputs.twin_absent is not None
    assert inputs.twin_absent.startswith("the pack cannot be calibrated (a real target without")
    plan = plan_at(inputs, capacity(36, 38), {}, BIG_PLAN, None)
    assert not plan.runnable
    assert plan.skip_reason.startswith(
        "the plan drill of a real target runs live, or in virtual time on its calibrated twin: "
        "4 replicas at 60 RPS"
    )
    assert "and there is no calibrated twin: the pack cannot be calibrated" in plan.skip_reason
    forced = plan_at(
        drill_inputs(real_pack(architecture=False, mode="virtual")),
        capacity(36, 38),
        {},
        BIG_PLAN,
        None,
    )
    assert not forced.runnable and forced.skip_reason.startswith(
        "configured: mode virtual, which for a real target runs on its calibrated twin, and there "
        "is no calibrated twin: the pack cannot be calibrated"
    )
    # Only the plan drill of a real target carries the reason: the other drills' params (and a
    # simulated target's plan drill's) are what they were.
    mechanism = drill_inputs(real_pack(architecture=False), "replica_kill")
    assert mechanism.twin_absent is None and "twin_absent" not in mechanism.canonical_json()


def test_a_real_plan_that_fits_live_runs_live_whatever_the_twin(profile):
    inputs = DrillInputs.for_drill(real_pack(peak=40), PLAN_DRILL)
    plan = plan_at(inputs, capacity(36, 38), {}, SMALL_PLAN, twin(profile, (38, 40), (36, 38)))
    assert plan.runnable and plan.execution == "live" and plan.twin is None
    assert plan.execution_reason.startswith("auto: 2 replicas at 40 RPS")


def test_the_twin_is_absent_for_a_pack_without_an_open_loop():
    data = pack_data()
    data["sweep"]["open_loop_rps"] = []
    data["sweep"].pop("search")
    data["experiments"] = []
    data["failure"] = None
    pack = validate_pack(data, "test pack")
    assert (
        twin_absent_reason(pack)
        == "the pack has no open loop to validate a calibrated twin against"
    )


def test_the_real_target_policy_is_the_project_routers_default():
    from capacity_pack.sim.cli import cluster

    (option,) = [p for p in cluster.params if p.name == "policy"]
    assert option.default == REAL_TARGET_POLICY


def test_a_virtual_plan_drill_of_a_real_target_runs_on_the_calibrated_profile(profile, tmp_path):
    pack = real_pack()
    inputs = DrillInputs.for_drill(pack, PLAN_DRILL)
    small = inputs.model_copy(
        update={"failure": inputs.failure.model_copy(update={"duration_s": 8, "baseline_s": 3})}
    )
    trusted = twin(profile, (38, 40), (36, 38))
    plan = plan_at(small, capacity(36, 38), {}, BIG_PLAN, trusted)
    plan = plan.model_copy(update={"rate_rps": 20.0, "rate_after_rps": 20.0})
    out = tmp_path / "drill"
    facts = run_virtual_drill(small, plan, out)
    for name in ("drill.json", "records.jsonl", "samples.parquet", "scrapes.parquet"):
        assert (out / name).exists(), name
    doc = json.loads((out / "drill.json").read_text())
    assert doc["execution"] == "virtual" and doc["target_kind"] == "openai"
    assert doc["prediction"].startswith("predicted by the calibrated twin")
    assert "2.8% from the measured bracket" in doc["prediction"]
    assert f"{REAL_TARGET_POLICY}" in doc["replicas_started_by"]
    assert str(profile) in doc["replicas_started_by"]
    assert doc["plan"]["twin"]["label"] == doc["prediction"]
    assert facts["load"]["statuses"].get("ok", 0) > 0
    # Words follow the target: a real target's files name the calibrated twin's engine model.
    text = (out / "drill.json").read_text()
    for word in ("simulat", "accelerator", "GPU"):
        assert word not in text, word


def test_a_twin_compared_with_nothing_is_untrusted_and_says_so(profile):
    # No measured bracket in the cache state the twin predicted: nothing was compared.
    prediction = {"cache_states": {"warm": {"pass_rps": 38, "fail_rps": 40}}}
    blind = ValidatedTwin(
        str(profile), TwinValidation.parse(validate(prediction, capacity(36, 38)), "test")
    )
    assert not blind.trusted and blind.validation.worst is None
    inputs = DrillInputs.for_drill(real_pack(), PLAN_DRILL)
    plan = plan_at(inputs, capacity(36, 38), {}, BIG_PLAN, blind)
    assert not plan.runnable
    assert "its prediction was compared with no measured bracket" in plan.skip_reason
    assert "no cache state has both a predicted and a measured bracket" in plan.skip_reason


def test_the_cli_drill_predicts_a_large_real_plan_on_the_twin_it_is_given(profile, tmp_path):
    from click.testing import CliRunner

    from capacity_pack.cli import main

    data = real_calibratable(pack_data())
    data["plan"]["peak_rps"] = 8
    data["failure"].update(duration_s=6, baseline_s=3)
    data["failure"]["drills"] = [d for d in data["failure"]["drills"] if d["kind"] != "kv_pressure"]
    config = tmp_path / "pack.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    files = {"capacity.json": capacity(36, 38), "plan.json": BIG_PLAN}
    prediction = {"cache_states": {"cold": {"pass_rps": 38, "fail_rps": 40}}}
    files["validation.json"] = validate(prediction, capacity(36, 38))
    for name, doc in files.items():
        (tmp_path / name).write_text(json.dumps(doc))
    args = ["drill", str(config), "--drill", PLAN_DRILL, "--capacity",
            str(tmp_path / "capacity.json"), "--plan", str(tmp_path / "plan.json")]  # fmt: skip
    twin_args = ["--twin", str(profile), str(tmp_path / "validation.json")]

    res = CliRunner().invoke(main, [*args, *twin_args, "-o", str(tmp_path / "with")])
    assert res.exit_code == 0, res.output
    assert f"{PLAN_DRILL} (virtual): Losing 1 of 4 replicas at the 8 RPS peak" in res.output
    assert "predicted by the calibrated twin" in res.output
    # Without --twin: skipped, naming the option that would give it one.
    res = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "without")])
    assert res.exit_code == 0, res.output
    assert f"{PLAN_DRILL}: skipped:" in res.output
    assert "there is no calibrated twin: none given (--twin PROFILE VALIDATION)" in res.output
    # The pair swapped: refused in one line, nothing run.
    swapped = ["--twin", str(tmp_path / "validation.json"), str(profile)]
    res = CliRunner().invoke(main, [*args, *swapped, "-o", str(tmp_path / "swapped")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    (line,) = res.output.strip().splitlines()
    assert line.startswith("Error: --twin PROFILE:") and "invalid simulator profile" in line
    assert not (tmp_path / "swapped").exists()
