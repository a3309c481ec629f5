"""The latency formulas of a request, from its client stamps (nanoseconds on one monotonic clock).

The client-side definitions of vLLM's benchmark (``vllm bench serve``) and AIPerf, for a
request sent at ``sent``, its first token at ``first``, its last at ``last``, O output tokens:

- TTFT (ms) = (first - sent) / 1e6;
- E2E (ms) = (last - sent) / 1e6;
- TPOT (ms per token) = (E2E - TTFT) / (O - 1) for O > 1; 0 for O <= 1 (one token has no
  inter-token time; written as 0, not NaN, so a one-token class meets any TPOT cutoff);
- ITL (ms): the gap between consecutive streamed chunks of one request (the first chunk has
  none), per chunk (:func:`capacity_pack.evidence.normalize.chunks_frame`).

Each function takes Python numbers or numpy arrays (NaN stamps give NaN latencies); numbers
stay plain Python arithmetic, because the in-run look applies them to every finished request
on the load generator's event loop (about 0.3 us a request, against 11 us through numpy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Nanoseconds per millisecond: the stamps' unit to the latencies'.
NS_PER_MS = 1e6


def ttft_ms(sent_ns: Any, first_token_ns: Any) -> Any:
    """Time to first token. Formula: (first - sent) / 1e6, in ms."""
    return (first_token_ns - sent_ns) / NS_PER_MS


def e2e_ms(sent_ns: Any, last_token_ns: Any) -> Any:
    """End-to-end latency. Formula: (last - sent) / 1e6, in ms."""
    return (last_token_ns - sent_ns) / NS_PER_MS


def tpot_ms(e2e: Any, ttft: Any, output_tokens: Any) -> Any:
    """Time per output token after the first. Formula: (E2E - TTFT) / (O - 1) for O > 1, else 0,
    in ms per token."""
    if isinstance(output_tokens, int | float):
        return (e2e - ttft) / (output_tokens - 1) if output_tokens > 1 else 0.0
    out = np.asarray(output_tokens, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(
            out > 1, (np.asarray(e2e, float) - np.asarray(ttft, float)) / (out - 1), 0.0
        )
