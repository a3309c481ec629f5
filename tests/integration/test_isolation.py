"""A point measured beside a deliberate CPU hog is marked disturbed and measured again.

The pack is the D/D/1 knee of tests/integration/test_search.py (one sequence slot of the
simulated engine, capacity 1 / S = 13.1 RPS) searched from 12 and 14 RPS at a resolution of
2 RPS: the bracket is [12, 14) in one round on a quiet host. Here a hog (one busy process per
CPU of the host, at normal priority, started by the test, so no descendant of any pipeline
job) runs until the first point's sweep summary is written. That point shares the host with
the hog: other processes' CPU over its run is far above ``client.other_cpu_bound`` (the shipped
10 %), so its summary says ``disturbed`` with the figure, its report is inconclusive for that
reason, its rate decides nothing, and the search measures the rate again at its next repeat,
this time quietly, and still finds [12, 14).

The measurement jobs run alone: the sweep rule asks for every core of the invocation when
the target is local (a managed simulated engine here), so no other job runs beside a point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from capacity_pack.plan.manifest import Client
from tests.conftest import run_snakemake, write_pack
from tests.integration.test_search import knee_pack, sweep_jobs

# Alone: the hog would disturb the other worker's tests, and the other worker's tests would
# disturb the remeasured point (the shipped bound is checked).
pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

HOG = textwrap.dedent(
    """\
    import glob, multiprocessing, sys, time

    def spin():
        while True:
            pass

    if __name__ == "__main__":
        procs = [multiprocessing.Process(target=spin, daemon=True)
                 for _ in range(multiprocessing.cpu_count())]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 600
        while not glob.glob(sys.argv[1]) and time.monotonic() < deadline:
            time.sleep(0.05)
    """
)


def isolation_pack() -> dict:
    data = knee_pack(max_rounds=1)
    data["pack"]["name"] = "isolation-test"
    data["sweep"]["open_loop_rps"] = [12, 14]
    data["sweep"]["closed_loop_concurrency"] = []
    data["sweep"]["search"].pop("concurrency")
    for key in ("other_cpu_bound", "step_lateness_bound_ms"):  # the shipped bounds
        data["client"][key] = Client.model_fields[key].default
    return data


@pytest.fixture(scope="module")
def hogged(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("isolation")
    write_pack(workdir, isolation_pack())
    results = workdir / "results" / "isolation-test"
    first = str(results / "raw" / "*" / "cold" / "rep0" / "summary.json")
    hog = subprocess.Popen([sys.executable, "-c", HOG, first])
    try:
        res = run_snakemake(workdir, "results/isolation-test/search/cold/search.json", alone=True)
    finally:
        hog.kill()
        hog.wait()
    return workdir, results, res.stdout + res.stderr


def summaries(results) -> dict[str, dict]:
    """Every point's sweep summary by point/cache/repN, in the order they were written."""
    paths = sorted(results.glob("raw/*/cold/rep*/summary.json"), key=lambda p: p.stat().st_mtime)
    return {"/".join(p.parts[-4:-1]): json.loads(p.read_text()) for p in paths}


def test_the_point_beside_the_hog_is_marked_disturbed_and_its_rate_measured_again(hogged):
    _, results, out = hogged
    docs = summaries(results)
    # The first point measured is the one the hog ran beside.
    first = next(iter(docs))
    hit = docs[first]
    assert hit["disturbed"], hit["host"]
    assert hit["host"]["other_cpu_share"] > 0.10, hit["host"]
    assert any(r.startswith("other processes used") for r in hit["disturbance_reasons"])
    point = first.split("/")[0]
    report = json.loads(
        (results / "reports" / point / "cold" / "rep0" / "slo-report.json").read_text()
    )
    assert report["verdict"] == "inconclusive"
    assert any(r.startswith("disturbed: other processes used") for r in report["verdict_reasons"])
    # Measured again at its next repeat, quietly; every other point was quiet too.
    again = f"{point}/cold/rep1"
    assert again in sweep_jobs(out), sweep_jobs(out)
    quiet = {k: d for k, d in docs.items() if k != first}
    assert again in quiet and not any(d["disturbed"] for d in quiet.values()), {
        k: d["disturbance_reasons"] for k, d in quiet.items()
    }
    doc = json.loads((results / "search" / "cold" / "search.json").read_text())
    b = doc["open"]["bracket"]
    assert (b["pass_rps"], b["fail_rps"]) == (12, 14), doc["open"]["tested"]
    steps = [
        json.loads(p.read_text())["open"]["search"]
        for p in sorted((results / "search" / "cold").glob("round*.json"))
    ]
    assert any(
        s["direction"] == "retry" and "other work on the host disturbed the point" in s["why"]
        for s in steps
    ), steps


def test_each_point_states_where_it_ran_and_ran_alone(hogged):
    _, results, out = hogged
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    for key, doc in summaries(results).items():
        placement = doc["host"]["placement"]
        assert placement["detail"], key
        assert placement["pinned"] == (cpus is not None and cpus >= 4), placement
        assert doc["host"]["own_processes"] >= 2, doc["host"]  # the client and its target
        # The managed server is the simulated engine: its step lateness is read too.
        assert doc["engine_step_lateness"]["steps"] > 0, doc["engine_step_lateness"]
    # A measuring job of a local target takes every core run_snakemake gives (2): nothing
    # else of the invocation runs beside it.
    sweeps = [j for j in out.split("\n\n") if "rule sweep:" in j]
    assert sweeps and all("threads: 2" in j for j in sweeps), sweeps[:1]
