"""The garbage collector during a run: its client-health fields on real runs against the
simulated engine over 127.0.0.1, and the collector left as it was found."""

from __future__ import annotations

import asyncio
import gc

import pytest

from capacity_pack.measure.collector import FORCE_THRESHOLD, LISTED_PAUSES, merge_summaries
from capacity_pack.measure.records import read_records
from capacity_pack.measure.run import run_point
from tests.unit.measure.test_loadgen import constant_schedule, settings, sim

LITTER_PER_TICK = 1000  # one-object reference cycles made every 2 ms beside the load


@pytest.fixture(scope="module")
def server():
    with sim() as s:
        yield s.base_url


def litter(made: list[int]):
    """A side task leaving cyclic garbage (only the collector frees it) while the load runs."""

    def tasks(run, stop: asyncio.Event):
        async def loop() -> None:
            while not stop.is_set():
                for _ in range(LITTER_PER_TICK):
                    x: list = []
                    x.append(x)
                made[0] += LITTER_PER_TICK
                await asyncio.sleep(0.002)

        return [loop()]

    return tasks


def check_health(summary: dict) -> None:
    n = summary["gc_collections"]
    by_gen = summary["gc_collections_by_generation"]
    assert set(by_gen) == {"0", "1", "2"} and sum(by_gen.values()) == n
    if summary["gc_policy"] == "quiet":
        assert by_gen["1"] == by_gen["2"] == 0  # young passes only inside the window
    if n:
        assert 0 <= summary["gc_pause_max_ms"] <= summary["gc_pause_total_ms"]
    else:
        assert summary["gc_pause_max_ms"] is None and summary["gc_pause_total_ms"] == 0
    listed = summary["gc_pauses_over_1ms"]
    assert summary["gc_pauses_over_1ms_count"] == len(listed) or len(listed) == LISTED_PAUSES
    assert summary["gc_pauses_over_1ms_count"] <= n
    for p in listed:
        assert set(p) == {"at_s", "pause_ms", "cpu_ms", "generation"}
        assert 1 < p["pause_ms"] <= summary["gc_pause_max_ms"] and p["cpu_ms"] >= 0
        assert p["generation"] == 0 or summary["gc_policy"] == "automatic"
    assert summary["gc_after_window_ms"] >= 0 and summary["gc_freed_after_window"] >= 0


@pytest.mark.parametrize(
    ("mode", "transport"),
    [("open", "capacity_pack"), ("open", "httpx"), ("closed", "capacity_pack")],
)
def test_every_collection_in_the_window_is_young_timed_and_reported(
    server, tmp_path, mode, transport
):
    made = [0]
    out = tmp_path / "r.jsonl"
    frozen_before = gc.get_freeze_count()
    load = settings(server, mode=mode, concurrency=8, transport=transport, side_tasks=litter(made))
    summary = run_point(constant_schedule(150, 100), load, out)
    assert {r["status"] for r in read_records(out)} == {"ok"}
    check_health(summary)
    # httpx's own transport keeps the automatic collector (collector module): timed only.
    assert summary["gc_policy"] == ("automatic" if transport == "httpx" else "quiet")
    # The litter was collected in the window, by young passes at the dispatcher's idle
    # moments: what is left for the collection after it is under the forcing threshold.
    bound = FORCE_THRESHOLD + 10 * LITTER_PER_TICK + 5_000
    assert made[0] > bound
    assert summary["gc_collections"] > 0
    assert summary["gc_freed_after_window"] < bound
    # The collector as it was: automatic collections on, nothing left frozen by the run.
    assert gc.isenabled() and gc.get_freeze_count() == frozen_before


def test_a_run_without_garbage_needs_no_collection_after_it(server, tmp_path):
    """Requests leave no reference cycles: a response is freed by reference counting when it
    ends, so the collection after the window finds little (not one or more per request)."""
    out = tmp_path / "r.jsonl"
    summary = run_point(constant_schedule(200, 100), settings(server), out)
    check_health(summary)
    assert summary["gc_freed_after_window"] < 200


def test_shards_merge_counts_and_keep_the_longest_pause():
    pause = {"at_s": 1.0, "pause_ms": 3.0, "cpu_ms": 2.5, "generation": 0}
    one = {
        "shard": 0, "gc_collections": 3, "gc_collections_by_generation": {"0": 3, "1": 0, "2": 0},
        "gc_pause_max_ms": 3.0, "gc_pause_total_ms": 3.4, "gc_pauses_over_1ms_count": 1,
        "gc_pauses_over_1ms": [pause], "gc_after_window_ms": 2.0, "gc_freed_after_window": 10,
    }  # fmt: skip
    two = {**one, "shard": 1, "gc_pause_max_ms": 0.2, "gc_pause_total_ms": 0.5,
           "gc_pauses_over_1ms_count": 0, "gc_pauses_over_1ms": [],
           "gc_after_window_ms": 4.0}  # fmt: skip
    merged = merge_summaries([one, two])
    assert merged["gc_collections"] == 6 and merged["gc_collections_by_generation"]["0"] == 6
    assert merged["gc_pause_max_ms"] == 3.0 and merged["gc_pause_total_ms"] == pytest.approx(3.9)
    assert merged["gc_pauses_over_1ms"] == [{**pause, "shard": 0}]
    assert merged["gc_after_window_ms"] == 4.0 and merged["gc_freed_after_window"] == 20
    assert merge_summaries([{"shard": 0}]) == {}  # summaries from before the collector's fields
