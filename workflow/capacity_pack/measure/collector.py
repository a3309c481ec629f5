"""The garbage collector during a run: kept out of the measured window's hot path, and timed.

:class:`QuietCollector`: before the clock one full collection and ``gc.freeze()``, then
``gc.disable()``; the dispatcher thread calls :meth:`QuietCollector.idle` when its next deadline
is at least ``IDLE_GAP_NS`` away, which collects generation 0 once ``YOUNG_INTERVAL_NS`` have
passed (or ``YOUNG_THRESHOLD`` objects are pending; forced after ``FORCE_INTERVAL_NS`` or
``FORCE_THRESHOLD``); generations 1 and 2 never inside the window, one full collection after
it. Every pass is timed through ``gc.callbacks`` into the client-health fields of
:meth:`QuietCollector.summary`. With httpx's own transport (``https://``) the policy is off
(``start(quiet=False)``): httpcore leaves cyclic garbage per request, so passes are only timed.
Why and the measurements: docs/performance.md, the garbage-collector section ('What changed').
"""

from __future__ import annotations

import gc
import time
from typing import Any

import httpx

NS = 1_000_000_000
#: The next deadline must be at least this far off for an idle collection.
IDLE_GAP_NS = 2_000_000
#: The dispatcher thread checks for an idle collection at least this often.
IDLE_CHECK_NS = 20_000_000
#: An idle pass once this long since the last one...
YOUNG_INTERVAL_NS = 10_000_000
#: ...or this many container objects pending (net; CPython's own generation-0 threshold).
YOUNG_THRESHOLD = 700
#: Past either, a pass at the next check, gap or not.
FORCE_INTERVAL_NS = 50_000_000
FORCE_THRESHOLD = 20_000
#: Pauses over 1 ms listed individually in the summary (all are counted).
LISTED_PAUSES = 50
PAUSE_REPORTED_NS = 1_000_000


# What an ended response's stream becomes (see unbind).
_ENDED_STREAM = httpx.ByteStream(b"")


def unbind(response: httpx.Response) -> None:
    """Once ``response`` is closed: httpx binds a response and its stream to each other, a
    reference cycle that only the garbage collector would free; unbound, reference counting
    frees the response, its body and its headers at once."""
    response.stream = _ENDED_STREAM


class QuietCollector:
    """The collector's policy for one run's window, and the record of every pass in it."""

    def __init__(self) -> None:
        # (start ns, pause ns, the collecting thread's CPU ns in it, generation)
        self.events: list[tuple[int, int, int, int]] = []
        self.t0_ns = 0
        self.active = False
        self.after_window_ns: int | None = None
        self.freed_after_window: int | None = None
        self._start_ns = self._start_cpu_ns = 0
        self._was_enabled = True
        self.quiet = True
        self._last_pass_ns = 0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        now, cpu = time.perf_counter_ns(), time.thread_time_ns()
        if phase == "start":
            self._start_ns, self._start_cpu_ns = now, cpu
        elif self.active:
            self.events.append(
                (
                    self._start_ns,
                    now - self._start_ns,
                    cpu - self._start_cpu_ns,
                    int(info["generation"]),
                )
            )

    def start(self, quiet: bool = True) -> None:
        """Before the clock: collect, freeze what is alive, stop automatic collections (unless
        not ``quiet``: httpx's own transport leaves cyclic garbage per request, which young
        passes alone let pile up into longer passes, so with it the automatic collector stays
        on and its collections are only timed)."""
        gc.collect()
        gc.freeze()
        self._was_enabled = gc.isenabled()
        self.quiet = quiet
        if quiet:
            gc.disable()
        self.active = True
        self._last_pass_ns = time.perf_counter_ns()
        gc.callbacks.append(self._callback)

    def idle(self, gap_ns: int) -> None:
        """The dispatcher's next deadline is ``gap_ns`` away: a young pass if one is due (see
        the module docstring)."""
        if not (self.active and self.quiet):
            return
        pending = gc.get_count()[0]
        since = time.perf_counter_ns() - self._last_pass_ns
        if gap_ns >= IDLE_GAP_NS:
            if since < YOUNG_INTERVAL_NS and pending < YOUNG_THRESHOLD:
                return
        elif since < FORCE_INTERVAL_NS and pending < FORCE_THRESHOLD:
            return
        gc.collect(0)
        self._last_pass_ns = time.perf_counter_ns()

    def stop(self) -> None:
        """After the window: one full collection (timed), the collector as it was before."""
        if not self.active:
            return
        self.active = False
        t = time.perf_counter_ns()
        self.freed_after_window = gc.collect()
        self.after_window_ns = time.perf_counter_ns() - t
        gc.callbacks.remove(self._callback)
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()

    def summary(self) -> dict[str, Any]:
        """The client-health fields (see the module docstring)."""
        pauses = self.events  # every pass from start() to stop(): the window
        long = [e for e in pauses if e[1] > PAUSE_REPORTED_NS]
        return {
            # "quiet": young passes at idle moments only; "automatic": CPython's own thresholds.
            "gc_policy": "quiet" if self.quiet else "automatic",
            "gc_collections": len(pauses),
            "gc_collections_by_generation": {
                str(g): sum(e[3] == g for e in pauses) for g in (0, 1, 2)
            },
            # Microseconds, as each listed pause.
            "gc_pause_max_ms": round(max(e[1] for e in pauses) / 1e6, 3) if pauses else None,
            "gc_pause_total_ms": round(sum(e[1] for e in pauses) / 1e6, 3),
            "gc_pauses_over_1ms_count": len(long),
            "gc_pauses_over_1ms": [
                {
                    "at_s": round((e[0] - self.t0_ns) / NS, 4),
                    "pause_ms": round(e[1] / 1e6, 3),
                    "cpu_ms": round(e[2] / 1e6, 3),
                    "generation": e[3],
                }
                for e in long[:LISTED_PAUSES]
            ],
            "gc_after_window_ms": (
                self.after_window_ns / 1e6 if self.after_window_ns is not None else None
            ),
            "gc_freed_after_window": self.freed_after_window,
        }


def merge_summaries(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``gc_*`` fields of a point run by several client processes (shards): counts and
    totals summed, the longest pause the longest of any, each long pause with its shard."""
    parts = [s for s in summaries if "gc_collections" in s]
    if not parts:
        return {}
    maxima = [s["gc_pause_max_ms"] for s in parts if s["gc_pause_max_ms"] is not None]
    after = [s["gc_after_window_ms"] for s in parts if s["gc_after_window_ms"] is not None]
    policies = {s.get("gc_policy", "quiet") for s in parts}
    return {
        "gc_policy": policies.pop() if len(policies) == 1 else "mixed",
        "gc_collections": sum(s["gc_collections"] for s in parts),
        "gc_collections_by_generation": {
            g: sum(s["gc_collections_by_generation"].get(g, 0) for s in parts)
            for g in ("0", "1", "2")
        },
        "gc_pause_max_ms": max(maxima) if maxima else None,
        "gc_pause_total_ms": sum(s["gc_pause_total_ms"] for s in parts),
        "gc_pauses_over_1ms_count": sum(s["gc_pauses_over_1ms_count"] for s in parts),
        "gc_pauses_over_1ms": [
            {**p, "shard": s.get("shard")} for s in parts for p in s["gc_pauses_over_1ms"]
        ][:LISTED_PAUSES],
        "gc_after_window_ms": max(after) if after else None,
        "gc_freed_after_window": sum(s["gc_freed_after_window"] or 0 for s in parts),
    }
