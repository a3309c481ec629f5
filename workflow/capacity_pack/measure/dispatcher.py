"""The dispatcher thread: timed sends at their due instant, outside the event loop's backlog.

Timed sends (open loop, the project's transport): the run starts each prebuilt request
``LEAD_NS`` ahead of its due time (connection taken, bytes ready) and the dispatcher thread
(:class:`Dispatcher`) sleeps until the due time and writes them to the socket itself
(:class:`~capacity_pack.measure.connection.TimedWrite`), stamping the send there. The thread is
made punctual by :func:`dispatcher_priority` (1 us timer slack, a short slice, SCHED_FIFO only
with ``client.realtime_dispatch``), the GIL switch interval is ``SWITCH_INTERVAL_S`` during a
run, and with ``client.pin_threads`` the dispatcher and the loop get CPUs of their own
(:func:`thread_placement`). With httpx's transport the thread hands each arrival to the loop at
its due time instead. Before each sleep it offers the idle time to an ``idle`` callback (at least
every ``IDLE_CHECK_NS``: :mod:`capacity_pack.measure.collector`).
Why, with the traces behind each choice: docs/performance.md ("Threads on CPUs of their own").
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capacity_pack.measure.connection import TimedWrite

NS = 1_000_000_000
# With an idle callback, the thread wakes at least this often to offer it an idle moment.
IDLE_CHECK_NS = 10_000_000
# GIL switch interval during a run: how long the dispatcher thread may wait for the GIL.
SWITCH_INTERVAL_S = 0.0002
# How far ahead of its due time a timed send is handed to the loop to be prepared: above the
# loop's longest usual backlog (a step's burst of chunks at 200 RPS is ~3 ms).
LEAD_NS = 5_000_000


class Dispatcher(threading.Thread):
    """The dispatcher thread: sleeps until the next deadline, then acts on it.

    Two uses. Timed sends (our transport): the thread wakes once at each expected due time
    (``expect``) and writes the prepared requests due by then (``write_at``, no wake-up needed
    to register one); a request registered after its due time was checked is written by the
    caller at once. Hand-overs (httpx's transport): ``start(i)`` goes to the loop through
    ``call_soon_threadsafe`` at ``times[i]``.

    ``threading.Condition.wait`` sleeps outside the GIL and wakes within tens of microseconds
    (the thread's timer slack is set to 1 us where Linux allows and, when ``realtime`` asks for
    it, SCHED_FIFO where permitted, so a busy machine does not hold its wake-up back); the
    lowered switch interval bounds its wait for the GIL while the loop works.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        realtime: bool = False,
        idle: Callable[[int], None] | None = None,
        cpu: int | None = None,
    ) -> None:
        super().__init__(name="capacity-pack-dispatch", daemon=True)
        self.loop = loop
        self.cond = threading.Condition(threading.Lock())
        self.times: list[int] = []
        self.next = 0
        self.start_cb: Callable[[int], None] | None = None
        self.expected: list[int] = []
        self.next_expected = 0
        self.writes: list[tuple[int, int, TimedWrite]] = []
        self.seq = 0
        self.checked_ns = 0  # every write due by then has been taken
        self.wake_ns = 0  # when the sleeping thread means to wake
        self.stopped = False
        self.halted = False
        self.realtime = realtime
        self.scheduling = "normal"
        self.scheduling_detail = "not requested (client.realtime_dispatch is false)"
        # Called (outside the lock) with the time to the next deadline whenever the thread is
        # about to sleep, at least every IDLE_CHECK_NS: the collector's idle moments.
        self.idle = idle
        self.cpu = cpu  # the CPU to bind the thread to (thread_placement), None: left free
        self.bound: str | None = None  # why binding it failed, once the thread has tried

    def arrivals(self, times: list[int], start: Callable[[int], None] | None) -> None:
        """Hand ``start(i)`` to the loop at ``times[i]`` (perf_counter_ns), in order."""
        with self.cond:
            self.times, self.next, self.start_cb = times, 0, start
            self.cond.notify()

    def expect(self, due: list[int]) -> None:
        """The (sorted) due times that timed writes will be registered for."""
        with self.cond:
            self.expected, self.next_expected = due, 0
            self.cond.notify()

    def more_arrivals(self, times: list[int]) -> None:
        """Append hand-overs to the current arrivals (an extension block; same ``start``)."""
        with self.cond:
            if self.start_cb is not None:
                self.times.extend(times)
                self.cond.notify()

    def expect_more(self, due: list[int]) -> None:
        """Append (sorted, later) due times to the expected ones (an extension block)."""
        with self.cond:
            if not self.halted:
                self.expected.extend(due)
                self.cond.notify()

    def write_at(self, t_ns: int, write: TimedWrite) -> bool:
        """Register a timed write; False if ``t_ns`` is already past (write it now yourself)."""
        with self.cond:
            if self.halted:
                return True  # held, never written: the interrupt ends its request
            if t_ns <= self.checked_ns:
                return False
            heapq.heappush(self.writes, (t_ns, self.seq, write))
            self.seq += 1
            if t_ns < self.wake_ns:
                self.cond.notify()  # not an expected due time: wake earlier for it
            return True

    def halt(self) -> None:
        """Dispatch no more (an interrupt): drop the arrivals and the timed writes not yet made."""
        with self.cond:
            self.halted = True
            self.writes.clear()
            self.times, self.next, self.start_cb = [], 0, None
            self.expected, self.next_expected = [], 0
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()
        self.join(timeout=5)

    def run(self) -> None:
        if self.cpu is not None:
            self.bound = bind_thread({self.cpu})
        # On a CPU of its own the thread keeps the default slice (see short_slice).
        alone = self.cpu is not None and self.bound is None
        self.scheduling, self.scheduling_detail = dispatcher_priority(self.realtime, not alone)
        clock, cond, writes, idle = time.perf_counter_ns, self.cond, self.writes, self.idle
        check_ns = NS if idle is None else IDLE_CHECK_NS
        offer, offered = -1, False  # the gap to offer the idle callback; offered this wake
        while True:
            if offer >= 0 and idle is not None:
                idle(offer)
                offered = True
            offer = -1
            due: list[TimedWrite] = []
            start, i = None, 0
            with cond:
                while True:
                    if self.stopped:
                        return
                    now = clock()
                    while writes and writes[0][0] <= now:
                        due.append(heapq.heappop(writes)[2])
                    self.checked_ns = now
                    if self.next < len(self.times) and self.times[self.next] <= now:
                        start, i = self.start_cb, self.next
                        self.next += 1
                    if due or start is not None:
                        offered = False
                        break
                    expected, k = self.expected, self.next_expected
                    while k < len(expected) and expected[k] <= now:
                        k += 1
                    self.next_expected = k
                    wake = now + check_ns
                    if k < len(expected):
                        wake = min(wake, expected[k])
                    if writes:
                        wake = min(wake, writes[0][0])
                    if self.next < len(self.times):
                        wake = min(wake, self.times[self.next])
                    if idle is not None and not offered:
                        offer = wake - now
                        break  # idle(gap) outside the lock first, then back here to sleep
                    self.wake_ns = wake
                    cond.wait((wake - now) / NS)
                    self.wake_ns = 0
                    offered = False
            for write in due:
                write.fire()
            if start is not None:
                try:
                    self.loop.call_soon_threadsafe(start, i)
                except RuntimeError:  # the loop is closed: the run is over
                    return


def thread_placement(
    allowed: set[int] | frozenset[int], part: tuple[int, int] | None = None
) -> tuple[list[int], int] | None:
    """Where the run's two threads go: (the loop thread's CPUs, the dispatcher's CPU), or None.

    ``allowed`` is the process's CPU set (``os.sched_getaffinity``). ``part`` = (i, K) when K
    client processes on one host share that set (a sharded point's local shards): shard i
    takes the i-th of K contiguous, equal parts (the remainder unused). The dispatcher gets
    the part's highest CPU, the loop thread the rest; under two CPUs there is nothing to
    separate (None: both threads stay free).
    """
    cpus = sorted(allowed)
    if part is not None:
        i, k = part
        size = len(cpus) // k
        cpus = cpus[i * size : (i + 1) * size]
    if len(cpus) < 2:
        return None
    return cpus[:-1], cpus[-1]


class LoopPlacement:
    """The calling (event loop) thread's CPUs for one run, restored after it, and the report.

    ``pin`` is ``client.pin_threads``; ``part`` as in :func:`thread_placement`. ``bind()``
    binds the calling thread and tells which CPU the dispatcher should take (None: leave it
    free); ``restore()`` gives the thread back the CPU set it had (threads it started during
    the run, such as the loop's executor, keep the set they were started with).
    """

    def __init__(self, pin: bool, part: tuple[int, int] | None = None) -> None:
        self.pin, self.part = pin, part
        self.allowed: set[int] | None = (
            set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        )
        self.plan = thread_placement(self.allowed, part) if pin and self.allowed else None
        self.failed: str | None = None
        self.saved: set[int] | None = None

    def bind(self) -> int | None:
        if self.plan is None:
            return None
        loop_cpus, dispatcher_cpu = self.plan
        self.failed = bind_thread(set(loop_cpus))
        if self.failed is not None:
            return None
        self.saved = self.allowed
        return dispatcher_cpu

    def restore(self) -> None:
        if self.saved is not None:
            bind_thread(self.saved)
            self.saved = None

    def report(self, dispatcher: Dispatcher | None) -> dict[str, Any]:
        """The summary's ``thread_placement``: pinned or not, where, and why."""
        out: dict[str, Any] = {"requested": self.pin, "pinned": False}
        if not self.pin:
            return {**out, "detail": "not pinned (client.pin_threads is false)"}
        if self.plan is None:
            if not self.allowed:
                return {**out, "detail": "not pinned: this platform has no CPU affinity"}
            n, whose = len(self.allowed), "the process's CPU set"
            if self.part is not None:
                n, whose = n // self.part[1], "this shard's part of the CPU set"
            return {**out, "detail": f"not pinned: {whose} has {n} CPU(s), two are needed"}
        loop_cpus, dispatcher_cpu = self.plan
        cpus = ", ".join(map(str, loop_cpus))
        if self.failed is not None:
            return {**out, "detail": f"not pinned: {self.failed}"}
        why = dispatcher.bound if dispatcher is not None else "no dispatcher"
        if why is not None:  # the loop thread was bound all the same: say so
            return {**out, "detail": f"not pinned: dispatcher: {why} (event loop on CPU {cpus})"}
        return {
            **out,
            "pinned": True,
            "loop_cpus": loop_cpus,
            "dispatcher_cpu": dispatcher_cpu,
            "detail": f"event loop on CPU {cpus}, dispatcher on CPU {dispatcher_cpu}",
        }


def bind_thread(cpus: set[int]) -> str | None:
    """Bind the calling thread (not the process: Linux's ``sched_setaffinity(0)`` acts on the
    caller) to ``cpus``; None when done, else why not."""
    if not hasattr(os, "sched_setaffinity"):
        return "this platform has no sched_setaffinity"
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        return f"sched_setaffinity refused ({exc.strerror or exc})"
    return None


#: The scheduler time slice the dispatcher thread asks for (Linux EEVDF, 6.12 and later:
#: ``sched_attr.sched_runtime`` of a SCHED_OTHER thread; the kernel's floor is 0.1 ms).
SHORT_SLICE_NS = 100_000
_SCHED_ATTR = "IIQiIQQQII"  # struct sched_attr, SCHED_ATTR_SIZE_VER1 (56 bytes)
_SYS_SCHED = {"x86_64": (314, 315), "aarch64": (274, 275)}  # sched_setattr, sched_getattr


def _sched_attr() -> tuple[Any, Any, int, int] | None:
    import platform

    if not sys.platform.startswith("linux") or platform.machine() not in _SYS_SCHED:
        return None
    import ctypes

    set_nr, get_nr = _SYS_SCHED[platform.machine()]
    return ctypes, ctypes.CDLL(None, use_errno=True), set_nr, get_nr


def thread_slice_ns() -> int | None:
    """The calling thread's scheduler time slice (``sched_getattr``), or ``None`` where it
    cannot be read."""
    import struct

    with contextlib.suppress(Exception):
        if (sys_ := _sched_attr()) is not None:
            ctypes, libc, _, get_nr = sys_
            size = struct.calcsize(_SCHED_ATTR)
            buf = ctypes.create_string_buffer(size)
            if libc.syscall(get_nr, 0, buf, size, 0) == 0:
                fields = struct.unpack(_SCHED_ATTR, buf.raw)
                return fields[5] if fields[1] == 0 else None  # SCHED_OTHER only
    return None


def short_slice(slice_ns: int = SHORT_SLICE_NS) -> bool:
    """Ask the scheduler for a short time slice for the calling thread; whether it took.

    A shorter slice gives a waking thread an earlier virtual deadline (EEVDF), so it preempts
    sooner, with no privilege and no change to its CPU share; ignored before Linux 6.12 (False).
    Not asked for a thread on a CPU of its own, where it would only let a waking task preempt a
    young collection holding the GIL. Measured: docs/performance.md.
    """
    import struct

    with contextlib.suppress(Exception):
        if (sys_ := _sched_attr()) is not None and thread_slice_ns() is not None:
            ctypes, libc, set_nr, _ = sys_
            size = struct.calcsize(_SCHED_ATTR)
            attr = struct.pack(_SCHED_ATTR, size, 0, 0, os.getpriority(os.PRIO_PROCESS, 0),
                               0, slice_ns, 0, 0, 0, 0)  # fmt: skip
            if libc.syscall(set_nr, 0, ctypes.create_string_buffer(attr), 0) == 0:
                return thread_slice_ns() == slice_ns
    return False


def dispatcher_priority(realtime: bool = False, short: bool = True) -> tuple[str, str]:
    """Make the calling thread's wake-ups punctual; its scheduling policy's name and why.

    Timer slack 1 us (Linux's default of 50 us lets a sleep end that much late); with
    ``short`` (a thread not on a CPU of its own), a short time slice (:func:`short_slice`). With
    ``realtime``, SCHED_FIFO at the lowest real-time priority where the process may (root,
    CAP_SYS_NICE): the thread then preempts ordinary work when its deadline comes instead of
    queueing behind it. It runs for tens of microseconds per request, but a real-time thread
    is outside what ``nice`` or a fair-share scheduler limit, so it is never taken unasked.
    """
    with contextlib.suppress(Exception):
        import ctypes  # here, inside the guard: a Python without ctypes just keeps the slack

        ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in nanoseconds
    if not realtime:
        if short and short_slice():
            return "normal", (
                "SCHED_FIFO not requested (client.realtime_dispatch is false); "
                f"time slice {SHORT_SLICE_NS / 1e6:g} ms"
            )
        return "normal", "not requested (client.realtime_dispatch is false)"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except AttributeError:
        return "normal", "requested; this platform has no SCHED_FIFO"
    except OSError as exc:
        return "normal", f"requested; not permitted ({exc.strerror or exc})"
    return "SCHED_FIFO", "requested and in effect (priority 1)"
