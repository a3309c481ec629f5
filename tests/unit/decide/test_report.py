"""The pack README states the capacity as a bracket, the achieved rates and the closed-loop
operating point's status; the throughput plot draws the bracket; the time-series plot draws
only the signals the engine exposes."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

from capacity_pack.decide.plots import (  # noqa: E402
    figure_text,
    plot_throughput,
    plot_timeseries,
)
from capacity_pack.decide.report import bracket_evidence, render_readme  # noqa: E402
from capacity_pack.plan.manifest import freeze, load_pack  # noqa: E402
from capacity_pack.vocab.words import decision_sentence  # noqa: E402
from tests.paths import DEFAULT  # noqa: E402
from tests.unit.decide.decided import build_capacity, build_plan  # noqa: E402
from tests.unit.decide.test_capacity import CLASSES, report  # noqa: E402


def _fail_36(repeat: int) -> dict:
    r = report(36, repeat, "fail", reasons=["interactive: attainment 0.9100 < 0.95"])
    r["classes"]["interactive"].update(
        p99_ttft_early_stopping={"over_cutoff": 30}, p99_tpot_early_stopping={"over_cutoff": 2}
    )
    return r


def pack_and_reports():
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
    pack, reports = pack_and_reports()
    capacity = build_capacity(reports, pack)
    sel = capacity["open_loop"]["cold"]
    sel["bracket"].update(resolution_rps=2.0, reached=True)  # as with a sweep.search of 2 RPS
    text = bracket_evidence(sel)
    # 36 RPS failed in repeat 0 and passed in repeat 1: inconsistent, and it says where.
    assert text.startswith("34 RPS is shown to pass; 36 RPS is inconsistent between its repeats: "
                           "interactive TTFT (repeat 0)")  # fmt: skip
    assert "resolution 2 RPS reached" in text and "95 % confidence" in text
    frozen = freeze(pack)
    readme = render_readme(frozen, capacity, build_plan(capacity, reports, pack), None, [])
    sentence = decision_sentence("cold", 34, 36, True)
    assert sentence == "cold: SLO-compliant capacity [34, 36) RPS, taken as 34 RPS"
    # The decision sentence in bold, then the evidence at the bracket's ends.
    assert f"**{sentence}.** {text}." in readme
    assert "RPS per GPU" in readme and "nominally" in readme
    # The rates table: nominal, offered (attempted / T) and achieved per repeat.
    assert "| nominal RPS | offered RPS | achieved RPS |" in readme
    row = next(line for line in readme.splitlines() if line.startswith("| 36 |"))
    assert "35.3 / 36" in row  # 600 attempts over 17 s in repeat 0, 36 RPS in repeat 1


def test_the_bracket_sentence_without_a_search_or_an_upper_end():
    pack, reports = pack_and_reports()
    # The default pack searches; this one measures its declared rates only.
    pack = pack.model_copy(update={"sweep": pack.sweep.model_copy(update={"search": None})})
    sel = build_capacity(reports, pack)["open_loop"]["cold"]
    assert "no search resolution declared" in bracket_evidence(sel)
    assert "the width, 2 RPS, is the tested grid's step" in bracket_evidence(sel)
    top = build_capacity([r for r in reports if r["offered_rps"] < 36], pack)["open_loop"]["cold"]
    assert bracket_evidence(top).startswith("34 RPS is shown to pass; no search resolution")
    assert top["bracket"]["note"] == (
        "cold: SLO-compliant capacity at least 34 RPS, taken as 34 RPS; the highest rate tested "
        "meets every gate, so the true capacity may be higher"
    )
    none = build_capacity([_fail_36(0)], pack)["open_loop"]["cold"]
    assert bracket_evidence(none).startswith("36 RPS fails: ")
    assert none["bracket"]["note"] == (
        "cold: no SLO-compliant capacity, below 36 RPS (the lowest rate tested does not meet "
        "every gate)"
    )


def test_the_readme_says_the_operating_point_status():
    pack, reports = pack_and_reports()
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
    pack, reports = pack_and_reports()
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


def _scrape(metrics, peak=2.0):
    """A server scrape like the engines': each signal rising to ``peak`` over 5 s."""
    import pandas as pd

    return pd.DataFrame(
        [
            {"source": "server", "metric": m, "t_offset_ns": t * 10**9, "value": peak * t / 4}
            for m in metrics
            for t in range(5)
        ]
    )


def _drawn_timeseries(monkeypatch, *args):
    """Draw the time-series plot; return the figure it saved and the value it returned."""
    import capacity_pack.decide.plots as plots_module

    figures = []
    save = plots_module.save_figure
    monkeypatch.setattr(
        plots_module, "save_figure", lambda fig, path: figures.append(fig) or save(fig, path)
    )
    missing = plot_timeseries(*args)
    return figures[0], missing


def test_the_timeseries_plot_says_at_each_rate_whether_the_server_kept_up(tmp_path, monkeypatch):
    import pandas as pd

    def scrape(queue_peak=1.0):
        # A queue of at most one request: a range a default locator ticks in halves.
        parts = [_scrape(["queue_depth"], queue_peak), _scrape(["running"], 7.0)]
        return pd.concat([*parts, _scrape(["kv_usage"], 0.3)], ignore_index=True)

    series = {
        "open-r10/cold/rep0": scrape(),
        "open-r10/warm/rep0": scrape(),
        "open-r2/cold/rep0": scrape(0.0),
        "open-r2/cold/rep1": scrape(0.0),
        "open-r2/warm/rep0": scrape(0.0),
    }
    verdicts = {
        "open-r10/cold/rep0": "fail",
        "open-r10/warm/rep0": "marginal",
        "open-r2/cold/rep0": "pass",
        "open-r2/cold/rep1": "inconclusive",
        "open-r2/warm/rep0": "pass",
    }
    path = tmp_path / "timeseries.png"
    fig, missing = _drawn_timeseries(monkeypatch, series, path, verdicts)
    assert missing == [] and path.stat().st_size > 10_000
    words = figure_text(fig).splitlines()
    assert any(w.startswith("Does the server keep up?") for w in words), words
    # One row per rate, ordered by rate (2 before 10, which a sort of the keys would invert),
    # each naming per cache state the verdict of every repeat.
    assert words.index("2 RPS") < words.index("10 RPS")
    assert "cold: ✓ pass / ? inconclusive" in words and "warm: ✓ pass" in words
    assert "cold: ✗ fail" in words and "warm: ~ marginal" in words
    # Not 5 panels of 3 signals: 2 rates x 3 signals, one column per signal.
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 6
    columns = {}
    for ax in fig.axes:
        columns.setdefault(ax.get_subplotspec().colspan.start, []).append(ax)
    titles = [col[0].get_title() for col in columns.values()]
    assert titles == [
        "queue depth (waiting requests)",
        "running requests",
        "KV-cache usage (share of blocks)",
    ]
    queue, running, kv = columns.values()
    # One scale per signal, so the rates compare; large enough for the busiest rate.
    for col in (queue, running, kv):
        assert len({ax.get_ylim() for ax in col}) == 1
    assert queue[0].get_ylim()[1] >= 1.0 and running[0].get_ylim()[1] >= 7.0
    assert kv[0].get_ylim() == (0.0, 1.0)
    # Counts of requests tick in whole requests.
    for ax in queue + running:
        lo, hi = ax.get_ylim()
        ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
    # The failing rate's row is marked; the passing one is not.
    assert queue[1].get_facecolor() != queue[0].get_facecolor()
    assert "a repeat at this rate failed" in words


def test_the_timeseries_plot_omits_a_signal_the_engine_does_not_expose(tmp_path, monkeypatch):
    path = tmp_path / "timeseries.png"
    llama = {"open-r2/cold/rep0": _scrape(["queue_depth", "running"])}  # no KV gauge
    fig, missing = _drawn_timeseries(monkeypatch, llama, path, {"open-r2/cold/rep0": "pass"})
    assert missing == ["KV-cache usage (share of blocks)"] and path.stat().st_size > 5_000
    text = figure_text(fig)
    assert "not exposed by this engine, not drawn: KV-cache usage (share of blocks)" in text
    assert [ax.get_title() for ax in fig.axes] == [
        "queue depth (waiting requests)",
        "running requests",
    ]
    assert "KV usage stays under 1" not in text  # the note reads no signal it lacks
    everything = {"open-r2/cold/rep0": _scrape(["queue_depth", "running", "kv_usage"])}
    fig, missing = _drawn_timeseries(monkeypatch, everything, path)
    assert missing == [] and "not exposed" not in figure_text(fig)
    assert fig.axes[-1].get_title() == "KV-cache usage (share of blocks)"
    assert "cold: n/a" in figure_text(fig)  # no verdict given: said, not guessed


def test_the_readme_shows_the_warm_runs_were_warm():
    pack, reports = pack_and_reports()
    warm = []
    for r in reports:
        w = json.loads(json.dumps(r))
        w.update(cache_state="warm", key=w["key"].replace("/cold/", "/warm/"))
        w["prefix_cache_hit_rate"] = 0.21
        warm.append(w)
    capacity = build_capacity(reports + warm, pack)
    readme = render_readme(freeze(pack), capacity, build_plan(capacity, reports, pack), None, [])
    table = readme[readme.index("### Open loop, warm cache") :].split("\n### ")[0]
    header = next(line for line in table.splitlines() if line.startswith("| nominal RPS"))
    assert "server hit rate" in header
    row = next(line for line in table.splitlines() if line.startswith("| 30 |"))
    assert "| 0.21 / 0.21 |" in row, row


def test_the_readme_defines_its_verdict_words_and_prices_in_the_packs_currency():
    pack, reports = pack_and_reports()
    capacity = build_capacity(reports, pack)
    readme = render_readme(freeze(pack), capacity, build_plan(capacity, reports, pack), None, [])
    words = readme[readme.index("## Verdict words") :].split("\n## ")[0]
    for word in ("pass", "marginal", "misses", "fail", "inconclusive", "inconsistent"):
        assert f"**{word}**" in words, word
    assert "0.95" in words and "95%" in words  # the pack's own gate and confidence
    cost = next(line for line in readme.splitlines() if line.startswith("Cost"))
    assert cost.startswith("Cost, in the currency of plan.price_per_gpu_hour (2.5 per GPU-hour)")


def test_the_closed_loop_plot_shows_ttft_and_tpot_against_their_cutoffs(tmp_path):
    from PIL import Image

    from capacity_pack.decide.plots import plot_closed_loop

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


def test_the_latency_plot_of_a_one_class_pack(tmp_path):
    """One class: a TTFT panel over a TPOT panel (a 2 x 1 grid), each against its cutoff."""
    from PIL import Image

    from capacity_pack.decide.plots import plot_latency

    reports = [report(rate, 0, "pass") for rate in (10, 20)]
    for r in reports:
        r["classes"] = {"chat": dict(r["classes"][CLASSES[0]])}
    path = tmp_path / "latency.png"
    plot_latency(reports, ["chat"], {"chat": (500.0, 50.0)}, path)
    words = Image.open(path).text["Description"].splitlines()
    assert {"chat: P95 TTFT (ms)", "chat: P95 TPOT (ms)"} <= set(words)
