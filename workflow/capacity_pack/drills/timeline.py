"""A drill's picture over time, from its report's ``timeline`` (presentation only).

Three panels on the drill clock (load, per-class attainment over all attempts against the gate,
queue), each marking injection, detection, router removal, first and last error, fault cleared
and recovery; the title says live or virtual and the plan drill's verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MARKS = (
    ("injection_time_s", "injection", "black", "-"),
    ("detection_time_s", "detection", "tab:purple", "--"),
    ("router_removal_time_s", "router removal", "tab:brown", ":"),
    ("first_error_time_s", "first error", "tab:red", "-."),
    ("last_error_time_s", "last error", "tab:red", ":"),
    ("fault_cleared_time_s", "fault cleared", "tab:cyan", "--"),
    ("recovery_time_s", "recovery", "tab:green", "-"),
)


def plot_drill_timeline(report: dict[str, Any], gate: float, path: str | Path) -> None:
    """Draw ``report``'s timeline to ``path`` (a PNG whose words are also in its metadata)."""
    from capacity_pack.decide.report import pyplot, save_figure

    plt = pyplot()
    if report.get("skipped"):
        fig, ax = plt.subplots(figsize=(9, 1.6))
        ax.axis("off")
        ax.text(0, 0.5, _wrap(f"Drill {report['drill']} ({report['kind']}) was not run: "
                              f"{report['skipped']}"), va="center", fontsize=9)  # fmt: skip
        save_figure(fig, Path(path))
        return
    tl = report.get("timeline") or {}
    fig, axes = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    load, slo, queue = axes
    t = tl.get("t_s") or []
    step = tl.get("step_s", 0.5)
    _load_panel(load, t, step, tl)
    load.set_ylabel("requests / s")
    load.legend(fontsize=7, loc="upper left", ncol=2)
    for name, share in (tl.get("all_attempt_attainment") or {}).items():
        slo.plot(t, [None if v is None else v for v in share], label=name)
    slo.axhline(gate, color="grey", linestyle="--", linewidth=1, label=f"gate {gate:g}")
    slo.set_ylim(-0.02, 1.05)
    slo.set_ylabel(f"attainment, all attempts\n(trailing {tl.get('window_s', 2):g} s)")
    slo.legend(fontsize=7, loc="lower left", ncol=4)
    if tl.get("scrape_t_s"):
        queue.plot(
            tl["scrape_t_s"], tl["client_in_flight"], color="tab:blue", label="client in flight"
        )
        if tl.get("server_waiting"):
            queue.plot(
                tl["scrape_t_s"],
                tl["server_waiting"],
                color="tab:orange",
                label="engines' waiting queue",
            )
    queue.set_ylabel("requests")
    queue.set_xlabel("seconds on the drill clock")
    queue.yaxis.get_major_locator().set_params(integer=True)
    if tl.get("scrape_t_s"):
        queue.legend(fontsize=7, loc="upper left")
    _marks(axes, load, report)
    title = (
        f"Drill {report['drill']} ({report['kind']}): {report['replicas']} replicas at "
        f"{report['rate_rps']:.1f} RPS, {report.get('execution', 'live')}"
    )
    n = report.get("n_plus_one")
    if n:
        title += f"\n{n['sentence']}"
    else:
        title += "\nmechanism test at the capacity point"
    fig.suptitle(title, fontsize=9)
    save_figure(fig, Path(path))


def _load_panel(load: Any, t: list[float], step: float, tl: dict[str, Any]) -> None:
    """Offered and completed rates as steps, errors and rejections as stacked bars."""
    if tl.get("offered_rps"):
        load.plot(
            t, tl["offered_rps"], color="tab:blue", label="offered (sent/s)", drawstyle="steps-post"
        )
        load.plot(
            t,
            tl["completed_rps"],
            color="tab:green",
            label="completed ok/s",
            drawstyle="steps-post",
        )
        load.bar(
            t,
            tl["errors_per_s"],
            width=step,
            align="edge",
            color="tab:red",
            alpha=0.6,
            label="errors + timeouts/s",
        )
        load.bar(
            t,
            tl["rejected_per_s"],
            width=step,
            align="edge",
            bottom=tl["errors_per_s"],
            color="tab:orange",
            alpha=0.6,
            label="rejected (429/503)/s",
        )


def _marks(axes: Any, load: Any, report: dict[str, Any]) -> None:
    """A vertical line at each moment of the drill on every panel, labelled on the top one."""
    for ax in axes:
        ax.grid(alpha=0.3)
        for i, (key, label, color, style) in enumerate(MARKS):
            v = report.get(key)
            if v is None:
                continue
            ax.axvline(v, color=color, linestyle=style, linewidth=1)
            if ax is load:
                ax.annotate(
                    label,
                    # Staggered: moments a few tenths of a second apart keep readable labels.
                    (v, 1.0 - 0.3 * (i % 3)),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    fontsize=6,
                    va="top",
                    ha="right",
                    color=color,
                )


def _wrap(text: str, width: int = 110) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))
