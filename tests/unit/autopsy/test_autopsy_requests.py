"""Request autopsy: SLO misses attributed to queueing, prefill, transport, client, decode."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from capacity_pack.autopsy.requests import (
    CAUSES,
    attribute_misses,
    miss_shares,
    read_ground_truth,
    request_autopsy,
    request_autopsy_markdown,
)
from capacity_pack.vocab.slo import class_cutoffs

CUTOFFS = {"interactive": (250.0, 25.0), "long_context": (600.0, 30.0)}
T0 = 5_000_000_000_000  # client CLOCK_MONOTONIC at the run's start
OFFSET = 1_790_000_000_000_000_000  # server epoch - monotonic
MS = 1_000_000
N = 80
OUT = 10

# Injected faults (request index -> what happened).
BURST = range(10, 20)  # a burst: long waits in the engine's queue
SLOW_PREFILL = range(30, 35)
PREEMPTED = range(40, 45)  # TPOT over the cutoff, preempted
INTERFERED = range(45, 48)  # TPOT over the cutoff, not preempted
CLIENT_LATE = range(50, 53)  # the load generator sent 1 s late and read 650 ms late
BOTH = 60  # queued and preempted


def synthetic(n: int = N, faults: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A requests table and the engine's ground truth, one request every 100 ms."""
    i = np.arange(n)
    klass = np.where(i % 4 == 3, "long_context", "interactive")
    late = np.full(n, 0.1)
    t_in = np.full(n, 0.2)
    queue = np.full(n, 1.0)
    prefill = np.where(klass == "long_context", 60.0, 20.0)
    emit = np.full(n, 0.1)
    t_out = np.full(n, 0.3)
    tpot = np.full(n, 10.0)
    preempt = np.zeros(n, dtype=np.int64)
    if faults:
        queue[list(BURST)] = 700.0 + 10 * np.arange(len(BURST))
        prefill[list(SLOW_PREFILL)] = 700.0
        tpot[list(PREEMPTED)] = 40.0
        preempt[list(PREEMPTED)] = 1
        tpot[list(INTERFERED)] = 40.0
        late[list(CLIENT_LATE)] = 1000.0
        t_out[list(CLIENT_LATE)] = 650.0
        queue[BOTH], tpot[BOTH], preempt[BOTH] = 400.0, 40.0, 2
    due_off = (i * 100 * MS).astype(np.int64)
    sent_off = due_off + (late * MS).astype(np.int64)
    sent = T0 + sent_off
    arrival = sent + (t_in * MS).astype(np.int64)
    scheduled = arrival + (queue * MS).astype(np.int64)
    first = scheduled + (prefill * MS).astype(np.int64)
    first_sent = first + (emit * MS).astype(np.int64)
    client_first = first_sent + (t_out * MS).astype(np.int64)
    end = client_first + (tpot * (OUT - 1) * MS).astype(np.int64)
    ttft = (client_first - sent) / MS
    requests = pd.DataFrame(
        {
            "request_id": [f"p.cold.rep0.{k:06d}" for k in i],
            "class": klass,
            "point": "p",
            "cache_state": "cold",
            "repeat": 0,
            "phase": "measure",
            "status": "ok",
            "output_tokens": OUT,
            "ttft_ms": ttft,
            "tpot_ms": (end - client_first) / MS / (OUT - 1),
            "e2e_ms": (end - sent) / MS,
            "client_delay_ms": (sent_off - due_off) / MS,
            "due_offset_ns": due_off,
            "sent_offset_ns": sent_off,
            "sent_ns": sent,
            "end_ns": end,
        }
    )
    ground_truth = pd.DataFrame(
        {
            "request_id": requests["request_id"],
            "clock_offset_ns": OFFSET,
            "arrival_ns": arrival + OFFSET,
            "scheduled_ns": scheduled + OFFSET,
            "first_token_ns": first + OFFSET,
            "first_token_sent_ns": first_sent + OFFSET,
            "preemptions": preempt,
        }
    )
    return requests, ground_truth


def series(requests: pd.DataFrame) -> pd.DataFrame:
    """Scrapes 1 ms before each due time: the queue holds 5 during the burst; the preemption
    counter steps at 4050 and 4450 ms (over the preempted requests' lifetimes) and once more
    for the request that missed both."""
    due = requests["due_offset_ns"].to_numpy()
    depth = np.zeros(len(due))
    depth[list(BURST)] = 5.0
    depth[BOTH] = 3.0
    q = pd.DataFrame({"t_offset_ns": due - MS, "metric": "queue_depth", "value": depth})
    t = np.arange(0, len(due) * 100 + 400, 100) * MS + 50 * MS
    counter = (t >= 4050 * MS).astype(float) + (t >= 4450 * MS) + (t >= 6050 * MS)
    p = pd.DataFrame({"t_offset_ns": t, "metric": "preemptions", "value": counter})
    s = pd.concat([q, p], ignore_index=True)
    s["source"] = "server"
    s["realtime_ns"] = s["t_offset_ns"] + OFFSET + T0
    return s[["t_offset_ns", "realtime_ns", "source", "metric", "value"]]


def causes_of(att: pd.DataFrame, idx) -> set[str]:
    ids = {f"p.cold.rep0.{k:06d}" for k in idx}
    return set(att.loc[att["request_id"].isin(ids), "cause"])


def test_ground_truth_attributes_each_injected_fault():
    req, gt = synthetic()
    att = attribute_misses(req, CUTOFFS, gt)
    faulty = [*BURST, *SLOW_PREFILL, *PREEMPTED, *INTERFERED, *CLIENT_LATE, BOTH]
    assert sorted(att["request_id"]) == sorted(f"p.cold.rep0.{k:06d}" for k in faulty)
    assert set(att["method"]) == {"ground_truth"}
    assert causes_of(att, BURST) == {"queueing"}
    assert causes_of(att, SLOW_PREFILL) == {"prefill"}
    assert causes_of(att, PREEMPTED) == {"preemption"}
    assert causes_of(att, INTERFERED) == {"decode"}
    assert causes_of(att, CLIENT_LATE) == {"client_scheduling"}
    both = att.set_index("request_id").loc[f"p.cold.rep0.{BOTH:06d}"]
    assert (both["miss"], both["cause"], both["secondary_cause"]) == (
        "ttft+tpot",
        "queueing",
        "preemption",
    )
    assert both["preemptions"] == 2 and bool(both["preempted"])
    # Components are the injected values; TTFT is their sum.
    burst = att[att["cause"] == "queueing"].set_index("request_id")
    first = burst.loc["p.cold.rep0.000010"]
    assert first["queueing_ms"] == pytest.approx(700.0, abs=1e-3)
    assert first["prefill_ms"] == pytest.approx(20.0, abs=1e-3)
    assert first["transport_in_ms"] == pytest.approx(0.2, abs=1e-3)
    assert first["transport_out_ms"] == pytest.approx(0.3, abs=1e-3)
    parts = att[["transport_in_ms", "queueing_ms", "prefill_ms", "emit_ms", "transport_out_ms"]]
    np.testing.assert_allclose(parts.sum(axis=1), att["ttft_ms"], atol=1e-6)
    # Excess over the SLO-meeting median of the class (queueing 1 ms, TPOT 10 ms).
    assert first["cause_excess_ms"] == pytest.approx(699.0, abs=1e-3)
    pre = att[att["cause"] == "preemption"]
    np.testing.assert_allclose(pre["cause_excess_ms"], 30.0, atol=1e-3)
    assert (att["ttft_cutoff_ms"] == att["class"].map(lambda c: CUTOFFS[c][0])).all()


def test_queueing_excess_beats_a_naturally_large_prefill():
    """Long prompts take 400 ms of prefill by nature; the 250 ms wait in the queue is the
    anomaly, though prefill is still the larger component."""
    req, gt = synthetic(faults=False)
    longc = (req["class"] == "long_context").to_numpy()
    gt.loc[longc, ["first_token_ns", "first_token_sent_ns"]] += 340 * MS
    req.loc[longc, ["ttft_ms", "e2e_ms"]] += 340.0
    k = 3
    gt.loc[k, ["scheduled_ns", "first_token_ns", "first_token_sent_ns"]] += 250 * MS
    req.loc[k, ["ttft_ms", "e2e_ms"]] += 250.0
    att = attribute_misses(req, CUTOFFS, gt)
    assert list(att["cause"]) == ["queueing"]
    row = att.iloc[0]
    assert row["prefill_ms"] == pytest.approx(400.0, abs=1e-3)
    assert row["queueing_ms"] == pytest.approx(251.0, abs=1e-3)
    assert row["cause_excess_ms"] == pytest.approx(250.0, abs=1e-3)


def test_shares_sum_to_one_and_count_failures():
    req, gt = synthetic()
    failed = pd.DataFrame(req.iloc[:3].copy())
    failed["request_id"] = ["f1", "f2", "f3"]
    failed["status"] = ["error", "timeout", "error"]
    failed["ttft_ms"] = 0.0
    warm = req.iloc[:2].copy()
    warm["request_id"] = ["w1", "w2"]
    warm["phase"] = "warmup"
    warm["ttft_ms"] = 9999.0  # a warm-up miss is not counted
    table = pd.concat([req, failed, warm], ignore_index=True)
    att = attribute_misses(table, CUTOFFS, gt)
    shares = miss_shares(att, table)
    json.dumps(shares)
    for name, entry in [*shares["classes"].items(), ("overall", shares["overall"])]:
        if entry["missed"]:
            assert math.isclose(sum(entry["cause_share"].values()), 1.0), name
        assert set(entry["cause_share"]) == set(CAUSES)
    inter = shares["classes"]["interactive"]
    n_inter = int((req["class"] == "interactive").sum())
    assert inter["successful"] == n_inter
    assert inter["missed"] == int((att["class"] == "interactive").sum())
    assert inter["failed_by_status"] == {"error": 2, "timeout": 1}
    assert inter["attainment"] == pytest.approx(1 - inter["missed"] / n_inter)
    ov = shares["overall"]
    assert ov["missed"] == len(att) == 27
    assert ov["failed"] == 3 and ov["successful"] == N
    assert ov["cause_counts"]["queueing"] == len(BURST) + 1
    assert ov["cause_share"]["queueing"] == pytest.approx(11 / 27)
    assert ov["secondary_counts"] == {"preemption": 1}
    # Four interactive (700 - 20 ms) and one long_context (700 - 60 ms).
    assert ov["mean_excess_ms"]["prefill"] == pytest.approx((4 * 680 + 640) / 5, abs=1e-3)
    assert ov["mean_excess_ms"]["transport"] is None
    assert ov["methods"] == {"ground_truth": 27}


def test_server_series_fallback_estimates_causes():
    req, _ = synthetic()
    att = attribute_misses(req, CUTOFFS, None, series(req))
    assert set(att["method"]) == {"server_series"}
    assert causes_of(att, BURST) == {"queueing"}
    assert att.loc[att["cause"] == "queueing", "queue_depth_at_send"].min() >= 3.0
    assert causes_of(att, SLOW_PREFILL) == {"prefill"}
    assert causes_of(att, PREEMPTED) == {"preemption"}
    assert causes_of(att, INTERFERED) == {"decode"}
    assert causes_of(att, CLIENT_LATE) == {"client_scheduling"}
    both = att.set_index("request_id").loc[f"p.cold.rep0.{BOTH:06d}"]
    assert (both["cause"], both["secondary_cause"]) == ("queueing", "preemption")
    # Estimates carry no server components; the whole TTFT excess goes to the cause.
    assert att["queueing_ms"].isna().all() and att["preemptions"].isna().all()
    row = att.set_index("request_id").loc["p.cold.rep0.000010"]
    meets = (req["class"] == "interactive") & ~req["request_id"].isin(att["request_id"])
    typical = req.loc[meets, "ttft_ms"].median()
    assert row["cause_excess_ms"] == pytest.approx(row["ttft_ms"] - typical, rel=0.01)
    shares = miss_shares(att, req)
    assert math.isclose(sum(shares["overall"]["cause_share"].values()), 1.0)


def test_server_series_queue_above_a_standing_floor():
    """An engine whose queue never drains below 2: only depth above that floor is queueing."""
    req, _ = synthetic()
    s = series(req)
    s.loc[s["metric"] == "queue_depth", "value"] += 2.0
    att = attribute_misses(req, CUTOFFS, None, s)
    assert causes_of(att, BURST) == {"queueing"}
    assert causes_of(att, SLOW_PREFILL) == {"prefill"}


def test_ground_truth_preferred_and_client_only_without_sources():
    req, gt = synthetic()
    att = attribute_misses(req, CUTOFFS, gt.iloc[:40], series(req))
    by_method = att.groupby("method")["request_id"].count().to_dict()
    assert by_method == {"ground_truth": 15, "server_series": 12}
    bare = attribute_misses(req, CUTOFFS)
    assert set(bare["method"]) == {"client_only"}
    assert causes_of(bare, CLIENT_LATE) == {"client_scheduling"}
    assert set(bare["cause"]) == {"client_scheduling", "unattributed"}


def test_no_misses_gives_empty_attribution_and_zero_shares():
    req, gt = synthetic(faults=False)
    att = attribute_misses(req, CUTOFFS, gt, series(req))
    assert att.empty and "cause" in att.columns
    shares = miss_shares(att, req)
    json.dumps(shares)
    for entry in [*shares["classes"].values(), shares["overall"]]:
        assert entry["missed"] == 0 and entry["attainment"] == 1.0
        assert all(v == 0.0 for v in entry["cause_share"].values())
        assert all(v is None for v in entry["mean_excess_ms"].values())
    empty = req.iloc[:0]
    none = miss_shares(attribute_misses(empty, CUTOFFS), empty)
    assert none["overall"]["successful"] == 0 and none["overall"]["attainment"] is None


def test_unknown_class_and_cutoff_forms():
    req, _ = synthetic()
    with pytest.raises(ValueError, match="long_context"):
        attribute_misses(req, {"interactive": (250.0, 25.0)})
    as_dicts = {k: {"ttft_ms": a, "tpot_ms": b} for k, a, b in [("x", 1, 2)]}
    assert class_cutoffs(as_dicts) == {"x": (1.0, 2.0)}


def test_read_ground_truth_ignores_a_torn_line(tmp_path):
    _, gt = synthetic(n=3, faults=False)
    path = tmp_path / "ground_truth.jsonl"
    lines = [json.dumps({**r, "extra": None}) for r in gt.to_dict("records")]
    path.write_text("\n".join(lines) + "\n" + lines[0][:20])
    back = read_ground_truth(path)
    assert len(back) == 3
    assert back["first_token_ns"].tolist() == gt["first_token_ns"].tolist()  # exact ns


def test_request_autopsy_on_a_tables_tree(tmp_path):
    req, gt = synthetic()
    tables, raw = tmp_path / "tables", tmp_path / "raw"
    for rep, with_gt in ((0, True), (1, False)):
        d = tables / "p" / "cold" / f"rep{rep}"
        d.mkdir(parents=True)
        req.to_parquet(d / "requests.parquet")
        series(req).to_parquet(d / "server_metrics.parquet")
        if with_gt:
            r = raw / "p" / "cold" / f"rep{rep}"
            r.mkdir(parents=True)
            (r / "ground_truth.jsonl").write_text(
                "".join(json.dumps(x) + "\n" for x in gt.to_dict("records"))
            )
    doc = request_autopsy(tables, raw, {k: v for k, v in CUTOFFS.items()})
    json.dumps(doc)
    assert set(doc["points"]) == {"p/cold/rep0", "p/cold/rep1"}
    assert doc["points"]["p/cold/rep0"]["overall"]["methods"] == {"ground_truth": 27}
    assert doc["points"]["p/cold/rep1"]["overall"]["methods"] == {"server_series": 27}
    md = request_autopsy_markdown(doc)
    assert "## p/cold/rep0" in md and "| interactive |" in md
    assert "add replicas or lower the offered rate" in md


def test_real_misses_are_attributed_from_ground_truth(real_run):
    """The committed fixture's pack run (tests/data/autopsy; real_run is in conftest.py)."""
    from capacity_pack.plan.manifest import load_pack

    pack = load_pack(real_run.fixture / "pack.yaml")
    tables, raw = real_run.results / "tables", real_run.results / "raw"
    points = sorted(tables.glob("*/*/rep*/requests.parquet"))
    assert points
    total, by_point = 0, {}
    for path in points:
        rel = path.parent.relative_to(tables)
        gt_path = raw / rel / "ground_truth.jsonl"
        # The pack writes the simulator's ground truth for every point: a table without it is
        # an incomplete results tree, which must fail rather than pass unchecked.
        assert gt_path.exists(), f"no ground truth for {rel}"
        req = pd.read_parquet(path)
        series_ = pd.read_parquet(path.parent / "server_metrics.parquet")
        att = attribute_misses(req, pack, read_ground_truth(gt_path), series_)
        measured = req[req["phase"].isin(["measure", "extension"]) & (req["status"] == "ok")]
        cut = measured["class"].map({c.name: c for c in pack.workload})
        over = (measured["ttft_ms"] > cut.map(lambda c: c.request_ttft_cutoff_ms)) | (
            measured["tpot_ms"] > cut.map(lambda c: c.request_tpot_cutoff_ms)
        )
        assert len(att) == int(over.sum())
        total += len(att)
        by_point[rel.as_posix()] = len(att)
        if att.empty:
            continue
        assert set(att["method"]) == {"ground_truth"}
        assert att[["queueing_ms", "prefill_ms", "transport_in_ms"]].notna().all().all()
        # Same host, same clock: the server cannot see a request before the client sends it.
        assert (att["transport_in_ms"] > 0).all() and (att["transport_out_ms"] > -1.0).all()
        parts = ["transport_in_ms", "queueing_ms", "prefill_ms", "emit_ms", "transport_out_ms"]
        np.testing.assert_allclose(att[parts].sum(axis=1), att["ttft_ms"], atol=1e-6)
        shares = miss_shares(att, req)
        for entry in [*shares["classes"].values(), shares["overall"]]:
            if entry["missed"]:
                assert math.isclose(sum(entry["cause_share"].values()), 1.0)
    # The fixture's highest open-loop rate overloads the simulated engine.
    top = max(pack.sweep.open_loop_rps)
    assert sum(n for k, n in by_point.items() if k.startswith(f"open-r{top:g}/")) > 0
    doc = request_autopsy(tables, raw, pack)
    json.dumps(doc)
    assert set(doc["points"]) == set(by_point)
    assert {k: p["overall"]["missed"] for k, p in doc["points"].items()} == by_point
    assert sum(p["overall"]["missed"] for p in doc["points"].values()) == total
    assert f"open-r{top:g}" in request_autopsy_markdown(doc)
