"""System and per-user output throughput of a point.

Two views of the same tokens (vLLM's benchmark and NVIDIA NIM's benchmarking guide both report
both; they answer different questions):

- **system** output throughput = output tokens of the successful measured requests / T, T the
  point's measured window (first measured send to last measured terminal event), in tokens/s:
  what the deployment delivers in aggregate (the SLO report's ``output_throughput_tps``);
- **per-user** output throughput of one successful request = its output tokens O / its E2E
  latency (client-side, send to last token), in tokens/s: what one user sees, prefill and
  queueing included. It approaches the decode rate 1 / TPOT as O grows, and falls as the system
  batches more requests together, while the system throughput rises;
- **per-user decode rate** of one successful request with O > 1 = 1 / TPOT (TPOT in seconds):
  the streaming speed after the first token.

The per-user figures are reported as nearest-rank P5, P50 and P95 over the successful requests
of the point (and of each class), with their count and mean; P5 is the slow users' side.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.vocab.percentile import nearest_rank
from capacity_pack.vocab.phases import MEASURED_PHASES

METHOD = (
    "system: output tokens of successful measured requests / measured window; per user: each "
    "successful request's output tokens / its E2E latency (and 1 / TPOT, its decode rate), "
    "nearest-rank P5/P50/P95"
)


def distribution(values: np.ndarray) -> dict[str, Any]:
    """Count, mean and nearest-rank P5, P50, P95 of per-request rates (finite values only)."""
    s = np.sort(values[np.isfinite(values)])
    return {
        "count": int(s.size),
        "mean": float(s.mean()) if s.size else None,
        "p5": nearest_rank(s, 0.05),
        "p50": nearest_rank(s, 0.50),
        "p95": nearest_rank(s, 0.95),
    }


def per_request_rates(ok: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each successful request's output tokens/s over its E2E, and its decode rate 1 / TPOT
    (requests with more than one output token and a positive TPOT)."""
    out = ok["output_tokens"].to_numpy(float)
    e2e_s = ok["e2e_ms"].to_numpy(float) / 1e3
    tpot_s = ok["tpot_ms"].to_numpy(float) / 1e3
    with np.errstate(divide="ignore", invalid="ignore"):
        user = np.where(e2e_s > 0, out / e2e_s, np.nan)
        decode = np.where((out > 1) & (tpot_s > 0), 1.0 / tpot_s, np.nan)
    return user, decode


def throughput_report(
    requests: pd.DataFrame, window_s: float, class_names: list[str]
) -> dict[str, Any]:
    """The point's system and per-user output throughput, overall and per class."""
    m = requests[requests["phase"].isin(MEASURED_PHASES)]
    ok = m[m["status"] == "ok"]
    user, decode = per_request_rates(ok)
    klass = ok["class"].to_numpy(dtype=object)
    tokens = ok["output_tokens"].to_numpy(np.int64)
    per_class = {}
    for name in class_names:
        mine = klass == name
        per_class[name] = {
            "system_output_tps": float(tokens[mine].sum()) / window_s,
            "per_user_output_tps": distribution(user[mine]),
            "per_user_decode_tps": distribution(decode[mine]),
        }
    return {
        "method": METHOD,
        "window_s": window_s,
        "system_output_tps": float(tokens.sum()) / window_s,
        "per_user_output_tps": distribution(user),
        "per_user_decode_tps": distribution(decode),
        "classes": per_class,
    }
