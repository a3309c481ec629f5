"""The capacity pack a person reads: decision, plan, plots, manifest, requests and SLO report.

``results/<pack>/pack/`` holds ``workload-manifest.yaml`` (the frozen manifest), ``requests.csv``
and ``slo-report.json`` of the selected point, ``capacity.json`` (selection, variation, curves),
``plan.json`` (replicas and GPUs from throughput and from memory, cost), the plots, and a
``README.md`` that states the decision, the gates, the evidence and its limits in plain words.

Plots (matplotlib, PNG, cold and warm side by side):

- ``throughput.png``: nominal offered RPS against the achieved request throughput and the
  observed goodput (mean, min-max over repeats), with the capacity bracket of each cache state
  shaded from its highest passing rate (solid line) to the lowest rate above it (dashed line);
- ``attainment.png``: per-class joint attainment with its confidence interval, and the gate;
- ``latency.png``: P95 TTFT and P95 TPOT per class against their cutoffs;
- ``closed_loop.png``: the latency-throughput curve with the chosen operating point;
- ``timeseries.png``: does the server keep up? Queue depth, running requests and KV usage
  over time, one row per open-loop rate labelled with its verdicts, one column per signal on a
  shared scale (a signal the engine does not expose is not drawn; the title names it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.decide import sessions
from capacity_pack.decide.capacity import tail_fit_sentences
from capacity_pack.decide.traffic import manifest_lines, selected_lines
from capacity_pack.evidence.gates import Gates
from capacity_pack.io import atomic_path, write_json_atomic, write_text_atomic
from capacity_pack.plan.words import target_words

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
        ax.axvline(lo, color=color, lw=1.2, alpha=0.7, label=f"{state}: passes ({lo:g})")
        ax.annotate(f"{state} capacity {lo:g}", xy=(lo, 0.02 + 0.48 * row),
                    xycoords=("data", "axes fraction"),
                    rotation=90, ha="right", va="bottom", fontsize=8, color=color)  # fmt: skip
    if hi is not None:
        ax.axvline(hi, color=color, lw=1.2, ls="--", alpha=0.7,
                   label=f"{state}: {b.get('fail_status') or 'fails'} ({hi:g})")  # fmt: skip
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
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    verdicts = verdicts or {}
    # A mark per verdict, so a reader finds the failures without reading the words.
    marks = {"pass": "✓", "marginal": "~", "misses": "-", "fail": "✗", "inconclusive": "?"}
    fail_tint = "#fbe3e0"

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
    # One y range per signal, set once from every point's values: a shared axis left to
    # autoscale would keep the first row's range and clip the busier rates below it.
    top = {}
    for metric, _, count, _ in drawn:
        peak = max(
            (s.loc[(s["source"] == "server") & (s["metric"] == metric), "value"].max()
             for s in series.values()),
            default=0.0,
        )  # fmt: skip
        peak = 0.0 if pd.isna(peak) else float(peak)
        top[metric] = max(peak * 1.08, 1.0 if count else 1e-9)
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
                ax.set_facecolor(fail_tint)
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
    handles = [plt.Line2D([], [], color=STATE_STYLE.get(s, ("gray",))[0], lw=1.4) for s in states]
    labels = [f"{s} cache" for s in states]
    if any(rep > 0 for _, _, rep in parsed.values()):
        handles.append(plt.Line2D([], [], color="gray", lw=0.8, alpha=0.35))
        labels.append("later repeats (faint)")
    handles.append(Patch(facecolor=fail_tint, edgecolor="lightgray"))
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
    save_figure(fig, path)
    return missing


def write_pack(
    out_dir: Path,
    *,
    frozen: dict[str, Any],
    capacity: dict[str, Any],
    plan: dict[str, Any],
    reports: list[dict[str, Any]],
    selected_tables: Path | None,
    selected_report: dict[str, Any] | None,
    series: dict[str, pd.DataFrame],
    extra_files: list[Path] | None = None,
    failure: dict[str, Any] | None = None,
    shapes: tuple[list[str], list[str]] | None = None,
    twin: tuple[list[str], Path] | None = None,
) -> list[Path]:
    """Write the pack folder; returns the files written. ``failure``: failure-test.json;
    ``shapes``: the load shapes' README section and its files, written beside it; ``twin``: the
    twin's README section (predicted vs measured capacity) and its validation file, copied."""
    import yaml

    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = frozen["manifest"]
    classes = [c["name"] for c in manifest["workload"]]
    cutoffs = {
        c["name"]: (c["request_ttft_cutoff_ms"], c["request_tpot_cutoff_ms"])
        for c in manifest["workload"]
    }
    gate = manifest["acceptance"]["class_slo_attainment_min"]
    files = []
    text = yaml.safe_dump(
        {"frozen_sha256": frozen["sha256"], **manifest}, sort_keys=False, width=100
    )
    write_text_atomic(out_dir / "workload-manifest.yaml", text)
    files.append(out_dir / "workload-manifest.yaml")
    write_json_atomic(out_dir / "capacity.json", capacity)
    write_json_atomic(out_dir / "plan.json", plan)
    files += [out_dir / "capacity.json", out_dir / "plan.json"]
    if selected_report is not None:
        write_json_atomic(out_dir / "slo-report.json", selected_report)
        files.append(out_dir / "slo-report.json")
    if selected_tables is not None and (selected_tables / "requests.csv").exists():
        with atomic_path(out_dir / "requests.csv") as tmp:
            shutil.copyfile(selected_tables / "requests.csv", tmp)
        files.append(out_dir / "requests.csv")
    # Each time-series row names its points' verdicts, so the plot says which point failed.
    verdicts = {r["key"]: r["verdict"] for r in reports if "key" in r}
    plots = {
        "throughput.png": lambda p: plot_throughput(capacity["open_loop"], p),
        "attainment.png": lambda p: plot_attainment(reports, classes, gate, p),
        "latency.png": lambda p: plot_latency(reports, classes, cutoffs, p),
        "closed_loop.png": lambda p: plot_closed_loop(capacity["closed_loop"], p, cutoffs),
        "timeseries.png": lambda p: plot_timeseries(series, p, verdicts),
    }
    for name, draw in plots.items():
        if name == "closed_loop.png" and not capacity["closed_loop"]:
            continue
        if name == "timeseries.png" and not series:
            continue
        draw(out_dir / name)
        files.append(out_dir / name)
    if (fig := sessions.figure(reports, pyplot())) is not None:
        save_figure(fig, out_dir / "sessions.png")
        files.append(out_dir / "sessions.png")
    for f in extra_files or []:
        if f.exists():
            with atomic_path(out_dir / f.name) as tmp:
                shutil.copyfile(f, tmp)
            files.append(out_dir / f.name)
    if failure is not None:
        # Written beside the README by the failure test: listed (and MLflow artifacts of the
        # parent run), not copied.
        written = ["failure-test.md", "failure-test.json"]
        written += [f"failure-timeline-{r['drill']}.png" for r in failure["drills"]]
        files += [out_dir / n for n in written if (out_dir / n).exists()]
    if shapes is not None:
        files += [out_dir / n for n in shapes[1] if (out_dir / n).exists()]
    if twin is not None:
        with atomic_path(out_dir / "twin-validation.json") as tmp:
            shutil.copyfile(twin[1], tmp)
        files.append(out_dir / "twin-validation.json")
    names = [f.name for f in files]
    section = shapes[0] if shapes else None
    readme = render_readme(
        frozen,
        capacity,
        plan,
        selected_report,
        names,
        failure,
        section,
        sessions.readme_lines(reports),
        twin[0] if twin is not None else None,
    )
    write_text_atomic(out_dir / "README.md", readme)
    files.append(out_dir / "README.md")
    return files


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e3 else f"{v:,.0f}"
    return str(v)


def gate_sentence(acceptance: dict[str, Any]) -> str:
    """The pass rule of a rate in words: every gate the pack's acceptance turns on."""
    gates = Gates.of(acceptance)
    rules = [
        ", ".join(g.phrase.format(threshold=g.threshold(gates)) for g in gates.active(scope))
        for scope in ("class", "point")
    ]
    return (
        f"A rate passes when, in **every repeat**, every class has {rules[0]}, {rules[1]}, and the "
        "client kept its schedule (dispatch lateness under its bound)."
    )


def render_readme(
    frozen: dict[str, Any],
    capacity: dict[str, Any],
    plan: dict[str, Any],
    selected: dict[str, Any] | None,
    files: list[str],
    failure: dict[str, Any] | None = None,
    shapes: list[str] | None = None,
    session_lines: list[str] | None = None,
    twin_lines: list[str] | None = None,
) -> str:
    """The pack's README.md: decision, the failure answer, replica plan, gates, evidence, the
    twin's predicted vs measured capacity (``twin_lines``: :mod:`capacity_pack.twin.validate`),
    the load shapes' answers, sessions by turn (``session_lines``:
    :mod:`capacity_pack.decide.sessions`), selected point, failure test, limits and files, one
    section renderer each."""
    m = frozen["manifest"]
    lines = [
        *_readme_title(m["pack"]),
        *_readme_decision(m, capacity),
        *_readme_failure_answer(failure),
        *_readme_plan(m, plan),
        *_readme_gates(m),
        *manifest_lines(frozen),
        *_readme_verdict_words(m),
        *_readme_evidence(capacity),
        *(twin_lines or []),
        *(shapes or []),
        *(session_lines or []),
        *_readme_selected(selected),
        *_readme_failure(m),
        *_readme_limits(m),
        *_readme_files(frozen, files),
    ]
    return "\n".join(lines)


def _readme_title(pack: dict[str, Any]) -> list[str]:
    lines = [f"# Capacity pack: {pack['title']}", ""]
    if pack["size"] == "rehearsal":
        lines += [
            "> **REHEARSAL-SIZE PACK.** Its sample gates and durations are scaled down so the",
            "> whole pipeline runs in minutes; its numbers exercise the method and are **not a",
            "> capacity claim**.",
            "",
        ]
    return lines


#: A bracket end's status in the bracket sentence.
BRACKET_WORDS = {
    "pass": "passes",
    "marginal": "meets every gate on the pooled estimate",
    "misses": "misses the attainment gate on the pooled estimate",
    "fail": "fails",
}


def bracket_sentence(sel: dict[str, Any]) -> str:
    """The capacity as a bracket in words: 'between 34 RPS (passes) and 36 RPS (fails:
    interactive TTFT (repeat 0)); resolution 2 RPS reached; verdicts at 95 % confidence'."""
    b = sel["bracket"]
    lo, hi = b["pass_rps"], b["fail_rps"]
    if hi is not None:
        status = b["fail_status"]
        word = BRACKET_WORDS.get(status, status)
        why = (
            b.get("fail_evidence")
            if status in ("misses", "marginal") and b.get("fail_evidence")
            else b["fail_summary"] or "see its reports"
        )
        upper = f"{hi:g} RPS ({word}: {why})"
    if lo is None:
        return f"below {upper}" if hi is not None else "no open-loop points"
    lower = BRACKET_WORDS.get(b.get("pass_status") or "pass", "passes")
    if b.get("pass_status") == "marginal" and b.get("pass_evidence"):
        lower += f": {b['pass_evidence']}"
    if hi is None:
        text = f"at least {lo:g} RPS ({lower}; the highest rate tested, so the true capacity "
        text += "may be higher)"
    else:
        text = f"between {lo:g} RPS ({lower}) and {upper}"
    res = b["resolution_rps"]
    if res is None:
        text += "; no search resolution declared (no `sweep.search`)" + (
            f": the width, {b['width_rps']:g} RPS, is the tested grid's step"
            if b["width_rps"] is not None else ""
        )  # fmt: skip
    elif b["reached"]:
        text += f"; resolution {res:g} RPS reached"
    elif b["reached"] is False:
        text += f"; resolution {res:g} RPS **not reached** (width {b['width_rps']:g} RPS)"
    else:
        text += f"; resolution {res:g} RPS (no upper end to measure the width against)"
    return text + f"; verdicts at {b['confidence'] * 100:g} % confidence"


def _readme_decision(m: dict[str, Any], capacity: dict[str, Any]) -> list[str]:
    w = target_words(m)
    primary = capacity["primary_cache_state"]
    sel = capacity["open_loop"].get(primary, {})
    cap = sel.get("capacity_rps")
    lines = ["## Decision", ""]
    if cap is None:
        lines.append(f"**No SLO-compliant capacity** among the tested rates ({primary} cache)" +
                     (f": {bracket_sentence(sel)}." if sel.get("bracket") else "."))  # fmt: skip
    else:
        goodput = sel["goodput_at_capacity_rps"]
        lines.append(
            f"**SLO-compliant capacity ({primary} cache): {bracket_sentence(sel)}.** "
            f"The pack takes {cap:g} RPS for {m['engine']['placement']['replicas']} replica(s), "
            f"i.e. **{sel['capacity_per_replica_rps']:g} RPS per replica** (the plan's figure). "
            f"Measured goodput at {cap:g} RPS: {_fmt(goodput)} RPS (the least over its repeats), "
            f"i.e. {_fmt(sel['goodput_per_gpu_rps'])} RPS per {w.unit} (goodput per {w.unit}"
            + (", DistServe's sense" if w.unit == "GPU" else "")
            + f", as measured; nominally {_fmt(sel['capacity_per_gpu_nominal_rps'])})."
        )
    lines += ["", *[f"- {s['decision']}" for s in capacity["open_loop"].values()], ""]
    if faults := capacity.get("measurement_faults"):
        lines += [
            "**Measurement faults** (results that contradict how a server works: the pack "
            "measured something besides the target; not findings):",
            "",
            *[f"- {f['message']}" for f in faults],
            "",
        ]
    if notes := capacity.get("measurement_notes"):
        lines += ["**Checks the brackets cannot settle** (at this resolution):", "",
                  *[f"- {n['message']}" for n in notes], ""]  # fmt: skip
    return lines


def _readme_plan(m: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    w = target_words(m)
    if plan.get("required_replicas") is None:
        return ["## Replica plan", "", plan["reason"], ""] if plan.get("reason") else []
    lines = [
        "## Replica plan",
        "",
        f"For a peak of **{m['plan']['peak_rps']:g} RPS** at a target utilization of "
        f"{plan['throughput']['target_utilization']:g}: "
        f"**{plan['required_replicas']} replicas, {plan['required_gpus']} {w.units}** "
        f"(bound by {plan['bound_by']}; {plan['throughput']['replicas_for_load']} replicas "
        f"for the load by throughput"
        + (f", {plan['memory']['replicas_for_memory']} by KV memory" if plan.get("memory")
           else "")
        + f", + {plan['throughput']['redundancy_replicas']} redundancy, "
        f"+ {plan['throughput']['warm_pool_replicas']} warm pool).",
        "",
        "required_replicas = ceil(peak_rps / (capacity_per_replica x target_utilization)); "
        "the memory bound comes from Little's Law (peak x P95 latency in flight) and KV bytes "
        "per request at the P95 context of the requests sent.",
        "",
        *tail_fit_sentences(plan),
    ]  # fmt: skip
    if plan.get("cost"):
        c = plan["cost"]
        price = m["plan"].get("price_per_gpu_hour")
        lines += [f"Cost, in the currency of plan.price_per_gpu_hour ({_fmt(price)} per "
                  f"{w.unit}-hour): {_fmt(c['cost_per_hour'])} per hour for "
                  f"{plan['required_gpus']} {w.units}; "
                  f"{_fmt(c['cost_per_request'])} per successful request; "
                  f"{_fmt(c['cost_per_task'])} per completed task.", ""]  # fmt: skip
    if plan.get("effective_bandwidth"):
        b = plan["effective_bandwidth"]
        lines += [f"Effective bandwidth (from the single-user TPOT): "
                  f"{_fmt(b['effective_bandwidth_gbps'])} GB/s for "
                  f"{_fmt(b['tokens_per_second'])} tokens/s at "
                  f"{_fmt(b['bytes_per_token_gb'])} GB per token"
                  + (f"; MBU {_fmt(b['mbu'])} of the spec" if b.get("mbu") else "") + ".",
                  ""]  # fmt: skip
    return lines


def _readme_gates(m: dict[str, Any]) -> list[str]:
    acc = m["acceptance"]
    return [
        "## Gates",
        "",
        gate_sentence(acc),
        "",
        "| class | TTFT cutoff (ms) | TPOT cutoff (ms) |",
        "|---|---:|---:|",
        *[f"| {c['name']} | {c['request_ttft_cutoff_ms']:g} | {c['request_tpot_cutoff_ms']:g} |"
          for c in m["workload"]],
        "",
    ]  # fmt: skip


def _readme_verdict_words(m: dict[str, Any]) -> list[str]:
    """What each verdict word in this README means (one repeat's, then a rate's)."""
    acc = m["acceptance"]
    gate, conf = acc["class_slo_attainment_min"], acc.get("attainment_confidence", 0.95)
    return [
        "## Verdict words",
        "",
        "One measured repeat of a rate gets one verdict:",
        "",
        f"- **pass**: every class's attainment is proven >= {gate:g}: the lower end of its "
        f"{conf:.0%} confidence sequence is at or over the gate, on at least the minimum "
        "successful requests per class; the error rate is within its cap, the queue did not "
        "grow, and the client kept its schedule;",
        f"- **marginal**: every gate passes on its point estimate, but some class's attainment "
        f"is not proven >= {gate:g} at {conf:.0%} (too few requests to tell);",
        f"- **fail**: a gate fails on its point estimate, or some class's attainment is proven "
        f"under {gate:g} (the upper end of its confidence sequence is below the gate);",
        "- **inconclusive**: the measurement cannot decide: a class is under-sampled, the queue "
        "trend is undecided, or the client fell behind its schedule (client-bound: the client "
        "was measured, not the target).",
        "",
        "A rate's status is taken on its repeats pooled (each a different schedule seed: "
        "their requests together per class, their time blocks together for the design "
        "effect, one confidence sequence): **pass** when every class is shown to pass; "
        "**marginal** when every class meets the gate on the pooled estimate but some is not "
        "shown at the confidence; **misses** when some class is under the gate on the pooled "
        "estimate but not shown to fail (cannot decide at this sample size); **fail** when a "
        "class is shown to fail pooled or another gate failed in a repeat; **inconclusive** "
        "when no repeat is a server result, or when every class meets the gate but a repeat's "
        "queue trend is undecided or a class is under its sample gate even pooled. (Repeats "
        "analyzed before pooling: **inconsistent** when some pass and others do not.) "
        "The capacity is the highest rate meeting every gate on its pooled estimate "
        "(pass or marginal) with every lower rate meeting them; the highest rate shown to "
        "pass is given beside it.",
        "",
    ]


def _per_repeat(row: dict[str, Any], key: str) -> str:
    return " / ".join(_fmt(p[key]) for p in row.get("per_repeat", [])) or "n/a"


def _cache_sources(capacity: dict[str, Any]) -> dict[str, Any] | None:
    """The first repeat's record of where the prefix-cache figures came from (one engine, one
    map: every repeat's is the same)."""
    for s in capacity["open_loop"].values():
        for r in s["rates"]:
            for p in r.get("per_repeat", []):
                if p.get("prefix_cache_sources"):
                    return p["prefix_cache_sources"]
    return None


def _readme_evidence(capacity: dict[str, Any]) -> list[str]:
    lines = [
        "## Evidence",
        "",
        "Per repeat (separated by /): the offered rate the schedule's measured requests arrived "
        "at (attempted / T) and the achieved rate (successful / T), T being the measured window "
        "(first measured send to last terminal event, the drain included). Ranges are min-max "
        "over the repeats.",
        "",
    ]
    sources = _cache_sources(capacity)
    if sources:
        lines += [
            "Prefix cache, per repeat: the server's hit rate "
            f"({sources.get('server') or 'not exposed by this engine'}) and the client's cached "
            f"share of prompt tokens ({sources.get('client') or 'not reported by this engine'}); "
            "n/a where the side has no figure.",
            "",
        ]
    for state, s in capacity["open_loop"].items():
        lines += [f"### Open loop, {state} cache", "",
                  "| nominal RPS | offered RPS | achieved RPS | server hit rate | client cached "
                  "share | status | verdicts | goodput RPS (mean, min-max) | limited by |",
                  "|---:|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in s["rates"]:
            g = r["variation"]["observed_goodput_rps"]
            why = r.get("failure_summary") or "; ".join(r["reasons"][:3]) or "-"
            verdicts = ", ".join(r["verdicts"])
            if aside := r.get("set_aside_repeats"):
                why = r.get("set_aside_why") or {}
                listed = ", ".join(f"{k} {why.get(str(k), 'client-bound')}" for k in aside)
                verdicts += f" (repeat {listed} set aside: decides nothing)"
            lines.append(
                f"| {r['offered_rps']:g} | {_per_repeat(r, 'offered_measured_rps')} | "
                f"{_per_repeat(r, 'achieved_rps')} | {_per_repeat(r, 'prefix_cache_hit_rate')} | "
                f"{_per_repeat(r, 'client_cached_token_fraction')} | {r['status']} | {verdicts} | "
                f"{_fmt(g['mean'])} ({_fmt(g['min'])}-{_fmt(g['max'])}) | {why} |"
            )
        lines.append("")
    for state, cur in capacity["closed_loop"].items():
        op = cur["operating_point"]
        single = cur["single_user"]
        lines += [f"### Closed loop, {state} cache", ""]
        note = cur.get("operating_point_note")
        lines.append(
            f"Operating point: concurrency {op['concurrency']} at "
            f"{_fmt(op['output_throughput_tps'])} output tokens/s, the highest throughput "
            "meeting every class's attainment gate"
            + (f": {note}." if note else ".") if op else
            "No concurrency level met the latency gates."
        )  # fmt: skip
        if single:
            ttft = ", ".join(f"{k} {_fmt(v)} ms" for k, v in single["p95_ttft_ms"].items())
            tpot = ", ".join(f"{k} {_fmt(v)} ms" for k, v in single["p95_tpot_ms"].items())
            lines.append(f"Single user (concurrency 1): P95 TTFT {ttft}; P95 TPOT {tpot}.")
        lines.append("")
    return lines


def _readme_selected(selected: dict[str, Any] | None) -> list[str]:
    if selected is None:
        return []
    return [
        "## The selected point",
        "",
        f"`slo-report.json` and `requests.csv` are point `{selected['key']}` "
        f"(verdict {selected['verdict']}): {selected['attempted']} attempted, "
        f"{selected['successful']} successful, error rate {_fmt(selected['error_rate'])}, "
        f"observed goodput {_fmt(selected['observed_goodput_rps'])} RPS, queue trend "
        f"{selected['queue_trend']}, prefix-cache hit rate "
        f"{_fmt(selected.get('prefix_cache_hit_rate'))}.",
        "",
        *selected_lines(selected),
    ]


def _readme_failure_answer(failure: dict[str, Any] | None) -> list[str]:
    """The second headline question, answered for the recommended plan, then one line per
    mechanism drill."""
    if failure is None:
        return []
    lines = ["## When a replica fails", ""]
    plan = failure.get("plan_drill")
    if plan is not None:
        lines.append(f"**{plan['sentence']}.**")
        if plan.get("why_fail"):
            lines.append(f"Why: {'; '.join(plan['why_fail'])}.")
        if plan.get("execution"):
            lines.append(
                f"Run {plan['execution']} ({plan.get('execution_reason')}); the verdict's "
                "checks, their numbers and `failure-timeline-plan_replica_kill.png` are in "
                "`failure-test.md`."
            )
        lines.append("")
    mechanism = failure["summary"].get("mechanism_lines") or []
    if mechanism:
        lines += [
            "Mechanism tests (replicas behind the router at the selected capacity per replica, "
            "not the plan):",
            "",
            *[f"- {line}" for line in mechanism],
            "",
        ]
    return lines


def _readme_failure(m: dict[str, Any]) -> list[str]:
    if not m.get("failure"):
        return []
    drills = ", ".join(f"`{d['name']}` ({d['kind']})" for d in m["failure"]["drills"])
    plan = (m["failure"].get("plan_drill") or {}).get("enabled", True)
    return [
        "## Failure test, alerts and dashboard",
        "",
        "`failure-test.md` (and `failure-test.json`) hold "
        + (
            "the plan drill (one replica of the recommended fleet killed at the planned peak, "
            "with its N+1 verdict) and "
            if plan
            else ""
        )
        + f"the mechanism drills {drills}, each run "
        "against replicas behind the router at the selected capacity point: injection, "
        "detection, router removal, errors, queue and recovery on one clock, and which "
        "alerts fired; `failure-timeline-<drill>.png` draws each over time. "
        "`alerts/alert-rules.yaml` holds the Prometheus alerting rules the "
        "drills were judged by; `dashboard/grafana-dashboard.json` is an importable Grafana "
        "dashboard of the same signals.",
        "",
    ]


def _readme_limits(m: dict[str, Any]) -> list[str]:
    return [
        "## Limits",
        "",
        "- The capacity holds only for this workload mix, cache state, placement, engine "
        "configuration and scaling regime; the per-replica figure is not a universal constant.",
        "- The replica plan assumes linear scaling: validate the planned topology with a live "
        "benchmark before procurement (load balancing, network paths and cache locality can "
        "prevent it).",
        "- Percentiles are nearest-rank; P99 is withheld below "
        f"{m['acceptance']['p99_min_samples']} successful requests per class, and the "
        "2,000/10,000 sample thresholds are reporting policies, not statistical guarantees.",
        f"- Target: {m['target']['kind']}"
        + (f" (simulated engine, profile `{m['target']['profile']}`): latencies come from a "
           "performance model, not hardware." if m["target"]["kind"] == "sim" else "."),
        "",
    ]  # fmt: skip


def _readme_files(frozen: dict[str, Any], files: list[str]) -> list[str]:
    return [
        "## Files",
        "",
        *[f"- `{f}`" for f in files],
        "",
        f"Frozen manifest sha256 `{frozen['sha256']}`.",
        "",
    ]


def load_reports(paths: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(Path(p).read_text()) for p in paths]


def selected_point(
    capacity: dict[str, Any], reports: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The report of the selected capacity point (primary cache state, repeat 0); without a
    capacity, the lowest tested rate, so the pack still shows why it failed."""
    state = capacity["primary_cache_state"]
    sel = capacity["open_loop"].get(state)
    if not sel or not sel["rates"]:
        return None
    rate = (
        sel["capacity_rps"] if sel["capacity_rps"] is not None else sel["rates"][0]["offered_rps"]
    )
    candidates = [
        r for r in reports
        if r.get("mode") == "open" and r["cache_state"] == state and r["offered_rps"] == rate
    ]  # fmt: skip
    return min(candidates, key=lambda r: r["repeat"]) if candidates else None
