"""The pack README's multi-turn section and its plot: TTFT and prefix reuse by turn index.

From every measured open-loop point's SLO report with a ``sessions`` section (repeat 0), per
cache state, rate and turn index: the client's prefix-cache hit rate (cached / prompt tokens of
the successful turns) and P50/P95 TTFT; ``sessions.png`` draws both against the turn index, one
line per point, cold and warm in their colours. Method: docs/metrics.md, "Multi-turn sessions".
"""

from __future__ import annotations

from typing import Any

from capacity_pack.evidence.sessions import RATE_UNIT

# Cold dashed under warm: after turn 0 both reuse their own conversation alike, so they meet.
STYLE = {"cold": ("tab:blue", "o", "--"), "warm": ("tab:orange", "s", "-")}


def session_reports(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Repeat 0 of the points with a sessions section, by cache state then rate."""
    out = [r for r in reports if r.get("sessions") and r.get("repeat", 0) == 0]
    return sorted(
        out, key=lambda r: (r["cache_state"], r.get("offered_rps") or 0, r.get("point", ""))
    )


def _label(r: dict[str, Any]) -> str:
    level = f"{r['offered_rps']:g}/s" if r.get("offered_rps") is not None else r.get("point", "")
    return f"{r['cache_state']} {level}"


def readme_lines(reports: list[dict[str, Any]]) -> list[str]:
    """``## Sessions by turn``: one table per class, a row per point and turn."""
    chosen = session_reports(reports)
    if not chosen:
        return []
    lines = [
        "## Sessions by turn",
        "",
        f"Open-loop rates of session classes are in {RATE_UNIT}; each turn is one request for "
        "the SLO (the class's cutoffs apply per turn) and for the request rates. Turn k resends "
        "turn k-1's prompt and answer plus a new user message, a think time after turn k-1 "
        "ended. Prefix hit rate: cached / prompt tokens of the successful turns k, as the "
        "server's usage reports them. Turn 0's rate is the reuse across sessions: near zero "
        "cold (a system prompt of its own per session), the shared system prompts' share warm. "
        "Plot: `sessions.png`.",
        "",
    ]
    classes = sorted({c for r in chosen for c in r["sessions"]["classes"]})
    for name in classes:
        lines += [
            f"### `{name}`",
            "",
            "| point | turn | turns ok | prefix hit rate | P50 TTFT ms | P95 TTFT ms | "
            "mean prompt tokens |",
            "|---|---:|---|---|---|---|---|",
        ]
        for r in chosen:
            c = r["sessions"]["classes"].get(name)
            if c is None:
                continue
            for t in c["turns"]:
                lines.append(
                    f"| {_label(r)} | {t['turn']} | {t['successful']}/{t['attempted']} | "
                    f"{_num(t['prefix_hit_rate'])} | {_num(t['p50_ttft_ms'], 1)} | "
                    f"{_num(t['p95_ttft_ms'], 1)} | {_num(t['mean_prompt_tokens'], 0)} |"
                )
        lines.append("")
    return lines


def figure(reports: list[dict[str, Any]], plt: Any) -> Any:
    """Hit rate and P95 TTFT by turn index (``sessions.png``), drawn with pyplot ``plt``;
    None when no point has sessions."""
    chosen = session_reports(reports)
    if not chosen:
        return None
    fig, (ax_hit, ax_ttft) = plt.subplots(1, 2, figsize=(10, 3.8))
    for r in chosen:
        color, marker, line = STYLE.get(r["cache_state"], ("tab:gray", "x", ":"))
        for name, c in r["sessions"]["classes"].items():
            turns = [t["turn"] for t in c["turns"]]
            hit = [t["prefix_hit_rate"] for t in c["turns"]]
            p95 = [t["p95_ttft_ms"] for t in c["turns"]]
            label = f"{name}, {_label(r)}"
            ax_hit.plot(turns, [h if h is not None else float("nan") for h in hit],
                        color=color, marker=marker, ls=line, alpha=0.8, label=label)  # fmt: skip
            ax_ttft.plot(turns, [v if v is not None else float("nan") for v in p95],
                         color=color, marker=marker, ls=line, alpha=0.8, label=label)  # fmt: skip
    ax_hit.set(xlabel="turn index", ylabel="prefix-cache hit rate (cached / prompt tokens)",
               title="Prefix reuse by turn", ylim=(-0.02, 1.02))  # fmt: skip
    ax_ttft.set(xlabel="turn index", ylabel="P95 TTFT (ms)", title="P95 TTFT by turn")
    ax_hit.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _num(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"
