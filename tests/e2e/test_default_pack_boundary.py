"""The default pack's capacity search, checked against the engine model's own SLO boundary.

The pipeline searches the default pack's workload (its classes, cutoffs, gates, client and
search settings; one repeat, no load-shape experiment, no drill, no closed loop: the open-loop
bracket is what is checked) against the simulated engine, over HTTP, cold and warm. The truth
it should find is the model's own boundary, computed without any server or client by
:func:`capacity_pack.sim.virtual.attainment_at` on the same workload (long seeded runs in
virtual time; a class's length distribution as a seeded pool of its draws; warm: with the
pack's shared prefixes): the model is evaluated at the bracket's
two rates and, where it disagrees, in steps of the resolution outward until it changes side,
which locates its boundary to the pack's resolution at the cost of two evaluations when the
two agree.

Consistency, per cache state:

- the bracket is no wider than the search's resolution;
- the model meets the gate at the passing rate (within its own noise): a pass above the
  model's boundary would be a false pass, which the confidence sequence makes rare;
- at the failing rate, unless the client could not keep its schedule there in any of the
  measurements the search may spend on it (client-bound: no server result, which each report
  must say; a client-bound repeat is measured again), the model's attainment is not one the point's
  largest sample could have proven: for some class it lies under a_prove, the least
  attainment whose share of n = rate x mix x client.maximum_duration_seconds requests, at the
  design effect the point measured, passes the gate
  (:func:`capacity_pack.binomial.sequential_outcome`), plus the model's noise. A point near
  the boundary is undecided (or futile), not passed, so the bracket may sit below the model's
  boundary by the width of that undecided band, never above it.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from capacity_pack.binomial import sequential_outcome
from capacity_pack.plan.manifest import sample_lengths, validate_pack
from capacity_pack.plan.schedule import Point
from capacity_pack.sim.profile import load_profile
from capacity_pack.sim.virtual import SharedPrefixes, VirtualClass, attainment_at
from tests.conftest import pack_data, run_snakemake, write_pack

# Alone: another test's jobs beside its sweep would take CPU from the load generator and the
# engine and move the bracket (client-bound points).
pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

NAME = "default-search"
# The model's runs: long enough that its own estimate is within about half a percent.
MODEL_S, MODEL_SEEDS = 120.0, (0, 1)
NOISE = 0.01
POOL = 20_000  # draws standing for a class's length distribution in the model's runs


def search_pack() -> dict:
    data = pack_data()
    data["pack"]["name"] = NAME
    data["experiments"] = []
    data.pop("failure")
    data["sweep"]["repeats"] = 1
    data["sweep"]["closed_loop_concurrency"] = []
    data["sweep"]["search"].pop("concurrency", None)
    return data


def least_provable(n: int, deff: float, gate: float, confidence: float) -> float:
    """The least attainment a whose a n of n requests, at design effect ``deff``, pass ``gate``."""
    for k in range(math.ceil(gate * n), n + 1):
        if sequential_outcome(k / deff, n / deff, gate, confidence) == "pass":
            return k / n
    return 1.0


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("default-search")
    data = search_pack()
    write_pack(workdir, data)
    targets = [f"results/{NAME}/search/{s}/search.json" for s in data["sweep"]["cache_states"]]
    run_snakemake(workdir, *targets)
    docs = {
        s: json.loads((workdir / "results" / NAME / "search" / s / "search.json").read_text())
        for s in data["sweep"]["cache_states"]
    }
    return validate_pack(data, "pack.yaml"), docs, workdir / "results" / NAME


def pool(spec) -> int | tuple[int, ...]:
    """A fixed length as it is; a distribution as a large seeded sample of it, which the
    model's runs draw from."""
    if isinstance(spec, int):
        return spec
    return tuple(int(v) for v in sample_lengths(spec, np.random.default_rng(0), POOL))


def model_boundary(meets, pass_rps: float, fail_rps: float, step: float) -> tuple[float, float]:
    """The model's (highest meeting, lowest missing) rates at ``step``, from the bracket out."""
    if meets(pass_rps) and not meets(fail_rps):
        return pass_rps, fail_rps
    if meets(fail_rps):
        rate = fail_rps
        while meets(rate + step) and rate < 4 * fail_rps:
            rate += step
        return rate, rate + step
    rate = pass_rps
    while not meets(rate - step) and rate > step:
        rate -= step
    return rate - step, rate


@pytest.mark.parametrize("state", ["cold", "warm"])
def test_the_default_packs_bracket_agrees_with_the_models_boundary(searched, state):
    pack, docs, results = searched
    bracket = docs[state]["open"]["bracket"]
    resolution = pack.sweep.search.resolution_rps
    assert bracket["within_resolution"] and bracket["fail_rps"] - bracket["pass_rps"] <= resolution
    classes = [
        VirtualClass(c.name, c.mix, pool(c.input_tokens), pool(c.output_tokens),
                     c.request_ttft_cutoff_ms / 1e3, c.request_tpot_cutoff_ms / 1e3)
        for c in pack.workload
    ]  # fmt: skip
    spec = pack.prompts.prefix
    prefixes = (
        SharedPrefixes(spec.shared_prefixes, spec.prefix_tokens, spec.zipf_exponent)
        if state == "warm"
        else None
    )
    profile = load_profile(pack.target.profile)
    acc = pack.acceptance
    gate, confidence = acc.class_slo_attainment_min, acc.attainment_confidence
    model: dict[float, dict[str, float]] = {}

    def attainment(rate: float) -> dict[str, float]:
        if rate not in model:
            model[rate] = attainment_at(
                profile, classes, rate, MODEL_S, MODEL_SEEDS, prefixes=prefixes
            )
        return model[rate]

    def meets(rate: float) -> bool:
        return min(attainment(rate).values()) >= gate

    passing, fail = bracket["pass_rps"], bracket["fail_rps"]
    boundary = model_boundary(meets, passing, fail, resolution)
    seen = {"bracket": bracket, "model boundary": boundary, "model": model}
    assert min(attainment(passing).values()) >= gate - NOISE, seen
    point = Point(mode="open", rate_rps=fail, cache_state=state, repeat=0).point_id
    reports = [
        json.loads(path.read_text())
        for path in sorted((results / "reports" / point / state).glob("rep*/slo-report.json"))
    ]
    server = [r for r in reports if not r["client_bound"]]
    if not server:
        # The client could not keep the schedule (a loaded host) in any of the measurements
        # the search may spend on the rate: no server result, and the pack must say so rather
        # than claim a failure; the bracket is then only a lower bound.
        assert len(reports) == 1 + pack.sweep.search.extra_repeats
        for report in reports:
            assert report["verdict"] == "inconclusive", report["verdict_reasons"]
            assert any(r.startswith("client-bound") for r in report["verdict_reasons"])
        return
    report = server[0]
    span = pack.client.maximum_duration_seconds
    provable = {
        c.name: least_provable(
            max(1, int(fail * c.mix * span)),
            report["classes"][c.name]["attainment_design_effect"],
            gate,
            confidence,
        )
        for c in pack.workload
    }
    at_fail = attainment(fail)
    assert any(at_fail[c] < provable[c] + NOISE for c in at_fail), {**seen, "provable": provable}
