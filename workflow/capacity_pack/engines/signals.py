"""Canonical server signals (queue depth, running, KV usage, prefix-cache queries and hits,
preemptions, token counters) and the Prometheus metric names each engine exposes them under.

``parse_metrics`` sums a signal over label sets and counts only the first name of the map an
engine exposes, so an engine that exports both an old and a new name is not counted twice.
"""

from __future__ import annotations

# Canonical server signals and the names engines expose them under (first match wins).
METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "queue_depth": (
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "llamacpp:requests_deferred",
        "tgi_queue_size",
        "trtllm_num_requests_waiting",
    ),
    "running": (
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "llamacpp:requests_processing",
        "tgi_batch_current_size",
        "trtllm_num_requests_running",
    ),
    "kv_usage": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "llamacpp:kv_cache_usage_ratio",
        "trtllm_kv_cache_utilization",
    ),
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
    "prefix_cache_evictions": ("sim:prefix_cache_evictions_total",),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prompt_tokens": (
        "vllm:prompt_tokens_total",
        "sglang:prompt_tokens_total",
        "llamacpp:prompt_tokens_total",
        "trtllm_prompt_tokens_total",
    ),
    "generation_tokens": (
        "vllm:generation_tokens_total",
        "sglang:generation_tokens_total",
        "llamacpp:tokens_predicted_total",
        "trtllm_generation_tokens_total",
    ),
}
_WANTED = {name: key for key, names in METRIC_NAMES.items() for name in names}


def parse_metrics(text: str) -> dict[str, float]:
    """Canonical signals from Prometheus text, summed over label sets; tolerant of any engine."""
    found: dict[str, float] = {}
    seen: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.rfind(" ")
        name = line[:brace] if 0 <= brace < space else line[: line.find(" ")]
        key = _WANTED.get(name)
        if key is None:
            continue
        # Only the first name of the map that the engine exposes counts (no double counting).
        if seen.setdefault(key, name) != name:
            continue
        try:
            value = float(line[space + 1 :])
        except ValueError:
            continue
        found[key] = found.get(key, 0.0) + value
    return found
