"""The per-turn section of a session pack's SLO report: TTFT and prefix reuse by turn index.

Over the measured requests of a point (``measure`` and ``extension`` phases) that belong to a
session class (:mod:`capacity_pack.plan.sessions`), grouped by class and turn index k:

- attempted_k, successful_k (``ok``), passing_k (the class SLO met: TTFT and TPOT within the
  class's cutoffs, the predicate of :mod:`.gates`; the class's SLO applies to every turn);
  attainment_k = passing_k / successful_k;
- nearest-rank P50 and P95 of TTFT over the successful turns (:mod:`.statistics`);
- the prefix-cache hit rate by turn, as the client sees it: sum of
  ``usage.prompt_tokens_details.cached_tokens`` / sum of ``usage.prompt_tokens`` over the
  successful turns k (the point-wide ``client_cached_token_fraction`` of
  :func:`capacity_pack.measure.sweep.hit_rates` restricted to turn k; a request without the
  field counts 0 cached tokens, as engines omit it when nothing was cached); None where no
  request of the point reports cached tokens at all;
- mean prompt tokens of turn k (the conversation's growth).

Turn 0 carries no earlier turn of its own session, so its hit rate is the cross-session reuse:
near zero for cold points (every session has its own system prompt), the shared system prompt
set's share for warm ones. Turns k >= 1 add the reuse of their own conversation, which grows
with k as the resent history outweighs the new user message.

Also per class: sessions started, sessions whose every scheduled turn was sent, and the turns
never sent (an earlier turn failed, an interrupt), from the sweep summary. The point's rate is
in arrivals per second, a session counting once (its turn 0): ``rate_unit`` says so; the
report's request rates (``offered_rate_rps``, throughputs, goodput) count every turn.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.vocab.percentile import nearest_rank
from capacity_pack.vocab.phases import MEASURED_PHASES
from capacity_pack.vocab.slo import meets_slo

RATE_UNIT = "sessions/s (a session counts once, at its turn 0; other classes: requests/s)"


def has_sessions(requests: pd.DataFrame) -> bool:
    return "turn" in requests.columns and bool(requests["turn"].notna().any())


def per_turn(
    requests: pd.DataFrame, classes: list[Any], sweep_summary: dict[str, Any]
) -> dict[str, Any]:
    """The per-turn section (module docstring) of the measured ``requests`` of one point."""
    m = requests[requests["phase"].isin(MEASURED_PHASES) & requests["turn"].notna()]
    not_sent = pd.DataFrame(
        sweep_summary.get("session_turns_not_sent") or [],
        columns=["request_id", "session", "turn", "kind", "reason"],
    )
    out: dict[str, Any] = {
        "rate_unit": RATE_UNIT,
        # The report's offered_rate_rps and throughputs count requests: every turn is one.
        "request_rates_count": "every turn as one request (offered_rate_rps, throughputs)",
        "hit_rate_method": "sum cached_tokens / sum prompt_tokens over successful turns k",
        "classes": {},
    }
    # An engine that reports cached tokens omits the field when none were cached (the
    # simulator, vLLM): absent then reads as 0, as in the point's client_cached_token_fraction.
    reported = bool(m["cached_tokens"].notna().any())
    for c in classes:
        mine = m[m["class"] == c.name]
        if mine.empty:
            continue
        rows = []
        for k, g in mine.groupby("turn", sort=True):
            ok = g[g["status"] == "ok"]
            ttft, tpot = ok["ttft_ms"].to_numpy(float), ok["tpot_ms"].to_numpy(float)
            passed = int(
                np.count_nonzero(meets_slo(ttft, tpot, c.ttft_cutoff_ms, c.tpot_cutoff_ms))
            )
            prompt = ok["prompt_tokens"].dropna().astype("int64").sum()
            cached = ok["cached_tokens"].fillna(0).astype("int64").sum()
            hit = float(cached / prompt) if prompt and reported else None
            srt = np.sort(ttft)
            rows.append(
                {
                    "turn": int(k),
                    "attempted": int(len(g)),
                    "successful": int(len(ok)),
                    "passing": passed,
                    "attainment": passed / len(ok) if len(ok) else None,
                    "p50_ttft_ms": nearest_rank(srt, 0.50) if srt.size else None,
                    "p95_ttft_ms": nearest_rank(srt, 0.95) if srt.size else None,
                    "prefix_hit_rate": hit,
                    "mean_prompt_tokens": float(ok["prompt_tokens"].dropna().mean())
                    if ok["prompt_tokens"].notna().any()
                    else None,
                }
            )
        sessions = mine["session"].dropna().astype(int).unique()
        ended = not_sent[not_sent["session"].isin(set(sessions))]
        out["classes"][c.name] = {
            "sessions": int(sessions.size),
            "sessions_ended_early": int(ended["session"].nunique()),
            "turns_not_sent": {
                kind: int((ended["kind"] == kind).sum()) for kind in sorted(set(ended["kind"]))
            },
            "turns": rows,
        }
    return out


def markdown(section: dict[str, Any]) -> list[str]:
    """The per-turn tables of a point (pack README and reports)."""
    lines = []
    for name, c in section["classes"].items():
        lines += [
            f"Sessions of `{name}`: {c['sessions']} measured, {c['sessions_ended_early']} ended "
            f"before their last turn. Rate unit: {section['rate_unit']}.",
            "",
            "| turn | turns ok | attainment | P50 TTFT ms | P95 TTFT ms | prefix hit rate | "
            "mean prompt tokens |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in c["turns"]:
            lines.append(
                f"| {r['turn']} | {r['successful']}/{r['attempted']} | {_num(r['attainment'])} "
                f"| {_num(r['p50_ttft_ms'], 1)} | {_num(r['p95_ttft_ms'], 1)} "
                f"| {_num(r['prefix_hit_rate'])} | {_num(r['mean_prompt_tokens'], 0)} |"
            )
        lines.append("")
    return lines


def _num(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"
