"""The pack README states the capacity as a bracket, the achieved rates and the closed-loop
operating point's status; the throughput plot draws the bracket; the time-series plot draws
only the signals the engine exposes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from capacity_pack.decide.capacity import build_capacity, build_plan  # noqa: E402
from capacity_pack.decide.report import (  # noqa: E402
    bracket_sentence,
    plot_throughput,
    plot_timeseries,
    render_readme,
)
from capacity_pack.plan.manifest import freeze, load_pack  # noqa: E402
from tests.paths import DEFAULT  # noqa: E402
from tests.unit.decide.test_capacity import CLASSES, report  # noqa: E402


def _fail_36(repeat: int) -> dict:
    r = report(36, repeat, "fail", reasons=["interactive: attainment 0.9100 < 0.95"])
    r["classes"]["interactive"].update(
        p99_ttft_early_stopping={"over_cutoff": 30}, p99_tpot_early_stopping={"over_cutoff": 2}
    )
    return r


def _pack_and_reports():
    pack = load_pack(DEFAULT)
    classes = pack.class_names
    reports = []
    for rate in (30, 34):
        for k in range(2):
            r = report(rate, k, "pass")
            r["classes"] = {c: dict(r["classes"][CLASSES[0]]) for c in classes}
            reports.append(r)
    for k in range(2):
        r = _fail_36(k) if k == 0 else report(36, k, "pass")
        r["classes"] = {c: dict(r["classes"][CLASSES[0]]) for c in classes}
        reports.append(r)
    reports[-2]["attempted"], reports[-2]["measured_window_s"] = 600, 17.0
    return pack, reports


def test_the_readme_states_the_capacity_as_a_bracket():
    pack, reports = _pack_and_reports()
    capacity = build_capacity(reports, pack)
    sel = capacity["open_loop"]["cold"]
    sel["bracket"].update(resolution_rps=2.0, reached=True)  # as with a sweep.search of 2 RPS
    text = bracket_sentence(sel)
    # 36 RPS failed in repeat 0 and passed in repeat 1: inconsistent, and it says where.
    assert text.startswith("between 34 RPS (passes) and 36 RPS (inconsistent: interactive TTFT "
                           "(repeat 0))")  # fmt: skip
    assert "resolution 2 RPS reached" in text and "95 % confidence" in text
    frozen = freeze(pack)
    readme = render_readme(frozen, capacity, build_plan(capacity, reports, pack), None, [])
    assert f"**SLO-compliant capacity (cold cache): {text}.**" in readme
    assert "RPS per GPU" in readme and "nominally" in readme
    # The rates table: nominal, offered (attempted / T) and achieved per repeat.
    assert "| nominal RPS | offered RPS | achieved RPS |" in readme
    row = next(line for line in readme.splitlines() if line.startswith("| 36 |"))
    assert "35.3 / 36" in row  # 600 attempts over 17 s in repeat 0, 36 RPS in repeat 1


def test_the_bracket_sentence_without_a_search_or_an_upper_end():
    pack, reports = _pack_and_reports()
    # The default pack searches; this one measures its declared rates only.
    pack = pack.model_copy(update={"sweep": pack.sweep.model_copy(update={"search": None})})
    sel = build_capacity(reports, pack)["open_loop"]["cold"]
    assert "no search resolution declared" in bracket_sentence(sel)
    assert "the width, 2 RPS, is the tested grid's step" in bracket_sentence(sel)
    top = build_capacity([r for r in reports if r["offered_rps"] < 36], pack)
    text = bracket_sentence(top["open_loop"]["cold"])
    assert text.startswith("at least 34 RPS") and "may be higher" in text
    none = build_capacity([_fail_36(0)], pack)
    assert bracket_sentence(none["open_loop"]["cold"]).startswith("below 36 RPS (fails: ")


def test_the_readme_says_the_operating_point_status():
    pack, reports = _pack_and_reports()
    for c, tps in ((1, 100.0), (8, 900.0)):
        r = report(None, 0, "inconclusive", mode="closed", conc=c, attainment=1.0,
                   reasons=["interactive: 5 successful < 80"])  # fmt: skip
        r["classes"] = {name: dict(r["classes"][CLASSES[0]]) for name in pack.class_names}
        r["output_throughput_tps"] = tps
        reports.append(r)
    capacity = build_capacity(reports, pack)
    readme = render_readme(freeze(pack), capacity, build_plan(capacity, reports, pack), None, [])
    line = next(x for x in readme.splitlines() if x.startswith("Operating point"))
    assert "concurrency 8" in line and "status is inconclusive" in line
    assert "largest concurrency tested" in line


def test_the_throughput_plot_draws_the_bracket(tmp_path, monkeypatch):
    pack, reports = _pack_and_reports()
    sel = build_capacity(reports, pack)["open_loop"]
    spans = []
    import matplotlib.axes

    original = matplotlib.axes.Axes.axvspan
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "axvspan",
        lambda self, lo, hi, **kw: spans.append((lo, hi)) or original(self, lo, hi, **kw),
    )
    path = tmp_path / "throughput.png"
    plot_throughput(sel, path)
    assert spans == [(34.0, 36.0)] and path.stat().st_size > 10_000
    # The plot's words travel in the PNG: title, axis labels and legend entries.
    from PIL import Image

    words = Image.open(path).text["Description"].splitlines()
    assert "offered load, nominal (RPS)" in words, words
    # Titled with the question it answers; the capacity line labelled on the plot itself.
    assert "How much load is served within the SLOs?" in words
    assert "cold capacity 34" in words


def test_the_timeseries_plot_omits_a_signal_the_engine_does_not_expose(tmp_path, monkeypatch):
    import matplotlib.figure
    import pandas as pd

    seen: dict[str, object] = {}
    legend, suptitle = matplotlib.figure.Figure.legend, matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "legend",
        lambda self, handles, labels, **kw: (
            seen.update(labels=labels) or legend(self, handles, labels, **kw)
        ),
    )
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "suptitle",
        lambda self, t, **kw: seen.update(title=t) or suptitle(self, t, **kw),
    )

    def scrape(metrics):  # like llama.cpp: queue and running, no KV gauge
        return pd.DataFrame(
            [
                {"source": "server", "metric": m, "t_offset_ns": t * 10**9, "value": float(t)}
                for m in metrics
                for t in range(5)
            ]
        )

    path = tmp_path / "timeseries.png"
    missing = plot_timeseries({"open-r2/cold/rep0": scrape(["queue_depth", "running"])}, path)
    assert missing == ["KV usage 0..1"] and path.stat().st_size > 5_000
    assert seen["labels"] == ["queue depth (left axis)", "running requests (left axis)"]
    assert "not exposed by this engine, not drawn: KV usage 0..1" in str(seen["title"])
    everything = scrape(["queue_depth", "running", "kv_usage"])
    assert plot_timeseries({"open-r2/cold/rep0": everything}, path) == []
    assert seen["labels"][-1] == "KV usage 0..1 (right axis)"
    assert "not exposed" not in str(seen["title"])


def test_the_readme_defines_its_verdict_words_and_prices_in_the_packs_currency():
    pack, reports = _pack_and_reports()
    capacity = build_capacity(reports, pack)
    readme = render_readme(freeze(pack), capacity, build_plan(capacity, reports, pack), None, [])
    words = readme[readme.index("## Verdict words") :].split("\n## ")[0]
    for word in ("pass", "marginal", "fail", "inconclusive", "inconsistent"):
        assert f"**{word}**" in words, word
    assert "0.95" in words and "95%" in words  # the pack's own gate and confidence
    cost = next(line for line in readme.splitlines() if line.startswith("Cost"))
    assert cost.startswith("Cost, in the currency of plan.price_per_gpu_hour (2.5 per GPU-hour)")


def test_the_closed_loop_plot_shows_ttft_and_tpot_against_their_cutoffs(tmp_path):
    from PIL import Image

    from capacity_pack.decide.report import plot_closed_loop

    def level(c: int, tps: float, ttft: float, tpot: float) -> dict:
        return {"concurrency": c, "output_throughput_tps": tps,
                "p95_ttft_ms": {"chat": ttft, "rag": ttft / 2},
                "p95_tpot_ms": {"chat": tpot, "rag": tpot * 2}}  # fmt: skip

    curve = [level(1, 100, 50, 10), level(8, 600, 200, 30), level(32, 900, 900, 70)]
    curves = {"cold": {"curve": curve, "operating_point": curve[1]}}
    path = tmp_path / "closed_loop.png"
    plot_closed_loop(curves, path, {"chat": (500, 50), "rag": (1000, 50)})
    words = Image.open(path).text["Description"].splitlines()
    assert "How far can concurrency go within the SLOs? (closed loop)" in words
    assert {"TTFT", "TPOT", "SLO cutoff"} <= set(words)
    assert "worst class P95 TPOT / its cutoff" in words and "c=32" in words
