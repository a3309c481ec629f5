"""One measurement run: a point's schedule sent to an OpenAI-compatible endpoint, all recorded.

Open loop (``mode == "open"``/``"exp"``): each request is sent at its scheduled offset regardless
of completions; nothing ever holds a scheduled arrival behind a concurrency cap. An optional
in-flight ceiling (``client.max_in_flight``; in flight = written and not yet ended) answers an
arrival beyond it, at its due time, with a client-side ``rejected`` record. Closed loop
(``mode == "closed"``): N workers, each sending its next request when the previous one ends, in
schedule order. Open-loop arrivals are sent at their due instant by the dispatcher thread
(:mod:`capacity_pack.measure.dispatcher`).

Client: one ``httpx.AsyncClient`` per run (keep-alive, explicit ``httpx.Timeout``, ``httpx.Limits``
without connection caps, ``Accept-Encoding: identity``, no cookie carried between requests) over
:class:`~capacity_pack.measure.transport.PlainHTTPTransport` for ``http://`` targets, httpx's
default transport for ``https://`` (``LoadSettings.transport`` overrides), verifying an https://
server's certificate unless ``LoadSettings.tls_verify`` is false (``ca_bundle``: a private CA).
The API key goes with every request and scrape, and a record whose text quotes it (a server's
error) has it replaced by ``[redacted]`` (:mod:`capacity_pack.measure.payload`).

Timeouts and cancellation deadlines run from the due time (from the start in closed loop): one
overall deadline per request (``asyncio.timeout``), whatever phase it is in (connecting, waiting
for the head, reading the body), so a request unfinished after ``request_timeout_s`` is a
``timeout`` and says in which phase. The transports' own per-phase timeouts are a backstop set
past that deadline (``BACKSTOP_S``), never what ends a request; a connection refused, reset or
unresolvable is an ``error`` with its cause. No automatic retries, ever. A request counts as
``ok`` only when the stream ended normally with the class's exact output length (the workload
contract of ``ignore_eos`` fixed-length classes); a short or long output is an ``error`` whose
text says so, never silently a success. Streams are read by
:class:`~capacity_pack.measure.sse.SSEReader`; each finished request is written as one record
(:mod:`capacity_pack.measure.records`, where the stamps and the latency definitions are).
SIGINT or SIGTERM stops the run with every request accounted for
(:mod:`capacity_pack.measure.interrupt`).

In-run decisions and extension (open loop, :mod:`capacity_pack.measure.sequential`): every
``look_interval_s`` a look judges each class's attainment by its time-uniform confidence
sequence. A class certain to fail stops the arrivals; every class certain to pass, at its
sample gate and past the minimum duration, stops them too; requests in flight finish and are
recorded, and the rows never sent are counted (``unsent_requests``). Otherwise the point
continues: when the queued arrivals cover less than the extension lead, a look that finds it
undecided (or, without an in-run decision, a class projected short of
``min_successful_per_class``) appends the schedule's next block to the running arrivals on
the same clock (block k+1's offsets continue block k's: no rebase, no pause, no idle drain),
up to ``maximum_duration_s``; every block is built, requests and all, ahead of its arrivals
and never by the loop: before the clock up to the minimum duration and two build leads
(``BUILD_AHEAD_S``), then by a worker thread a lead ahead of the clock
(:class:`capacity_pack.measure.arrivals.BlocksAhead`), so appending one costs the loop
nothing and a point decided early pays only for the blocks it could have used. Closed-loop
extension blocks run after the previous block has ended, as before.

The client watches itself: dispatch lateness, event-loop lag (a 10 ms ticker's wake-up delay)
and its own CPU time from the clock's start (request building before it is not counted); when
lateness p99 exceeds ``client.lateness_bound_ms`` the summary labels the point ``client_bound``
and the analysis treats it as invalid. The garbage collector is kept out of the measured
window (:mod:`capacity_pack.measure.collector`): what is alive at the clock's start is frozen
(``gc.freeze``), automatic collections are off until the load ends, the dispatcher thread
collects the young generations at its idle moments, and every pass is timed into the
summary's ``gc_*`` fields; a response is unbound from its stream when it ends, so requests
leave no cyclic garbage behind. ``/metrics`` is scraped every
``client.metrics_interval_seconds`` into a long time series (queue depth, running, KV usage,
prefix-cache queries/hits, preemptions) through a name map for vLLM, SGLang, llama.cpp, TGI,
TensorRT-LLM and the simulator (:func:`capacity_pack.engines.signals.parse_metrics`), with the
client's own backlog series (due but unsent, in flight) alongside
(:mod:`capacity_pack.measure.watchers`).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import http.cookiejar
import json
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pandas as pd

from capacity_pack.engines import verify_setting
from capacity_pack.io import atomic_path, finite_or_none, write_json_atomic
from capacity_pack.measure.arrivals import Arrivals, Block, BlocksAhead, build_block, feed
from capacity_pack.measure.collector import QuietCollector, unbind
from capacity_pack.measure.connection import DRAIN_GRACE_S, RequestWithdrawn
from capacity_pack.measure.dispatcher import (
    LEAD_NS,
    SWITCH_INTERVAL_S,
    Dispatcher,
    LoopPlacement,
)
from capacity_pack.measure.interrupt import Interrupted, catch_signals, interruption
from capacity_pack.measure.payload import RequestBuilder
from capacity_pack.measure.records import Attempt, RecordWriter
from capacity_pack.measure.sequential import (
    LOOK_INTERVAL_S,
    Decider,
    extension_lead_ns,
    projected_short,
    wants_extension,
)
from capacity_pack.measure.sessions import SessionTurns, answer_text, end_reason, is_dependent
from capacity_pack.measure.settings import LoadSettings
from capacity_pack.measure.sse import SSEReader
from capacity_pack.measure.transport import BODY_EXTENSION, SEND_AT, SENT_HOOK, PlainHTTPTransport
from capacity_pack.measure.watchers import health, lag_monitor, progress, progress_lines, scraper

NS = 1_000_000_000
# Idle keep-alive connections httpx's default transport may keep (see Run._http_options).
HTTPX_MAX_IDLE_CONNECTIONS = 32
# The transports' per-phase timeouts lie this far past the request's overall deadline: they
# only catch what the deadline somehow did not, and then still read as a timeout.
BACKSTOP_S = 1.0
# Extension blocks are built this far ahead of the clock (seconds of arrivals): a worker
# thread has that long to build the next block before the run wants it (capacity_pack.
# measure.arrivals.BlocksAhead); well over the 2 s extension lead.
BUILD_AHEAD_S = 5.0
#: The schedule's phases inside the measured window (warm-up requests are sent before it).
MEASURED_PHASES = ("measure", "extension")


@dataclass
class _State:
    """The run's counters (the dispatcher thread changes some of them, under ``Run._lock``)."""

    in_flight: int = 0
    sent: int = 0
    sent_measured: int = 0  # of them, in the measured window (not warm-up)
    finished: int = 0
    failed: int = 0
    due_unsent: int = 0
    streamed_tokens: int = 0
    ok_by_class: dict[str, int] = field(default_factory=dict)
    terminal_by_class: dict[str, int] = field(default_factory=dict)


class _Gate:
    """Called at a request's send instant (on the dispatcher thread for a timed send): stamps
    the send, then applies the in-flight ceiling (in flight = written and not yet ended)."""

    __slots__ = ("a", "block", "st", "lock", "ceiling", "gated", "sent")

    def __init__(
        self,
        a: Attempt,
        block: Arrivals | None,
        st: _State,
        lock: threading.Lock,
        ceiling: int | None,
    ) -> None:
        self.a, self.block, self.st, self.lock, self.ceiling = a, block, st, lock, ceiling
        self.gated = self.sent = False

    def __call__(self, now_ns: int) -> bool:
        a, st = self.a, self.st
        a.sent_ns = now_ns
        a.sent_realtime_ns = time.time_ns()
        self.gated = True
        with self.lock:
            if self.block is not None:
                self.block.decided += 1
            if self.ceiling is not None and st.in_flight >= self.ceiling:
                return False
            st.in_flight += 1
            st.sent += 1
            st.sent_measured += a.phase in MEASURED_PHASES
        self.sent = True
        return True


def _attempt(row: dict[str, Any], due_ns: int) -> Attempt:
    a = _plain_attempt(row, due_ns)
    turn = row.get("turn")
    if turn is not None and turn == turn and int(turn) >= 0:  # a session class's turn
        a.session, a.turn = int(row["session"]), int(turn)
    return a


def _plain_attempt(row: dict[str, Any], due_ns: int) -> Attempt:
    return Attempt(
        request_id=row["request_id"],
        seq=int(row["seq"]),
        klass=row["class"],
        phase=row["phase"],
        block=int(row["block"]),
        input_tokens=int(row["input_tokens"]),
        output_tokens_expected=int(row["output_tokens"]),
        scheduled_offset_ns=int(row["scheduled_offset_ns"]),
        due_ns=due_ns,
    )


class Run:
    """One point: the schedule, the client, the records, the series."""

    def __init__(
        self,
        schedule: pd.DataFrame,
        settings: LoadSettings,
        records_path: str | Path,
        *,
        prewarm: pd.DataFrame | None = None,
    ):
        self.schedule = schedule.reset_index(drop=True)
        self.prewarm = prewarm
        self.s = settings
        self.writer = RecordWriter(records_path)
        if settings.shard is not None:
            self.writer.suffix = f',"shard":{int(settings.shard)}'
        self.state = _State()
        self.lateness_ns: list[int] = []
        self.loop_lag_ns: list[int] = []
        self.series: list[tuple[int, int, str, str, float]] = []
        self.t0_ns = 0
        self.t0_realtime_ns = 0
        self.blocks_sent = 0
        measured = self.schedule[self.schedule["phase"].isin(list(MEASURED_PHASES))]
        self._scheduled = {str(k): int(v) for k, v in measured["class"].value_counts().items()}
        # The progress figures, kept up to date as blocks are appended, never recomputed from
        # the frames while the load runs (a pandas pass at the clock's start delayed the first
        # sends by milliseconds).
        self._appended_measured = 0
        self._span_s: float | None = (
            float(measured["scheduled_offset_ns"].max()) / NS
            if settings.mode != "closed" and len(measured)
            else None
        )
        self.cut_at_max_duration = 0
        self._appended: list[pd.DataFrame] = []  # extension blocks (joined to the schedule)
        self._ahead: BlocksAhead | None = None  # extension blocks built ahead of the arrivals
        self.stopped_early = False
        self._decider = (
            Decider(settings.sequential, settings.min_successful_per_class)
            if settings.sequential is not None and settings.mode == "open"
            else None
        )
        self._requests: dict[str, httpx.Request] = {}
        self._client: httpx.AsyncClient | None = None
        # Counters the dispatcher thread updates too (at a timed send) are changed under it.
        self._lock = threading.Lock()
        self._dispatcher: Dispatcher | None = None
        self._placement: LoopPlacement | None = None
        self._own_transport = False
        self._lead_ns = 0
        self._stream: Arrivals | None = None
        self._builder = RequestBuilder(settings)
        # Session classes: later turns held until their predecessor ends.
        self._sessions = SessionTurns()
        self.writer.secrets = self._builder.secrets
        # Interrupts: the signal's name once one came, when, and the tasks sending a request.
        self.interrupted: str | None = None
        self._interrupt_ns = 0
        self._halt: asyncio.Event | None = None
        self._active: set[asyncio.Task] = set()
        self.cancelled_in_flight = 0
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.collector = QuietCollector()

    # -- request construction --------------------------------------------------------------

    def _request(self, row: dict[str, Any]) -> httpx.Request | None:
        assert self._client is not None
        if is_dependent(row):
            return None  # its prompt holds the previous answer: built when that has come
        return self._builder.request(self._client, row)

    def _prepare(self, rows: list[dict[str, Any]]) -> None:
        """Build the requests (prompt text, JSON body, httpx.Request) before the clock starts,
        so dispatch never waits on them."""
        for row in rows:
            if (request := self._request(row)) is not None:
                self._requests[row["request_id"]] = request

    # -- one request -----------------------------------------------------------------------

    async def _send(
        self,
        client,
        row: dict[str, Any],
        due_ns: int,
        block: Arrivals | None = None,
        *,
        request: httpx.Request | None = None,
        capture: bool = False,
    ) -> Attempt | None:
        """Send one request and record it; its attempt (None: never sent, interrupted)."""
        if self.interrupted is not None:
            return None  # started after the interrupt: never sent
        a = _attempt(row, due_ns)
        if capture:
            a.text = []
        request = request or self._requests.pop(a.request_id, None) or self._request(row)
        assert request is not None
        cancel_after = int(row.get("cancel_after_ns", -1))
        # Until the request is written (it may be prepared ahead of its due time): a request
        # that never is (no connection) keeps the later of now and its due time.
        now = time.perf_counter_ns()
        a.sent_ns = max(now, due_ns)
        a.sent_realtime_ns = time.time_ns() + a.sent_ns - now
        gate = _Gate(a, block, self.state, self._lock, self.s.max_in_flight)
        if self._own_transport:
            request.extensions[SENT_HOOK] = gate
            if due_ns and self._lead_ns:
                request.extensions[SEND_AT] = due_ns
        elif not gate(time.perf_counter_ns()):
            self._reject(a)
            return a
        limit_s = self.s.request_timeout_s
        cancel_s = cancel_after / NS if cancel_after >= 0 else None
        deadline_s = min(limit_s, cancel_s) if cancel_s is not None else limit_s
        # Both limits count from the send, not from the early preparation of a timed send.
        deadline_s += max(0, due_ns - time.perf_counter_ns()) / NS
        # Registered for the interrupt (which cancels it) from here to its end.
        task = asyncio.current_task()
        assert task is not None
        self._active.add(task)
        record = True
        try:
            async with asyncio.timeout(deadline_s):
                await self._exchange(client, request, a)
        except RequestWithdrawn:
            self._reject(a)
            return a
        except asyncio.CancelledError:
            if self.interrupted is None:
                raise  # not the interrupt's: the run is being torn down
            task.uncancel()  # the interrupt's cancellation ends here, with the request
            # In flight once written or due (its connection opening); else never sent.
            record = gate.gated or a.due_ns <= self._interrupt_ns
            if record:
                self.cancelled_in_flight += 1
                a.status = "cancelled"
                a.error = f"interrupted by {self.interrupted} ({_phase(a, gate)})"
        except TimeoutError:
            cancelled = cancel_s is not None and cancel_s <= limit_s
            a.status = "cancelled" if cancelled else "timeout"
            a.error = (
                f"cancelled by policy after {cancel_s:.3f} s"
                if cancelled
                else f"no complete response within {limit_s:.3f} s ({_phase(a, gate)})"
            )
        except httpx.TimeoutException as exc:  # a transport's backstop: a timeout all the same
            a.status = "timeout"
            a.error = f"{type(exc).__name__}: {exc} ({_phase(a, gate)})"
        except httpx.HTTPError as exc:
            a.status = "error"
            a.error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a failed request is data, never a crash
            a.status = "error"
            a.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._active.discard(task)
            if record and (a.status != "rejected" or a.http_status is not None):
                self._settle(a, gate, block)
        return a if record else None

    async def _session(
        self, client, row: dict[str, Any], due_ns: int, block: Arrivals | None = None
    ) -> None:
        """Send ``row``; when it starts a session, then each later turn in order, each due its
        think time after the previous turn ended, carrying the conversation so far
        (:mod:`capacity_pack.measure.sessions`). A turn that does not end ``ok`` or an interrupt
        ends the session: the rest are listed as never sent."""
        later = self._sessions.take(row)
        a = await self._send(client, row, due_ns, block, capture=bool(later))
        if not later:
            return
        contents = [self._builder.prompt(row)]
        for k, nxt in enumerate(later):
            held = self._held_back()
            if held is None and (a is None or a.status != "ok"):
                status, error = (a.status, a.error) if a is not None else (None, None)
                held = "session_ended", end_reason(status, error, int(nxt["turn"]) - 1)
            if held is not None:
                self._sessions.skip(later[k:], *held)
                return
            assert a is not None and self._client is not None
            contents += [answer_text(a.text), self._user_message(nxt)]
            request = self._builder.session_request(self._client, nxt, contents)
            due = a.end_ns + int(nxt["think_ns"])
            timed = self.s.mode != "closed"
            if timed:
                nxt = {**nxt, "scheduled_offset_ns": due - self.t0_ns}
            # A timed send is handed to the dispatcher a lead early (as the arrivals are).
            wait_ns = due - (self._lead_ns if timed else 0) - time.perf_counter_ns()
            if wait_ns > 0:
                await asyncio.sleep(wait_ns / NS)
            if (held := self._held_back()) is not None:
                self._sessions.skip(later[k:], *held)
                return
            a = await self._send(
                client, nxt, due if timed else 0, request=request, capture=k + 1 < len(later)
            )

    def _held_back(self) -> tuple[str, str] | None:
        """Why no further turn may be sent now (an interrupt), or None. An early stop of the
        arrivals starts no new session, but the sessions under way go on to their last turn,
        as their users would."""
        if self.interrupted is not None:
            return "interrupted", f"interrupted by {self.interrupted}"
        return None

    def _user_message(self, row: dict[str, Any]) -> str:
        return self._builder.user_message(row)

    async def _exchange(self, client, request: httpx.Request, a: Attempt) -> None:
        """Send the request, read its response into ``a``."""
        resp = await client.send(request, stream=True)
        try:
            a.http_status = resp.status_code
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                a.status = "rejected" if resp.status_code in (429, 503) else "error"
                a.error = f"HTTP {resp.status_code}: {_error_message(text)}"
            else:
                await self._consume(resp, a)
        finally:
            await resp.aclose()
            unbind(resp)

    def _settle(self, a: Attempt, gate: _Gate, block: Arrivals | None) -> None:
        """The request ended (any way but the ceiling's refusal): stamp, count, record it."""
        st = self.state
        a.end_ns = time.perf_counter_ns()
        a.end_realtime_ns = time.time_ns()
        with self._lock:
            if gate.sent:
                st.in_flight -= 1
            else:
                st.sent += 1  # attempted, never written (no connection, cancelled)
                st.sent_measured += a.phase in MEASURED_PHASES
                if block is not None and not gate.gated:
                    block.decided += 1
        self._finish(a)

    def _reject(self, a: Attempt) -> None:
        """The client's in-flight ceiling refused the request at its send time."""
        a.status = "rejected"
        a.error = f"client in-flight ceiling {self.s.max_in_flight} reached"
        a.end_ns, a.end_realtime_ns = a.sent_ns, a.sent_realtime_ns
        self._finish(a)

    async def _consume(self, resp, a: Attempt) -> None:
        reader = SSEReader(chat=self.s.endpoint == "chat_completions")
        st = self.state
        body = resp.extensions.get(BODY_EXTENSION)
        if body is not None and resp.headers.get("content-encoding", "identity") == "identity":
            # Our transport: each read is parsed in the connection's read callback, stamped
            # with its kernel receive time.
            def sink(now_ns: int, data: bytes) -> bool:
                st.streamed_tokens += reader.feed(data, now_ns, a)
                return reader.ended

            await body.feed(sink)
            if not reader.ended:
                st.streamed_tokens += reader.close(time.perf_counter_ns(), a)
        else:
            chunks = resp.aiter_bytes()
            async for data in chunks:
                st.streamed_tokens += reader.feed(data, time.perf_counter_ns(), a)
                if reader.ended:
                    break
            else:
                st.streamed_tokens += reader.close(time.perf_counter_ns(), a)
            if reader.done:
                # Read the body's end (it follows [DONE] at once): httpcore keeps only a
                # connection whose response was read to the end, else every request reconnects.
                with contextlib.suppress(httpx.HTTPError, TimeoutError):
                    async with asyncio.timeout(DRAIN_GRACE_S):
                        async for _ in chunks:
                            pass
        if reader.failed:
            return
        if reader.done and body is not None:
            # The response is over for us; its last bytes may trail: reuse the connection if
            # they arrive, instead of closing it (a new connection per request costs both sides).
            body.reuse_when_complete = True
        got = sum(a.chunk_tokens)
        if not reader.done:
            a.status, a.error = "error", f"stream ended without [DONE] after {got} tokens"
        elif a.completion_tokens is not None and a.completion_tokens != got:
            a.status = "error"
            a.error = f"usage reports {a.completion_tokens} completion tokens, stream carried {got}"
        elif got != a.output_tokens_expected:
            a.status = "error"
            a.error = f"output_tokens {got} != the scheduled {a.output_tokens_expected}"
        else:
            a.status = "ok"

    def _finish(self, a: Attempt) -> None:
        st = self.state
        if a.due_ns:
            self.lateness_ns.append(a.sent_ns - a.due_ns)
        st.finished += 1
        if a.status != "ok":
            st.failed += 1
        if a.phase in MEASURED_PHASES:
            st.terminal_by_class[a.klass] = st.terminal_by_class.get(a.klass, 0) + 1
            if a.status == "ok":
                st.ok_by_class[a.klass] = st.ok_by_class.get(a.klass, 0) + 1
            if self._decider is not None:
                self._decider.record(a)
        self.writer.write(a.to_json(self.t0_ns, self.t0_realtime_ns))

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

    # -- entry point ---------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        # The dispatcher thread must get the GIL promptly when an arrival is due.
        old_switch = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        own, limits, timeout = self._http_options()
        loop = asyncio.get_running_loop()
        self._halt = asyncio.Event()
        # This (the loop's) thread and the dispatcher thread on CPUs of their own.
        self._placement = LoopPlacement(self.s.pin_threads, self.s.cpu_part)
        self._dispatcher = Dispatcher(
            loop,
            realtime=self.s.realtime_dispatch,
            idle=self.collector.idle,
            cpu=self._placement.bind(),
        )
        self._dispatcher.start()
        transport = PlainHTTPTransport(limits, scheduler=self._dispatcher) if own else None
        # TLS as the target says (the https:// default transport; ours serves http only).
        verify = verify_setting(self.s.tls_verify, self.s.ca_bundle)
        self._own_transport = own
        self._lead_ns = LEAD_NS if self._own_transport and self.s.mode != "closed" else 0
        stop = asyncio.Event()

        def on_signal(signum: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the run is over anyway
                loop.call_soon_threadsafe(self._interrupt, signum)

        try:
            with catch_signals(on_signal):
                await self._client_run(transport, limits, timeout, verify, stop)
        finally:
            stop.set()
            self._dispatcher.stop()
            self._placement.restore()
            sys.setswitchinterval(old_switch)
            self.writer.close()
        self.wall_s = (time.perf_counter_ns() - self.t0_ns) / NS
        return self.summary()

    async def _client_run(self, transport, limits, timeout, verify, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(
            transport=transport,
            limits=limits,
            timeout=timeout,
            verify=verify,
            # A compressed event stream would hold events back in the server's compressor.
            # The key goes to every request, /metrics scrapes included (llama-server guards
            # /metrics with it).
            headers={"Accept-Encoding": "identity", **self._builder.auth},
            # Requests are independent: no cookie (a load balancer's stickiness) carries over.
            cookies=_NoCookies(),
        ) as client:
            self._client = client
            await self._measure(client, stop)

    def _interrupt(self, signum: int) -> None:
        """SIGINT or SIGTERM (on the loop): stop dispatching, end every request in flight; each
        records itself as cancelled (``_send``), and the run then ends as usual."""
        if self.interrupted is not None:
            return  # a second signal: already stopping (Ctrl-C reaches a shard twice)
        self.interrupted = signal.Signals(signum).name
        self._interrupt_ns = time.perf_counter_ns()
        if self._dispatcher is not None:
            self._dispatcher.halt()
        if self._halt is not None:
            self._halt.set()
        for task in list(self._active):
            task.cancel()

    def _http_options(self) -> tuple[bool, httpx.Limits, httpx.Timeout]:
        """Whether our transport serves the run, and the client's pool limits and timeouts."""
        choice = self.s.transport
        own = choice == "capacity_pack" or (
            choice == "auto" and self._builder.url.startswith("http://")
        )
        limits = httpx.Limits(
            max_connections=None,
            # httpcore's pool scans every connection, and polls every idle one, for each idle
            # one on every request: unbounded, that grows quadratically and melts the client
            # past ~100 RPS. Bounding the idle pool only closes surplus idle connections; new
            # ones still open whenever needed. Our transport keeps every idle connection.
            max_keepalive_connections=None if own else HTTPX_MAX_IDLE_CONNECTIONS,
            # Under the 5 s keep-alive timeout of uvicorn (vLLM, SGLang, the simulator), so an
            # idle connection is dropped here before the server can close it under a request.
            keepalive_expiry=4.0,
        )
        # Every phase is bounded by the request's overall deadline (``_send``); these only back
        # it up, so a slow phase always reads as the timeout it is.
        timeout = httpx.Timeout(self.s.request_timeout_s + BACKSTOP_S)
        return own, limits, timeout

    async def _measure(self, client, stop: asyncio.Event) -> None:
        """Prepare every request, prewarm, start the clock and the watchers, send the load."""
        rows = self.schedule.to_dict("records")
        self._prepare(rows)
        make, limit = self.s.extension_block, self.s.maximum_duration_s
        if make is not None and limit is not None and self.s.mode != "closed" and len(rows):
            first = int(self.schedule["block"].max()) + 1
            # Before the clock: the blocks of the span most points are decided in (the
            # minimum duration and two leads); the rest only if the run gets that far.
            minimum = self._decider.settings.minimum_duration_s if self._decider else limit
            self._ahead = BlocksAhead(
                make, first, limit, self._request,
                prebuilt_s=min(limit, minimum + 2 * BUILD_AHEAD_S), lead_s=BUILD_AHEAD_S,
            )  # fmt: skip
        if self.prewarm is not None and len(self.prewarm) and self.interrupted is None:
            await asyncio.gather(
                *(self._send(client, r, 0) for r in self.prewarm.to_dict("records"))
            )
        # Everything allocated so far (pandas, the schedule, the bodies) is long-lived: frozen,
        # and no automatic collection until the load has ended (collector module).
        self.collector.start(quiet=self._own_transport)
        watchers: list[asyncio.Task] = []
        try:
            self._start_clock()
            self.collector.t0_ns = self.t0_ns
            # The client's CPU from the start on (a shard's wait for the others excluded).
            cpu0 = time.process_time()
            watchers = self._watchers(client, stop)
            if self.interrupted is not None:
                pass  # interrupted before the clock started: nothing is sent
            elif self.s.mode == "closed":
                self.blocks_sent = int(self.schedule["block"].max()) if len(rows) else 0
                await self._closed_loop(client, rows)
                await self._extend_closed(client)
            else:
                self.blocks_sent = int(self.schedule["block"].max()) if len(rows) else 0
                await self._open_loop(client, rows, self.t0_ns)
                if self._decider is not None and not self.stopped_early:
                    # The outcome at the final counts (the offline analysis computes the same).
                    self._decider.look(time.perf_counter_ns() - self.t0_ns)
            stop.set()
            await asyncio.gather(*watchers)
            self.cpu_s = time.process_time() - cpu0
        finally:
            stop.set()
            for w in watchers:
                w.cancel()
            if self._ahead is not None:
                await self._ahead.close()
            self.collector.stop()

    def _start_clock(self) -> None:
        if self.s.start_at is not None and self.interrupted is None:
            # A shared start (realtime) mapped onto this process's monotonic clock.
            start_rt = int(self.s.start_at())
            mono, rt = time.perf_counter_ns(), time.time_ns()
            self.t0_ns = mono + (start_rt - rt)
            self.t0_realtime_ns = start_rt
        else:
            # The clock starts one lead ahead, so even the first arrivals are prepared early.
            self.t0_ns = time.perf_counter_ns() + self._lead_ns
            self.t0_realtime_ns = time.time_ns() + self._lead_ns

    def _watchers(self, client, stop: asyncio.Event) -> list[asyncio.Task]:
        """The tasks beside the load: lag ticker, scraper, progress line, side tasks."""
        watchers = [
            asyncio.create_task(lag_monitor(self, stop)),
            asyncio.create_task(scraper(self, client, stop)),
        ]
        if self.s.progress:
            watchers.append(asyncio.create_task(progress(self, stop)))
        if self.s.report is not None:
            watchers.append(asyncio.create_task(progress_lines(self, stop, self.s.report)))
        if self.s.side_tasks is not None:
            watchers += [asyncio.create_task(c) for c in self.s.side_tasks(self, stop)]
        return watchers

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

    @property
    def decider(self) -> Decider | None:
        """The in-run decision's counts (open-loop rate points), or None."""
        return self._decider

    def measured_total(self) -> int:
        """Requests scheduled in the measured window so far (extension blocks included)."""
        return sum(self._scheduled.values()) + self._appended_measured

    def measured_span_s(self) -> float | None:
        """Seconds from the clock's start to the last measured arrival scheduled so far (open
        loop; None for a closed loop, whose arrivals follow the responses)."""
        return self._span_s

    def series_frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            self.series, columns=["t_offset_ns", "realtime_ns", "source", "metric", "value"]
        )

    def summary(self) -> dict[str, Any]:
        st = self.state
        scheduled = len(self.schedule) + (len(self.prewarm) if self.prewarm is not None else 0)
        d = self._dispatcher
        return {
            "mode": self.s.mode,
            "concurrency": self.s.concurrency,
            "requests_recorded": self.writer.count,
            "sent": st.sent,
            "finished": st.finished,
            "failed": st.failed,
            "ok_by_class": st.ok_by_class,
            "terminal_by_class": st.terminal_by_class,
            "streamed_tokens": st.streamed_tokens,
            "wall_s": self.wall_s,
            "client_cpu_s": self.cpu_s,
            "client_cpu_ms_per_1k_tokens": (
                1000 * self.cpu_s / st.streamed_tokens * 1000 if st.streamed_tokens else None
            ),
            **health(
                self.lateness_ns,
                self.loop_lag_ns,
                self.s,
                "capacity_pack" if self._own_transport else "httpx",
                d.scheduling if d is not None else None,
                d.scheduling_detail if d is not None else None,
            ),
            "thread_placement": (
                self._placement.report(d) if self._placement is not None else None
            ),
            **self.collector.summary(),
            "extension_blocks": max(0, self.blocks_sent - 1),
            # Blocks built before the clock and by a worker thread during the run.
            "extension_blocks_built": (
                {"before_clock": self._ahead.prebuilt, "in_run": self._ahead.in_run}
                if self._ahead is not None
                else None
            ),
            "cut_at_max_duration": self.cut_at_max_duration,
            "under_sampled_classes": self._short_classes(projected=False),
            "stopped_early": self.stopped_early,
            # With the later turns of the sessions never started (they follow in the schedule).
            "unsent_requests": (
                self._stream.unsent() + (self._sessions.unstarted() if self._stream.stopped else 0)
                if self._stream is not None
                else 0
            ),
            **(self._sessions.summary() if self._sessions.seen else {}),
            "sequential": self._decider.summary() if self._decider is not None else None,
            "interrupted": interruption(
                self.interrupted, scheduled, self.writer.count, self.cancelled_in_flight
            ),
        }


class _NoCookies(http.cookiejar.CookieJar):
    """A cookie jar that keeps nothing."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def set_cookie(self, cookie: Any) -> None:
        return None


def _phase(a: Attempt, gate: _Gate) -> str:
    """Where a request was when it ended early, for its error text."""
    if a.http_status is not None:
        return f"reading the body, {sum(a.chunk_tokens)} tokens received"
    if gate.sent:
        return "no response head yet"
    return "connecting, request not written"


def _error_message(text: str) -> str:
    try:
        err = json.loads(text).get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))[:500]
        return str(err)[:500]
    except (ValueError, AttributeError):
        return text[:500]


def run_point(
    schedule: pd.DataFrame,
    settings: LoadSettings,
    records_path: str | Path,
    *,
    metrics_path: str | Path | None = None,
    summary_path: str | Path | None = None,
    prewarm: pd.DataFrame | None = None,
    extra_summary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one point to completion; write records (streamed), metrics parquet and summary.

    Interrupted (SIGINT, SIGTERM), it writes them all the same, then raises
    :class:`~capacity_pack.measure.interrupt.Interrupted` carrying the summary."""
    run = Run(schedule, settings, records_path, prewarm=prewarm)
    summary = asyncio.run(run.run())
    summary.update(extra_summary or {})
    if metrics_path is not None:
        frame = run.series_frame()
        with atomic_path(metrics_path) as tmp:
            frame.to_parquet(tmp, index=False)
    if summary_path is not None:
        write_json_atomic(summary_path, finite_or_none(summary))
    if run.interrupted is not None:
        raise Interrupted(run.interrupted, summary)
    return summary
