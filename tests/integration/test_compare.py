"""capacity-pack compare on packs the real pipeline built: two runs of one small pack differ by
nothing beyond run-to-run variation, the same pack on a slower simulated engine does; an
MLflow parent run reads as its results folder; the HTML page carries the verdict.

Three pipeline runs in all (module-scoped): one open-loop rate, two repeats, cold only, no
drills.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from capacity_pack.cli import COMPARE_DIFFERS_STATUS, main
from capacity_pack.decide.compare import BEYOND, NO_DIFFERENCE, CompareError, run_compare
from tests.conftest import run_snakemake as snakemake
from tests.conftest import small_pack_data, with_fixed_lengths, write_pack

pytestmark = pytest.mark.slow

NAME = "compare-test"
FAST = "small-fast"
# A 70B model on two simulated H100s: its decode step alone is near the pack's 25-30 ms TPOT
# cutoffs, so it fails the rate the small model passes.
SLOW = "llama-3.1-70b-tp2-h100"


def small_pack(profile: str) -> dict:
    data = small_pack_data(
        NAME,
        requests=60,
        min_samples=10,
        sweep={"open_loop_rps": [10], "closed_loop_concurrency": [], "cache_states": ["cold"]},
        # The slow engine's growing queue takes CPU from the load generator on a busy 2-core
        # host: at the default 5 ms its points were client-bound (inconclusive), not failed.
        lateness_bound_ms=50,
    )
    # Fixed lengths: with the default pack's tailed lengths a 60-request point at 10 RPS ends
    # before the queue trend has its 8 scrapes (inconclusive), and a longer point costs CI
    # time for nothing this test checks.
    with_fixed_lengths(data)
    # Two repeats: the between-repeat spread the latency comparison is judged against.
    data["sweep"]["repeats"] = 2
    data["target"]["profile"] = profile
    # No drills: each pipeline run costs CI time, and the drill columns are unit-tested
    # (tests/unit/decide/test_compare.py).
    data.pop("failure")
    return data


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    """Work directories: `first` and `again` (one pack, run twice), `slower` (its profile).

    The three pipelines run side by side: their measurements still take turns through the
    target lock (capacity_pack.measure.lock; the worker's own under pytest-xdist,
    tests/exclusive.py), and each one's analysis jobs fill the time another measures (one
    after another they took 330 s of a CI worker on 2026-12-07)."""
    out = {}
    for key, profile in (("first", FAST), ("again", FAST), ("slower", SLOW)):
        out[key] = tmp_path_factory.mktemp(key)
        write_pack(out[key], small_pack(profile))
    with ThreadPoolExecutor(len(out)) as pool:
        list(pool.map(snakemake, out.values()))
    return out


def results(workdir: Path) -> str:
    return str(workdir / "results" / NAME)


def parent_run(workdir: Path) -> tuple[str, str]:
    """(tracking URI, parent run id) of the pack's MLflow store."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{workdir}/results/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(f"capacity-pack/{NAME}")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    (parent,) = [r for r in runs if r.data.tags.get("capacity_pack.run_kind") == "parent"]
    return uri, parent.info.run_id


class _Verdict(HTMLParser):
    """The text of the page's verdict paragraph."""

    def __init__(self) -> None:
        super().__init__()
        self.text, self._inside = "", False

    def handle_starttag(self, tag, attrs):
        self._inside = self._inside or dict(attrs).get("id") == "verdict"

    def handle_endtag(self, tag):
        self._inside = self._inside and tag != "p"

    def handle_data(self, data):
        self.text += data if self._inside else ""


def compare_cli(tmp_path: Path, a: str, b: str, *extra: str) -> tuple[dict, str, str]:
    """Run the command; (its JSON, its Markdown, its page's verdict text)."""
    md, page, js = tmp_path / "c.md", tmp_path / "c.html", tmp_path / "c.json"
    args = ["compare", a, b, "-o", str(md), "--html", str(page), "--json", str(js), *extra]
    res = CliRunner().invoke(main, args)
    doc = json.loads(js.read_text())
    expected = COMPARE_DIFFERS_STATUS if "--exit-code" in extra and doc["beyond"] else 0
    assert res.exit_code == expected, res.output
    parser = _Verdict()
    parser.feed(page.read_text())
    return doc, md.read_text(), parser.text


def test_two_runs_of_one_pack_differ_by_nothing_beyond_variation(packs, tmp_path):
    doc, md, verdict = compare_cli(
        tmp_path, results(packs["first"]), results(packs["again"]), "--exit-code"
    )
    assert doc["summary"].startswith(NO_DIFFERENCE[0].upper() + NO_DIFFERENCE[1:]), doc["summary"]
    assert not doc["beyond"] and doc["beyond_what"] == []
    assert verdict == doc["summary"] and f"**{doc['summary']}**" in md
    assert doc["manifest"]["sections"] == []  # the same pack: only the runs differ
    (cold,) = doc["capacity"]
    assert cold["capacity_rps"] == [10.0, 10.0] and not cold["beyond"]
    assert doc["attainment"] and not any(r["beyond"] for r in doc["attainment"])
    # Each pack's two repeats estimate the spread the P95s are judged against.
    assert all(v["df"] > 0 for v in doc["latency_variation"].values())
    tested = [m for r in doc["latency"] for m in r["metrics"].values() if m["tested"]]
    assert tested and not any(m["beyond"] for m in tested)


def test_a_slower_engine_profile_differs_beyond_variation(packs, tmp_path):
    doc, md, verdict = compare_cli(
        tmp_path, results(packs["first"]), results(packs["slower"]), "--exit-code"
    )
    assert doc["beyond"] and doc["summary"].endswith(BEYOND), doc["summary"]
    assert verdict == doc["summary"]
    (cold,) = doc["capacity"]
    assert cold["capacity_rps"][0] == 10.0 and cold["beyond"]
    assert (cold["capacity_rps"][1] or 0.0) < 10.0
    fields = {f["field"]: f["values"] for f in doc["manifest"]["fields"]}
    assert fields["target.profile"] == [FAST, SLOW]
    assert [s["section"] for s in doc["manifest"]["sections"]] == ["target"]
    assert f"`target.profile` | {FAST} | {SLOW}" in md


def test_an_mlflow_parent_run_reads_as_its_results_folder(packs, monkeypatch):
    uri, run_id = parent_run(packs["slower"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    _, from_runs = run_compare(f"mlflow:{run_id}", results(packs["first"]))
    _, from_folder = run_compare(results(packs["slower"]), results(packs["first"]))
    assert from_runs["a"]["origin"] == f"mlflow:{run_id}"
    assert from_runs["a"]["reports"].endswith("child runs")  # the per-point reports too
    for key in ("summary", "capacity", "attainment", "plan", "drills"):
        assert from_runs[key] == from_folder[key], key
    assert from_runs["manifest"]["sections"] == from_folder["manifest"]["sections"]


def test_mlflow_sources_that_are_not_parent_runs_are_named(packs):
    from mlflow import MlflowClient

    uri, run_id = parent_run(packs["first"])
    child = MlflowClient(tracking_uri=uri).search_runs(
        [MlflowClient(tracking_uri=uri).get_run(run_id).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{run_id}'",
    )[0]
    first = results(packs["first"])
    with pytest.raises(CompareError, match=f"not a capacity-pack parent run.*mlflow:{run_id}"):
        run_compare(f"mlflow:{child.info.run_id}", first, tracking=uri)
    with pytest.raises(CompareError, match="mlflow:0123abc: no such run in the MLflow store"):
        run_compare("mlflow:0123abc", first, tracking=uri)
