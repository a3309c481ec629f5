"""The load generator's threads on CPUs of their own (``client.pin_threads``).

Real threads, real ``sched_setaffinity``: the dispatcher thread is bound where the plan says,
the event loop's thread is bound for the run and given its CPU set back after it, and the run
summary says where each ran, or why they were not pinned."""

from __future__ import annotations

import os
import threading

import pytest

from capacity_pack.measure.dispatcher import Dispatcher, LoopPlacement, thread_placement
from capacity_pack.measure.inputs import SweepInputs
from capacity_pack.measure.run import run_point
from capacity_pack.measure.shards import merge_placement
from capacity_pack.plan.manifest import ManifestError, validate_pack
from capacity_pack.plan.schedule import Point
from tests.conftest import pack_data
from tests.unit.measure.test_interrupt import refused_url
from tests.unit.measure.test_loadgen import constant_schedule, settings


def test_the_plan_gives_the_dispatcher_the_highest_cpu_and_the_loop_the_rest():
    assert thread_placement({0, 1}) == ([0], 1)
    assert thread_placement({3, 5, 9, 4}) == ([3, 4, 5], 9)
    assert thread_placement({2}) is None  # one CPU: nothing to separate
    # Local shards share the set: shard i takes the i-th of K equal parts.
    assert thread_placement(set(range(8)), (0, 2)) == ([0, 1, 2], 3)
    assert thread_placement(set(range(8)), (1, 2)) == ([4, 5, 6], 7)
    assert thread_placement(set(range(7)), (2, 3)) == ([4], 5)  # the remainder (6) unused
    assert thread_placement({0, 1}, (1, 2)) is None  # one CPU per shard


def test_the_dispatcher_thread_runs_on_the_cpu_it_was_given():
    import asyncio

    cpu = max(os.sched_getaffinity(0))
    loop = asyncio.new_event_loop()
    try:
        d = Dispatcher(loop, cpu=cpu)
        d.start()
        seen = None
        for _ in range(200):  # the thread binds itself as it starts
            seen = os.sched_getaffinity(d.native_id)
            if seen == {cpu}:
                break
            threading.Event().wait(0.005)
        d.stop()
    finally:
        loop.close()
    assert seen == {cpu}
    assert d.bound is None


def test_a_run_pins_its_threads_reports_where_and_gives_the_loop_its_cpus_back(tmp_path):
    allowed = os.sched_getaffinity(0)
    summary = run_point(
        constant_schedule(3, 50), settings(refused_url(), scrape_metrics=False), tmp_path / "r"
    )
    placed = summary["thread_placement"]
    assert placed["requested"] is True
    if len(allowed) >= 2:
        loop_cpus, dispatcher_cpu = sorted(allowed)[:-1], max(allowed)
        assert placed["pinned"] is True, placed
        assert placed["loop_cpus"] == loop_cpus
        assert placed["dispatcher_cpu"] == dispatcher_cpu
        assert placed["detail"] == (
            f"event loop on CPU {', '.join(map(str, loop_cpus))}, dispatcher on CPU "
            f"{dispatcher_cpu}"
        )
    else:
        assert placed["pinned"] is False
        assert placed["detail"] == "not pinned: the process's CPU set has 1 CPU(s), two are needed"
    # The calling (loop) thread has its whole set back after the run.
    assert os.sched_getaffinity(0) == allowed


def test_pinning_is_off_when_the_pack_says_so(tmp_path):
    allowed = os.sched_getaffinity(0)
    s = settings(refused_url(), scrape_metrics=False, pin_threads=False)
    summary = run_point(constant_schedule(3, 50), s, tmp_path / "r")
    assert summary["thread_placement"] == {
        "requested": False,
        "pinned": False,
        "detail": "not pinned (client.pin_threads is false)",
    }
    assert os.sched_getaffinity(0) == allowed


def test_a_refused_binding_is_reported_and_the_loop_keeps_its_cpus():
    # A CPU outside the machine: the kernel refuses it (EINVAL), the run goes on unpinned.
    placement = LoopPlacement(True)
    before = os.sched_getaffinity(0)
    placement.plan = ([os.cpu_count() + 64], max(before))
    assert placement.bind() is None
    assert os.sched_getaffinity(0) == before
    report = placement.report(None)
    assert report["pinned"] is False
    assert report["detail"].startswith("not pinned: sched_setaffinity refused (")
    # The dispatcher refused, the loop bound: the summary says both, and the loop gets its set back.
    import types

    placement = LoopPlacement(True)
    placement.plan = ([min(before)], os.cpu_count() + 64)
    assert placement.bind() == os.cpu_count() + 64
    refused = types.SimpleNamespace(bound="sched_setaffinity refused (Invalid argument)")
    assert placement.report(refused)["detail"] == (
        "not pinned: dispatcher: sched_setaffinity refused (Invalid argument) "
        f"(event loop on CPU {min(before)})"
    )
    placement.restore()
    assert os.sched_getaffinity(0) == before


def test_a_sharded_points_placement_is_pinned_only_if_every_shard_was():
    yes = {"requested": True, "pinned": True, "loop_cpus": [0], "dispatcher_cpu": 1,
           "detail": "event loop on CPU 0, dispatcher on CPU 1"}  # fmt: skip
    why = "not pinned: this shard's part of the CPU set has 1 CPU(s), two are needed"
    no = {"requested": True, "pinned": False, "detail": why}
    both = merge_placement([{"shard": 0, "thread_placement": yes},
                            {"shard": 1, "thread_placement": yes}])  # fmt: skip
    assert both["pinned"] is True
    one = merge_placement([{"shard": 0, "thread_placement": yes},
                           {"shard": 1, "thread_placement": no}])  # fmt: skip
    assert one["pinned"] is False
    assert "shard 1: not pinned: this shard's part" in one["detail"]
    assert merge_placement([{"shard": 0}]) is None  # a summary from before the field


def test_the_pack_setting_is_a_strict_boolean_and_on_by_default():
    data = pack_data()
    pack = validate_pack(data)
    assert pack.client.pin_threads is True
    point = Point.parse("open-r10", "cold", 0)
    # On (the default), a point's inputs read as before the setting existed; off is an input.
    assert "pin_threads" not in SweepInputs.for_point(pack, point).canonical_json()
    data["client"]["pin_threads"] = False
    pack = validate_pack(data)
    assert pack.client.pin_threads is False
    assert '"pin_threads":false' in SweepInputs.for_point(pack, point).canonical_json()
    for bad in ("no", 0, "off"):
        data["client"]["pin_threads"] = bad
        with pytest.raises(ManifestError, match="pin_threads"):
            validate_pack(data)
