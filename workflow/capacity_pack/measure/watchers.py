"""The tasks that watch a run beside its load: event-loop lag, the /metrics series, progress.

Each takes the :class:`capacity_pack.measure.run.Run` it watches and the run's stop event.

- **Loop lag**: a 10 ms ticker's wake-up delay beyond its period (epoll rounds timeouts up to
  whole milliseconds, so lag beyond that is the loop's).
- **Series**: every ``metrics_interval_s`` from the clock's start, the client's own backlog
  (in flight, due but unsent, finished, streamed tokens) and, unless ``scrape_metrics`` is
  off, the server's ``/metrics`` through :func:`capacity_pack.engines.signals.parse_metrics`;
  a failed scrape is a ``scrape_failed`` sample, a gap, never a crash.
- **Progress** (:func:`progress_text`), over the measured window only (warm-up and prefix
  prewarm requests are not counted): elapsed and scheduled seconds with the time left (open
  loop: to the schedule's last arrival; closed loop: the requests left at the rate so far),
  sent/scheduled, finished, failed, in flight, successful requests per second and, with an
  in-run decision, requests within their SLO per second (goodput so far) and the decision so
  far, and the recent dispatch lateness p99. A live line on stderr each second
  (``capacity-pack load --progress``), or, for a pipeline job, one line every
  max(10 s, scheduled duration / 20) to ``settings.report``, and one when the load ends: at
  most about 20 lines a point.
- **Health** (:func:`health`, for the summary): dispatch lateness and loop lag percentiles,
  the transport, the dispatcher's scheduling, and ``client_bound``: lateness p99 above
  ``client.lateness_bound_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

import numpy as np

from capacity_pack.engines.signals import parse_metrics
from capacity_pack.measure.clock import realtime_at
from capacity_pack.measure.collector import unbind

NS = 1_000_000_000


async def lag_monitor(run: Any, stop: asyncio.Event) -> None:
    period = 0.010
    while not stop.is_set():
        before = time.perf_counter_ns()
        await asyncio.sleep(period)
        run.loop_lag_ns.append(max(0, time.perf_counter_ns() - before - int(period * NS)))


async def scraper(run: Any, client, stop: asyncio.Event) -> None:
    url = f"{run.s.base_url}/metrics"
    interval = run.s.metrics_interval_s
    # The clock may start a little ahead (timed sends): the series starts with it.
    await asyncio.sleep(max(0, run.t0_ns - time.perf_counter_ns()) / NS)
    next_t = time.perf_counter()
    while True:
        t_ns = time.perf_counter_ns()
        rt_ns = realtime_at(t_ns)
        st = run.state
        rel = t_ns - run.t0_ns
        run.series += [
            (rel, rt_ns, "client", "in_flight", float(st.in_flight)),
            (rel, rt_ns, "client", "due_unsent", float(run.due_unsent(t_ns))),
            (rel, rt_ns, "client", "finished", float(st.finished)),
            (rel, rt_ns, "client", "streamed_tokens", float(st.streamed_tokens)),
        ]
        if run.s.scrape_metrics:
            try:
                resp = await client.get(url, timeout=max(0.5, interval))
                unbind(resp)  # read and closed: freed at once, not by the collector
                if resp.status_code == 200:
                    for key, val in parse_metrics(resp.text).items():
                        run.series.append((rel, rt_ns, "server", key, val))
            except Exception:  # a scrape failure is a gap in the series, not a crash
                run.series.append((rel, rt_ns, "client", "scrape_failed", 1.0))
        if stop.is_set():
            return
        next_t += interval
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_t - time.perf_counter()))


def progress_text(run: Any, elapsed_s: float, *, ended: bool = False) -> str:
    """The run's progress now, over its measured window (see the module docstring); once the
    load has ended, without the time left."""
    st = run.state
    total = run.measured_total()
    finished = sum(st.terminal_by_class.values())
    ok = sum(st.ok_by_class.values())
    scheduled_s = run.measured_span_s()
    if ended:
        left = None
    elif run.s.mode == "closed" or scheduled_s is None:
        left = (total - finished) * elapsed_s / finished if finished else None
    else:
        left = max(0.0, scheduled_s - elapsed_s)
    when = f"{elapsed_s:.0f} s" + (f", about {left:.0f} s left" if left is not None else "")
    late = np.percentile(run.lateness_ns[-500:], 99) / 1e6 if run.lateness_ns else 0.0
    rate = ok / elapsed_s if elapsed_s > 0 else 0.0
    parts = [
        when,
        f"sent {st.sent_measured}/{total}",
        f"finished {finished}",
        f"failed {finished - ok}",
        f"in flight {st.in_flight}",
        f"ok {rate:.1f}/s",
    ]
    decider = run.decider
    if decider is not None:
        within = sum(c.passed for c in decider.classes.values())
        parts.append(f"within SLO {within / elapsed_s if elapsed_s > 0 else 0.0:.1f}/s")
        parts.append(f"in-run {decider.decision}")
    parts.append(f"lateness p99 {late:.2f} ms")
    return ", ".join(parts)


async def progress(run: Any, stop: asyncio.Event) -> None:
    """The live line on stderr, rewritten each second."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        elapsed = max(0.0, (time.perf_counter_ns() - run.t0_ns) / NS)
        print(f"\r  {progress_text(run, elapsed)} ", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr, flush=True)


async def progress_lines(run: Any, stop: asyncio.Event, report: Any) -> None:
    """A line to ``report`` at a steady cadence, and a last one when the load ends."""
    span = run.measured_span_s() or 0.0
    interval = max(10.0, span / 20)
    label = f"{run.s.label}: " if run.s.label else ""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        elapsed = max(0.0, (time.perf_counter_ns() - run.t0_ns) / NS)
        if stop.is_set():
            report(f"{label}load ended: {progress_text(run, elapsed, ended=True)}")
            return
        report(label + progress_text(run, elapsed))


def health(
    lateness_ns: list[int],
    loop_lag_ns: list[int],
    settings: Any,
    transport: str,
    scheduling: str | None,
    scheduling_detail: str | None,
) -> dict[str, Any]:
    """The client-health fields of a run's summary (milliseconds)."""
    late = np.array(lateness_ns, dtype=float) / 1e6
    lag = np.array(loop_lag_ns, dtype=float) / 1e6

    def pct(x: np.ndarray, q: float) -> float | None:
        return float(np.percentile(x, q)) if x.size else None

    late_p99 = pct(late, 99)
    return {
        "dispatch_lateness_ms": {"p50": pct(late, 50), "p99": late_p99, "max": pct(late, 100)},
        "event_loop_lag_ms": {"p50": pct(lag, 50), "p99": pct(lag, 99), "max": pct(lag, 100)},
        "lateness_bound_ms": settings.lateness_bound_ms,
        "client_transport": transport,
        "dispatcher_scheduling": scheduling,
        "realtime_dispatch": {
            "requested": settings.realtime_dispatch,
            "in_effect": scheduling == "SCHED_FIFO",
            "detail": scheduling_detail,
        },
        "client_bound": late_p99 is not None and late_p99 > settings.lateness_bound_ms,
    }
