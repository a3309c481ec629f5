"""The live engine's clock and pacing: one monotonic clock with its Unix-epoch offset, the
deadline timer that wakes the step loop, and the garbage-collection settings of a serving process.

Timing (:mod:`capacity_pack.sim.engine` steps on it): the loop wakes through
:class:`DeadlineTimer`, a thread that sleeps on a condition variable (tens of microseconds of
precision; the event loop's own timers round up to whole milliseconds) and hands the wake-up to
the loop. ``*_ns`` stamps are CLOCK_MONOTONIC; :func:`epoch_ns` turns one into Unix-epoch
nanoseconds with an offset fixed at start-up (``CLOCK_OFFSET_NS``), so they never jump.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time

mono_ns = time.monotonic_ns
CLOCK_OFFSET_NS = time.time_ns() - time.monotonic_ns()


def epoch_ns(mono: int | None) -> int | None:
    return None if mono is None else mono + CLOCK_OFFSET_NS


# GIL switch interval for a process serving the live loop: the timer thread must get the GIL
# promptly at a deadline while the loop thread runs request handlers (the default 5 ms would show
# up as step lateness whenever a step's handlers are still busy at its deadline).
SWITCH_INTERVAL_S = 0.0002


# Objects allocated (net) before the live loop collects the young generations itself; CPython's
# own first threshold.
GC_YOUNG_THRESHOLD = 700
# The automatic collector's first threshold while the live loop collects: a safety net for an
# idle server (no steps) that still answers scrapes and health checks.
GC_SAFETY_THRESHOLD = 100_000


def collect_young(threshold: int = GC_YOUNG_THRESHOLD) -> None:
    """Run the collection CPython's automatic policy would run once ``threshold`` net
    allocations are pending: generation 0, generation 1 every 10th time, 2 every 100th."""
    c0, c1, c2 = gc.get_count()
    if c0 >= threshold:
        gc.collect(2 if c1 >= 10 and c2 >= 10 else 1 if c1 >= 10 else 0)


class DeadlineTimer:
    """Wakes an asyncio loop at absolute CLOCK_MONOTONIC deadlines with sub-millisecond error
    (a thread, so the process should run with :data:`SWITCH_INTERVAL_S`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._cond = threading.Condition()
        self._deadline_ns: int | None = None
        self._future: asyncio.Future[None] | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="sim-deadline-timer", daemon=True)
        self._thread.start()

    async def wait_until(self, deadline_ns: int) -> None:
        if deadline_ns <= mono_ns():
            # Past due: still yield once, so request handlers run between back-to-back steps.
            await asyncio.sleep(0)
            return
        fut = self._loop.create_future()
        with self._cond:
            self._deadline_ns = deadline_ns
            self._future = fut
            self._cond.notify()
        await fut

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while self._deadline_ns is None and not self._closed:
                    cond.wait()
                if self._closed:
                    return
                remaining = self._deadline_ns - mono_ns()
                if remaining > 0:
                    # Re-checked after waking: a new deadline may have replaced this one.
                    cond.wait(remaining / 1e9)
                    continue
                fut = self._future
                self._deadline_ns = None
                self._future = None
            try:
                self._loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:
                return  # the loop is closed: the server is shutting down


def _resolve(fut: asyncio.Future[None] | None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)
