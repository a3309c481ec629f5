"""Preflight prediction: virtual points judged as measured ones, the predicted bracket, lint."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from capacity_pack.plan.manifest import validate_pack
from capacity_pack.plan.schedule import Point, build_schedule
from capacity_pack.sim.profile import load_profile
from capacity_pack.twin.preflight import (
    DEFAULT_RESOLUTION_REL,
    planned_rates,
    preflight,
)
from capacity_pack.twin.requests import fleet_requests
from capacity_pack.twin.virtual_point import predict_point
from tests.conftest import small_pack_data
from tests.paths import ROOT, TUTORIAL


def small(rates=(10, 20), caches=("cold",)) -> dict:
    """The default pack shrunk (small-fast, one replica): 60 requests per point, 10 per class."""
    data = small_pack_data(
        "preflight-test",
        requests=60,
        min_samples=10,
        sweep={"open_loop_rps": list(rates), "closed_loop_concurrency": [1]},
        minimum_duration_seconds=9,
    )
    data["sweep"]["cache_states"] = list(caches)
    return data


@pytest.fixture(scope="module")
def profile():
    return load_profile("small-fast")


def test_a_cold_point_shares_no_prefix_and_a_warm_one_does():
    pack = validate_pack(small(caches=("cold", "warm")), "p")
    heads = {}
    for cache in ("cold", "warm"):
        point = Point(mode="open", rate_rps=20, cache_state=cache, repeat=0)
        reqs = fleet_requests(build_schedule(pack, point), 1)
        firsts = [r.prompt_ids[:16] for r in reqs]
        heads[cache] = len(set(firsts)) / len(firsts)
        # Same arrivals and lengths cold and warm: a paired comparison.
        assert [round(r.due_s, 9) for r in reqs] == [
            round(r.due_s, 9) for r in fleet_requests(build_schedule(pack, point), 2)
        ]
    assert heads["cold"] == 1.0  # every prompt its own from its first token
    assert heads["warm"] < 0.5  # shared prefixes (8 of them) open most warm prompts


def test_a_virtual_point_passes_far_below_the_boundary_and_fails_far_above(profile):
    pack = validate_pack(small(), "p")
    low = predict_point(pack, 10, "cold", profile)
    high = predict_point(pack, 80, "cold", profile)
    assert low.status == "pass" and low.queue_trend == "flat" and low.reasons == ()
    assert all(c.attainment >= 0.95 and c.attainment_ci[0] >= 0.6 for c in low.classes)
    assert high.status == "fail"
    assert high.worst_class().attainment < 0.6
    assert any("attainment" in r for r in high.reasons)
    for p in (low, high):
        assert not p.capped and p.simulated_requests >= p.scheduled_requests
        assert p.virtual_s > 9 and p.cpu_s > 0
        assert sum(c.attempted for c in p.classes) == p.simulated_requests
    doc = low.to_dict()
    assert doc["status"] == "pass" and doc["capped"] is False


def test_the_cap_simulates_the_first_requests_and_scales_the_sample_gate(profile):
    data = small(rates=(10,))
    data["client"]["initial_scheduled_requests"] = 400
    data["acceptance"]["min_successful_samples_per_class"] = 40
    pack = validate_pack(data, "p")
    capped = predict_point(pack, 10, "cold", profile, max_requests=100)
    assert capped.capped and capped.simulated_requests == 100
    assert capped.scheduled_requests == 400
    # 40 per class of 400, taken at the least share of a class the first 100 hold.
    assert 5 <= capped.min_samples_used <= 20
    assert capped.status == "pass"


def independent_bisection(pack, profile, low, high, resolution_rel):
    """Plain bisection on the predicted status (meeting every gate, shown or on the estimate),
    midpoints untidied."""
    while high - low > resolution_rel * low:
        mid = (low + high) / 2
        if predict_point(pack, mid, "cold", profile).status in ("pass", "marginal"):
            low = mid
        else:
            high = mid
    return low, high


def test_the_predicted_bracket_agrees_with_an_independent_bisection(profile):
    pack = validate_pack(small(), "p")
    doc = preflight(pack)
    b = doc.bracket_of("cold")
    assert b.pass_rps is not None and b.fail_rps is not None
    assert b.fail_rps - b.pass_rps <= DEFAULT_RESOLUTION_REL * b.pass_rps + 1e-9
    # The search went up from the planned rates (both pass) and down again.
    assert {p.rate_rps for p in b.probes} - set(planned_rates(pack))
    low, high = independent_bisection(pack, profile, 20, 160, DEFAULT_RESOLUTION_REL)
    res = DEFAULT_RESOLUTION_REL * max(low, b.pass_rps)
    assert abs(b.pass_rps - low) <= res and abs(b.fail_rps - high) <= res
    # Every planned rate passes: the finding says the sweep cannot bracket, naming the bracket.
    assert doc.findings == (
        f"cold: every planned rate (10/20 RPS) is predicted to pass: the sweep cannot bracket "
        f"the boundary; the engine model's predicted bracket is {b.text()}",
    )
    saved = doc.to_dict()
    assert saved["format"] == "capacity-pack/preflight/v1"
    assert saved["profile"] == "small-fast" and len(saved["profile_sha256"]) == 64
    assert saved["brackets"][0]["text"] == b.text()


def test_no_planned_rate_passing_is_a_finding(profile):
    pack = validate_pack(small(rates=(200, 300)), "p")
    doc = preflight(pack)
    b = doc.bracket_of("cold")
    assert b.fail_rps is not None and b.fail_rps < 200
    (finding,) = doc.findings
    assert finding.startswith("cold: no planned rate is predicted to pass (200 fail, 300 fail")
    assert finding.endswith(f"the engine model's predicted bracket is {b.text()}")


def test_a_real_target_without_a_profile_is_not_predicted(profile):
    data = small()
    data["target"] = {"kind": "openai", "base_url": "http://127.0.0.1:9", "cache_reset": "none"}
    pack = validate_pack(data, "p")
    doc = preflight(pack)
    assert doc.points == () and doc.findings == ()
    assert "no prediction is possible before the closed loop is measured" in doc.unavailable
    # With a profile given (a calibrated twin), it is predicted on that profile.
    given = preflight(pack, profile, search="findings")
    assert given.unavailable is None and given.profile == profile.model.name
    assert [p.status for p in given.points] == ["pass", "pass"]


def lint(path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "capacity_pack", "lint", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


@pytest.mark.slow
def test_lint_warns_that_no_rate_of_the_old_tutorial_sweep_is_predicted_to_pass(tmp_path):
    """The tutorial pack at the illustrative 16-28 RPS it used to sweep."""
    data = yaml.safe_load(TUTORIAL.read_text())
    data["sweep"]["open_loop_rps"] = [16, 20, 24, 28]
    path = tmp_path / "tutorial-16-28.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = lint(path)
    assert res.returncode == 0, res.stderr  # a prediction is a warning, not a finding
    warnings = [line for line in res.stdout.splitlines() if ": warning: preflight: " in line]
    assert len(warnings) == 2, res.stdout
    for line, cache in zip(warnings, ("cold", "warm"), strict=True):
        assert f"warning: preflight: {cache}: no planned rate is predicted to pass (16 " in line
        assert "the engine model's predicted bracket is [" in line
    skipped = subprocess.run(
        [sys.executable, "-m", "capacity_pack", "lint", "--no-predict", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert skipped.returncode == 0 and "preflight" not in skipped.stdout


@pytest.mark.slow
def test_the_tutorial_packs_predicted_bracket_lies_inside_its_sweep():
    res = lint(TUTORIAL)
    assert res.returncode == 0 and "warning" not in res.stdout, res.stdout
    assert "no findings" in res.stdout
    assert "note: preflight: the planned rates bracket the boundary" in res.stdout
    pack = validate_pack(yaml.safe_load(TUTORIAL.read_text()), "tutorial")
    rates = planned_rates(pack)
    # The brackets the lint states (not predicted a second time here: a minute of CPU).
    stated = re.findall(r"(cold|warm) \[([\d.]+), ([\d.]+)\) RPS", res.stdout)
    assert {s for s, _, _ in stated} == set(pack.sweep.cache_states), res.stdout
    for state, low, high in stated:
        assert rates[0] <= float(low) < float(high) <= rates[-1], (state, low, high, rates)


def predicted_search(**search) -> dict:
    data = small(rates=())
    data["sweep"]["open_loop_rps"] = []
    data["sweep"]["search"] = {"initial": "predicted", "resolution_rel": 0.2, **search}
    return data


def test_a_predicted_search_starts_from_the_predicted_bracket():
    from capacity_pack.decide.search import SearchInputs, decide_round, plan_rounds, predicted_rates

    doc = {
        "brackets": [
            {"cache_state": "cold", "pass_rps": 40.0, "fail_rps": 42.0},
            {"cache_state": "warm", "pass_rps": None, "fail_rps": 0.3},
        ]
    }
    assert predicted_rates(doc, "cold") == [40.0, 41.0, 42.0]
    assert predicted_rates(doc, "warm") == [0.15, 0.3]
    assert predicted_rates({"brackets": []}, "cold") == []
    pack = validate_pack(predicted_search(), "p")
    inputs = SearchInputs.of(pack)
    assert inputs.predicted and inputs.initial_rps is None
    assert '"predicted":true' in inputs.canonical_json()
    # Round 1 measures no open-loop rate; its decision hands round 2 the predicted rates.
    plans = plan_rounds([], inputs, 4, "cold")
    assert [p for p in plans[0]["points"] if p.mode == "open"] == []
    round1 = decide_round([], inputs, "cold", 1, predicted_rps=predicted_rates(doc, "cold"))
    step = round1["open"]["search"]
    assert step["rates"] == [40.0, 41.0, 42.0] and step["direction"] == "predicted"
    assert round1["first_round_rps"] == [40.0, 41.0, 42.0]
    plans = plan_rounds([round1], inputs, 4, "cold")
    assert sorted(p.rate_rps for p in plans[1]["points"] if p.mode == "open") == [40, 41, 42]
    # Without 'predicted' the round's params are what they were before it existed.
    plain = SearchInputs.of(validate_pack(predicted_search(initial=[10, 20]), "p"))
    assert "predicted" not in plain.canonical_json()


def test_a_predicted_search_needs_a_simulated_target_and_no_declared_rates():
    from capacity_pack.plan.manifest import ManifestError

    data = predicted_search()
    data["target"] = {"kind": "openai", "base_url": "http://127.0.0.1:9", "cache_reset": "none"}
    with pytest.raises(ManifestError, match="needs an engine model: target.kind sim"):
        validate_pack(data, "p")
    data = predicted_search()
    data["sweep"]["open_loop_rps"] = [10]
    with pytest.raises(ManifestError, match="both name round 1's rates"):
        validate_pack(data, "p")
