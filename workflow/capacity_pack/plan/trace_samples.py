"""Sample traces in the public layouts (Mooncake JSON Lines, Azure LLM inference CSV), generated.

The shipped samples under ``config/traces/`` are written by :func:`write_sample`
(``capacity-pack trace-sample``): small, seeded, made here (no public trace is copied). The
model behind them, all draws from ``numpy.random.default_rng(seed)``:

- arrivals: ``rows`` gamma inter-arrival gaps of shape 1/CV^2 (CV = ``burstiness``, 1.5 by
  default: burstier than Poisson, as production traces are), scaled so the last arrival is at
  ``seconds``; the first at 0;
- Mooncake layout: each request opens with one of ``shared_prompts`` system prompts, chosen with
  Zipf weights P(k) ~ 1 / (k + 1)^1.1, of 1-3 blocks of ``block_tokens`` tokens each, then a
  unique part of lognormal length (median 600, P95 2,500 tokens, at most 4,000); its hash ids
  are the system prompt's block ids then fresh ids, ceil(input / block_tokens) in all (the last
  block partial), as Mooncake's release numbers its blocks; output lognormal (median 60, P95
  250, at most 512 tokens); ``timestamp`` in whole milliseconds;
- Azure layout: ``ContextTokens`` lognormal (median 900, P95 3,500, at most 6,000),
  ``GeneratedTokens`` lognormal (median 80, P95 300, at most 600), ``TIMESTAMP`` date-times from
  2023-11-16 18:15:46 with seven fractional digits, as the 2023 release writes them.

Lognormal draws use mu = ln p50, sigma = (ln p95 - ln p50) / 1.6448536, rounded and clipped to
[1, max] (the manifest's lognormal lengths).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from capacity_pack.io import atomic_path

Z_95 = 1.6448536
AZURE_START = "2023-11-16 18:15:46"


def _lognormal(rng: np.random.Generator, n: int, p50: float, p95: float, hi: int) -> np.ndarray:
    sigma = (math.log(p95) - math.log(p50)) / Z_95
    return np.clip(np.rint(rng.lognormal(math.log(p50), sigma, n)), 1, hi).astype(np.int64)


def arrival_offsets_s(
    rng: np.random.Generator, rows: int, seconds: float, burstiness: float
) -> np.ndarray:
    """``rows`` arrival offsets from 0 to ``seconds`` with gamma gaps of CV ``burstiness``."""
    shape = 1.0 / (burstiness * burstiness)
    gaps = rng.gamma(shape, 1.0 / shape, rows - 1)
    return np.concatenate([[0.0], np.cumsum(gaps) / gaps.sum() * seconds])


def mooncake_rows(
    rng: np.random.Generator,
    rows: int,
    seconds: float,
    *,
    burstiness: float = 1.5,
    shared_prompts: int = 6,
    block_tokens: int = 512,
) -> list[dict]:
    offsets = arrival_offsets_s(rng, rows, seconds, burstiness)
    sizes = rng.integers(1, 4, shared_prompts)  # blocks per system prompt
    starts = np.concatenate([[0], np.cumsum(sizes)])
    system_ids = [list(range(starts[k], starts[k + 1])) for k in range(shared_prompts)]
    weights = 1.0 / np.power(np.arange(shared_prompts) + 1.0, 1.1)
    which = rng.choice(shared_prompts, size=rows, p=weights / weights.sum())
    unique = _lognormal(rng, rows, 600, 2500, 4000)
    outputs = _lognormal(rng, rows, 60, 250, 512)
    next_id = int(starts[-1])
    out = []
    for i in range(rows):
        head = system_ids[which[i]]
        n_in = len(head) * block_tokens + int(unique[i])
        blocks = math.ceil(n_in / block_tokens)
        ids = head + list(range(next_id, next_id + blocks - len(head)))
        next_id += blocks - len(head)
        out.append(
            {
                "timestamp": int(round(offsets[i] * 1000)),
                "input_length": n_in,
                "output_length": int(outputs[i]),
                "hash_ids": ids,
            }
        )
    return out


def azure_frame(
    rng: np.random.Generator, rows: int, seconds: float, *, burstiness: float = 1.5
) -> pd.DataFrame:
    offsets = arrival_offsets_s(rng, rows, seconds, burstiness)
    stamps = pd.Timestamp(AZURE_START) + pd.to_timedelta(np.rint(offsets * 1e7) * 100, unit="ns")
    return pd.DataFrame(
        {
            # Microseconds then the 100 ns digit: the release's seven fractional digits.
            "TIMESTAMP": [
                f"{s.strftime('%Y-%m-%d %H:%M:%S.%f')}{s.nanosecond // 100}" for s in stamps
            ],
            "ContextTokens": _lognormal(rng, rows, 900, 3500, 6000),
            "GeneratedTokens": _lognormal(rng, rows, 80, 300, 600),
        }
    )


def write_sample(
    fmt: str, path: str | Path, *, rows: int, seconds: float, seed: int, burstiness: float = 1.5
) -> Path:
    """Write a sample trace of ``rows`` requests over ``seconds`` in layout ``fmt``."""
    if rows < 2 or seconds <= 0:
        raise ValueError("a sample trace needs at least two rows over a positive span")
    rng = np.random.default_rng(seed)
    path = Path(path)
    with atomic_path(path) as tmp:
        if fmt == "mooncake":
            lines = mooncake_rows(rng, rows, seconds, burstiness=burstiness)
            text = "".join(json.dumps(r, separators=(", ", ": ")) + "\n" for r in lines)
            Path(tmp).write_text(text)
        elif fmt == "azure":
            azure_frame(rng, rows, seconds, burstiness=burstiness).to_csv(tmp, index=False)
        else:
            raise ValueError(f"unknown sample format {fmt!r}; expected mooncake or azure")
    return path
