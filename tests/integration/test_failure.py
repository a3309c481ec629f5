"""Failure drills: planning, analysis on hand-made timelines, and real drills on 127.0.0.1.

The real drills run the simulated cluster (router + replica processes), the load generator,
the scraper and the injector for real, then evaluate the pack's alert rules over the scraped
series. Each drill must fire the alert that names its mechanism and no other drill's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capacity_pack.artifacts import FailureTest
from capacity_pack.drills import analyze
from capacity_pack.drills.analyze import (
    DrillAnalysisSpec,
    counter_increase,
    phase_stats,
    queue_evidence,
    windows,
)
from capacity_pack.drills.plan import (
    CONSEQUENCES,
    MECHANISM,
    DrillError,
    DrillInputs,
    drill_schedule,
)
from capacity_pack.drills.render import failure_test, failure_test_markdown
from capacity_pack.engines.metric_map import ROUTER_OUTSTANDING
from capacity_pack.track import records
from tests.drills import make_pack, plan_at, run_all

NS = 1_000_000_000


# -- planning ----------------------------------------------------------------------------------


def capacity_doc(per_replica: float | None) -> dict:
    sel = {"capacity_per_replica_rps": per_replica, "capacity_rps": per_replica}
    return {"primary_cache_state": "cold", "open_loop": {"cold": sel, "warm": sel}}


def report(rate: float, in_flight: float) -> dict:
    return {"offered_rps": rate, "littles_law": {"average_in_flight": in_flight}}


def test_plan_uses_the_selected_capacity_and_littles_law():
    pack = make_pack()
    inputs = DrillInputs.for_drill(pack, "replica_kill")
    reports = {"a": report(15, 10.0), "b": report(15, 12.5), "c": report(20, 30.0)}
    plan = plan_at(inputs, capacity_doc(15.0), reports, None, None)
    assert plan.replicas == 2 and plan.scope == "capacity_point"
    assert plan.rate_rps == 30.0 and plan.rate_after_rps == 30.0
    assert "15 RPS per replica" in plan.rate_source
    # 2 x the larger in-flight count measured at 15 RPS (not at 20 RPS).
    assert plan.admission_max_outstanding == 25
    assert plan.inject_at_s == 8 and plan.restore_at_s is None
    cold = plan_at(
        DrillInputs.for_drill(pack, "cold_replica"), capacity_doc(15.0), reports, None, None
    )
    assert cold.rate_after_rps == 30.0  # the default pack keeps the load steady (2-core host)
    stepped = make_pack(lambda d: d["failure"]["drills"][1].pop("rate_multiplier"))
    cold = plan_at(
        DrillInputs.for_drill(stepped, "cold_replica"), capacity_doc(15.0), reports, None, None
    )
    assert cold.rate_after_rps == pytest.approx(45.0)  # (N + 1) / N: the autoscaler's trigger
    kv = plan_at(
        DrillInputs.for_drill(pack, "kv_pressure"), capacity_doc(15.0), reports, None, None
    )
    assert kv.restore_at_s == 16
    # Past this host's live limit the router, not the mechanism, would be measured: capped.
    capped = plan_at(inputs, capacity_doc(30.0), reports, None, None)
    assert capped.rate_rps == 40.0 and "capped at this host's live limit" in capped.rate_source


def test_plan_without_a_capacity_point_falls_back_and_says_so():
    inputs = DrillInputs.for_drill(make_pack(), "replica_kill")
    plan = plan_at(
        inputs, capacity_doc(None), {"a": report(20, 10.0), "b": report(40, 9)}, None, None
    )
    assert plan.rate_rps == 40.0  # lowest tested rate (20 on one replica) x 2 replicas
    assert "no capacity point selected" in plan.rate_source
    configured = make_pack(lambda d: d["failure"].update(rate_rps=12, admission_max_outstanding=5))
    plan = plan_at(DrillInputs.for_drill(configured, "replica_kill"), None, {}, None, None)
    assert plan.rate_rps == 12 and plan.admission_max_outstanding == 5
    with pytest.raises(DrillError, match="set failure.rate_rps"):
        plan_at(inputs, None, {}, None, None)


def test_real_target_without_commands_is_skipped_with_a_reason():
    def real(d):
        d["target"] = {"kind": "openai", "base_url": "http://127.0.0.1:9", "cache_reset": "none"}

    pack = make_pack(real)
    plan = plan_at(DrillInputs.for_drill(pack, "replica_kill"), capacity_doc(30.0), {}, None, None)
    assert not plan.runnable
    assert "needs failure.drills[].commands" in plan.skip_reason
    # Cancellations are the client's own doing: they need no command.
    plan = plan_at(DrillInputs.for_drill(pack, "cancellation"), capacity_doc(30.0), {}, None, None)
    assert plan.runnable


def test_bad_drill_settings_are_refused_with_the_field():
    with pytest.raises(Exception, match="replica 5 does not exist"):
        make_pack(lambda d: d["failure"]["drills"][0].update(replica=5))
    with pytest.raises(Exception, match="drill names must be unique"):
        make_pack(
            lambda d: d["failure"]["drills"].append({"name": "replica_kill", "kind": "kv_pressure"})
        )
    pack = make_pack(lambda d: d["failure"]["drills"][2].update(fault_s=30))
    with pytest.raises(DrillError, match="after the schedule"):
        plan_at(DrillInputs.for_drill(pack, "kv_pressure"), capacity_doc(30.0), {}, None, None)


def test_cancellation_schedule_cancels_only_inside_the_fault_window():
    pack = make_pack()
    inputs = DrillInputs.for_drill(pack, "cancellation")
    plan = plan_at(inputs, capacity_doc(30.0), {}, None, None)
    frame, start = drill_schedule(inputs, plan)
    again, _ = drill_schedule(inputs, plan)
    pd.testing.assert_frame_equal(frame, again)  # seeded
    cancelled = frame[frame["cancel_after_ns"] >= 0]
    lo, hi = start + 8 * NS, start + 16 * NS
    assert cancelled["scheduled_offset_ns"].between(lo, hi).all()
    inside = frame["scheduled_offset_ns"].between(lo, hi - 1).sum()
    assert 0.2 < len(cancelled) / inside < 0.4  # cancel_fraction 0.3
    assert (cancelled["cancel_after_ns"] == int(0.3 * NS)).all()


# -- analysis on hand-made timelines -------------------------------------------------------------


def spec() -> DrillAnalysisSpec:
    return DrillAnalysisSpec.of(make_pack())


def requests(rows: list[tuple[float, str, float, float]]) -> pd.DataFrame:
    """(end_s, status, ttft_ms, tpot_ms) rows of the interactive class."""
    end = np.array([r[0] for r in rows])
    frame = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(len(rows))],
            "class": "interactive",
            "status": [r[1] for r in rows],
            "ttft_ms": [r[2] for r in rows],
            "tpot_ms": [r[3] for r in rows],
            "sent_offset_ns": ((end - 0.5) * NS).astype(np.int64),
            "sent_ns": ((end - 0.5) * NS).astype(np.int64) + 1000,
            "end_ns": (end * NS).astype(np.int64) + 1000,
        }
    )
    frame["end_offset_ns"] = frame["sent_offset_ns"] + (frame["end_ns"] - frame["sent_ns"])
    frame["meets_slo"] = (
        (frame["status"] == "ok") & (frame["ttft_ms"] <= 250) & (frame["tpot_ms"] <= 25)
    )
    frame["failed"] = frame["status"].isin(["error", "timeout", "rejected"])
    return frame


def test_windows_phases_and_recovery_on_a_known_timeline():
    rows = []
    for t in np.arange(0.05, 20, 0.1):  # 10 requests per second, ended at t
        if 10 <= t < 13:
            rows.append((t, "rejected" if int(t * 10) % 2 else "ok", 900.0, 40.0))
        else:
            rows.append((t, "ok", 100.0, 10.0))
    req = requests(rows)
    s = spec()
    wins = windows(req, 0, 20 * NS, 2.0)
    assert list(wins["attempted"]) == [20] * 10
    assert wins.loc[0, "attainment"] == 1.0 and wins.loc[5, "attainment"] == 0.0
    assert wins.loc[5, "failure_share"] == pytest.approx(0.5)
    rec, rule = analyze._recovery(wins, 10 * NS, 12 * NS, s, start_s=0)
    assert rec == 14 * NS  # the window [12, 14) still holds failures; [14, 16) on all pass
    assert "first window from which every window" in rule
    # A fault that is still there keeps the service unrecovered, whatever the latencies say.
    assert analyze._recovery(wins, 10 * NS, None, s, start_s=0)[0] is None
    before = phase_stats(req, 0, 10 * NS, s)
    during = phase_stats(req, 10 * NS, 14 * NS, s)
    assert before["error_rate"] == 0 and before["attainment"] == 1.0
    assert during["rejected"] == 15 and during["attainment"] == pytest.approx(10 / 25)
    assert during["classes"]["interactive"]["ttft_p95_ms"] == 900.0


def test_queue_evidence_and_counter_increase():
    t = (np.arange(0, 20, 0.5) * NS).astype(np.int64)
    waiting = np.where((t >= 10 * NS) & (t < 13 * NS), 30.0, 1.0)
    in_flight = np.where((t >= 10 * NS) & (t < 14 * NS), 80, 40)
    samples = pd.DataFrame(
        {"t_ns": t, "metric": "vllm:num_requests_waiting", "labels": '{engine="0"}',
         "value": waiting}
    )  # fmt: skip
    scrapes = pd.DataFrame({"t_ns": t, "realtime_ns": t, "ok": True, "client_in_flight": in_flight})
    q = queue_evidence(samples, scrapes, 10 * NS, 2 * NS, "vllm:num_requests_waiting")
    assert q["peak_server_waiting"] == 30 and q["peak_client_in_flight"] == 80
    assert q["baseline_server_waiting_max"] == 1 and q["recovered_t_s"] == 14.0
    counter = pd.DataFrame(
        {"t_ns": [1, 2, 3, 4, 1, 2], "metric": "c", "labels": ["a"] * 4 + ["b"] * 2,
         "value": [0.0, 5.0, 2.0, 4.0, 1.0, 3.0]}
    )  # fmt: skip
    # a: +5, reset to 2 (counts 2), +2; b: +2.
    assert counter_increase(counter, "c") == 11.0
    assert counter_increase(counter, "missing") is None


# -- real drills -----------------------------------------------------------------------------


def drill_pack(tmp_path: Path):
    """The default pack's drills, shortened: 21 s each at 40 RPS on two replicas. The killed
    replica is back in rotation about 9 s after the injection at 6 s; the 6 s after that are
    for the survivor's backlog to drain into a recovered window on a host shared with another
    test worker (with 3 s, a fresh-clone CI run on 2026-12-06 once ended replica_kill before it
    recovered: no recovery time, capacity not returned)."""

    def short(d):
        d["failure"].update(
            rate_rps=40,
            admission_max_outstanding=24,
            duration_s=21,
            baseline_s=6,
            warmup_s=1,
            window_s=1,
            # Down and then loading (a cold replica) for longer than the rules' `for`.
            restart_after_s=3,
            cold_start_s=3.5,
        )
        for drill in d["failure"]["drills"]:
            if drill["kind"] in ("cancellation", "degraded_link"):
                drill["fault_s"] = 5
            elif drill["kind"] == "kv_pressure":
                # The default pack's 8 s: its KVCachePressure fires 3-4 s after the injection
                # (KV usage above 0.9 for 2 s, or a preemption), which 5 s left to chance (a
                # fresh-clone CI run on 2026-12-07: usage peaked at 0.997, never held 2 s, no
                # preemption, no alert).
                drill["fault_s"] = 8

    return make_pack(short)


# The tests that read the real drills are marked `exclusive` and run alone (tests/exclusive.py),
# the drills with them: five 21-s timelines of a router, two replica processes, the load
# generator and the scraper at 40 RPS, whose alerts and phases are timed. Beside two other
# workers' pipelines on a slow 2-core host (2026-12-07, the suite's shared part 86 % CPU-bound)
# the scrapes fell a second behind, requests failed before the injection, and TransferDegraded,
# QueueSaturation and ColdReplica fired in drills that inject none of them; alone on the same
# host every test passed.
@pytest.fixture(scope="module")
def drill_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("drills")


@pytest.fixture(scope="module")
def drills(drill_root):
    return run_all(drill_pack(drill_root), drill_root)


@pytest.mark.slow
@pytest.mark.exclusive
def test_replica_kill_fields_are_present_and_consistent(drills):
    r = drills["replica_kill"]
    inj = r["injection_time_s"]
    assert r["injection_source"].startswith("router event 'killed'")
    # Detection and router removal after the injection; recovery after the removal.
    assert inj < r["detection_time_s"] < inj + 5
    assert inj <= r["router_removal_time_s"] < inj + 1
    assert r["fault_cleared_time_s"] > r["router_removal_time_s"]
    assert r["recovery_time_s"] >= r["fault_cleared_time_s"]
    assert inj <= r["first_error_time_s"] <= r["last_error_time_s"]
    # No request without a terminal status: every scheduled request recorded exactly once.
    done = r["schedule_completeness"]
    assert done["cut_at_max_duration"] == 0 and done["recorded"] == done["expected"]
    assert sum(r["terminal_statuses"].values()) == done["expected"]
    assert set(r["terminal_statuses"]) <= {"ok", "error", "timeout", "rejected", "cancelled"}
    assert r["requests_lost"] >= 1  # the streams cut by SIGKILL
    assert r["requests_retried"] is not None
    q = r["queue"]
    assert q["peak_client_in_flight"] is not None and q["recovered_t_s"] is not None
    assert "ReplicaDown" in r["alerts_fired"]
    down = next(a for a in r["alerts"] if a["alert"] == "ReplicaDown")
    assert 'replica="0"' in down["labels"] and down["firing_t_s"] >= inj
    back = r["capacity_returned_without_manual_repair"]
    assert back["value"] is True and back["manual_actions"] == 0
    for phase in ("before", "during", "after"):
        st = r["phases"][phase]
        assert st["attempted"] > 0
        assert set(st["classes"]) == {"interactive", "long_context", "generation_heavy"}
    assert r["phases"]["before"]["error_rate"] == 0
    assert r["clock_check"]["max_divergence_us"] < 1000
    assert "CLOCK_MONOTONIC" in r["clock"]


@pytest.mark.slow
@pytest.mark.exclusive
@pytest.mark.parametrize(
    "name", ["replica_kill", "cold_replica", "kv_pressure", "cancellation", "degraded_link"]
)
def test_each_drill_fires_its_own_alert_and_no_other_drills(drills, name):
    r = drills[name]
    assert r["expected_alert_fired"], (name, r["alerts_fired"])
    own = [a for a in r["alerts"] if a["mechanism"] == MECHANISM[name] and a["firing_t_s"]]
    assert min(a["firing_t_s"] for a in own) >= r["injection_time_s"]
    others = {MECHANISM[k] for k in MECHANISM if k != name} - CONSEQUENCES[name]
    fired = {a["mechanism"] for a in r["alerts"] if a["firing_t_s"] is not None}
    assert not fired & others, (name, r["alerts_fired"])
    assert r["unexpected_mechanisms_fired"] == []


@pytest.mark.slow
@pytest.mark.exclusive
def test_admission_control_sheds_instead_of_queueing(drills, drill_root):
    r = drills["replica_kill"]
    # One survivor cannot carry 40 RPS: the router answers 429 rather than queue without bound.
    assert r["requests_rejected"] > 0 and r["admission_rejected"] > 0
    # The router never holds more than the cap on a replica, at any scrape...
    samples = pd.read_parquet(drill_root / "replica_kill" / "samples.parquet")
    outstanding = samples[samples["metric"] == ROUTER_OUTSTANDING]
    assert len(outstanding) and outstanding["value"].max() <= 24
    # ...and the client's in-flight count stays near it: the cap plus the arrivals of the half
    # second a refusal may take to come back on a loaded host (40 RPS x 0.5 s), where an
    # unbounded queue would hold ~(40 - survivor's capacity) x 12 s.
    assert r["queue"]["peak_client_in_flight"] <= 24 + 40 * 0.5


@pytest.mark.slow
@pytest.mark.exclusive
def test_failure_test_markdown_names_every_seed_field(drills, tmp_path):
    doc = failure_test(list(drills.values()), {"name": "t", "label": "rehearsal"})
    md = failure_test_markdown(doc)
    for field in (
        "injection_time", "detection_time", "router_removal_time", "first_error_time",
        "last_error_time", "queue peak", "queue recovery time", "recovery_time",
        "requests retried", "requests rejected", "requests lost", "alerts fired",
        "capacity returned without manual repair", "| before |", "| during |", "| after |",
    ):  # fmt: skip
        assert field in md, field
    for name in drills:
        assert f"## Drill `{name}`" in md
    assert (
        "n/a"
        not in md.split("## Drill `replica_kill`")[1]
        .split("## Drill")[0]
        .split("Alerts (evaluated")[0]
    )
    json.dumps(doc, allow_nan=False)  # the JSON twin is strict JSON
    # ...and what its model reads back, field for field.
    assert FailureTest.parse(doc, "failure-test.json").dump() == json.loads(json.dumps(doc))
    assert doc["clock"] and f"Every time below is in seconds on one clock: {doc['clock']}" in md
    # Drills on different clocks (a live one and one in virtual time) name no common clock:
    # each section names its own.
    live = drills["replica_kill"]
    virtual = {**live, "drill": "replica_kill_virtual", "clock": "virtual: the engine model's"}
    mixed = failure_test([live, virtual], {"name": "t"})
    assert FailureTest.parse(mixed, "failure-test.json").clock is None
    assert mixed["clock"] is None
    assert mixed["clocks"] == {
        "replica_kill": live["clock"],
        "replica_kill_virtual": virtual["clock"],
    }
    md = failure_test_markdown(mixed)
    assert "one clock" not in md and "each drill's own clock" in md
    assert f"- Clock: {live['clock']}." in md and "- Clock: virtual: the engine model's." in md


def test_tracking_record_of_a_skipped_drill():
    skipped = {"drill": "x", "kind": "kv_pressure", "mechanism": "kv_pressure", "skipped": "why"}
    rec = records.drill(skipped)
    assert rec["job"] == "failure/x" and rec["tags"]["capacity_pack.skipped"] == "true"
    assert rec["run_name"] == "drill · x"
    assert rec["metrics"] == {}
