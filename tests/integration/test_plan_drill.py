"""The plan drill: one replica of the recommended fleet killed at the planned peak, judged N+1.

Everything goes through the pipeline's own code: the replica plan from ``build_plan`` (the
capacity stage's), then the stages ``failure_drill``, ``dashboard``, ``failure_analyze`` and
``failure_test`` as their Snakemake scripts call them. The engine model's small-fast profile
serves about 30 RPS per replica within the default pack's SLOs (cold), a little more warm.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from capacity_pack.artifacts.capacity import Capacity
from capacity_pack.decide.capacity import build_plan
from capacity_pack.drills.plan import DrillInputs, DrillNumbers
from capacity_pack.plan.manifest import PLAN_DRILL, validate_pack
from capacity_pack.stages import entry
from capacity_pack.twin.calibrate import twin_absent_reason
from tests.conftest import (
    pack_data,
    real_calibratable,
    run_snakemake,
    small_pack_data,
    with_fixed_lengths,
    write_pack,
)

LOG = logging.getLogger("test")


def make_pack(peak: float, utilization: float, redundancy: int, mode: str, **failure):
    # Fixed lengths: the live-vs-virtual tolerances were set on them (a tailed class's few
    # requests in the one-short window differ between the two by more than 0.05).
    data = with_fixed_lengths(pack_data())
    data["plan"].update(peak_rps=peak, redundancy_replicas=redundancy)
    data["acceptance"]["target_utilization"] = utilization
    data["failure"]["plan_drill"] = {"mode": mode}
    data["failure"].update(failure)
    return validate_pack(data, "test pack")


def capacity_doc(per_replica: float) -> dict:
    sel = {"capacity_per_replica_rps": per_replica, "capacity_rps": per_replica}
    return {"primary_cache_state": "cold", "open_loop": {"cold": sel}, "closed_loop": {}}


def plan_drill(pack, out: Path, per_replica: float = 30.0, **twin: Path) -> dict:
    """The capacity stage's plan for ``pack``, then the plan drill run and analysed (``twin``:
    ``twin_profile`` and ``twin_validation``, the files the rule gives a real target's plan
    drill)."""
    out.mkdir(parents=True, exist_ok=True)
    cap = capacity_doc(per_replica)
    (out / "capacity.json").write_text(json.dumps(cap))
    (out / "plan.json").write_text(json.dumps(build_plan(Capacity.model_validate(cap), [], pack)))
    drill = out / PLAN_DRILL / "drill.json"
    # As the rule gives them: with why the pack has no validated twin, where it has none.
    inputs = DrillInputs.for_drill(pack, PLAN_DRILL, twin_absent_reason(pack))
    plan = json.loads((out / "plan.json").read_text())
    entry("failure_drill")(
        inputs=inputs.canonical_json(),
        numbers=DrillNumbers.of(inputs, cap, {}, plan).canonical_json(),
        drill=drill,
        log=LOG,
        **twin,
    )
    entry("dashboard")(inputs=pack, rules=out / "rules.yaml", log=LOG)
    from capacity_pack.drills.analyze import DrillAnalysisSpec

    return entry("failure_analyze")(
        spec=DrillAnalysisSpec.of(pack).canonical_json(),
        drill=drill,
        rules=out / "rules.yaml",
        report=out / PLAN_DRILL / "drill-report.json",
        timeline=out / PLAN_DRILL / "timeline.png",
        log=LOG,
    )


def test_a_plan_without_redundancy_fails_and_one_with_it_passes(tmp_path):
    # No redundancy at utilization 1.0: 60 RPS on ceil(60 / 30) = 2 replicas; one dies and the
    # other is offered twice its capacity.
    bare = make_pack(60, 1.0, 0, "virtual", admission_max_outstanding=51)
    fail = plan_drill(bare, tmp_path / "bare")
    n = fail["n_plus_one"]
    assert fail["replicas"] == 2 and fail["rate_rps"] == 60 and fail["execution"] == "virtual"
    assert n["verdict"] == "FAIL" and not n["checks"]["survivors_carry_the_peak"]
    assert n["checks"]["plan_holds_before_the_failure"]
    assert n["requests_rejected"] > 0 and n["failure_share"] > 0.01
    assert any("met the SLO" in w for w in n["why_fail"])
    # Attainment among successful requests hides what all-attempt attainment shows.
    during = fail["phases"]["during"]
    assert during["attainment"] > 0.95 > during["all_attempt_attainment"]
    # The pipeline's default: 3 replicas for the load at 0.75 + 1 redundancy = 4.
    kept = make_pack(60, 0.75, 1, "virtual", admission_max_outstanding=51)
    ok = plan_drill(kept, tmp_path / "kept")
    n = ok["n_plus_one"]
    assert ok["replicas"] == 4 and n["planned"]["replicas_for_load"] == 3
    assert n["verdict"] == "PASS", n["why_fail"]
    assert n["checks"] == {
        "plan_holds_before_the_failure": True,
        "survivors_carry_the_peak": True,
        "blast_radius_is_the_failed_replica": True,
        "recovered": True,
    }
    assert n["requests_lost"] > 0 and n["lost_sent_after_removal"] == 0
    assert 0 < n["recovery_after_injection_s"] < 12
    assert n["sentence"].startswith("Losing 1 of 4 replicas at the 60 RPS peak: PASS")
    # failure-test.md leads with the answer; the timeline is drawn with the verdict in words.
    md, js = tmp_path / "failure-test.md", tmp_path / "failure-test.json"
    entry("failure_test")(
        pack=json.dumps({"name": "t", "title": "t"}),
        reports=[tmp_path / "bare" / PLAN_DRILL / "drill-report.json"],
        markdown=md,
        json_path=js,
        log=LOG,
        timelines=[(tmp_path / "bare" / PLAN_DRILL / "timeline.png", tmp_path / "t.png")],
    )
    text = md.read_text()
    assert "## The plan, one replica down" in text
    assert "**Losing 1 of 2 replicas at the 60 RPS peak: FAIL" in text
    assert "attainment over all attempts" in text and "attainment among successful" in text
    assert json.loads(js.read_text())["plan_drill"]["verdict"] == "FAIL"
    from PIL import Image

    words = Image.open(tmp_path / "t.png").info["Description"]
    assert "FAIL" in words and "injection" in words and "router removal" in words


def test_a_sixteen_replica_plan_is_drilled_in_virtual_time(tmp_path):
    # 100 RPS at 0.25 utilization on 30 RPS replicas: 14 for the load + 2 redundancy.
    pack = make_pack(100, 0.25, 2, "auto", admission_max_outstanding=51)
    report = plan_drill(pack, tmp_path)
    assert report["replicas"] == 16 and report["execution"] == "virtual"
    assert "auto: 16 replicas at 100 RPS" in report["execution_reason"]
    assert report["n_plus_one"]["verdict"] == "PASS"
    facts = json.loads((tmp_path / PLAN_DRILL / "drill.json").read_text())
    assert facts["clock"].startswith("virtual") and facts["load"]["requests"] > 2000


def test_a_real_target_that_does_not_fit_live_is_skipped_saying_why(tmp_path):
    data = pack_data()
    data["target"] = {"kind": "openai", "base_url": "http://127.0.0.1:9", "cache_reset": "none"}
    data["failure"]["plan_drill"] = {
        "commands": {"inject": ["true"]},
        "live_max_replicas": 2,
    }
    pack = validate_pack(data, "test pack")
    report = plan_drill(pack, tmp_path)
    assert report["skipped"].startswith("the plan drill of a real target runs live, or in virtual")
    assert report["skipped"].endswith(
        "and there is no calibrated twin: the pack cannot be "
        "calibrated (a real target without model.architecture (a config.json-style file of the "
        "model's shape): the engine model has no shape to calibrate)"
    )
    assert "4 replicas at 60 RPS" in report["skipped"]


def test_no_plan_no_plan_drill_and_the_choice_of_live_or_virtual():
    from tests.drills import plan_at as plan_of

    pack = make_pack(60, 0.75, 1, "auto")
    inputs = DrillInputs.for_drill(pack, PLAN_DRILL)
    cap = capacity_doc(30.0)
    none = plan_of(inputs, cap, {}, {"required_replicas": None, "reason": "no capacity found"})
    assert not none.runnable and none.skip_reason == "no plan to drill: no capacity found"
    fits = plan_of(
        DrillInputs.for_drill(make_pack(40, 1.0, 0, "auto"), PLAN_DRILL),
        cap,
        {},
        {"required_replicas": 2},
    )
    assert fits.execution == "live" and fits.execution_reason.startswith("auto: 2 replicas")
    big = plan_of(inputs, cap, {}, {"required_replicas": 4})
    assert big.execution == "virtual" and big.replicas == 4 and big.rate_rps == 60
    forced = plan_of(
        DrillInputs.for_drill(make_pack(60, 0.75, 1, "live"), PLAN_DRILL),
        cap,
        {},
        {"required_replicas": 4},
    )
    assert forced.execution == "live" and forced.execution_reason == "configured: mode live"


def test_a_real_targets_plan_too_large_to_run_live_is_predicted_by_its_trusted_twin(tmp_path):
    """Through the stages: the plan drill of a real target, 4 replicas at 60 RPS, beyond the
    live limit, with the pack's calibrated twin (its profile file and a validation that trusts
    it): run in virtual time on the calibrated profile, and labelled a prediction with the
    twin's validation error in drill.json, the N+1 sentence, failure-test.md and its picture,
    in words that never call the real target simulated."""
    import yaml
    from PIL import Image

    from capacity_pack.sim.profile import load_profile
    from capacity_pack.twin.validate import validate

    data = with_fixed_lengths(real_calibratable(pack_data()))
    data["plan"].update(peak_rps=60, redundancy_replicas=1)
    data["failure"].update(admission_max_outstanding=51)
    pack = validate_pack(data, "test pack")
    # The calibrated profile (as the calibrate stage writes one) and a validation trusting it:
    # the twin predicted [30, 32) RPS where [30, 32) was measured, error 0.
    profile = load_profile("small-fast").model_dump(mode="json")
    profile["name"] = "small-fast-calibrated"
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    bracket = {"pass_rps": 30.0, "fail_rps": 32.0}
    measured = {"open_loop": {"cold": {"bracket": bracket, "rates": []}}}
    doc = {"format": "capacity-pack/twin-validation/v1", "pack": "t"}
    doc.update(validate({"cache_states": {"cold": bracket}}, measured))
    (tmp_path / "validation.json").write_text(json.dumps(doc))
    report = plan_drill(
        pack,
        tmp_path / "drill",
        twin_profile=tmp_path / "profile.yaml",
        twin_validation=tmp_path / "validation.json",
    )
    assert report["execution"] == "virtual" and report["replicas"] == 4
    label = "predicted by the calibrated twin"
    assert label in report["execution_reason"]
    assert "0.0% from the measured bracket (cold), tolerance 15%" in report["execution_reason"]
    n = report["n_plus_one"]
    assert n["sentence"].startswith("Losing 1 of 4 replicas at the 60 RPS peak")
    assert label in n["sentence"] and n["prediction"].startswith(label)
    facts = json.loads((tmp_path / "drill" / PLAN_DRILL / "drill.json").read_text())
    assert facts["prediction"].startswith(label) and facts["target_kind"] == "openai"
    assert facts["plan"]["twin"]["profile"] == str(tmp_path / "profile.yaml")
    md, js = tmp_path / "failure-test.md", tmp_path / "failure-test.json"
    entry("failure_test")(
        pack=json.dumps({"name": "t", "title": "t"}),
        reports=[tmp_path / "drill" / PLAN_DRILL / "drill-report.json"],
        markdown=md,
        json_path=js,
        log=LOG,
        timelines=[(tmp_path / "drill" / PLAN_DRILL / "timeline.png", tmp_path / "t.png")],
    )
    text = md.read_text()
    answer = json.loads(js.read_text())["plan_drill"]
    words = Image.open(tmp_path / "t.png").info["Description"]
    assert label in text and label in words
    assert label in answer["sentence"] and label in answer["execution_reason"]
    for word in ("simulat", "accelerator", "GPU"):
        assert word not in text, (word, text[max(0, text.find(word) - 120) :][:240])
        assert word not in json.dumps(answer), word
        assert word not in words, word


def drill_ancestors(workdir: Path, pack: str, drills: list[str]) -> dict[str, set[str]]:
    """The rules each drill's job depends on, transitively, in the workflow's own DAG (a dry
    run: ``snakemake --dag dot``)."""
    targets = [f"results/{pack}/failure/{d}/drill.json" for d in drills]
    dot = run_snakemake(workdir, "--dag", "dot", *targets).stdout
    label = {
        n: text.replace("\\n", " ")
        for n, text in re.findall(r'^\s*(\d+)\[label = "([^"]*)"', dot, re.M)
    }
    parents: dict[str, set[str]] = {}
    for a, b in re.findall(r"^\s*(\d+) -> (\d+)", dot, re.M):
        parents.setdefault(b, set()).add(a)
    out = {}
    for d in drills:
        (node,) = [n for n, text in label.items() if text == f"failure_drill drill: {d}"]
        seen, todo = set(), [node]
        while todo:
            for p in parents.get(todo.pop(), ()):
                if p not in seen:
                    seen.add(p)
                    todo.append(p)
        out[d] = {label[n].split()[0] for n in seen}
    return out


def test_only_a_real_targets_plan_drill_waits_for_the_validated_twin(tmp_path):
    """A real target whose pack calibrates (a managed server, the model's shape declared): its
    plan drill depends on twin_validate (and so on calibrate), its mechanism drills do not; a
    simulated target's plan drill, which has its own engine model, waits for no twin."""
    data = small_pack_data(
        "drill-dag", requests=60, min_samples=10,
        sweep={"open_loop_rps": [20], "closed_loop_concurrency": [1, 8]},
    )  # fmt: skip
    write_pack(tmp_path, data)
    sim = drill_ancestors(tmp_path, "drill-dag", [PLAN_DRILL])
    assert "capacity" in sim[PLAN_DRILL] and "twin_validate" not in sim[PLAN_DRILL]
    write_pack(tmp_path, real_calibratable(data))
    real = drill_ancestors(tmp_path, "drill-dag", [PLAN_DRILL, "replica_kill"])
    assert {"twin_validate", "twin_predict", "calibrate", "capacity"} <= real[PLAN_DRILL]
    assert "capacity" in real["replica_kill"]
    assert not {"twin_validate", "twin_predict", "calibrate"} & real["replica_kill"]
