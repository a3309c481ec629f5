"""Multi-turn sessions: a session class's arrivals expanded into turns, and each turn's prompt.

Each arrival of a class with a ``session:`` block (:class:`capacity_pack.plan.manifest.SessionSpec`)
is a session of K turns; turn k's prompt is turn k-1's plus its answer plus a new user message,
so input_tokens_k = S + sum_(j<=k) u_j + sum_(j<k) o_j; turns k >= 1 are sent ``think_ns``
after the previous turn ends (:mod:`capacity_pack.measure.sessions`). Schedule columns, only
when a pack has a session class: ``session`` and ``turn`` (-1 for other classes), ``think_ns``
and ``user_tokens``; each from its own seeded stream per block, so cold and warm points send
the same sessions. Method: docs/metrics.md, 'Multi-turn sessions'.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.plan.lengths import (
    EmpiricalLength,
    LognormalLength,
    length_stats,
    sample_lengths,
)
from capacity_pack.plan.prompts import CORPUS_REVISION, body, fit_words
from capacity_pack.plan.workload import GeometricTurns, SessionSpec, WorkloadClass

SESSION_COLUMNS = ["session", "turn", "think_ns", "user_tokens"]
NS_PER_S = 1_000_000_000
# Random streams of a block (spawn-key second component), apart from the schedule's 0..5 and
# the prewarm's 14.
_TURNS, _THINK, _USER, _ANSWER, _SEEDS = range(20, 25)


def has_sessions(workload: list[WorkloadClass]) -> bool:
    return any(c.session is not None for c in workload)


def system_prompt_tokens(prompts: Any) -> int:
    """S: the shared prefix's length when the pack has a prefix set, else 0."""
    return int(prompts.prefix.prefix_tokens) if prompts.prefix is not None else 0


def sample_turns(spec: SessionSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    turns = spec.turns
    if isinstance(turns, GeometricTurns):
        return turns.sample(rng, n)
    return sample_lengths(turns, rng, n)


def mean_turns(spec: SessionSpec) -> float:
    """E[K]: exact for fixed and clipped lognormal/empirical; for the clipped geometric,
    E[min(G, m)] = sum_(k=0)^(m-1) (1 - p)^k = (1 - (1 - p)^m) / p."""
    turns = spec.turns
    if isinstance(turns, GeometricTurns):
        p = 1.0 / turns.mean
        return (1 - (1 - p) ** turns.max) / p
    assert isinstance(turns, int | LognormalLength | EmpiricalLength)
    return length_stats(turns).mean


def offered_turns_per_arrival(workload: list[WorkloadClass]) -> float:
    """Requests per scheduled arrival: 1 + sum_c mix_c (E[K_c] - 1) over session classes."""
    return 1.0 + sum(c.mix * (mean_turns(c.session) - 1) for c in workload if c.session)


def _rng(entropy: list[int], block: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(block, stream)))


def expand_sessions(
    frame: pd.DataFrame,
    workload: list[WorkloadClass],
    prompts: Any,
    entropy: list[int],
) -> pd.DataFrame:
    """The schedule frame (one row per arrival, before ids) with each session arrival expanded
    into its turns, in order; the session columns added. Vectorized per block."""
    s_tokens = system_prompt_tokens(prompts)
    frame = frame.reset_index(drop=True)
    out = []
    arrival = np.arange(len(frame), dtype=np.int64)
    for block, part in frame.groupby("block", sort=True):
        idx = part.index.to_numpy()
        k = np.ones(len(part), dtype=np.int64)
        klass = part["class"].to_numpy(dtype=object)
        is_session = np.zeros(len(part), dtype=bool)
        for c in workload:
            if c.session is None:
                continue
            mask = klass == c.name
            is_session |= mask
            k[mask] = sample_turns(c.session, _rng(entropy, int(block), _TURNS), int(mask.sum()))
        rows = part.loc[np.repeat(idx, k)].reset_index(drop=True)
        first = np.repeat(np.cumsum(k) - k, k)
        turn = (np.arange(len(rows)) - first).astype(np.int32)
        session = np.repeat(np.where(is_session, arrival[idx], -1), k)
        sess = np.repeat(is_session, k)
        later = sess & (turn > 0)
        think = np.zeros(len(rows), dtype=np.int64)
        user = np.where(sess, rows["input_tokens"].to_numpy(dtype=np.int64), 0)
        answer = rows["output_tokens"].to_numpy(dtype=np.int64).copy()
        seeds = rows["prompt_seed"].to_numpy(dtype=np.int64).copy()
        rclass = rows["class"].to_numpy(dtype=object)
        think_rng, user_rng = _rng(entropy, int(block), _THINK), _rng(entropy, int(block), _USER)
        answer_rng = _rng(entropy, int(block), _ANSWER)
        for c in workload:
            if c.session is None:
                continue
            mask = later & (rclass == c.name)
            n = int(mask.sum())
            think[mask] = np.rint(c.session.think_time.sample(think_rng, n) * NS_PER_S)
            user[mask] = sample_lengths(c.input_tokens, user_rng, n)
            answer[mask] = sample_lengths(c.output_tokens, answer_rng, n)
        seeds[later] = _rng(entropy, int(block), _SEEDS).integers(
            0, 2**63 - 1, size=int(later.sum()), dtype=np.int64
        )
        # input_k = S + sum_(j<=k) u_j + sum_(j<k) o_j, cumulated within each session.
        grown = np.cumsum(user + answer) - answer
        grown -= np.repeat(grown[np.cumsum(k) - k] - user[np.cumsum(k) - k], k)
        prefix_id = rows["prefix_id"].to_numpy(dtype=np.int32)
        rows["input_tokens"] = np.where(sess, s_tokens + grown, rows["input_tokens"])
        rows["output_tokens"] = answer
        rows["prompt_seed"] = seeds
        rows["prefix_tokens"] = np.where(
            sess, np.where(prefix_id >= 0, s_tokens, 0), rows["prefix_tokens"]
        ).astype(np.int32)
        # A later turn is never cancelled by the seeded policy on its own: its session's turn 0
        # carries the draw (the policy cancels requests, not conversations).
        rows["cancel_after_ns"] = np.where(later, -1, rows["cancel_after_ns"])
        rows["session"] = session
        rows["turn"] = np.where(sess, turn, -1).astype(np.int32)
        rows["think_ns"] = think
        rows["user_tokens"] = user.astype(np.int64)
        out.append(rows)
    return (
        pd.concat(out, ignore_index=True)
        if out
        else frame.assign(
            session=np.int64(-1), turn=np.int32(-1), think_ns=np.int64(0), user_tokens=np.int64(0)
        )
    )


def summary(frame: pd.DataFrame, workload: list[WorkloadClass]) -> dict[str, Any]:
    """The schedule summary's session figures: sessions and turns per class, the rate unit,
    and the session arrivals' realised rate and gaps (turn 0 rows: dependent turns have no
    scheduled send time)."""
    measured = frame[frame["phase"] != "warmup"]
    sess = measured[measured["session"] >= 0]
    arrivals = measured[measured["turn"] <= 0]
    offsets_s = arrivals["scheduled_offset_ns"].to_numpy() / NS_PER_S
    gaps = np.diff(offsets_s)
    per_class = {}
    for c in workload:
        if c.session is None:
            continue
        mine = sess[sess["class"] == c.name]
        turns = mine.groupby("session")["turn"].max() + 1
        per_class[c.name] = {
            "sessions": int(len(turns)),
            "turns": int(len(mine)),
            "mean_turns_scheduled": float(turns.mean()) if len(turns) else None,
            "max_turns_scheduled": int(turns.max()) if len(turns) else None,
            "mean_turns_expected": mean_turns(c.session),
            "think_time_mean_s": c.session.think_time.mean_s,
        }
    out: dict[str, Any] = {
        "rate_unit": "arrivals/s (a session counts once, at its turn 0)",
        "requests_per_arrival_expected": offered_turns_per_arrival(workload),
        "session_classes": per_class,
    }
    if gaps.size > 1:
        span = offsets_s[-1] - offsets_s[0]
        out["realised_rps"] = float(gaps.size / span) if span > 0 else None
        out["gap_mean_s"] = float(gaps.mean())
        out["gap_cv"] = float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else None
    return out


def user_message(
    prompt_seed: int, user_tokens: int, counter: Any = None, corpus_revision: str = CORPUS_REVISION
) -> str:
    """A later turn's new user message: ``user_tokens`` words drawn from its prompt seed
    (fitted to a target's own tokenizer where the run has one)."""
    words = body(prompt_seed, user_tokens + (16 if counter is not None else 0), corpus_revision)
    if counter is None or getattr(counter, "name", "") == "capacity-pack-ws-v1":
        return " ".join(words[:user_tokens])
    return fit_words(words, user_tokens, counter)
