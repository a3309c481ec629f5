"""One measurement run: a point's schedule sent to an OpenAI-compatible endpoint, all recorded.

Open loop sends each request at its scheduled offset (the dispatcher thread), closed loop runs
N workers; one ``httpx.AsyncClient`` per run; one overall deadline per request from its due
time (the transports' timeouts a backstop past it, ``BACKSTOP_S``); no retries; ``ok`` only with
the class's exact output length. Method: docs/metrics.md, 'The load generator's client'.

Module map: this module holds the run (:class:`Run`: its client, clock, watchers and summary)
and :func:`run_point`; :mod:`capacity_pack.measure.send` one request's life (send, read,
record); :mod:`capacity_pack.measure.load_modes` the open and closed loops, in-run decisions and
extension blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.cookiejar
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pandas as pd

from capacity_pack.engines import verify_setting
from capacity_pack.io import atomic_path, finite_or_none, write_json_atomic
from capacity_pack.measure.arrivals import Arrivals, BlocksAhead
from capacity_pack.measure.clock import offset_ns, realtime_at
from capacity_pack.measure.collector import QuietCollector
from capacity_pack.measure.dispatcher import (
    LEAD_NS,
    SWITCH_INTERVAL_S,
    Dispatcher,
    LoopPlacement,
)
from capacity_pack.measure.interrupt import Interrupted, catch_signals, interruption
from capacity_pack.measure.load_modes import LoadModes
from capacity_pack.measure.payload import RequestBuilder
from capacity_pack.measure.records import RecordWriter
from capacity_pack.measure.send import MEASURED_PHASES, NS, RequestSending, RunState
from capacity_pack.measure.sequential import Decider
from capacity_pack.measure.sessions import SessionTurns, is_dependent
from capacity_pack.measure.settings import LoadSettings
from capacity_pack.measure.transport import PlainHTTPTransport
from capacity_pack.measure.watchers import health, lag_monitor, progress, progress_lines, scraper

# Idle keep-alive connections httpx's default transport may keep (see Run._http_options).
HTTPX_MAX_IDLE_CONNECTIONS = 32
# The transports' per-phase timeouts lie this far past the request's overall deadline: they
# only catch what the deadline somehow did not, and then still read as a timeout.
BACKSTOP_S = 1.0
# Extension blocks are built this far ahead of the clock (seconds of arrivals): a worker
# thread has that long to build the next block before the run wants it (capacity_pack.
# measure.arrivals.BlocksAhead); well over the 2 s extension lead.
BUILD_AHEAD_S = 5.0


class Run(RequestSending, LoadModes):
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
        self.state = RunState()
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
            self.t0_ns = start_rt - offset_ns()
            self.t0_realtime_ns = start_rt
        else:
            # The clock starts one lead ahead, so even the first arrivals are prepared early.
            self.t0_ns = time.perf_counter_ns() + self._lead_ns
            self.t0_realtime_ns = realtime_at(self.t0_ns)

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
