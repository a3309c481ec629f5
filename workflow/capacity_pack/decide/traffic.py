"""The pack README's words on the traffic itself: the lengths the manifest asks for, the lengths
the selected point sent and received with the check that they match (:mod:`capacity_pack.evidence
.lengths`), and its system and per-user output throughput (:mod:`capacity_pack.evidence
.throughput`). Markdown lines only; the README and ``index.html`` share them."""

from __future__ import annotations

from typing import Any


def _n(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e3 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _triple(d: dict[str, Any] | None) -> str:
    """P50 / P95 / max of a length summary."""
    if not d:
        return "n/a"
    return " / ".join(_n(d.get(k)) for k in ("p50", "p95", "max"))


def _kind(workload: dict[str, Any], field: str) -> str:
    spec = workload[field]
    if isinstance(spec, int):
        return "fixed"
    return str(spec.get("distribution", "distribution"))


def manifest_lines(frozen: dict[str, Any]) -> list[str]:
    """``## Workload lengths``: each class's input and output length distribution as frozen
    (mean, P50, P95, P99, max)."""
    stats = (frozen.get("derived") or {}).get("length_stats")
    if not stats:
        return []
    classes = {c["name"]: c for c in frozen["manifest"]["workload"]}
    lines = [
        "## Workload lengths",
        "",
        "The frozen manifest's token lengths per class (a distribution's mean and percentiles are "
        "those of its rounded, clipped draws):",
        "",
        "| class | tokens | kind | mean | P50 | P95 | P99 | max |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, per in stats.items():
        for field in ("input_tokens", "output_tokens"):
            s = per[field]
            lines.append(
                f"| {name} | {field.split('_')[0]} | {_kind(classes[name], field)} | "
                f"{s['mean']:,.1f} | "
                + " | ".join(_n(s[k]) for k in ("p50", "p95", "p99", "max"))
                + " |"
            )
    lines.append("")
    return lines


def selected_lines(selected: dict[str, Any]) -> list[str]:
    """The selected point's lengths (sent, received, the manifest's, the check) and throughput;
    nothing for a report without them."""
    lines: list[str] = []
    classes = selected.get("classes") or {}
    if any("lengths" in e for e in classes.values()):
        lines += [
            "Lengths of the measured requests, P50 / P95 / max tokens: input as **sent** (the "
            "scheduled prompt length of every attempt) and output as **received** (successful "
            "requests), beside the manifest's; the check asks whether they follow the manifest's "
            "distribution within sampling error (exact equality for a fixed length; else every "
            "value in range and the manifest's P50, P95 and P99 inside order-statistic intervals, "
            'Bonferroni-corrected; docs/metrics.md, "Lengths sent and received"). A reported '
            "check, not a capacity gate.",
            "",
            "| class | input sent | manifest input | server prompt tokens | output received | "
            "manifest output | lengths match |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, e in sorted(classes.items()):
            lengths = e.get("lengths")
            if not lengths:
                continue
            match = e.get("lengths_match_manifest")
            word = "n/a" if match is None else ("yes" if match else "**no**")
            server = lengths.get("server_prompt_tokens")
            server_text = (
                f"{_triple(server)} ({server['differs_from_sent']} differ)" if server else "n/a"
            )
            lines.append(
                f"| {name} | {_triple(lengths['sent'])} | "
                f"{_triple(lengths['manifest']['input_tokens'])} | {server_text} | "
                f"{_triple(lengths['received'])} | "
                f"{_triple(lengths['manifest']['output_tokens'])} | {word} |"
            )
        lines.append("")
        why = [f"- {name}: {w}" for name, e in sorted(classes.items())
               for w in e.get("lengths_match_why") or []]  # fmt: skip
        if why:
            lines += ["Why the lengths do not match:", "", *why, ""]
    t = selected.get("throughput")
    if t:
        u, d = t["per_user_output_tps"], t["per_user_decode_tps"]
        lines += [
            f"Throughput: **system** {_n(t['system_output_tps'])} output tokens/s (all "
            "successful requests' output tokens over the measured window); **per user** "
            f"(each successful request's output tokens / its E2E latency) P5 {_n(u['p5'])}, "
            f"P50 {_n(u['p50'])}, P95 {_n(u['p95'])} tokens/s over {u['count']} requests; "
            f"decode rate 1 / TPOT P5 {_n(d['p5'])}, P50 {_n(d['p50'])}, P95 {_n(d['p95'])} "
            "tokens/s.",
            "",
            "| class | system output tokens/s | per user P5 / P50 / P95 tokens/s |",
            "|---|---:|---|",
            *[
                f"| {name} | {_n(c['system_output_tps'])} | "
                + " / ".join(_n(c["per_user_output_tps"][k]) for k in ("p5", "p50", "p95"))
                + " |"
                for name, c in sorted(t["classes"].items())
            ],
            "",
        ]
    return lines
