"""The pack page (``pack/index.html``) from a pack folder's files: decision first, every plot
embedded, nothing fetched, one folded drill-down per point with its per-class numbers, every
verdict word and every linked metric defined, the pack's texts escaped. The browser check of the
page a real pipeline writes is in ``tests/integration/test_pipeline.py``."""

from __future__ import annotations

import copy
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.image  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

from capacity_pack.decide.glossary import METRICS  # noqa: E402
from capacity_pack.decide.html import load_pack, render_page  # noqa: E402
from capacity_pack.decide.report import bracket_evidence, selected_point  # noqa: E402
from capacity_pack.plan.manifest import freeze  # noqa: E402
from capacity_pack.vocab.words import STATUS_WORDS, decision_sentence  # noqa: E402
from tests.unit.decide.decided import build_capacity, build_plan  # noqa: E402
from tests.unit.decide.test_report import pack_and_reports  # noqa: E402

HOSTILE = "<script>alert(1)</script>"
PLAN_SENTENCE = "Losing 1 of 4 replicas at the 60 RPS peak: PASS, recovered in 7.2 s"


class Page(HTMLParser):
    """What a test reads of the page: ids, links, images, and the text under each section."""

    def __init__(self, text: str):
        super().__init__()
        self.ids: list[str] = []
        self.hrefs: list[str] = []
        self.srcs: list[str] = []
        self.order: list[str] = []  # "decision" and "img", in document order
        self.section_text: dict[str, str] = {}
        self._section: str | None = None
        self.details: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(a["id"])
        if "href" in a:
            self.hrefs.append(a["href"])
        if tag == "img":
            self.srcs.append(a.get("src", ""))
            self.order.append("img")
        if a.get("id") == "decision-sentence":
            self.order.append("decision")
        if tag == "section":
            self._section = a.get("id")
        if tag == "details" and a.get("data-key"):
            self.details.append(a["data-key"])

    def handle_endtag(self, tag):
        if tag == "section":
            self._section = None

    def handle_data(self, data):
        if self._section:
            self.section_text[self._section] = self.section_text.get(self._section, "") + data


def _png(path: Path) -> None:
    matplotlib.image.imsave(path, np.zeros((8, 12)))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A finished pack's folder, written from synthetic cold and warm reports."""
    root = tmp_path_factory.mktemp("pack")
    pack, reports = pack_and_reports()
    warm = []
    for r in reports:
        w = copy.deepcopy(r)
        w["cache_state"], w["key"] = "warm", r["key"].replace("/cold/", "/warm/")
        w["prefix_cache_hit_rate"] = 0.4
        warm.append(w)
    reports += warm
    for r in reports:
        r["queue_trend"] = "flat"
    reports[-1]["verdict_reasons"] = [f"interactive: {HOSTILE}"]
    for r in reports:
        path = root / "reports" / r["key"] / "slo-report.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(r))
    capacity = build_capacity(reports, pack)
    frozen = freeze(pack)
    out = root / "pack"
    out.mkdir()
    manifest = {"frozen_sha256": frozen["sha256"], **frozen["manifest"]}
    (out / "workload-manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    (out / "capacity.json").write_text(json.dumps(capacity))
    (out / "plan.json").write_text(json.dumps(build_plan(capacity, reports, pack)))
    (out / "slo-report.json").write_text(json.dumps(selected_point(capacity, reports)))
    failure = {
        "pack": {"name": "p"}, "clock": "CLOCK_MONOTONIC",
        "clocks": {"plan_replica_kill": "CLOCK_MONOTONIC"},
        "plan_drill": {"verdict": "PASS", "sentence": PLAN_SENTENCE, "execution": "virtual",
                       "execution_reason": "auto"},
        "summary": {"drills_run": ["plan_replica_kill"], "drills_skipped": {},
                    "any_alert_fired": False, "expected_alerts_fired": {},
                    "alerts_not_evaluated": {}, "unexpected_mechanisms": {},
                    "mechanism_lines": ["`replica_kill`: detected in 0.7 s"]},
        "drills": [{"drill": "plan_replica_kill"}],
    }  # fmt: skip
    (out / "failure-test.json").write_text(json.dumps(failure))
    (out / "failure-test.md").write_text("# Failure test\n\n| drill | verdict |\n|---|---|\n")
    (out / "autopsy.md").write_text(f"# Performance autopsy\n\n{HOSTILE}\n")
    for name in ("throughput.png", "attainment.png", "failure-timeline-plan_replica_kill.png"):
        _png(out / name)
    return out


@pytest.fixture(scope="module")
def page(folder) -> str:
    return render_page(load_pack(folder, sorted(folder.parent.glob("reports/*/*/*/*.json"))))


def test_the_decision_comes_first_in_the_readmes_words(folder, page):
    parsed = Page(page)
    assert parsed.order[0] == "decision" and parsed.order.count("img") == 3
    capacity = json.loads((folder / "capacity.json").read_text())
    decision = page[page.index('id="decision-sentence"') :].split("</div>", 1)[0]
    # The README's sentence, as the README builds it (its Markdown bold become <strong>): the
    # decision sentence, then the evidence at the bracket's ends.
    cold = capacity["open_loop"]["cold"]
    b = cold["bracket"]
    sentence = decision_sentence("cold", b["pass_rps"], b["fail_rps"], b["reached"])
    assert sentence == "cold: SLO-compliant capacity [34, 36) RPS, taken as 34 RPS"
    assert f"<strong>{sentence}.</strong> {bracket_evidence(cold)}." in decision
    sections = re.findall(r'<section id="([\w-]+)">', page)
    assert sections[:5] == ["decision", "bracket", "plan", "failure", "gates"]
    assert sections.index("evidence") < sections.index("cache") < sections.index("definitions")
    assert sections.index("definitions") < sections.index("limits")


def test_every_plot_is_embedded_and_nothing_is_fetched(folder, page):
    parsed = Page(page)
    assert all(s.startswith("data:image/png;base64,") for s in parsed.srcs)
    assert len(parsed.srcs) == len(list(folder.glob("*.png")))
    assert 'alt="throughput.png: How much load is served within the SLOs?' in page
    assert not [h for h in parsed.hrefs if re.match(r"(https?:)?//", h)]
    assert "<script" not in page.replace("&lt;script", "")
    assert "<link" not in page and "@import" not in page


def test_each_point_folds_with_its_per_class_numbers(folder, page):
    parsed = Page(page)
    keys = sorted("/".join(p.parts[-4:-1]) for p in folder.parent.glob("reports/*/*/*/*.json"))
    assert sorted(parsed.details) == keys
    first = page[page.index('data-key="open-r30/cold/rep0"') :].split("</details>", 1)[0]
    for cls in ("interactive", "long_context", "generation_heavy"):
        row = first[first.index(f'data-class="{cls}"') :].split("</tr>", 1)[0]
        # P95 TTFT of the synthetic report: 100 + rate.
        assert '<td class="num">130.0</td>' in row or '<td class="num">130</td>' in row
    selected = json.loads((folder / "slo-report.json").read_text())["key"]
    marked = [k for k in keys if "the selected point" in page.split(f'data-key="{k}"')[1][:900]]
    assert marked == [selected]


def test_cold_and_warm_side_by_side_with_hit_rates(page):
    table = page[page.index('id="cache-by-rate"') :].split("</table>", 1)[0]
    for label in ("cold status", "warm status", "cold server hit rate", "warm server hit rate"):
        assert label in table
    assert '<td class="num">0.4</td>' in table


def test_every_verdict_word_and_every_linked_metric_is_defined(page):
    parsed = Page(page)
    definitions = parsed.section_text["definitions"]
    for word in STATUS_WORDS:
        assert re.search(rf"\b{word}\b", definitions), word
    linked = {h[1:] for h in parsed.hrefs if h.startswith("#def-")}
    assert linked and linked <= set(parsed.ids)
    assert {f"def-{k}" for k in METRICS} <= set(parsed.ids)


def test_the_failure_answer_limits_and_autopsy_are_there_and_the_packs_text_escaped(page):
    parsed = Page(page)
    assert PLAN_SENTENCE in parsed.section_text["failure"]
    assert "linear scaling" in parsed.section_text["limits"]
    assert HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Performance autopsy" in parsed.section_text["autopsy"]


def test_a_pack_without_drills_or_autopsy_still_has_its_page(folder, tmp_path):
    bare = tmp_path / "pack"
    bare.mkdir()
    for name in ("workload-manifest.yaml", "capacity.json", "plan.json"):
        (bare / name).write_text((folder / name).read_text())
    page = render_page(load_pack(bare))
    parsed = Page(page)
    assert parsed.order == ["decision"] and not parsed.details
    assert "ran no failure drills" in parsed.section_text["failure"]
    assert "No autopsy" in parsed.section_text["autopsy"]


def test_load_shapes_sit_beside_their_pictures(folder, tmp_path):
    """A pack with experiments: each answer in the load-shapes section, its picture after it
    (not among the other figures); without experiments the section says so."""
    import shutil

    assert (
        "This pack ran no load-shape experiments."
        in Page(render_page(load_pack(folder))).section_text["shapes"]
    )
    pack = tmp_path / "pack"
    shutil.copytree(folder, pack)
    doc = {
        "experiments": [
            {"name": "spike", "test_type": "spike", "question": "How high does the queue go?",
             "plot": "shape-spike.png",
             "points": [{"key": "exp-spike/warm/rep0", "verdict": "pass",
                         "answer": "The 50 RPS burst peaks the server queue at a depth of 7."}]}
        ]
    }  # fmt: skip
    (pack / "shapes.json").write_text(json.dumps(doc))
    _png(pack / "shape-spike.png")
    page = render_page(load_pack(pack))
    shapes = Page(page).section_text["shapes"]
    assert "spike (spike): How high does the queue go?" in shapes
    assert "peaks the server queue at a depth of 7" in shapes
    section = page.split('<section id="shapes">', 1)[1].split("</section>", 1)[0]
    assert "<figcaption><code>shape-spike.png</code>" in section
    assert '<section id="other-figures">' not in page
