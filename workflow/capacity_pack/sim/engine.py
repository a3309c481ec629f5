"""The live engine: the scheduler stepped on the wall clock, faults, metrics and ground truth.

Step ``k`` starts at ``S_k`` with its tokens due at ``D_k = S_k + step_time_k``; the next step
starts at ``D_k`` while there is work, so a late wake-up never accumulates drift, and
``lateness = wake - D_k`` goes into ``sim:step_lateness_seconds``. Tokens are stamped with the
real wake time in the ground-truth log. Faults: :class:`Faults`. Method: docs/reference.md,
'The engine's clock, ground truth and faults'.

Module map: :mod:`capacity_pack.sim.pacing` holds the clock, the deadline timer and the GC
settings of a serving process; :mod:`capacity_pack.sim.engine_report` the ground-truth log and
the ``/metrics`` families (:class:`~capacity_pack.sim.engine_report.EngineMetrics`, a base of
:class:`Engine`); this module the engine itself, its faults and its admission checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import signal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.sim import metrics as m
from capacity_pack.sim.engine_report import (
    EngineMetrics,
    GroundTruthLog,
    RequestContext,
    ground_truth_record,
)
from capacity_pack.sim.pacing import (
    DeadlineTimer,
    collect_young,
    mono_ns,
)
from capacity_pack.sim.profile import Profile
from capacity_pack.sim.scheduler import FINISHED, Scheduler, SimRequest, Step

log = logging.getLogger("capacity_pack.sim")

FINISH_REASONS = ("stop", "length", "abort")


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


class Engine(EngineMetrics):
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
        self.ground_truth.write(ground_truth_record(req, ctx, arrival_ns, self.replica))

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
