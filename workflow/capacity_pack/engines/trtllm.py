"""NVIDIA TensorRT-LLM's ``trtllm-serve``.

Identity: ``GET /version`` -> ``{"version"}``; ``/v1/models`` cards ``owned_by
"tensorrt_llm"``; its ``/metrics`` answers JSON iteration stats (a list), and its Prometheus
series (``trtllm_*``, only with ``return_perf_metrics``) are under ``/prometheus/metrics``.

Metrics: the prefix-cache hit rate is a gauge; histogram bucket bounds vary between releases,
so none are assumed. Cache: no reset endpoint; ``cache_reset: restart`` is the only way.
"""

from __future__ import annotations

from typing import Any

from capacity_pack.engines.base import Engine, IdentityEndpoint
from capacity_pack.engines.metric_map import EngineMetrics
from capacity_pack.engines.registry import register


def _json_stats(path: str, body: Any) -> str | None:
    if isinstance(body, list):
        return f"{path} answers JSON iteration stats (trtllm-serve)"
    return None


ENGINE = register(
    Engine(
        kind="trtllm",
        aliases=("trtllm-serve", "tensorrt-llm", "tensorrt_llm"),
        owned_by=("tensorrt_llm",),
        families=("trtllm_",),
        identity=(
            IdentityEndpoint(paths=("/version",), version="version"),
            IdentityEndpoint(paths=("/metrics",), identifies=_json_stats),
        ),
        metrics_path="/prometheus/metrics",
        signals={
            "queue_depth": ("trtllm_num_requests_waiting",),
            "running": ("trtllm_num_requests_running",),
            "kv_usage": ("trtllm_kv_cache_utilization",),
            "prompt_tokens": ("trtllm_prompt_tokens_total",),
            "generation_tokens": ("trtllm_generation_tokens_total",),
        },
        metrics=EngineMetrics(
            waiting="trtllm_num_requests_waiting",
            running="trtllm_num_requests_running",
            kv_usage="trtllm_kv_cache_utilization",
            prefix_hit_rate="trtllm_kv_cache_hit_rate",
            prompt_tokens="trtllm_prompt_tokens_total",
            generation_tokens="trtllm_generation_tokens_total",
            e2e_hist="trtllm_e2e_request_latency_seconds",
            queue_time_hist="trtllm_request_queue_time_seconds",
        ),
    )
)
