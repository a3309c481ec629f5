"""The live engine: the scheduler stepped on the wall clock, faults, metrics and ground truth.

Timing. Step ``k`` starts at ``S_k`` and its tokens are due at the absolute deadline
``D_k = S_k + step_time_k`` (CLOCK_MONOTONIC). The next step starts at ``S_{k+1} = D_k`` while
there is work, or at the arrival that ends an idle spell, so sleeping never accumulates drift:
a late wake-up shortens the next sleep instead of delaying every later token. The loop wakes
through :class:`DeadlineTimer`, a thread that sleeps on a condition variable (tens of
microseconds of precision; the event loop's own timers round up to whole milliseconds) and hands
the wake-up to the loop. ``lateness = wake - D_k`` goes into ``sim:step_lateness_seconds``: an
overloaded simulator shows there instead of silently stretching every latency.

Tokens are stamped with the real wake time, so the ground-truth log records what the server did,
lateness included. Per request the log holds (one JSON object per line, appended as each request
ends; ``*_ns`` are Unix-epoch nanoseconds taken from CLOCK_MONOTONIC plus an offset fixed at
start-up, ``clock_offset_ns``, so they never jump): arrival (request read), scheduled (left the
queue), first and last token (emitted by the engine), first and last token sent (handed to the
HTTP transport), finished, tokens, finish reason, cached tokens and preemptions.

Faults (:class:`Faults`, settable from the command line and ``POST /sim/faults``):

- ``error_rate``: that share of requests is answered at once with ``error_status`` (seeded draw);
- ``stall_every_s`` / ``stall_s``: the engine stops stepping for ``stall_s`` at the start of every
  ``stall_every_s`` period (``POST /sim/stall`` adds a one-off stall);
- ``disconnect_rate``: that share of streaming requests has its connection dropped after a
  seeded, uniformly drawn number of tokens in ``[1, max_tokens - 1]``, without ``[DONE]``;
- ``kv_capacity_fraction``: only that share of the KV blocks may be in use (preemptions follow);
- a hard kill (``POST /sim/kill``, ``--kill-after-s``): SIGKILL to the process itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.sim import metrics as m
from capacity_pack.sim.profile import Profile
from capacity_pack.sim.scheduler import FINISHED, RUNNING, Scheduler, SimRequest, Step

log = logging.getLogger("capacity_pack.sim")

mono_ns = time.monotonic_ns
CLOCK_OFFSET_NS = time.time_ns() - time.monotonic_ns()
FINISH_REASONS = ("stop", "length", "abort")


def epoch_ns(mono: int | None) -> int | None:
    return None if mono is None else mono + CLOCK_OFFSET_NS


class Faults(BaseModel):
    """Fault knobs; every field can be changed while the server runs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    error_rate: float = Field(default=0.0, ge=0, le=1, description="Share of requests failed.")
    error_status: Literal[429, 500, 502, 503] = Field(
        default=500, description="HTTP status of an injected error."
    )
    stall_every_s: float = Field(default=0.0, ge=0, description="Stall period (0: no stalls).")
    stall_s: float = Field(default=0.0, ge=0, description="Length of each periodic stall.")
    disconnect_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of streams cut mid-stream."
    )
    kv_capacity_fraction: float = Field(
        default=1.0, gt=0, le=1, description="Share of KV blocks usable."
    )


class Rejected(Exception):
    """A request refused before queueing: carries its HTTP status and OpenAI error type."""

    def __init__(self, status: int, err_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.message = message


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


class RequestContext:
    """Server-side facts about one request, kept beside the engine state for the log."""

    __slots__ = (
        "client_request_id",
        "endpoint",
        "stream",
        "status",
        "error",
        "disconnect_after",
        "disconnected",
        "first_sent_ns",
        "last_sent_ns",
        "logged",
    )

    def __init__(self, client_request_id: str, endpoint: str, stream: bool) -> None:
        self.client_request_id = client_request_id
        self.endpoint = endpoint
        self.stream = stream
        self.status = 200
        self.error: str | None = None
        self.disconnect_after: int | None = None
        self.disconnected = False
        self.first_sent_ns: int | None = None
        self.last_sent_ns: int | None = None
        self.logged = False


class GroundTruthLog:
    """Append-only JSONL; one ``write`` per record, so replicas can share one file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        if self._fd is not None:
            line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
            os.write(self._fd, line.encode("utf-8"))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Engine:
    """One simulated replica: scheduler, wall-clock step loop, metrics, faults, ground truth."""

    def __init__(
        self,
        profile: Profile,
        *,
        model_name: str | None = None,
        seed: int = 0,
        faults: Faults | None = None,
        ground_truth: str | Path | None = None,
        engine_index: int = 0,
        replica: int | None = None,
        kill_after_s: float | None = None,
    ) -> None:
        self.profile = profile
        self.kill_after_s = kill_after_s
        self.model_name = model_name or profile.model.name
        self.engine_index = engine_index
        self.replica = replica
        self.sched = Scheduler(profile)
        self.faults = faults or Faults()
        self.sched.pool.set_capacity_fraction(self.faults.kv_capacity_fraction)
        self._fault_rng = random.Random(f"{seed}:faults")
        self._eos_rng = random.Random(f"{seed}:eos")
        self._seed = seed
        self._counter = 0
        self.ground_truth = GroundTruthLog(ground_truth) if ground_truth else None
        self.started_ns = mono_ns()
        self._stall_until_ns = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._timer: DeadlineTimer | None = None
        self._idle: asyncio.Future[None] | None = None
        self.dead: str | None = None
        self.accepting = True
        self._kill_handle: asyncio.TimerHandle | None = None
        # Metrics not held by the scheduler.
        self.ttft = m.Histogram(m.TTFT_BUCKETS_S)
        self.itl = m.Histogram(m.ITL_BUCKETS_S)
        self.e2e = m.Histogram(m.REQUEST_LATENCY_BUCKETS_S)
        self.queue_time = m.Histogram(m.REQUEST_LATENCY_BUCKETS_S)
        self.inference_time = m.Histogram(m.REQUEST_LATENCY_BUCKETS_S)
        token_buckets = m.build_1_2_5_buckets(profile.model.max_model_len)
        self.prompt_hist = m.Histogram(token_buckets)
        self.generation_hist = m.Histogram(token_buckets)
        self.iteration_tokens = m.Histogram(m.ITERATION_TOKENS_BUCKETS)
        self.lateness = m.Histogram(m.LATENESS_BUCKETS_S)
        # True in a server process: the loop runs the young collections itself, just after a
        # step's wake-ups, when the next deadline is a whole step away; left to the automatic
        # collector they land at random moments and a millisecond-long generation-1 pass
        # that straddles a deadline shows up as step lateness.
        self.collect_between_steps = False
        self.step_time = m.Histogram(m.STEP_BUCKETS_S)
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.rejected: dict[str, int] = {}
        self.faults_injected = {"error": 0, "disconnect": 0, "stall": 0}
        self.resets = {"done": 0, "refused": 0}
        self.steps = 0
        self.stall_s_total = 0.0
        self.requests_failed = 0

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._timer = DeadlineTimer(self._loop)
        self._task = self._loop.create_task(self._run_guarded(), name="sim-engine")
        if self.kill_after_s is not None:
            self.schedule_kill(self.kill_after_s)

    async def stop(self) -> None:
        self.accepting = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._timer is not None:
            self._timer.close()
        now = mono_ns()
        for req in [*self.sched.running, *self.sched.waiting]:
            self.sched.abort(req, now)
            self._wake(req)
        if self.ground_truth is not None:
            self.ground_truth.close()

    def schedule_kill(self, after_s: float) -> None:
        """SIGKILL this process ``after_s`` seconds from now (0: at once)."""
        if after_s <= 0:
            os.kill(os.getpid(), signal.SIGKILL)
        assert self._loop is not None, "the engine is not started"
        if self._kill_handle is not None:
            self._kill_handle.cancel()
        self._kill_handle = self._loop.call_later(after_s, os.kill, os.getpid(), signal.SIGKILL)

    def stall(self, seconds: float) -> None:
        """Stop stepping for ``seconds`` from now (a one-off latency stall)."""
        self._stall_until_ns = max(self._stall_until_ns, mono_ns() + int(seconds * 1e9))
        self.faults_injected["stall"] += 1

    def set_faults(self, faults: Faults) -> None:
        self.faults = faults
        self.sched.pool.set_capacity_fraction(faults.kv_capacity_fraction)

    @property
    def healthy(self) -> bool:
        return self.dead is None and self._task is not None and not self._task.done()

    # -- requests ---------------------------------------------------------------------------

    def submit(
        self,
        ctx: RequestContext,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        min_tokens: int = 0,
        ignore_eos: bool = True,
        stop_strings: tuple[str, ...] = (),
        seed: int | None = None,
        arrival_ns: int,
    ) -> SimRequest:
        """Queue a request, or raise :class:`Rejected` (admission control, injected error)."""
        if not self.healthy or not self.accepting:
            self.reject("not_running")
            raise Rejected(503, "ServiceUnavailableError", "the engine is not running")
        faults = self.faults
        if faults.error_rate and self._fault_rng.random() < faults.error_rate:
            self.faults_injected["error"] += 1
            raise Rejected(
                faults.error_status,
                _ERROR_TYPES.get(faults.error_status, "InternalServerError"),
                "injected fault: simulated engine error",
            )
        self.check_room(len(prompt_ids), max_tokens)
        sched = self.sched
        self._counter += 1
        eos_at = None
        if not ignore_eos:
            rng = random.Random(f"{self._seed}:{seed}") if seed is not None else self._eos_rng
            eos_at = _geometric(rng, self.profile.engine.eos_mean_output_tokens)
        out_seed = seed if seed is not None else self._counter
        req = SimRequest(
            ctx.client_request_id,
            prompt_ids,
            max_tokens,
            arrival_ns=arrival_ns,
            min_tokens=min_tokens,
            eos_at=eos_at,
            stop_strings=stop_strings,
            out_seed=out_seed,
        )
        req.ctx = ctx
        cut = faults.disconnect_rate
        if ctx.stream and cut and self._fault_rng.random() < cut:
            ctx.disconnect_after = self._fault_rng.randint(1, max(1, req.stop_at - 1))
        sched.add(req)
        idle = self._idle
        if idle is not None and not idle.done():
            idle.set_result(None)
        return req

    def check_room(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise :class:`Rejected` when the waiting queue is full or the request can never fit
        the usable KV blocks (the engine's own admission checks, live and in virtual time)."""
        sched = self.sched
        if len(sched.waiting) >= self.profile.engine.max_waiting_requests:
            self.reject("queue_full")
            raise Rejected(
                429,
                "RateLimitError",
                f"the waiting queue is full ({len(sched.waiting)} requests); retry later",
            )
        need = sched.blocks_needed(prompt_tokens + max_tokens)
        if need > sched.pool.capacity:
            self.reject("kv_capacity")
            raise Rejected(
                503,
                "ServiceUnavailableError",
                f"the request needs {need} KV blocks but only {sched.pool.capacity} are usable",
            )

    def abort(self, req: SimRequest) -> None:
        self.abort_at(req, mono_ns())

    def abort_at(self, req: SimRequest, now_ns: int) -> None:
        """Abort ``req`` at ``now_ns`` (the client went away), counted as finished."""
        if self.sched.abort(req, now_ns):
            self._on_finished(req)

    async def wait(self, req: SimRequest) -> None:
        """Until the request emits a token or finishes (or is woken by a disconnect)."""
        if req.status == FINISHED:
            return
        assert self._loop is not None
        fut = self._loop.create_future()
        req.waiter = fut
        await fut

    @staticmethod
    def _wake(req: SimRequest) -> None:
        listener = req.listener
        if listener is not None:
            listener()  # a stream writes its tokens now (never raises)
            return
        w = req.waiter
        if w is not None:
            req.waiter = None
            if not w.done():
                w.set_result(None)

    def record(self, req: SimRequest | None, ctx: RequestContext, arrival_ns: int) -> None:
        """Append the request's ground-truth line (once)."""
        if self.ground_truth is None or ctx.logged:
            return
        ctx.logged = True
        rec: dict[str, Any] = {
            "request_id": ctx.client_request_id,
            "replica": self.replica,
            "endpoint": ctx.endpoint,
            "stream": ctx.stream,
            "status": ctx.status,
            "error": ctx.error,
            "arrival_ns": epoch_ns(arrival_ns),
            "clock_offset_ns": CLOCK_OFFSET_NS,
        }
        if req is not None:
            rec.update(
                scheduled_ns=epoch_ns(req.scheduled_ns),
                first_token_ns=epoch_ns(req.first_token_ns),
                last_token_ns=epoch_ns(req.last_token_ns),
                finished_ns=epoch_ns(req.finished_ns),
                first_token_sent_ns=epoch_ns(ctx.first_sent_ns),
                last_token_sent_ns=epoch_ns(ctx.last_sent_ns),
                prompt_tokens=req.num_prompt,
                completion_tokens=req.num_output,
                max_tokens=req.max_tokens,
                cached_tokens=req.num_cached_tokens,
                preemptions=req.num_preemptions,
                finish_reason=req.finish_reason,
                disconnected=ctx.disconnected,
            )
        self.ground_truth.write(rec)

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def reset_prefix_cache(self) -> bool:
        ok = self.sched.pool.reset_prefix_cache()
        self.resets["done" if ok else "refused"] += 1
        if not ok:
            log.warning(
                "prefix cache reset refused: %d KV blocks are in use", self.sched.pool.num_used
            )
        return ok

    # -- the step loop ----------------------------------------------------------------------

    async def _run_guarded(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # a bug must not leave clients hanging on a dead loop
            self.dead = f"{type(err).__name__}: {err}"
            log.exception("simulated engine loop died")
            now = mono_ns()
            for req in [*self.sched.running, *self.sched.waiting]:
                self.sched.abort(req, now, "error")
                self._wake(req)
            raise

    def _stall_end(self, t_ns: int) -> int:
        """Start of the next step after ``t_ns`` once stalls are taken into account."""
        end = t_ns
        if self._stall_until_ns > end:
            end = self._stall_until_ns
        f = self.faults
        if f.stall_every_s > 0 and f.stall_s > 0:
            period = int(f.stall_every_s * 1e9)
            length = int(min(f.stall_s, f.stall_every_s) * 1e9)
            phase = (end - self.started_ns) % period
            if phase < length:
                end += length - phase
                self.faults_injected["stall"] += 1
        return end

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        sched = self.sched
        timer = self._timer
        assert timer is not None
        step_start: int | None = None
        wake = self._wake
        lateness = self.lateness
        while True:
            if not sched.has_work():
                step_start = None
                self._idle = loop.create_future()
                await self._idle
                self._idle = None
                continue
            if step_start is None:
                step_start = mono_ns()
            begin = self._stall_end(step_start)
            if begin != step_start:
                self.stall_s_total += (begin - step_start) / 1e9
                step_start = begin
                await timer.wait_until(step_start)
                continue  # requests may have been aborted during the stall
            step = self.begin_step(mono_ns())
            for req in step.failed:
                wake(req)
            if not step.reqs:
                step_start = None
                continue
            deadline = step_start + int(step.duration_s * 1e9)
            await timer.wait_until(deadline)
            now = mono_ns()
            late = now - deadline
            lateness.observe(late / 1e9 if late > 0 else 0.0)
            for req in self.end_step(step, now):
                wake(req)
            if self.collect_between_steps:
                collect_young()
            step_start = deadline

    def begin_step(self, now_ns: int) -> Step:
        """Schedule the next step at ``now_ns``; requests that can never fit fail here."""
        step = self.sched.schedule(now_ns)
        for req in step.failed:
            self.requests_failed += 1
            self._on_finished(req)
        return step

    def end_step(self, step: Step, now_ns: int) -> list[SimRequest]:
        """Complete ``step`` at ``now_ns`` with its metrics; returns the requests that emitted
        a token (the finished ones among them). The live loop and virtual time both call it."""
        self.step_time.observe(step.duration_s)
        self.iteration_tokens.observe(step.num_tokens)
        self.steps += 1
        emitted, finished = self.sched.complete(step, now_ns)
        ttft, itl = self.ttft, self.itl
        for req in emitted:
            if req.num_output == 1:
                ttft.observe((now_ns - req.arrival_ns) / 1e9)
            else:
                itl.observe((now_ns - req.prev_token_ns) / 1e9)
        for req in finished:
            self._on_finished(req)
        return emitted

    def _on_finished(self, req: SimRequest) -> None:
        reason = req.finish_reason if req.finish_reason in self.success else "abort"
        self.success[reason] += 1
        end = req.finished_ns or mono_ns()
        self.e2e.observe((end - req.arrival_ns) / 1e9)
        if req.scheduled_ns is not None:
            self.queue_time.observe((req.scheduled_ns - req.arrival_ns) / 1e9)
            self.inference_time.observe((end - req.scheduled_ns) / 1e9)
        self.prompt_hist.observe(req.num_prompt)
        self.generation_hist.observe(req.num_output)

    # -- observability ----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        pool = self.sched.pool
        return {
            "model": self.model_name,
            "profile": self.profile.name,
            "replica": self.replica,
            "healthy": self.healthy,
            "dead": self.dead,
            "running": len(self.sched.running),
            "waiting": len(self.sched.waiting),
            "kv_blocks_total": pool.num_blocks,
            "kv_blocks_usable": pool.capacity,
            "kv_blocks_used": pool.num_used,
            "kv_blocks_cached": pool.num_cached_blocks,
            "steps": self.steps,
            "faults": self.faults.model_dump(),
        }

    def metrics_text(self) -> str:
        """The ``/metrics`` exposition (:meth:`metrics_exposition`) as text."""
        return self.metrics_exposition().text()

    def metrics_exposition(self) -> m.Exposition:
        """The ``/metrics`` families: vLLM's under vLLM's names, help texts and labels
        (``model_name``, ``engine``), then the simulator's own ``sim:`` families."""
        base = [("model_name", self.model_name), ("engine", str(self.engine_index))]
        x = m.Exposition()
        self._vllm_counts(x, base)
        self._vllm_histograms(x, base)
        self._vllm_cache_config(x)
        self._sim_families(x, base)
        return x

    def _vllm_counts(self, x: m.Exposition, base: list[tuple[str, str]]) -> None:
        """vLLM's scheduler gauges and its token, preemption and request counters."""
        sched, pool = self.sched, self.sched.pool
        x.gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            [(base, len(sched.running))],
        )
        x.gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            [(base, len(sched.waiting))],
        )
        x.gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            [(base, pool.usage)],
        )
        x.counter(
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            [(base, sched.prefix_queries_tokens)],
        )
        x.counter(
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
            [(base, sched.prefix_hits_tokens)],
        )
        x.counter(
            "vllm:num_preemptions_total",
            "Cumulative number of preemption from the engine.",
            [(base, sched.num_preemptions)],
        )
        x.counter(
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            [(base, sched.prompt_tokens)],
        )
        x.counter(
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            [(base, sched.generation_tokens)],
        )
        x.counter(
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            [([*base, ("finished_reason", r)], n) for r, n in self.success.items()],
        )

    def _vllm_histograms(self, x: m.Exposition, base: list[tuple[str, str]]) -> None:
        """vLLM's per-request and per-step histograms."""
        x.histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            [(base, self.prompt_hist)],
        )
        x.histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            [(base, self.generation_hist)],
        )
        x.histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            [(base, self.iteration_tokens)],
        )
        x.histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            [(base, self.ttft)],
        )
        x.histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            [(base, self.itl)],
        )
        x.histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            [(base, self.e2e)],
        )
        x.histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            [(base, self.queue_time)],
        )
        x.histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            [(base, self.inference_time)],
        )

    def _vllm_cache_config(self, x: m.Exposition) -> None:
        """vLLM's ``cache_config_info``: the cache settings as labels of a constant 1."""
        pool = self.sched.pool
        x.gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            [
                (
                    [
                        ("block_size", str(pool.block_size)),
                        ("enable_prefix_caching", str(pool.enable_caching)),
                        ("engine", str(self.engine_index)),
                        ("gpu_memory_utilization", str(self.profile.engine.gpu_memory_utilization)),
                        ("num_gpu_blocks", str(pool.num_blocks)),
                    ],
                    1.0,
                )
            ],
        )

    def _sim_families(self, x: m.Exposition, base: list[tuple[str, str]]) -> None:
        """The simulator's own families: step timing, KV blocks, rejections, faults, resets."""
        pool = self.sched.pool
        x.histogram(
            "sim:step_lateness_seconds",
            "Wake-up time of the engine loop minus the step's deadline.",
            [(base, self.lateness)],
        )
        x.histogram(
            "sim:step_duration_seconds",
            "Modelled duration of each engine step.",
            [(base, self.step_time)],
        )
        x.gauge(
            "sim:kv_blocks_usable",
            "KV blocks that may be in use at once (reduced by the KV fault).",
            [(base, pool.capacity)],
        )
        x.gauge("sim:kv_blocks_total", "KV blocks of the profile.", [(base, pool.num_blocks)])
        x.gauge(
            "sim:kv_blocks_cached",
            "KV blocks holding a reusable prefix-cache hash.",
            [(base, pool.num_cached_blocks)],
        )
        x.counter(
            "sim:prefix_cache_evictions_total",
            "Cached KV blocks evicted from the free queue to make room.",
            [(base, pool.evictions)],
        )
        x.counter(
            "sim:requests_rejected_total",
            "Requests refused before queueing, by reason.",
            [([*base, ("reason", r)], n) for r, n in sorted(self.rejected.items())],
        )
        x.counter(
            "sim:requests_failed_total",
            "Queued requests failed because they can no longer fit in the KV cache.",
            [(base, self.requests_failed)],
        )
        x.counter(
            "sim:faults_injected_total",
            "Injected faults, by kind.",
            [([*base, ("kind", k)], n) for k, n in self.faults_injected.items()],
        )
        x.counter(
            "sim:stall_seconds_total",
            "Seconds the engine loop spent stalled by the stall fault.",
            [(base, self.stall_s_total)],
        )
        x.counter(
            "sim:prefix_cache_resets_total",
            "POST /reset_prefix_cache calls, by result (refused while blocks are in use).",
            [([*base, ("result", r)], n) for r, n in self.resets.items()],
        )
        x.counter("sim:steps_total", "Engine steps executed.", [(base, self.steps)])


_ERROR_TYPES = {
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
}


def _geometric(rng: random.Random, mean: float) -> int:
    """A draw >= 1 with the given mean: the position of the first EOS when each token is EOS
    with probability 1 / mean."""
    if mean <= 1:
        return 1
    u = rng.random()
    return 1 + int(math.log1p(-u) / math.log1p(-1.0 / mean))


__all__ = [
    "CLOCK_OFFSET_NS",
    "Engine",
    "Faults",
    "GroundTruthLog",
    "RUNNING",
    "Rejected",
    "RequestContext",
    "epoch_ns",
    "mono_ns",
]
