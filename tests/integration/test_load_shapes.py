"""The shipped k6 pack, shrunk, through the real pipeline: its README answers each load-shape
experiment's question, with its plot, and the page and the published pack hold them too."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from capacity_pack.decide.shapes import SHAPES
from tests.conftest import run_snakemake as snakemake
from tests.conftest import write_pack
from tests.paths import ROOT

pytestmark = pytest.mark.slow

K6 = ROOT / "config" / "packs" / "k6-load-shapes.yaml"

#: What a README answer of each shape begins with (its own words, never the generic verdict).
ANSWERS = {
    "smoke": r"(Yes: every class works|No: )",
    "average-load": r"At the expected load \(10 RPS held\) the SLO verdict is \*\*\w+\*\*",
    "stress": r"At the \S+ RPS plateau all-attempt attainment is .*P95 TTFT goes from",
    "spike": r"The 30 RPS burst \(t = 4-6 s\) peaks the server queue at .*in sliding 2 s "
    r"windows .*attainment (never fell|fell to).*the queue is back at its pre-spike level",
    "soak": r"(No drift|Drift) over the 12 s soak.*Mann-Kendall two-sided",
    "breakpoint": r"(first breaks its SLO at about \S+ RPS \(the window .* spans .* RPS nominal"
    r"|did not break its SLO on the ramp)",
}


def short_k6_pack() -> dict:
    """The shipped k6 pack with every profile a few seconds long and a small closed loop."""
    data = yaml.safe_load(K6.read_text())
    data["pack"]["name"] = "k6-short"
    data["client"].update(warmup_seconds=0.5, maximum_duration_seconds=30)
    data["sweep"].update(closed_loop_min_requests=8, closed_loop_requests_per_worker=2)
    profiles = {
        "smoke": {"segments": [{"duration_s": 3, "rate_rps": 2}]},
        "average_load": {"segments": [{"duration_s": 2, "from_rps": 0, "to_rps": 10},
                                      {"duration_s": 6, "rate_rps": 10},
                                      {"duration_s": 2, "from_rps": 10, "to_rps": 0}]},
        "stress": {"segments": [{"duration_s": 3, "from_rps": 0, "to_rps": 20},
                                {"duration_s": 6, "rate_rps": 20}]},
        "spike": {"segments": [{"duration_s": 12, "rate_rps": 8}],
                  "spike": {"at_s": 4, "duration_s": 2, "rate_rps": 30}},
        "soak": {"segments": [{"duration_s": 12, "rate_rps": 10}]},
        "breakpoint": {"segments": [{"duration_s": 2, "rate_rps": 5},
                                    {"duration_s": 12, "from_rps": 5, "to_rps": 60}]},
    }  # fmt: skip
    for e in data["experiments"]:
        e.update(profiles[e["name"]])
    return data


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("k6")
    write_pack(workdir, short_k6_pack())
    snakemake(workdir)
    return workdir / "results" / "k6-short"


def test_every_shipped_test_type_is_answered(ran):
    shipped = {e["test_type"] for e in yaml.safe_load(K6.read_text())["experiments"]}
    assert shipped == set(SHAPES)
    doc = json.loads((ran / "pack" / "shapes.json").read_text())
    assert [e["test_type"] for e in doc["experiments"]] == [
        e["test_type"] for e in short_k6_pack()["experiments"]
    ]


def test_the_readme_answers_each_experiments_question_with_its_plot(ran):
    pack = ran / "pack"
    readme = (pack / "README.md").read_text()
    section = readme.split("## Load shapes", 1)[1].split("\n## ", 1)[0]
    doc = json.loads((pack / "shapes.json").read_text())
    for e in doc["experiments"]:
        heading = f"### {e['name']} ({e['test_type']}): {SHAPES[e['test_type']].question}"
        assert heading in section, heading
        block = section.split(heading, 1)[1].split("\n### ", 1)[0]
        line = next(ln for ln in block.splitlines() if ln.startswith(f"- `exp-{e['name']}/"))
        assert re.search(ANSWERS[e["test_type"]], line), line
        assert line.endswith(e["points"][0]["answer"])
        # Its plot: linked under the answer, written, listed among the pack's files.
        assert f"]({e['plot']})" in block
        png = pack / e["plot"]
        assert png.stat().st_size > 5000
        assert f"- `{e['plot']}`" in readme.split("## Files", 1)[1]


def test_the_page_and_the_published_pack_hold_the_answers(ran):
    pack = ran / "pack"
    page = (pack / "index.html").read_text()
    assert '<section id="shapes">' in page
    doc = json.loads((pack / "shapes.json").read_text())
    published = json.loads((ran / "tracking" / "parent.json").read_text())["pack_files"]
    for e in doc["experiments"]:
        assert f"<figcaption><code>{e['plot']}</code>" in page
        assert e["plot"] in published
    assert "shapes.json" in published
