"""The pairing of the load generator's two clocks: CLOCK_MONOTONIC (``time.perf_counter_ns``,
every duration) and CLOCK_REALTIME (``time.time_ns``, the stamp that lines a request up with a
server's, a router's or another shard's events).

Formula: offset = realtime - (m1 + m2) / 2, from the tightest of a few bracketed reads
``m1 = monotonic; realtime; m2 = monotonic`` (uncertainty (m2 - m1) / 2). Two bare reads in a
row are not enough on a loaded host: a thread switch between them (the GIL's switch interval,
the kernel's scheduler) moves one request's realtime stamp by milliseconds, which the drills'
clock check then reads as a clock divergence.
"""

from __future__ import annotations

import time

#: Bracketed reads per pairing: the tightest wins.
READS = 3


def _tightest(reads: int) -> tuple[int, int, int]:
    """(realtime, m1, m2) of the tightest of ``reads`` bracketed reads."""
    best = (0, 0, 1 << 62)
    for _ in range(reads):
        m1 = time.perf_counter_ns()
        rt = time.time_ns()
        m2 = time.perf_counter_ns()
        if m2 - m1 < best[2] - best[1]:
            best = (rt, m1, m2)
    return best


def clock_sample(reads: int = READS) -> dict[str, int]:
    """realtime - monotonic, from the tightest of ``reads`` bracketed reads, with its
    uncertainty (half the bracket)."""
    rt, m1, m2 = _tightest(reads)
    mid = (m1 + m2) // 2
    return {
        "realtime_ns": rt,
        "monotonic_ns": mid,
        "offset_ns": rt - mid,
        "uncertainty_ns": (m2 - m1 + 1) // 2,
    }


def offset_ns() -> int:
    """realtime - monotonic now (:data:`READS` bracketed reads; no dict on a hot path)."""
    rt, m1, m2 = _tightest(READS)
    return rt - (m1 + m2) // 2


def realtime_at(monotonic_ns: int) -> int:
    """The realtime stamp of a monotonic instant, with the offset read now."""
    return monotonic_ns + offset_ns()
