"""What-if changes: the mix rescaled, the fleet resized, the engine limits replaced, refusals
named."""

from __future__ import annotations

import pytest

from capacity_pack.plan.manifest import load_pack
from capacity_pack.sim.profile import load_profile
from capacity_pack.twin.whatif import (
    Changes,
    WhatIfError,
    changed_pack,
    changed_profile,
    new_mix,
    parse_mix,
)
from tests.paths import ROOT

TUTORIAL = ROOT / "config" / "packs" / "tutorial-70b.yaml"


def test_new_mix_keeps_the_other_classes_relative_shares():
    mix = new_mix({"a": 0.7, "b": 0.2, "c": 0.1}, {"b": 0.4})
    assert mix == pytest.approx({"a": 0.7 * 0.6 / 0.8, "b": 0.4, "c": 0.1 * 0.6 / 0.8})
    assert sum(mix.values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"d": 0.1}, "--mix: unknown workload class 'd'; the pack's classes: a, b"),
        ({"a": 1.0}, "--mix: the given shares sum to 1, leaving nothing for b"),
        ({"a": 0.5, "b": 0.4}, "--mix: every class given, the shares must sum to 1, not 0.9"),
    ],
)
def test_new_mix_refuses_what_cannot_be_a_mix(given, message):
    with pytest.raises(WhatIfError, match="^" + message.replace("(", r"\(")):
        new_mix({"a": 0.5, "b": 0.5}, given)


def test_parse_mix_names_the_bad_item():
    assert parse_mix(["long_context=0.4"]) == {"long_context": 0.4}
    with pytest.raises(WhatIfError, match=r"--mix 'long_context:0.4': expected CLASS=SHARE"):
        parse_mix(["long_context:0.4"])


def test_changed_pack_recounts_a_stratified_schedule_and_resizes_the_fleet():
    pack = load_pack(TUTORIAL)
    new = changed_pack(pack, Changes(mix={"long_context": 0.4}, replicas=8))
    mix = {c.name: c.mix for c in new.workload}
    assert mix["long_context"] == pytest.approx(0.4)
    assert mix["interactive"] / mix["generation_heavy"] == pytest.approx(7.0)
    assert new.target.replicas == 8
    placement = new.engine.placement
    assert (placement.replicas, placement.gpus) == (8, 16)
    assert new.class_counts(new.client.initial_scheduled_requests)["long_context"] == pytest.approx(
        0.4 * new.client.initial_scheduled_requests, abs=1
    )
    assert pack.target.replicas != 8  # the original is untouched


def test_changed_profile_replaces_the_engine_limits_validated():
    profile = load_profile("small-fast")
    new = changed_profile(profile, Changes(max_num_seqs=16, max_num_batched_tokens=2048))
    assert (new.engine.max_num_seqs, new.engine.max_num_batched_tokens) == (16, 2048)
    assert changed_profile(profile, Changes()) is profile
    with pytest.raises(WhatIfError, match="--max-num-seqs 0: expected at least 1"):
        changed_profile(profile, Changes(max_num_seqs=0))


def test_the_whatif_command_predicts_on_the_simulated_targets_own_model(tmp_path):
    from click.testing import CliRunner

    from capacity_pack.cli import main

    config = ROOT / "config" / "config.yaml"
    args = ["whatif", str(config), "--rate", "20", "--cache-state", "cold"]
    res = CliRunner().invoke(main, [*args, "--max-num-seqs", "64", "--results", str(tmp_path)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "rehearsal-sim: what if max_num_seqs 64 (a prediction in virtual time)"
    assert "the simulated target's own engine model (small-fast): exact" in lines[1]
    assert lines[2].startswith("  cold 20 RPS: pass (interactive ")


def test_the_whatif_command_refuses_a_real_target_without_a_twin(tmp_path):
    from click.testing import CliRunner

    from capacity_pack.cli import main

    config = ROOT / "config" / "packs" / "llamacpp-smollm2.yaml"
    res = CliRunner().invoke(main, ["whatif", str(config), "--results", str(tmp_path)])
    assert res.exit_code == 1
    assert res.output.strip().splitlines() == [
        f"Error: {tmp_path}/llamacpp-smollm2/twin/profile.yaml: no calibrated twin for this real "
        "target; run the pack's closed loop and its calibrate stage first (snakemake ... "
        "calibrate), or give --profile"
    ]
