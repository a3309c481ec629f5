"""``cancellation``: the client cancels ``cancel_fraction`` of the requests it sends during
``fault_s``, ``cancel_after_s`` after sending them; it needs nothing of the target, so it runs
on every target without commands. The cancelled requests are picked with a seeded generator,
so the same pack cancels the same requests."""

from __future__ import annotations

import numpy as np
import pandas as pd

from capacity_pack.drills.kinds.base import NS, DrillKind
from capacity_pack.drills.kinds.registry import register
from capacity_pack.plan.failure import Drill


def _cancel(frame: pd.DataFrame, drill: Drill, window: tuple[int, int], seed: int) -> None:
    lo, hi = window
    rng = np.random.default_rng([seed, 0xCA9CE1])
    due = frame["scheduled_offset_ns"].to_numpy()
    pick = (due >= lo) & (due < hi) & (rng.random(len(frame)) < drill.cancel_fraction)
    cancel = frame["cancel_after_ns"].to_numpy().copy()
    cancel[pick] = int(drill.cancel_after_s * NS)
    frame["cancel_after_ns"] = cancel


KIND = register(
    DrillKind(
        name="cancellation",
        mechanism="cancellation",
        client_fault="the schedule's cancellations",
        reversible=True,
        schedule=_cancel,
    )
)
