"""A search that starts from the preflight prediction (``sweep.search.initial: predicted``), run
for real by Snakemake: the preflight job's bracket is the first open-loop round."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_snakemake, small_pack_data, write_pack


@pytest.mark.slow
def test_a_predicted_search_measures_the_predicted_bracket_first(tmp_path):
    data = small_pack_data("predicted-search", requests=300, min_samples=10)
    data["client"]["minimum_duration_seconds"] = 9
    data["sweep"] = {
        "open_loop_rps": [],
        "closed_loop_concurrency": [1],
        "cache_states": ["cold"],
        "repeats": 1,
        # The closed loop's smallest size (the default 50 requests at c = 1 took 23 s, every
        # second of it behind the suite's host-wide target lock): the bracket comes from the
        # preflight here, not from the closed loop.
        "closed_loop_min_requests": 10,
        "closed_loop_requests_per_worker": 2,
        "search": {"initial": "predicted", "resolution_rel": 0.2, "max_rounds": 2},
    }
    data.pop("failure", None)
    write_pack(tmp_path, data)
    run_snakemake(tmp_path)
    results = tmp_path / "results" / "predicted-search"
    preflight = json.loads((results / "preflight" / "preflight.json").read_text())
    (bracket,) = preflight["brackets"]
    assert bracket["pass_rps"] is not None and bracket["fail_rps"] is not None
    round1 = json.loads((results / "search" / "cold" / "round1.json").read_text())
    step = round1["open"]["search"]
    assert step["direction"] == "predicted"
    assert step["rates"][0] == bracket["pass_rps"] and step["rates"][-1] == bracket["fail_rps"]
    # The two ends only: the preflight searched its bracket down to the resolution already.
    assert bracket["fail_rps"] - bracket["pass_rps"] <= 0.2 * bracket["pass_rps"]
    assert len(step["rates"]) == 2
    summary = json.loads((results / "search" / "cold" / "search.json").read_text())
    measured = {row["offered_rps"] for row in summary["open"]["tested"]}
    assert set(step["rates"]) <= measured
