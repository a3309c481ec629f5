"""SGLang (``python -m sglang.launch_server``).

Identity: ``GET /get_server_info`` (newer releases: ``/server_info``) -> the server args,
``internal_states``, ``version`` and ``context_length``; ``GET /get_model_info`` ->
``model_path``, ``is_generation``; ``/v1/models`` cards ``owned_by "sglang"``; ``sglang:*``
series. The server args carry the server's own ``api_key``: the probe redacts secret-named
fields.

Metrics: scheduler gauges carry ``dp_rank`` under data parallelism; retraction is its preemption
(a running request pushed back to the queue when KV runs out). The prefix cache is a hit-rate
gauge, not counters; its tokenizer-side counters have no finish-reason label, and it exposes no
prefix-cache eviction counter. Bucket bounds are its defaults; a server started with custom
buckets needs overrides.

Cache: ``POST /flush_cache`` once the engine has drained (it refuses while requests run).
Tokenize: vLLM's ``POST /tokenize`` shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capacity_pack.engines.base import Engine, HttpReset, IdentityEndpoint
from capacity_pack.engines.metric_map import EngineMetrics
from capacity_pack.engines.registry import register
from capacity_pack.engines.vllm import TOKENIZE

TTFT_BUCKETS_S = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1,
    0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip


def _server_info(path: str, body: Any) -> str | None:
    if isinstance(body, Mapping) and "internal_states" in body:
        return f"{path} has SGLang's internal_states"
    return None


def _model_info(path: str, body: Any) -> str | None:
    if isinstance(body, Mapping) and {"model_path", "is_generation"} <= set(body):
        return f"{path} has model_path and is_generation"
    return None


METRICS = EngineMetrics(
    waiting="sglang:num_queue_reqs",
    running="sglang:num_running_reqs",
    kv_usage="sglang:token_usage",
    prefix_hit_rate="sglang:cache_hit_rate",
    preemptions="sglang:num_retracted_requests_total",
    prompt_tokens="sglang:prompt_tokens_total",
    generation_tokens="sglang:generation_tokens_total",
    ttft_hist="sglang:time_to_first_token_seconds",
    ttft_buckets=TTFT_BUCKETS_S,
    itl_hist="sglang:inter_token_latency_seconds",
    itl_buckets=ITL_BUCKETS_S,
    e2e_hist="sglang:e2e_request_latency_seconds",
    queue_time_hist="sglang:queue_time_seconds",
    replica_label="dp_rank",
)

ENGINE = register(
    Engine(
        kind="sglang",
        owned_by=("sglang",),
        families=("sglang:",),
        identity=(
            IdentityEndpoint(
                paths=("/get_server_info", "/server_info"),
                identifies=_server_info,
                fields={"context_length": "context_length", "model_path": "model_path"},
                version="version",
            ),
            IdentityEndpoint(
                paths=("/get_model_info",),
                identifies=_model_info,
                fields={"model_path": "model_path"},
            ),
        ),
        signals={
            "queue_depth": ("sglang:num_queue_reqs",),
            "running": ("sglang:num_running_reqs",),
            "kv_usage": ("sglang:token_usage",),
            "prompt_tokens": ("sglang:prompt_tokens_total",),
            "generation_tokens": ("sglang:generation_tokens_total",),
        },
        metrics=METRICS,
        resets=(
            HttpReset(name="sglang", path="/flush_cache", describe="SGLang's POST /flush_cache"),
        ),
        tokenize=TOKENIZE,
    )
)
