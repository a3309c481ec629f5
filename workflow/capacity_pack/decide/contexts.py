"""The contexts a replica plan sizes from: what was sent at the selected capacity point(s).

Context = prompt tokens (the server's ``prompt_tokens``, else the scheduled ``input_tokens``) +
max(requested output, tokens received), over the measured rows of every deciding repeat of the
capacity rate in the primary cache state; time in system = end - sent (Little's W, failed
requests included). Without a requests table: 20,000 draws from the manifest's distributions.

Method: docs/metrics.md, "Sizing from the tail" ("The contexts").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.artifacts import SloReport
from capacity_pack.vocab.phases import MEASURED_PHASES

#: Columns of the requests table the contexts are read from.
COLUMNS = ["phase", "input_tokens", "prompt_tokens", "output_tokens_expected", "output_tokens",
           "sent_ns", "end_ns"]  # fmt: skip
MANIFEST_DRAWS = 20_000
MANIFEST_SEED = 0
NS_PER_S = 1e9


class SentContexts:
    """Each sent request's context (tokens) and time in system (seconds, None if unknown)."""

    def __init__(
        self, contexts: np.ndarray, durations_s: np.ndarray | None, source: str, label: str,
        points: list[str],
    ) -> None:  # fmt: skip
        self.contexts = contexts
        self.durations_s = durations_s
        self.source = source
        self.label = label
        self.points = points

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "label": self.label, "points": self.points}


def from_table(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Contexts and times in system of a requests table's measured rows."""
    m = frame[frame["phase"].isin(MEASURED_PHASES)]
    prompt = m["prompt_tokens"].astype("Int64").fillna(m["input_tokens"]).to_numpy(np.int64)
    output = np.maximum(m["output_tokens_expected"].to_numpy(np.int64),
                        m["output_tokens"].to_numpy(np.int64))  # fmt: skip
    duration = (m["end_ns"].to_numpy(np.int64) - m["sent_ns"].to_numpy(np.int64)) / NS_PER_S
    return prompt + output, np.maximum(duration, 0.0)


def tables_of(reports: list[SloReport], tables: Sequence[str | Path]) -> dict[str, Path]:
    """The requests table of each report, by the report's key (``<point>/<cache>/rep<k>``): the
    normalize stage writes it under ``tables/<key>/``."""
    by_key: dict[str, Path] = {}
    for path in map(Path, tables):
        key = "/".join(path.parts[-4:-1])
        by_key[key] = path
    return {r.key: by_key[r.key] for r in reports if r.key in by_key}


def sent_contexts(
    reports: list[SloReport], tables: Sequence[str | Path] | None, pack
) -> SentContexts:
    """The contexts sent at ``reports``' points, from their tables when every one is at hand,
    else drawn from the manifest (see the module docstring)."""
    found = tables_of(reports, tables or [])
    keys = [r.key for r in reports if r.key]
    if keys and len(found) == len(keys):
        parts = [from_table(pd.read_parquet(found[k], columns=COLUMNS)) for k in keys]
        contexts = np.concatenate([p[0] for p in parts])
        if contexts.size:
            return SentContexts(
                contexts,
                np.concatenate([p[1] for p in parts]),
                "measured",
                f"sent at the capacity point ({contexts.size} measured requests of "
                f"{', '.join(keys)})",
                keys,
            )
    return SentContexts(
        manifest_contexts(pack),
        None,
        "manifest",
        f"drawn from the manifest's length distributions ({MANIFEST_DRAWS} draws, seed "
        f"{MANIFEST_SEED}; no measured requests table of the capacity point)",
        keys,
    )


def manifest_contexts(pack, n: int = MANIFEST_DRAWS, seed: int = MANIFEST_SEED) -> np.ndarray:
    """``n`` contexts drawn from the manifest's classes in proportion to their mix."""
    from capacity_pack.plan.manifest import sample_lengths

    rng = np.random.default_rng(seed)
    counts = pack.class_counts(n)
    out = []
    for c in pack.workload:
        k = counts[c.name]
        out.append(sample_lengths(c.input_tokens, rng, k) + sample_lengths(c.output_tokens, rng, k))
    return np.concatenate(out)
