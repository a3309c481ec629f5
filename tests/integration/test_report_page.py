"""The pack page, ``pack/index.html``, as a person sees it: a small pack built by the real
pipeline, its page opened from ``file://`` in headless Chromium (``tests/browser.py``): the
decision is visible at the top, above every plot; every plot is really decoded; a point's
drill-down opens onto its per-class numbers; nothing is fetched; the definitions hold every
verdict word. Then ``snakemake --report`` carries the page as an HTML entry."""

from __future__ import annotations

import re
import zipfile

import pytest

from tests.browser import chromium
from tests.conftest import run_snakemake, small_pack_data, write_pack

pytestmark = pytest.mark.slow

NAME = "report-page-test"
VERDICT_WORDS = ("pass", "marginal", "fail", "inconsistent", "inconclusive")


def small_pack() -> dict:
    # tests/integration/test_pipeline.py's small pack under another name: every section of the
    # page (both cache states, closed loop, one mechanism drill and the plan drill) in seconds.
    data = small_pack_data(
        NAME,
        requests=60,
        min_samples=10,
        sweep={"open_loop_rps": [10, 20], "closed_loop_concurrency": [1]},
    )
    data["failure"].update(
        rate_rps=20, duration_s=10, baseline_s=4, warmup_s=1, window_s=1, restart_after_s=3,
        cold_start_s=1, admission_max_outstanding=16,
    )  # fmt: skip
    data["failure"]["drills"] = [{"name": "replica_kill", "kind": "replica_kill"}]
    return data


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("page")
    write_pack(workdir, small_pack())
    run_snakemake(workdir)
    return workdir


def _pack(workdir):
    return workdir / "results" / NAME / "pack"


def test_the_pack_page_in_a_browser(built):
    pack = _pack(built)
    pngs = sorted(p.name for p in pack.glob("*.png"))
    assert {"throughput.png", "attainment.png", "failure-timeline-replica_kill.png"} <= set(pngs)
    with chromium() as browser:
        browser.get((pack / "index.html").as_uri())
        run = browser.execute_script
        # The decision, first: displayed within the first screen, above every plot.
        decision = browser.find_element("id", "decision-sentence")
        assert decision.is_displayed()
        assert "SLO-compliant capacity" in decision.text, decision.text
        top = run("return arguments[0].getBoundingClientRect().top + window.scrollY", decision)
        bottom = run(
            "return arguments[0].getBoundingClientRect().bottom + window.scrollY", decision
        )
        assert 0 <= top < run("return window.innerHeight")
        # Every plot: displayed, decoded (a broken image has naturalWidth 0), below the decision.
        images = browser.find_elements("tag name", "img")
        assert len(images) == len(pngs)
        for img in images:
            assert img.is_displayed()
            decoded = run("return arguments[0].complete && arguments[0].naturalWidth", img)
            assert decoded and decoded > 0, img.get_attribute("alt")[:80]
            y = run("return arguments[0].getBoundingClientRect().top + window.scrollY", img)
            assert y > bottom
        # Nothing fetched: no resource at all (the plots are data URIs), no link off the page.
        fetched = run(
            "return performance.getEntriesByType('resource').map(e => e.name)"
            ".filter(n => !n.startsWith('data:'))"
        )
        assert fetched == []
        remote = run(
            "return Array.from(document.querySelectorAll('[src],[href]'))"
            ".map(e => e.getAttribute('src') || e.getAttribute('href'))"
            ".filter(u => /^(https?:)?\\/\\//i.test(u))"
        )
        assert remote == []
        # A point's drill-down: folded, then open onto its per-class numbers.
        point = browser.find_element("css selector", "details.point")
        row = point.find_element("css selector", "tr.class-row")
        assert not row.is_displayed()
        point.find_element("tag name", "summary").click()
        assert point.get_attribute("open") is not None and row.is_displayed()
        cells = [td.text for td in row.find_elements("tag name", "td")]
        assert cells[0] in {"interactive", "long_context", "generation_heavy"}
        assert re.fullmatch(r"\d+", cells[1]) and re.fullmatch(r"[\d.,]+", cells[6]), cells
        # Every verdict word is defined, on the page as displayed.
        definitions = browser.find_element("id", "definitions")
        words = {w.text for w in definitions.find_elements("css selector", "strong")}
        assert set(VERDICT_WORDS) <= words, words
        # Every metric link lands on its definition.
        targets = run(
            "return Array.from(document.querySelectorAll('a[href^=\"#def-\"]'))"
            ".map(a => a.getAttribute('href').slice(1))"
            ".filter(id => !document.getElementById(id))"
        )
        assert targets == []


def test_snakemake_report_carries_the_page_as_html(built):
    out = built / "report.zip"
    run_snakemake(built, "--report", str(out))
    page = (_pack(built) / "index.html").read_bytes()
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        carried = [n for n in names if n.endswith("/index.html")]
        assert len(carried) == 1 and z.read(carried[0]) == page
        registry = z.read(next(n for n in names if n.endswith("report.html"))).decode()
    mimes = re.findall(r'"mime_type": "([^"]+)"', registry)
    assert "text/html" in mimes and not [m for m in mimes if m.startswith("text/markdown")]
