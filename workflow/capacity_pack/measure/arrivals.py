"""An open-loop run's arrivals: the rows to send, their due times, and the blocks appended.

:class:`Arrivals` is the one stream of arrivals of an open-loop run: the schedule's rows with
their due times (``t0 + scheduled_offset_ns``), growing while the run goes on as extension
blocks are appended (:func:`build_block`), never rebased: block k+1's offsets continue block
k's on the run's clock (:func:`capacity_pack.plan.schedule.build_schedule`). It counts the
arrivals started (handed to a request task, a lead early for a timed send: :func:`feed`) and
those sent or settled (``decided``), and ends when it is closed (no block will be appended)
and every arrival was started, or when the in-run decision stops it: the rows after the last
started are then never sent. Every block's requests are built before the clock starts, those
the maximum duration may append included (:func:`build_blocks`): building one (~0.5 ms, the
prompt and the body) is work the event loop must not do while it sends, nor a worker thread
contending with it and the dispatcher for the interpreter lock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import pandas as pd

NS = 1_000_000_000


class Arrivals:
    """The open loop's arrivals. ``started`` and the flags change on the loop's thread only;
    ``decided`` also on the dispatcher thread (under the run's lock)."""

    __slots__ = (
        "rows", "due", "decided", "started", "closed", "stopped", "pending", "more", "done",
        "span_ns",
    )  # fmt: skip

    def __init__(self, rows: list[dict[str, Any]], due: list[int], done: asyncio.Future) -> None:
        self.rows, self.due, self.done = rows, due, done
        self.decided = self.started = 0
        self.closed = False  # no block will be appended
        self.stopped = False  # the in-run decision ended the arrivals
        self.pending = False  # the next block is being built
        self.more = asyncio.Event()  # a block was appended, or the arrivals ended
        self.span_ns = last_block_span(rows, due)

    def sendable(self) -> int:
        """The arrivals that will be started: all, or those started before a stop."""
        return self.started if self.stopped else len(self.due)

    def unsent(self) -> int:
        """Rows never started because the arrivals were stopped."""
        return len(self.due) - self.started if self.stopped else 0

    def append(self, rows: list[dict[str, Any]], due: list[int]) -> None:
        self.rows.extend(rows)
        self.due.extend(due)
        self.span_ns = due[-1] - due[0]
        self.more.set()

    def settle(self) -> None:
        if self.stopped or (self.closed and self.started >= len(self.due)):
            self.more.set()
            if not self.done.done():
                self.done.set_result(None)

    def close(self) -> None:
        self.closed = True
        self.settle()

    def stop(self) -> None:
        self.stopped = self.closed = True
        self.settle()


def last_block_span(rows: list[dict[str, Any]], due: list[int]) -> int:
    """The span of the last block's due times (0 for no rows)."""
    if not rows:
        return 0
    last, j = rows[-1]["block"], len(rows) - 1
    while j > 0 and rows[j - 1]["block"] == last:
        j -= 1
    return due[-1] - due[j]


async def feed(stream: Arrivals, start: Callable[[int], None], lead_ns: int) -> None:
    """Start each arrival ``lead_ns`` before it is due; at the end, wait for appended blocks."""
    i = 0
    while not stream.stopped:
        if i < len(stream.due):
            delay_ns = stream.due[i] - lead_ns - time.perf_counter_ns()
            if delay_ns > 0:
                await asyncio.sleep(delay_ns / NS)
            start(i)
            i += 1
        elif stream.closed:
            return
        else:
            stream.more.clear()
            await stream.more.wait()


class Block(NamedTuple):
    """An extension block ready to append: its frame, its rows to send (within the maximum
    duration), their requests, and how many rows the maximum duration cut."""

    frame: pd.DataFrame
    rows: list[dict[str, Any]]
    requests: dict[str, Any]
    cut: int


def build_block(
    make: Callable[[int], pd.DataFrame | None] | None,
    k: int,
    maximum_duration_s: float | None,
    request: Callable[[dict[str, Any]], Any],
) -> Block | None:
    """Block ``k`` from ``make`` (None: no such block), cut at the maximum duration, with its
    requests built by ``request`` (~0.5 ms each: the prompt and the body)."""
    frame = make(k) if make is not None else None
    if frame is None or not len(frame):
        return None
    rows = frame.to_dict("records")
    if maximum_duration_s is not None:
        limit = int(maximum_duration_s * NS)
        kept = [r for r in rows if int(r["scheduled_offset_ns"]) <= limit]
    else:
        kept = rows
    return Block(frame, kept, {r["request_id"]: request(r) for r in kept}, len(rows) - len(kept))


def build_blocks(
    make: Callable[[int], pd.DataFrame | None] | None,
    first: int,
    maximum_duration_s: float,
    request: Callable[[dict[str, Any]], Any],
) -> list[Block]:
    """Every block from ``first`` on that the maximum duration holds (the last one cut)."""
    blocks: list[Block] = []
    k = first
    while (block := build_block(make, k, maximum_duration_s, request)) is not None:
        blocks.append(block)
        if block.cut or not block.rows:
            break
        k += 1
    return blocks
