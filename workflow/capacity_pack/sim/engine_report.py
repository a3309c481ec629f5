"""What a simulated replica reports: its ground-truth log and its ``/metrics`` families.

- Ground truth (:class:`GroundTruthLog`, one JSON object per line, appended as each request
  ends; several replicas may share the file): per request, arrival (request read), scheduled
  (left the queue), first and last token (emitted by the engine), first and last token sent
  (handed to the HTTP transport), finished, tokens, finish reason, cached tokens and
  preemptions, as Unix-epoch nanoseconds (:func:`capacity_pack.sim.pacing.epoch_ns`).
  :class:`RequestContext` holds the server-side facts about one request that the line carries.
- Metrics (:class:`EngineMetrics`, a base of :class:`capacity_pack.sim.engine.Engine`): vLLM's
  families under vLLM's names, help texts and labels, then the simulator's own ``sim:``
  families, read from the engine's scheduler, histograms and counters.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from capacity_pack.sim import metrics as m
from capacity_pack.sim.pacing import CLOCK_OFFSET_NS, epoch_ns
from capacity_pack.sim.scheduler import SimRequest


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


def ground_truth_record(
    req: SimRequest | None, ctx: RequestContext, arrival_ns: int, replica: int | None
) -> dict[str, Any]:
    """One request's ground-truth line (``req`` None: refused before it was queued)."""
    rec: dict[str, Any] = {
        "request_id": ctx.client_request_id,
        "replica": replica,
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
    return rec


class EngineMetrics:
    """The engine's ``/metrics`` exposition, a base of :class:`capacity_pack.sim.engine.Engine`
    whose scheduler (``sched``), profile, histograms and counters it reads."""

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
