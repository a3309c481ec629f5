"""The pack's plots (matplotlib, PNG, cold and warm side by side), each titled with the question
it answers, its words kept in the PNG's Description (:func:`save_figure`), and :data:`PLOTS`,
their registry: each plot's file name, the page section and caption that show it, when it has
data, and the function that draws it from the report's inputs (:class:`PlotInputs`). A new plot
is one function and one :func:`register`: the report draws it into the pack folder and lists it
in the README, and the page shows it in its section.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.decide import sessions
from capacity_pack.decide.registry import Registry
from capacity_pack.io import atomic_path
from capacity_pack.vocab.words import rate_status_words

STATE_STYLE = {"cold": ("tab:blue", "o"), "warm": ("tab:orange", "s")}


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_text(fig) -> str:
    """Every piece of text the figure draws (titles, axis labels, ticks, legend entries, notes),
    in drawing order, one per line."""
    from matplotlib.text import Text

    seen: list[str] = []
    for t in fig.findobj(Text):
        text = t.get_text().strip()
        if text and t.get_visible() and text not in seen:
            seen.append(text)
    return "\n".join(seen)


def save_figure(fig, path: Path) -> None:
    # The figure's words go into the PNG (its Description text chunk): what a screen reader
    # or a search finds in the picture, and what a test can read back.
    with atomic_path(path) as tmp:
        fig.savefig(
            tmp,
            format="png",
            dpi=110,
            bbox_inches="tight",
            metadata={"Description": figure_text(fig)},
        )
    pyplot().close(fig)


def plot_throughput(selection: dict[str, Any], path: Path) -> None:
    """How much load is served within the SLOs? Goodput (thick, filled) over the achieved rate
    (thin, hollow: the two coincide below the capacity), each state's bracket labelled on the
    plot, and the axes cropped to the tested rates."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    rates_all: list[float] = []
    for i, (state, sel) in enumerate(selection.items()):
        color, marker = STATE_STYLE.get(state, ("gray", "x"))
        rates = [r["offered_rps"] for r in sel["rates"]]
        thr = [r["variation"]["observed_goodput_rps"] for r in sel["rates"]]
        raw = [r["variation"]["request_throughput_rps"]["mean"] for r in sel["rates"]]
        ax.plot(rates, raw, color=color, marker=marker, mfc="none", ms=9, lw=0.9, ls=":",
                label=f"{state}: achieved RPS (all completions)")  # fmt: skip
        _errorline(ax, rates, thr, color, marker, f"{state}: goodput (within SLO)")
        _bracket(ax, sel.get("bracket") or {"pass_rps": sel["capacity_rps"]}, color, state, i)
        rates_all += rates
    if rates_all:
        lo, hi = min(rates_all), max(rates_all)
        pad = 0.06 * max(hi - lo, hi * 0.2)
        ax.set_xlim(max(0.0, lo - pad), hi + pad)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="gray", lw=0.8, ls="-.",
                label="served = offered")  # fmt: skip
    ax.set_xlabel("offered load, nominal (RPS)")
    ax.set_ylabel("requests per second")
    ax.set_title("How much load is served within the SLOs?\n"
                 "goodput and achieved rate by offered rate; shaded: the capacity bracket",
                 fontsize=10)  # fmt: skip
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def _bracket(ax, b: dict[str, Any], color: str, state: str, row: int = 0) -> None:
    """The bracket: a solid line at the passing rate, labelled on the plot ("cold capacity 34"),
    a dashed one at the failing rate, and the span between them shaded (no shade when either
    end is missing)."""
    lo, hi = b.get("pass_rps"), b.get("fail_rps")
    if lo is not None:
        words = rate_status_words(lo, b.get("pass_status") or "pass")
        ax.axvline(lo, color=color, lw=1.2, alpha=0.7, label=f"{state}: {words}")
        ax.annotate(f"{state} capacity {lo:g}", xy=(lo, 0.02 + 0.48 * row),
                    xycoords=("data", "axes fraction"),
                    rotation=90, ha="right", va="bottom", fontsize=8, color=color)  # fmt: skip
    if hi is not None:
        words = rate_status_words(hi, b.get("fail_status") or "fail")
        ax.axvline(hi, color=color, lw=1.2, ls="--", alpha=0.7, label=f"{state}: {words}")
    if lo is not None and hi is not None:
        ax.axvspan(lo, hi, color=color, alpha=0.12)


def _errorline(ax, x, stats, color, marker, label) -> None:
    mean = [s["mean"] for s in stats]
    lo = [max(s["mean"] - s["min"], 0.0) if s["mean"] is not None else 0 for s in stats]
    hi = [max(s["max"] - s["mean"], 0.0) if s["mean"] is not None else 0 for s in stats]
    ax.errorbar(x, mean, yerr=[lo, hi], color=color, marker=marker, capsize=3, label=label)


def plot_attainment(
    reports: list[dict[str, Any]], classes: list[str], gate: float, path: Path
) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(classes), figsize=(4.2 * len(classes), 3.8), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, c in zip(axes, classes, strict=True):
        states = sorted({r["cache_state"] for r in reports})
        for i, state in enumerate(states):
            shift = 0.012 * (i - (len(states) - 1) / 2)
            color, marker = STATE_STYLE.get(state, ("gray", "x"))
            rows = sorted(
                (r for r in reports if r["cache_state"] == state and r.get("mode") == "open"),
                key=lambda r: (r["offered_rps"], r["repeat"]),
            )
            if not rows:
                continue
            # Side by side, never on top of each other: cold left, warm right of the rate,
            # repeats further apart.
            x = [r["offered_rps"] * (1 + shift + 0.006 * r["repeat"]) for r in rows]
            y = [r["classes"][c]["attainment"] or 0.0 for r in rows]
            ci = [r["classes"][c]["attainment_ci"] or [v, v] for r, v in zip(rows, y, strict=True)]
            # Clamped at 0: an interval bound computed in floating point can sit a hair on the
            # wrong side of its point (attainment 0.0, lower bound 6.9e-18), and matplotlib
            # refuses a negative error bar.
            err = [[max(v - lo, 0.0) for v, (lo, _) in zip(y, ci, strict=True)],
                   [max(hi - v, 0.0) for v, (_, hi) in zip(y, ci, strict=True)]]  # fmt: skip
            ax.errorbar(x, y, yerr=err, color=color, marker=marker, ls="none", capsize=3,
                        mfc="none" if i else color, label=state)  # fmt: skip
        ax.axhline(gate, color="red", lw=1, ls="--", label=f"gate {gate:g}")
        ax.set_title(f"class {c}", fontsize=10)
        ax.set_xlabel("offered RPS (states and repeats side by side)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("joint TTFT+TPOT attainment (CI)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Which rates keep every class within its SLO? (attainment per repeat)", y=1.0)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    save_figure(fig, path)


def plot_latency(
    reports: list[dict[str, Any]], classes: list[str], cutoffs: dict[str, tuple[float, float]],
    path: Path,
) -> None:  # fmt: skip
    plt = pyplot()
    # squeeze=False: one class gives a 2 x 1 grid, which atleast_2d would turn into 1 x 2.
    fig, axes = plt.subplots(
        2, len(classes), figsize=(4.2 * len(classes), 6.5), sharex=True, squeeze=False
    )
    for j, c in enumerate(classes):
        for i, (metric, cutoff) in enumerate((("p95_ttft_ms", cutoffs[c][0]),
                                              ("p95_tpot_ms", cutoffs[c][1]))):  # fmt: skip
            ax = axes[i, j]
            for state in sorted({r["cache_state"] for r in reports}):
                color, marker = STATE_STYLE.get(state, ("gray", "x"))
                rows = [r for r in reports if r["cache_state"] == state and r.get("mode") == "open"]
                ax.scatter([r["offered_rps"] for r in rows],
                           [r["classes"][c][metric] or np.nan for r in rows],
                           color=color, marker=marker, label=state)  # fmt: skip
            ax.axhline(cutoff, color="red", lw=1, ls="--", label="cutoff")
            ax.set_title(f"{c}: {metric.replace('_ms', '').replace('_', ' ').upper()} (ms)")
            ax.grid(alpha=0.3)
            if i == 1:
                ax.set_xlabel("offered RPS")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("P95 latency against the per-request cutoffs (every repeat)")
    save_figure(fig, path)


def plot_closed_loop(
    curves: dict[str, Any], path: Path, cutoffs: dict[str, tuple[float, float]] | None = None
) -> None:
    """How far can concurrency go within the SLOs? Two panels, TTFT and TPOT: the worst class's
    P95 as a share of that class's own cutoff (so one SLO line at 1 serves every class),
    against output throughput; each level labelled once, the operating point circled."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharex=True)
    for col, (metric, name) in enumerate((("p95_ttft_ms", "TTFT"), ("p95_tpot_ms", "TPOT"))):
        ax = axes[col]

        def worst(p: dict[str, Any], metric=metric, col=col) -> float | None:
            vals = [
                v / cutoffs[c][col] if cutoffs and c in cutoffs and cutoffs[c][col] else v
                for c, v in (p.get(metric) or {}).items()
                if v is not None
            ]
            return max(vals) if vals else None

        for i, (state, cur) in enumerate(curves.items()):
            color, marker = STATE_STYLE.get(state, ("gray", "x"))
            pts = [p for p in cur["curve"] if worst(p) is not None]
            x = [p["output_throughput_tps"] for p in pts]
            y = [worst(p) for p in pts]
            ax.plot(x, y, color=color, marker=marker, mfc="none" if i else color, label=state)
            if col == 0:
                for p, xi, yi in zip(pts, x, y, strict=True):
                    ax.annotate(f"c={p['concurrency']}", (xi, yi), fontsize=7, color=color,
                                xytext=(4, 6 - 14 * i), textcoords="offset points")  # fmt: skip
            op = cur["operating_point"]
            if op is not None and worst(op) is not None:
                ax.scatter([op["output_throughput_tps"]], [worst(op)], s=180, facecolors="none",
                           edgecolors=color, lw=2, label=f"{state} operating point")  # fmt: skip
        if cutoffs:
            ax.axhline(1.0, color="red", lw=1, ls="--", label="SLO cutoff")
            ax.set_ylabel(f"worst class P95 {name} / its cutoff")
        else:
            ax.set_ylabel(f"worst class P95 {name} (ms)")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("output throughput (tokens/s)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("How far can concurrency go within the SLOs? (closed loop)", y=1.0)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    save_figure(fig, path)


#: The server signals the time-series plot draws, one column each: metric, column title,
#: whether the quantity is a count (integer ticks) and the fixed y range of a share (else None).
TIMESERIES = (
    ("queue_depth", "queue depth (waiting requests)", True, None),
    ("running", "running requests", True, None),
    ("kv_usage", "KV-cache usage (share of blocks)", False, (0.0, 1.0)),
)


#: The tint of a time-series row where a repeat failed.
FAIL_TINT = "#fbe3e0"


def _timeseries_tops(series: dict[str, pd.DataFrame], drawn) -> dict[str, float]:
    """One y range per signal, set once from every point's values: a shared axis left to
    autoscale would keep the first row's range and clip the busier rates below it."""
    top = {}
    for metric, _, count, _ in drawn:
        peak = max(
            (s.loc[(s["source"] == "server") & (s["metric"] == metric), "value"].max()
             for s in series.values()),
            default=0.0,
        )  # fmt: skip
        peak = 0.0 if pd.isna(peak) else float(peak)
        top[metric] = max(peak * 1.08, 1.0 if count else 1e-9)
    return top


def _timeseries_frame(fig, states: list[str], parsed: dict, present: set, missing: list) -> None:
    """The time-series figure's legend, footnote, title and margins."""
    from matplotlib.patches import Patch

    plt = pyplot()
    handles = [plt.Line2D([], [], color=STATE_STYLE.get(s, ("gray",))[0], lw=1.4) for s in states]
    labels = [f"{s} cache" for s in states]
    if any(rep > 0 for _, _, rep in parsed.values()):
        handles.append(plt.Line2D([], [], color="gray", lw=0.8, alpha=0.35))
        labels.append("later repeats (faint)")
    handles.append(Patch(facecolor=FAIL_TINT, edgecolor="lightgray"))
    labels.append("a repeat at this rate failed")
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 0.3 / fig.get_figheight()))  # fmt: skip
    # The figure travels without its caption: the one reading of a red row it needs is on it.
    kv = " and whose KV usage stays under 1" if "kv_usage" in present else ""
    fig.text(0.5, 0.05 / fig.get_figheight(), f"A failed rate whose queue stays flat{kv} kept up: "
             "its misses are latency or errors (latency.png, the README's 'limited by').",
             ha="center", va="bottom", fontsize=8, color="dimgray")  # fmt: skip
    title = (
        "Does the server keep up? Queue, running requests and KV cache over time at each "
        "offered rate\n"
        "one row per open-loop rate, repeat 0 solid; per cache state the verdict of each "
        "repeat (/)"
    )
    if missing:
        title += f"\nnot exposed by this engine, not drawn: {', '.join(missing)}"
    fig.suptitle(title, fontsize=10)
    top_in = 0.95 + 0.17 * bool(missing)
    # Margins in inches, so the row labels, title and legend keep their room at any grid size.
    width, height = fig.get_figwidth(), fig.get_figheight()
    fig.subplots_adjust(left=2.2 / width, right=1 - 0.15 / width, hspace=0.18, wspace=0.22,
                        top=1 - top_in / height, bottom=1.1 / height)  # fmt: skip


def plot_timeseries(
    series: dict[str, pd.DataFrame], path: Path, verdicts: dict[str, str] | None = None
) -> list[str]:
    """Does the server keep up? One row per offered rate (lowest at the top), one column per
    server signal of :data:`TIMESERIES`, every column on one y scale so rates compare; cold
    and warm overlaid in each panel, repeat 0 solid and later repeats faint. Each row is
    labelled with its rate and, per cache state, the verdict of every repeat (``verdicts``:
    point key -> its SLO report's verdict); a row where a repeat failed is tinted red.

    A signal that no point's scrape holds (an engine without a KV gauge, such as llama.cpp) has
    no column; the title names it and its label is returned."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    verdicts = verdicts or {}
    # A mark per verdict, so a reader finds the failures without reading the words.
    marks = {"pass": "✓", "marginal": "~", "misses": "-", "fail": "✗", "inconclusive": "?"}

    def point(key: str) -> tuple[float, str, int]:  # open-r36.5/warm/rep1 -> (36.5, warm, 1)
        name, state, rep = key.split("/")
        return float(name.removeprefix("open-r")), state, int(rep.removeprefix("rep"))

    present = {
        m for s in series.values() for m in s.loc[s["source"] == "server", "metric"].unique()
    }
    drawn = [t for t in TIMESERIES if t[0] in present]
    missing = [label for metric, label, _, _ in TIMESERIES if metric not in present]
    parsed = {key: point(key) for key in series}
    rates = sorted({rate for rate, _, _ in parsed.values()})
    states = [s for s in STATE_STYLE if any(st == s for _, st, _ in parsed.values())]
    states += sorted({st for _, st, _ in parsed.values()} - set(states))
    top = _timeseries_tops(series, drawn)
    rows, cols = max(1, len(rates)), max(1, len(drawn))
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols + 2.4, 1.15 * rows + 2.1),
                             sharex=True, sharey="col", squeeze=False)  # fmt: skip
    for row, rate in enumerate(rates):
        here = sorted((k for k, (r, _, _) in parsed.items() if r == rate), key=parsed.get)
        for col, (metric, label, count, share) in enumerate(drawn):
            ax = axes[row][col]
            for key in here:
                _, state, rep = parsed[key]
                s = series[key]
                m = s[(s["source"] == "server") & (s["metric"] == metric)]
                color = STATE_STYLE.get(state, ("gray", "x"))[0]
                # Later repeats faint: they show the spread without hiding repeat 0's shape.
                ax.plot(m["t_offset_ns"] / 1e9, m["value"], color=color,
                        lw=1.4 if rep == 0 else 0.8, alpha=1.0 if rep == 0 else 0.35)  # fmt: skip
            ax.set_ylim(*(share or (0, top[metric])))
            if share:
                ax.set_yticks([share[0], (share[0] + share[1]) / 2, share[1]])
            else:
                ax.yaxis.set_major_locator(MaxNLocator(nbins=3, integer=count))
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(label, fontsize=9)
            if row == rows - 1:
                ax.set_xlabel("time since the point's start (s)", fontsize=8)
            if any(verdicts.get(k) == "fail" for k in here):
                ax.set_facecolor(FAIL_TINT)
        first = axes[row][0]
        first.annotate(f"{rate:g} RPS", (0, 0.5), xycoords="axes fraction", xytext=(-34, 12),
                       textcoords="offset points", ha="right", va="center", fontsize=9,
                       fontweight="bold")  # fmt: skip
        for i, state in enumerate(st for st in states if any(parsed[k][1] == st for k in here)):
            words = [verdicts.get(k, "n/a") for k in here if parsed[k][1] == state]
            text = " / ".join(f"{marks.get(w, '')} {w}".strip() for w in words)
            first.annotate(f"{state}: {text}", (0, 0.5), xycoords="axes fraction",
                           xytext=(-34, -2 - 12 * i), textcoords="offset points", ha="right",
                           va="center", fontsize=8, color=STATE_STYLE.get(state, ("gray",))[0],
                           fontweight="bold" if "fail" in words else "normal")  # fmt: skip
    if not drawn:
        for ax in axes.flat:
            ax.set_yticks([])
    _timeseries_frame(fig, states, parsed, present, missing)
    save_figure(fig, path)
    return missing


# --- The registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlotInputs:
    """What the report draws its plots from: the frozen manifest, ``capacity.json``, every
    point's SLO report and the open-loop points' server series (point key -> scrape table)."""

    manifest: dict[str, Any]
    capacity: dict[str, Any]
    reports: list[dict[str, Any]]
    series: dict[str, pd.DataFrame]

    @property
    def classes(self) -> list[str]:
        return [c["name"] for c in self.manifest["workload"]]

    @property
    def cutoffs(self) -> dict[str, tuple[float, float]]:
        return {
            c["name"]: (c["request_ttft_cutoff_ms"], c["request_tpot_cutoff_ms"])
            for c in self.manifest["workload"]
        }


@dataclass(frozen=True)
class Plot:
    """``name``: its file in the pack folder; ``draw``: writes it to a path; ``section``: the
    page section that shows it (an id of :data:`capacity_pack.decide.html.PAGE_SECTIONS`, else
    "Other figures"); ``caption``: the question it answers there; ``when``: whether the inputs
    hold its data (no file otherwise)."""

    name: str
    draw: Callable[[PlotInputs, Path], Any]
    section: str
    caption: str
    when: Callable[[PlotInputs], bool] | None = None


#: The report's plots, drawn and listed in registration order.
PLOTS: Registry[Plot] = Registry("plot", Plot)
#: ``@register(name, section, caption, when=None)`` over ``draw(inputs, path)``.
register = PLOTS.register


register(
    "throughput.png",
    "bracket",
    "How much load is served within the SLOs? Goodput and achieved request rate by offered "
    "rate, each cache state's capacity bracket shaded from its highest passing rate (solid "
    "line) to the next rate up (dashed).",
)(lambda i, path: plot_throughput(i.capacity["open_loop"], path))
register(
    "attainment.png",
    "evidence",
    "Which rates keep every class within its SLO? Each class's joint TTFT+TPOT attainment "
    "per repeat with its confidence bound, against the gate.",
)(
    lambda i, path: plot_attainment(
        i.reports, i.classes, i.manifest["acceptance"]["class_slo_attainment_min"], path
    )
)
register(
    "latency.png",
    "evidence",
    "P95 TTFT and P95 TPOT per class and repeat against the class's cutoffs.",
)(lambda i, path: plot_latency(i.reports, i.classes, i.cutoffs, path))
register(
    "closed_loop.png",
    "cache",
    "How far can concurrency go within the SLOs? The worst class's P95 TTFT and TPOT as a "
    "share of its cutoff against output throughput, cold and warm, the operating point "
    "circled.",
    when=lambda i: bool(i.capacity["closed_loop"]),
)(lambda i, path: plot_closed_loop(i.capacity["closed_loop"], path, i.cutoffs))
# Each time-series row names its points' verdicts, so the plot says which point failed.
register(
    "timeseries.png",
    "cache",
    "The server's queue depth, running requests and KV usage over time, one panel per "
    "open-loop point.",
    when=lambda i: bool(i.series),
)(
    lambda i, path: plot_timeseries(
        i.series, path, {r["key"]: r["verdict"] for r in i.reports if "key" in r}
    )
)
register(
    "sessions.png",
    "cache",
    "Multi-turn sessions: the prefix-cache hit rate and P95 TTFT by turn index, cold and warm.",
    when=lambda i: bool(sessions.session_reports(i.reports)),
)(lambda i, path: save_figure(sessions.figure(i.reports, pyplot()), path))
