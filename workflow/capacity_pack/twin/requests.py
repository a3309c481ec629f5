"""A schedule's requests as the engine model's fleet takes them: token ids with shared prefixes.

Each request's ids are its shared prefix's (``prefix_id``; -1 on a cold point: nothing shared)
followed by its own, seeded by ``prompt_seed`` and ``seq``, so the prefix cache hits in virtual
time where it hits live; it is due at ``scheduled_offset_ns`` plus ``shift_s``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

NS = 1_000_000_000


def fleet_requests(schedule: pd.DataFrame, seed: int, shift_s: float = 0.0) -> list[Any]:
    """The schedule's requests with token ids: shared prefixes, then ids of their own."""
    from capacity_pack.sim.fleet import FleetRequest

    heads: dict[tuple[int, int], tuple[int, ...]] = {}
    out = []
    for row in schedule.to_dict("records"):
        n = int(row["input_tokens"])
        pid, plen = int(row["prefix_id"]), min(int(row["prefix_tokens"]), max(0, n - 1))
        head: tuple[int, ...] = ()
        if pid >= 0 and plen > 0:
            key = (pid, plen)
            if key not in heads:
                g = np.random.default_rng([seed, 0x9EAD, pid])
                heads[key] = tuple(g.integers(1, 2**31, plen).tolist())
            head = heads[key]
        own = np.random.default_rng(
            [seed, int(row["prompt_seed"]) & 0xFFFFFFFF, int(row["seq"]) & 0xFFFFFFFF]
        )
        ids = head + tuple(own.integers(1, 2**31, n - len(head)).tolist())
        out.append(
            FleetRequest(
                due_s=int(row["scheduled_offset_ns"]) / NS + shift_s,
                prompt_ids=ids,
                max_tokens=int(row["output_tokens"]),
            )
        )
    return out
