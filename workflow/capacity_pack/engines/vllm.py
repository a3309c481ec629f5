"""vLLM (``vllm serve``, the V1 engine).

Identity: ``GET /version`` -> ``{"version"}``; ``GET /v1/models`` cards ``owned_by "vllm"`` with
``max_model_len``; ``vllm:*`` series on ``/metrics``.

Metrics: V1's names, labelled ``model_name`` and ``engine`` (the data-parallel engine index,
hence the replica label). Older releases named the KV gauge ``gpu_cache_usage_perc`` and the
prefix-cache counters ``gpu_prefix_cache_*``; they are read when the new names are absent.
Histogram bucket bounds are vLLM's defaults (``vllm/v1/metrics/loggers.py``).

Cache: ``POST /reset_prefix_cache`` once the engine has drained; it answers 200 with
``{"reset": false}`` (older releases: a plain 200) while blocks are still in use, so it is
called again until it does not refuse. Tokenize: ``POST /tokenize`` ``{"model", "prompt",
"add_special_tokens"}`` -> ``{"count", "tokens", "max_model_len"}`` (SGLang takes the same).
"""

from __future__ import annotations

from capacity_pack.engines.base import Engine, HttpReset, IdentityEndpoint, TokenizeFormat
from capacity_pack.engines.metric_map import EngineMetrics
from capacity_pack.engines.registry import register

TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip

RESET = HttpReset(
    name="vllm",
    path="/reset_prefix_cache",
    refused_key="reset",
    describe="vLLM's POST /reset_prefix_cache",
)
TOKENIZE = TokenizeFormat(
    name="openai",
    body=lambda model, text: {"model": model, "prompt": text, "add_special_tokens": False},
)
SIGNALS = {
    "queue_depth": ("vllm:num_requests_waiting",),
    "running": ("vllm:num_requests_running",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "prefix_cache_queries": (
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:prefix_cache_queries",
    ),
    "prefix_cache_hits": (
        "vllm:prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_hits_total",
        "vllm:prefix_cache_hits",
    ),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
}
METRICS = EngineMetrics(
    waiting="vllm:num_requests_waiting",
    running="vllm:num_requests_running",
    kv_usage="vllm:kv_cache_usage_perc",
    prefix_hits="vllm:prefix_cache_hits_total",
    prefix_queries="vllm:prefix_cache_queries_total",
    preemptions="vllm:num_preemptions_total",
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
    request_success="vllm:request_success_total",
    finish_reason_label="finished_reason",
    abort_reason="abort",
    ttft_hist="vllm:time_to_first_token_seconds",
    ttft_buckets=TTFT_BUCKETS_S,
    itl_hist="vllm:inter_token_latency_seconds",
    itl_buckets=ITL_BUCKETS_S,
    e2e_hist="vllm:e2e_request_latency_seconds",
    queue_time_hist="vllm:request_queue_time_seconds",
    iteration_tokens_hist="vllm:iteration_tokens_total",
    # vLLM V1 labels every series with its data-parallel engine index.
    replica_label="engine",
)

ENGINE = register(
    Engine(
        kind="vllm",
        owned_by=("vllm",),
        families=("vllm:",),
        identity=(IdentityEndpoint(paths=("/version",), version="version"),),
        signals=SIGNALS,
        metrics=METRICS,
        resets=(RESET,),
        tokenize=TOKENIZE,
    )
)
