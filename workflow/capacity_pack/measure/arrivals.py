"""An open-loop run's arrivals: the rows to send, their due times, and the blocks appended.

:class:`Arrivals` is the one stream of arrivals of an open-loop run: the schedule's rows with
their due times (``t0 + scheduled_offset_ns``), growing while the run goes on as extension
blocks are appended (:func:`build_block`), never rebased: block k+1's offsets continue block
k's on the run's clock (:func:`capacity_pack.plan.schedule.build_schedule`). It counts the
arrivals started (handed to a request task, a lead early for a timed send: :func:`feed`) and
those sent or settled (``decided``), and ends when it is closed (no block will be appended)
and every arrival was started, or when the in-run decision stops it: the rows after the last
started are then never sent.

A block's requests are built ahead of its arrivals (:class:`BlocksAhead`), never by the event
loop: building one request (~0.3-0.5 ms, the prompt and the body) is work the loop must not do
while it sends. Before the clock starts, the blocks up to ``prebuilt_s`` (the span most points
are decided in); past it, while the run goes on, a worker thread builds the next block
whenever the blocks built reach less than ``lead_s`` beyond the clock, one block (48 requests
on the default pack, ~20 ms of interpreter time in 0.2 ms slices) at a time. Building every
block the maximum duration could hold before the clock instead cost a 60 s-maximum point at
50 RPS 1.7 s before its first request for 3,093 requests, of which it sent about 250.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    until_s: float | None = None,
) -> tuple[list[Block], bool]:
    """(blocks, ended): the blocks from ``first`` on that the maximum duration holds (the last
    one cut), or, with ``until_s``, up to the first whose last arrival is due at ``until_s``
    or later; ``ended``: no block follows them within the maximum duration."""
    blocks: list[Block] = []
    k = first
    while (block := build_block(make, k, maximum_duration_s, request)) is not None:
        blocks.append(block)
        if _ends(block):
            return blocks, True
        if until_s is not None and _last_offset_ns(block) >= until_s * NS:
            return blocks, False
        k += 1
    return blocks, True


def _last_offset_ns(block: Block) -> int:
    return int(block.rows[-1]["scheduled_offset_ns"]) if block.rows else 0


def _ends(block: Block | None) -> bool:
    """No block follows this one within the maximum duration."""
    return block is None or bool(block.cut) or not block.rows


class BlocksAhead:
    """An open-loop run's extension blocks, built ahead of their arrivals (module docstring):
    before the clock up to ``prebuilt_s``, then by a worker thread ``lead_s`` ahead of the
    clock (:meth:`refill`, called at every look), one block at a time. :meth:`next` gives the
    next block in order, or None when no block is left within the maximum duration."""

    def __init__(
        self,
        make: Callable[[int], pd.DataFrame | None] | None,
        first: int,
        maximum_duration_s: float,
        request: Callable[[dict[str, Any]], Any],
        *,
        prebuilt_s: float,
        lead_s: float,
    ) -> None:
        self.make, self.limit_s, self.request = make, maximum_duration_s, request
        self.lead_ns = int(lead_s * NS)
        self.blocks, self.ended = build_blocks(
            make, first, maximum_duration_s, request, until_s=prebuilt_s
        )
        self.next_k = first + len(self.blocks)
        self.built_ns = _last_offset_ns(self.blocks[-1]) if self.blocks else 0
        self.prebuilt = len(self.blocks)
        self.in_run = 0  # blocks a worker thread built during the run
        self._task: asyncio.Future | None = None

    def refill(self, now_offset_ns: int) -> None:
        """Take a block the worker thread has finished; start building the next one when the
        blocks built reach less than the lead beyond ``now_offset_ns`` (the clock's offset
        now) and none is building."""
        if self._task is not None and self._task.done():
            self._take(self._task.result())
        if self.ended or self._task is not None or self.built_ns - now_offset_ns >= self.lead_ns:
            return
        self._task = asyncio.ensure_future(
            asyncio.to_thread(build_block, self.make, self.next_k, self.limit_s, self.request)
        )

    def _take(self, block: Block | None) -> None:
        self._task = None
        self.next_k += 1
        self.in_run += 1
        if block is not None:
            self.blocks.append(block)
            self.built_ns = max(self.built_ns, _last_offset_ns(block))
        self.ended = _ends(block)

    async def next(self) -> Block | None:
        """The next block: built already, being built (awaited), or built now in a thread."""
        while not self.blocks:
            if self._task is None:
                if self.ended:
                    return None
                self.refill(self.built_ns)  # nothing queued or building: build it at once
            task = self._task
            assert task is not None
            # Shielded: a cancelled caller leaves the thread's block for the next call.
            await asyncio.shield(task)
            if self._task is task:
                self._take(task.result())
        return self.blocks.pop(0)

    async def close(self) -> None:
        """Wait for a block being built (a worker thread cannot be cancelled)."""
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
            self._task = None
