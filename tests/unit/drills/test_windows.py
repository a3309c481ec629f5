"""A drill window's P95 is the pack's one percentile: the nearest rank, as a point's P95 is."""

from __future__ import annotations

import numpy as np
import pandas as pd

from capacity_pack.drills.analyze import windows
from capacity_pack.vocab.percentile import nearest_rank

NS = 1_000_000_000


def test_a_window_p95_is_the_nearest_rank_not_the_next_order_statistic():
    n = 20
    req = pd.DataFrame({
        "end_offset_ns": np.arange(n) * (NS // 100),  # all in the first 1 s window
        "status": ["ok"] * n,
        "failed": [False] * n,
        "meets_slo": [True] * n,
        "ttft_ms": np.arange(1.0, n + 1),
        "tpot_ms": np.arange(1.0, n + 1) / 10,
    })  # fmt: skip
    frame = windows(req, 0, 2 * NS, 1.0)
    # 20 values: rank ceil(0.95 x 20) = 19, the 19th smallest, as the SLO report takes it
    # (pandas' quantile(interpolation="higher") took the 20th, the maximum).
    assert frame.loc[0, "ttft_p95_ms"] == 19.0 == nearest_rank(np.sort(req["ttft_ms"]), 0.95)
    assert frame.loc[0, "tpot_p95_ms"] == 1.9
    assert frame.loc[0, "attempted"] == n
    # A window without a successful request has no P95.
    assert np.isnan(frame.loc[1, "ttft_p95_ms"])
