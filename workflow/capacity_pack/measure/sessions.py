"""A run's multi-turn sessions: the dependent turns held until their predecessor ends.

The schedule of a pack with session classes (:mod:`capacity_pack.plan.sessions`) holds every
turn of every session. Turn 0 (and every request of other classes) is an *independent* arrival,
sent at its scheduled offset like any other; turn k >= 1 is *dependent*: :class:`SessionTurns`
keeps it aside, and the run (:meth:`capacity_pack.measure.run.Run._session`) sends it when turn
k-1 has ended plus its think time, due at ``end(k-1) + think_ns`` (its record's due time and
scheduled offset are that instant, so dispatch lateness stays send - due). Its prompt is the
conversation so far: turn 0's prompt, then alternately each answer as streamed (the text of
the response's chunks, joined and stripped) and each later user message
(:func:`capacity_pack.plan.sessions.user_message`); completions send them joined by one space,
chat completions as alternating user and assistant messages.

A turn that does not end ``ok`` ends its session: the later turns are never sent and are
listed, each with the reason, in the run summary's ``session_turns_not_sent`` (request id,
session, turn, kind, reason), never a crash; so are the turns held back when a signal
interrupts the run. When the in-run decision stops the arrivals, no new session starts, but
the sessions under way go on to their last turn (their users would); the sessions whose turn
0 was never started count in ``unsent_requests`` with it (all their turns follow it in
schedule order).
"""

from __future__ import annotations

import math
from typing import Any

#: Why a held turn was never sent: an earlier turn of its session did not end ``ok``; a signal
#: interrupted the run.
NOT_SENT = ("session_ended", "interrupted")


def turn_of(row: dict[str, Any]) -> int:
    """The row's turn index (-1 for a request outside any session)."""
    t = row.get("turn", -1)
    if t is None or (isinstance(t, float) and math.isnan(t)):
        return -1
    return int(t)


def is_dependent(row: dict[str, Any]) -> bool:
    """A turn after a session's first: sent when its predecessor ends, never on a clock."""
    return turn_of(row) > 0


class SessionTurns:
    """The dependent turns of a run by session, and the turns that were never sent."""

    def __init__(self) -> None:
        self.held: dict[int, list[dict[str, Any]]] = {}
        self.not_sent: list[dict[str, Any]] = []
        self.seen = False  # a session row was split: the run has sessions

    def split(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The independent rows of ``rows``; the dependent ones are held by session."""
        out = []
        for r in rows:
            if is_dependent(r):
                self.seen = True
                self.held.setdefault(int(r["session"]), []).append(r)
            else:
                out.append(r)
        return out

    def take(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The later turns of the session ``row`` starts (in turn order; [] for none)."""
        if turn_of(row) != 0:
            return []
        return sorted(self.held.pop(int(row["session"]), []), key=turn_of)

    def skip(self, rows: list[dict[str, Any]], kind: str, reason: str) -> None:
        """Record ``rows`` as never sent: ``kind`` one of :data:`NOT_SENT`, ``reason`` the text."""
        for r in rows:
            self.not_sent.append(
                {
                    "request_id": r["request_id"],
                    "session": int(r["session"]),
                    "turn": turn_of(r),
                    "kind": kind,
                    "reason": reason,
                }
            )

    def unstarted(self) -> int:
        """Dependent turns of sessions whose turn 0 never started."""
        return sum(len(v) for v in self.held.values())

    def summary(self) -> dict[str, Any]:
        reasons = {k: sum(r["kind"] == k for r in self.not_sent) for k in NOT_SENT}
        return {"session_turns_not_sent": self.not_sent, "session_turns_not_sent_by": reasons}


def end_reason(status: str | None, error: str | None, turn: int) -> str:
    """Why a session ended before its last turn, from the turn that ended it."""
    if status is None:
        return f"turn {turn} never sent"
    return f"turn {turn} ended {status}: {error or ''}".rstrip(": ")


def answer_text(parts: list[str] | None) -> str:
    """The streamed answer as the next turn carries it: the chunks' text, joined, stripped."""
    return "".join(parts or ()).strip()
