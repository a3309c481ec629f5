"""The load modes of a measurement run: open loop with in-run decisions and extension blocks,
and closed loop.

A mixin of :class:`capacity_pack.measure.run.Run` (:class:`LoadModes`), whose schedule,
dispatcher, decider and counters it uses:

- open loop: each arrival is handed to the dispatcher thread, which sends it at its due instant
  (a lead early to the loop when the run's own transport times the write); every
  ``look_interval_s`` a look judges each class (:mod:`capacity_pack.measure.sequential`) and
  stops the arrivals once the outcome is certain, and near the end of the queued arrivals the
  next block (built ahead, :class:`capacity_pack.measure.arrivals.BlocksAhead`) is appended on
  the same clock while the point needs more;
- closed loop: N workers, each sending its next request when the previous one ends, in schedule
  order; extension blocks run after the previous block has ended, while a class is under its
  sample gate and time remains.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from typing import Any

import pandas as pd

from capacity_pack.measure.arrivals import Arrivals, Block, build_block, feed
from capacity_pack.measure.send import NS
from capacity_pack.measure.sequential import (
    LOOK_INTERVAL_S,
    extension_lead_ns,
    projected_short,
    wants_extension,
)


class LoadModes:
    """Runs the open or closed loop of a :class:`~capacity_pack.measure.run.Run` (a mixin: the
    run holds the state)."""

    # -- load modes ------------------------------------------------------------------------

    async def _open_loop(self, client, rows: list[dict[str, Any]], base_ns: int) -> None:
        """Send ``rows`` at base_ns + scheduled offset, and the blocks :meth:`_control` appends
        while they run; returns when every request started has terminated."""
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task] = set()
        rows = self._sessions.split(rows)  # later turns of sessions follow their predecessor
        due = [base_ns + int(r["scheduled_offset_ns"]) for r in rows]
        stream = self._stream = Arrivals(rows, due, loop.create_future())
        stream.closed = self.s.extension_block is None

        def start(i: int) -> None:
            if self.interrupted is not None or stream.stopped:
                return  # handed over just before the interrupt or the stop: never sent
            task = loop.create_task(self._session(client, stream.rows[i], stream.due[i], stream))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            stream.started = i + 1
            if stream.started == len(stream.due) and not stream.pending:
                stream.close()  # no block was appended before the last arrival: they end here

        dispatcher = self._dispatcher
        assert dispatcher is not None
        feeder = controller = None
        if self._lead_ns:
            # Timed sends: the loop starts each request a lead early (its own timers, to the
            # millisecond, are enough for that); the thread writes it at its due time.
            dispatcher.expect(list(due))
            feeder = loop.create_task(feed(stream, start, self._lead_ns))
        else:
            dispatcher.arrivals(list(due), start)
        if self._decider is not None or not stream.closed:
            controller = loop.create_task(self._control(stream))
        assert self._halt is not None
        halted = loop.create_task(self._halt.wait())
        try:
            if rows:
                await asyncio.wait({stream.done, halted}, return_when=asyncio.FIRST_COMPLETED)
            while tasks:
                await asyncio.wait(set(tasks))
        finally:
            for task in (halted, feeder, controller):
                if task is not None:
                    task.cancel()
            if self._appended:
                self.schedule = pd.concat([self.schedule, *self._appended], ignore_index=True)
                self._appended = []
            dispatcher.arrivals([], None)
            dispatcher.expect([])

    # -- in-run decisions and extension blocks ------------------------------------------------

    async def _control(self, stream: Arrivals) -> None:
        """The looks: stop the arrivals once the point's outcome is certain; near the end of
        the queued arrivals, append the next block while the point needs more."""
        decider = self._decider
        period = decider.settings.look_interval_s if decider is not None else LOOK_INTERVAL_S
        while not stream.done.done():
            outcome = "undecided"
            if decider is not None:
                outcome = decider.look(time.perf_counter_ns() - self.t0_ns)
            if outcome != "undecided":
                self._stop_arrivals(stream)
                return
            if self._ahead is not None:
                self._ahead.refill(time.perf_counter_ns() - self.t0_ns)
            # Blocks shorter than the lead: as many as it takes to cover it again.
            while not stream.closed and self.interrupted is None:
                if stream.due[-1] - time.perf_counter_ns() >= extension_lead_ns(stream.span_ns):
                    break
                short = [] if decider is not None else self._short_classes(projected=True)
                if not wants_extension(decider, outcome, short):
                    break
                await self._append_block(stream)
            await asyncio.sleep(period)

    def _stop_arrivals(self, stream: Arrivals) -> None:
        """No more arrivals (requests already started go on and are recorded)."""
        stream.stop()
        self.stopped_early = True
        assert self._dispatcher is not None
        self._dispatcher.arrivals([], None)
        self._dispatcher.expect([])

    async def _append_block(self, stream: Arrivals) -> None:
        """The next block (built ahead of its arrivals) appended to the running arrivals."""
        k = self.blocks_sent + 1
        block: Block | None = None
        stream.pending = True
        try:
            if self._ahead is not None:
                block = await self._ahead.next()
            else:  # no maximum duration: no end to build ahead to; a worker thread builds it
                block = await asyncio.to_thread(
                    build_block, self.s.extension_block, k, None, self._request
                )
        finally:
            stream.pending = False
        if stream.stopped or self.interrupted is not None:
            return
        if block is not None:
            self.blocks_sent = k
            self._appended.append(block.frame)
            self._appended_measured += len(block.rows)
            if block.rows and self._span_s is not None:
                last = max(int(r["scheduled_offset_ns"]) for r in block.rows) / NS
                self._span_s = max(self._span_s, last)
            self.cut_at_max_duration += block.cut
        if block is None or not block.rows:
            stream.close()  # no block left within the maximum duration
            return
        for r in block.rows:
            self._scheduled[r["class"]] = self._scheduled.get(r["class"], 0) + 1
        self._requests.update(block.requests)
        arrivals = self._sessions.split(block.rows)
        # The block continues the seeded process on the run's own clock: no rebase.
        due = [self.t0_ns + int(r["scheduled_offset_ns"]) for r in arrivals]
        assert self._dispatcher is not None
        if self._lead_ns:
            self._dispatcher.expect_more(due)
        else:
            self._dispatcher.more_arrivals(due)
        stream.append(arrivals, due)

    async def _closed_loop(self, client, rows: list[dict[str, Any]]) -> None:
        it = iter(self._sessions.split(rows))  # a worker runs a session's turns in turn

        async def worker() -> None:
            for row in it:
                if self.interrupted is not None:
                    return
                await self._session(client, row, 0)

        n = self.s.concurrency or 1
        await asyncio.gather(*(worker() for _ in range(n)))

    # -- watchers ---------------------------------------------------------------------------

    def due_unsent(self, now_ns: int) -> int:
        """Arrivals due by ``now_ns`` and not yet sent (the client's backlog)."""
        stream = self._stream
        if stream is None:
            return 0
        due = bisect.bisect_right(stream.due, now_ns, hi=stream.sendable())
        return max(0, due - stream.decided)

    def _short_classes(self, projected: bool) -> list[str]:
        """Classes under the sample gate (now, or projected to the schedule's end)."""
        gate, st = self.s.min_successful_per_class, self.state
        if projected:
            return projected_short(self._scheduled, st.ok_by_class, st.terminal_by_class, gate)
        if gate is None:
            return []
        return [k for k in self._scheduled if st.ok_by_class.get(k, 0) < gate]

    async def _extend_closed(self, client) -> None:
        """Closed loop: extension blocks, each after the previous one ended, while a class is
        under its sample gate and time remains."""
        make = self.s.extension_block
        if make is None:
            return
        limit_ns = None
        if self.s.maximum_duration_s is not None:
            limit_ns = self.t0_ns + int(self.s.maximum_duration_s * NS)
        while self.interrupted is None and self._short_classes(projected=False):
            if limit_ns is not None and time.perf_counter_ns() >= limit_ns:
                return
            rows = make(self.blocks_sent + 1)
            if rows is None or not len(rows):
                return
            self.blocks_sent += 1
            self.schedule = pd.concat([self.schedule, rows], ignore_index=True)
            for klass, n in rows["class"].value_counts().items():
                self._scheduled[str(klass)] = self._scheduled.get(str(klass), 0) + int(n)
            records = rows.to_dict("records")
            self._prepare(records)
            await self._closed_loop(client, records)
