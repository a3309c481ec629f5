"""The registries of the pack's plots, README sections and page sections: a plot or a section
registered from outside (here, from the test) is drawn, listed and shown with no other edit;
a name is registered once; the registered sets are the shipped ones."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from capacity_pack import stages  # noqa: E402
from capacity_pack.decide.html import PAGE_SECTIONS, load_pack, render_page  # noqa: E402
from capacity_pack.decide.plots import PLOTS, Plot, pyplot, register, save_figure  # noqa: E402
from capacity_pack.decide.report import README_SECTIONS, selected_point, write_pack  # noqa: E402
from capacity_pack.plan.manifest import freeze  # noqa: E402

# The decision the README and page tests build from their synthetic reports.
from tests.unit.decide.test_report import (  # noqa: E402
    build_capacity,
    build_plan,
    pack_and_reports,
)

SHIPPED_PLOTS = [
    "throughput.png",
    "attainment.png",
    "latency.png",
    "closed_loop.png",
    "timeseries.png",
    "sessions.png",
]
README = [
    "title",
    "decision",
    "failure-answer",
    "plan",
    "gates",
    "workload-lengths",
    "verdict-words",
    "evidence",
    "twin",
    "shapes",
    "sessions",
    "selected",
    "failure-test",
    "limits",
    "files",
]
PAGE = [
    "decision",
    "bracket",
    "plan",
    "failure",
    "gates",
    "evidence",
    "shapes",
    "cache",
    "failure-test",
    "autopsy",
    "definitions",
    "limits",
    "other-figures",
    "files",
]
CAPTION = "How many toys fit? One bar per cache state."


def _pack(out):
    """A pack folder written by the report from synthetic reports (no series, no sessions)."""
    pack, reports = pack_and_reports()
    for r in reports:
        r["queue_trend"] = "flat"
        for c in r["classes"].values():
            c["attainment_ci"] = [c["attainment"] - 0.01, 1.0]  # the attainment plot's bars
    capacity = build_capacity(reports, pack)
    write_pack(
        out,
        frozen=freeze(pack),
        capacity=capacity,
        plan=build_plan(capacity, reports, pack),
        reports=reports,
        selected_tables=None,
        selected_report=selected_point(capacity, reports),
        series={},
    )
    return out


@pytest.fixture
def toy_plot():
    def draw(inputs, path):
        fig, ax = pyplot().subplots()
        ax.bar(list(inputs.capacity["open_loop"]), [1.0] * len(inputs.capacity["open_loop"]))
        save_figure(fig, path)

    register("toy.png", "evidence", CAPTION)(draw)
    yield
    PLOTS.remove("toy.png")


def test_a_registered_plot_is_drawn_listed_and_shown(tmp_path, toy_plot):
    folder = _pack(tmp_path / "pack")
    assert (folder / "toy.png").stat().st_size > 1_000
    assert "- `toy.png`" in (folder / "README.md").read_text().splitlines()
    page = render_page(load_pack(folder))
    evidence = page.split('<section id="evidence">', 1)[1].split("</section>", 1)[0]
    assert f"<figcaption><code>toy.png</code>: {CAPTION}</figcaption>" in evidence
    assert '<section id="other-figures">' not in page


def test_a_plot_without_its_data_is_not_drawn(tmp_path):
    # The synthetic pack has no closed loop, no server series and no sessions.
    folder = _pack(tmp_path / "pack")
    drawn = sorted(p.name for p in folder.glob("*.png"))
    assert drawn == ["attainment.png", "latency.png", "throughput.png"]


@pytest.fixture
def toy_sections():
    PAGE_SECTIONS.register("toy", "Toy section", order=55, nav="Toy")(
        lambda p: [f"<p>toy of {len(p.capacity['open_loop'])} states</p>"]
    )
    README_SECTIONS.register("toy", "Toy section", order=45)(lambda d: ["toy line", ""])
    yield
    PAGE_SECTIONS.remove("toy")
    README_SECTIONS.remove("toy")


def test_a_registered_section_shows_in_its_order(tmp_path, toy_sections):
    folder = _pack(tmp_path / "pack")
    page = render_page(load_pack(folder))
    sections = re.findall(r'<section id="([\w-]+)">', page)
    assert sections[sections.index("gates") + 1] == "toy"
    assert '<section id="toy">\n<h2>Toy section</h2>\n<p>toy of 1 states</p>' in page
    assert '<a href="#gates">Gates</a><a href="#toy">Toy</a>' in page
    readme = (folder / "README.md").read_text()
    assert "## Replica plan" in readme
    assert readme.index("## Replica plan") < readme.index("## Toy section\n\ntoy line\n")
    assert readme.index("## Toy section") < readme.index("## Gates")


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="plot 'throughput.png' is registered already"):
        PLOTS.add(Plot("throughput.png", lambda i, p: None, "bracket", "again"))
    with pytest.raises(ValueError, match="page section 'decision' is registered already"):
        PAGE_SECTIONS.register("decision", "Again", order=1)(lambda p: [])
    with pytest.raises(ValueError, match="README section 'limits' is registered already"):
        README_SECTIONS.register("limits", "Again", order=1)(lambda d: [])
    assert PLOTS.names() == SHIPPED_PLOTS


def test_the_registered_sets_are_the_shipped_ones():
    assert PLOTS.names() == SHIPPED_PLOTS
    assert README_SECTIONS.names() == README
    assert PAGE_SECTIONS.names() == PAGE
    # Every plot the report job declares to Snakemake is a registered one, shown on the page.
    assert set(stages.REPORT_PLOTS) <= set(PLOTS.names())
    assert {p.section for p in PLOTS} <= set(PAGE_SECTIONS.names())
