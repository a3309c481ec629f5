"""Benchmark: the cost of reading a realistic vLLM ``/metrics`` scrape with the project's one
exposition reader (:mod:`capacity_pack.engines.exposition`, over prometheus_client's parser).

Run (from the repository root, in the project's virtualenv):

    python tests/bench/bench_exposition.py

Method. The scrape is built here as vLLM 0.11 (V1 engine, one model, one data-parallel engine)
writes it through prometheus_client: the Python GC and process families, the scheduler gauges,
the prefix-cache, preemption and token counters with their ``_created`` samples, the
finish-reason counter, the token and latency histograms with vLLM's default buckets, the
cache-config info gauge and prometheus-fastapi-instrumentator's HTTP families: 478 lines,
about 44 kB. Each reader runs ``--repeat`` times and the median per call is reported:

- ``parse_metrics``: the load generator's scrape loop (once a second, in its event loop), the
  canonical signals only;
- ``read_signals``: the cold check, through the vLLM map;
- ``metric_families``: the identity probe (every sample);
- ``samples(strict=True)``: the failure drills (every sample, histograms checked).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

from capacity_pack import engines  # noqa: E402
from capacity_pack.engines.exposition import samples  # noqa: E402
from capacity_pack.engines.probe import metric_families  # noqa: E402
from capacity_pack.engines.vllm import ITL_BUCKETS_S, TTFT_BUCKETS_S  # noqa: E402

REQUEST_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
             120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
LABELS = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'


def vllm_scrape() -> str:
    lines: list[str] = []

    def family(name: str, kind: str) -> None:
        lines.extend([f"# HELP {name} {name}.", f"# TYPE {name} {kind}"])

    def histogram(name: str, bounds: tuple[float, ...]) -> None:
        family(name, "histogram")
        for i, b in enumerate(bounds):
            lines.append(f'{name}_bucket{{{LABELS},le="{float(b)}"}} {float(i * 10)}')
        n = float(len(bounds) * 10)
        lines.append(f'{name}_bucket{{{LABELS},le="+Inf"}} {n}')
        lines.extend([f"{name}_count{{{LABELS}}} {n}", f"{name}_sum{{{LABELS}}} 1234.5"])
        family(f"{name}_created", "gauge")
        lines.append(f"{name}_created{{{LABELS}}} 1.7e+09")

    for name in ("collected", "uncollectable", "collections"):
        family(f"python_gc_objects_{name}_total", "counter")
        lines += [
            f'python_gc_objects_{name}_total{{generation="{g}"}} {g * 123}.0' for g in range(3)
        ]
    family("python_info", "gauge")
    lines.append('python_info{implementation="CPython",major="3",minor="12",version="3.12.11"} 1.0')
    for name in ("virtual_memory_bytes", "resident_memory_bytes", "start_time_seconds",
                 "cpu_seconds_total", "open_fds", "max_fds"):  # fmt: skip
        family(f"process_{name}", "gauge")
        lines.append(f"process_{name} 1.23456789e+09")
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "gpu_cache_usage_perc"):  # fmt: skip
        family(f"vllm:{name}", "gauge")
        lines.append(f"vllm:{name}{{{LABELS}}} 3.0")
    for name in ("prefix_cache_queries", "prefix_cache_hits", "gpu_prefix_cache_queries",
                 "gpu_prefix_cache_hits", "num_preemptions", "prompt_tokens",
                 "generation_tokens"):  # fmt: skip
        family(f"vllm:{name}_total", "counter")
        lines.append(f"vllm:{name}_total{{{LABELS}}} 12345.0")
        family(f"vllm:{name}_created", "gauge")
        lines.append(f"vllm:{name}_created{{{LABELS}}} 1.7e+09")
    family("vllm:request_success_total", "counter")
    for reason in ("stop", "length", "abort", "error"):
        lines.append(f'vllm:request_success_total{{{LABELS},finished_reason="{reason}"}} 10.0')
    for name in ("request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total",
                 "request_max_num_generation_tokens", "request_params_n",
                 "request_params_max_tokens"):  # fmt: skip
        histogram(f"vllm:{name}", TOKENS)
    histogram("vllm:time_to_first_token_seconds", TTFT_BUCKETS_S)
    histogram("vllm:inter_token_latency_seconds", ITL_BUCKETS_S)
    histogram("vllm:time_per_output_token_seconds", ITL_BUCKETS_S)
    for name in ("e2e_request_latency", "request_queue_time", "request_inference_time",
                 "request_prefill_time", "request_decode_time"):  # fmt: skip
        histogram(f"vllm:{name}_seconds", REQUEST_S)
    family("vllm:cache_config_info", "gauge")
    lines.append('vllm:cache_config_info{block_size="16",enable_prefix_caching="True"} 1.0')
    family("http_requests_total", "counter")
    handlers = ("/v1/completions", "/v1/chat/completions", "/metrics", "/health")
    for h in handlers:
        lines += [f'http_requests_total{{handler="{h}",method="POST",status="{s}"}} 100.0'
                  for s in ("2xx", "4xx")]  # fmt: skip
    return "\n".join(lines) + "\n"


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    text = vllm_scrape()
    emap = engines.metric_map("vllm")
    print(f"scrape: {len(text.splitlines())} lines, {len(text)} bytes")
    readers = {
        "parse_metrics": lambda: engines.parse_metrics(text),
        "read_signals": lambda: engines.read_signals(text, emap, map_name="vllm", url="-"),
        "metric_families": lambda: metric_families(text),
        "samples(strict=True)": lambda: samples(text, strict=True),
    }
    for name, fn in readers.items():
        print(f"{name:22s} {median_ms(fn, args.repeat):8.3f} ms per call (median)")


if __name__ == "__main__":
    main()
