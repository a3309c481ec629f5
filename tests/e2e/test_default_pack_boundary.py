"""The default pack's capacity search, checked against the engine model's own SLO boundary.

The pipeline searches the default pack's workload (its classes, cutoffs, gates, client and
search settings; one repeat, no load-shape experiment, no drill, no closed loop: the open-loop
bracket is what is checked) against the simulated engine, over HTTP, cold and warm. The truth
it should find is the model's own attainment, computed without any server or client by
:func:`capacity_pack.sim.virtual.attainment_at` on the same workload
(:func:`capacity_pack.twin.boundary.virtual_classes`: a class's length distribution as a
seeded pool of its draws; warm: with the pack's shared prefixes), at the bracket's two rates.

Consistency, per cache state:

- the bracket is no wider than the search's resolution;
- the search decides each rate on its pooled estimate and states an interval (the confidence
  sequence at the time-block effective sample): at both ends of the bracket, for every class,
  the model's long-run attainment lies inside the interval measured there, widened by the
  model's own noise (:data:`NOISE`). A measured interval that excludes the model's truth is
  a measurement that contradicts its own engine: a biased client, a design effect that
  under-states the correlation, or a decision taken on the wrong side of the evidence. An end
  with no server result (each repeat client-bound: the client could not keep its schedule on
  this host) has no interval; its report must say so.
"""

from __future__ import annotations

import json

import pytest

from capacity_pack.decide.capacity import (
    deciding_reports,
    pooled_attainment,
    rate_status,
    void,
)
from capacity_pack.plan.manifest import Client, validate_pack
from capacity_pack.plan.schedule import Point
from capacity_pack.sim.profile import load_profile
from capacity_pack.sim.virtual import attainment_at
from capacity_pack.twin.boundary import shared_prefixes, virtual_classes
from tests.conftest import UNCHECKED_HOST, pack_data, run_snakemake, write_pack

# Alone: another test's jobs beside its sweep would take CPU from the load generator and the
# engine and move the bracket (client-bound points).
pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

NAME = "default-search"
# The model's runs: long enough that its own estimate is within about a percent.
MODEL_S, MODEL_SEEDS = 120.0, (0, 1)
NOISE = 0.01


def search_pack() -> dict:
    data = pack_data()
    data["pack"]["name"] = NAME
    # The shipped host checks (this test runs alone): a disturbed point is measured again.
    for key in UNCHECKED_HOST:
        data["client"][key] = Client.model_fields[key].default
    data["experiments"] = []
    data.pop("failure")
    data["sweep"]["repeats"] = 1
    data["sweep"]["closed_loop_concurrency"] = []
    data["sweep"]["search"].pop("concurrency", None)
    return data


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


@pytest.mark.parametrize("state", ["cold", "warm"])
def test_the_default_packs_bracket_agrees_with_the_models_attainment(searched, state):
    pack, docs, results = searched
    bracket = docs[state]["open"]["bracket"]
    resolution = pack.sweep.search.resolution_rps
    assert bracket["within_resolution"] and bracket["fail_rps"] - bracket["pass_rps"] <= resolution
    profile = load_profile(pack.target.profile)
    for rate in (bracket["pass_rps"], bracket["fail_rps"]):
        point = Point(mode="open", rate_rps=rate, cache_state=state, repeat=0).point_id
        reports = [
            json.loads(path.read_text())
            for path in sorted((results / "reports" / point / state).glob("rep*/slo-report.json"))
        ]
        deciding = deciding_reports(reports)
        if all(void(r) for r in deciding):
            # The client could not keep its schedule (a loaded host) in any of the measurements
            # the search may spend on the rate: no server result, and the pack must say so
            # rather than claim a side of the gate.
            for report in deciding:
                assert report["verdict"] == "inconclusive", report["verdict_reasons"]
            continue
        pooled = pooled_attainment(deciding)
        model = attainment_at(
            profile,
            virtual_classes(pack),
            rate,
            MODEL_S,
            MODEL_SEEDS,
            prefixes=shared_prefixes(pack, state),
        )
        seen = {"rate": rate, "status": rate_status(deciding), "model": model, "pooled": pooled}
        for name, truth in model.items():
            low, high = pooled[name]["ci"]
            assert low - NOISE <= truth <= high + NOISE, seen
