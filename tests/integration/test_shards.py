"""Sharded load generation: assignment, shared start, clock checks, merge and its checks.

The end-to-end tests run real shard processes (``capacity-pack shard``) against the simulated
engine on 127.0.0.1 and normalize and analyze what they wrote.
"""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pandas as pd
import pytest
import yaml

from capacity_pack.evidence.analysis import analyze_point
from capacity_pack.evidence.gates import pack_gates
from capacity_pack.evidence.normalize import NormalizeError, normalize_point
from capacity_pack.evidence.slo_report import pack_classes
from capacity_pack.measure.clock import clock_sample
from capacity_pack.measure.shards import (
    Rendezvous,
    ShardError,
    assign_shards,
    assignment_seed,
    clock_check,
    merge_series,
)
from capacity_pack.measure.sweep import measure_point
from capacity_pack.plan import schedule as S
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.track.records import sweep as sweep_record
from tests.conftest import with_fixed_lengths
from tests.paths import DEFAULT


def small_pack(**client):
    data = yaml.safe_load(DEFAULT.read_text())
    data["client"].update(
        initial_scheduled_requests=120, warmup_seconds=1, minimum_duration_seconds=2, **client
    )
    data["client"].pop("class_schedule_counts")
    data["acceptance"]["min_successful_samples_per_class"] = 10
    # Fixed lengths, as the shard counts and series checks were set on.
    return validate_pack(with_fixed_lengths(data))


def point(rate=30, cache="cold"):
    return S.Point(mode="open", rate_rps=rate, cache_state=cache, repeat=0)


# -- assignment ---------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 3, 8])
def test_assignment_is_a_deterministic_balanced_interleaving(k):
    pack = small_pack()
    sched = S.build_schedule(pack, point())
    seed = assignment_seed(pack.client.request_schedule_seed, point().key)
    a = assign_shards(sched, k, seed)
    assert np.array_equal(a, assign_shards(sched, k, seed))
    assert set(a) == set(range(k))
    counts = np.bincount(a, minlength=k)
    # One arrival per shard in every full window of k consecutive arrivals.
    assert counts.max() - counts.min() <= 1
    order = np.lexsort((sched["seq"].to_numpy(), sched["scheduled_offset_ns"].to_numpy()))
    windows = a[order][: len(a) // k * k].reshape(-1, k)
    assert all(sorted(w) == list(range(k)) for w in windows)
    # The permutation is seeded: not the same fixed round-robin in every window.
    assert len({tuple(w) for w in windows}) > 1
    assert not np.array_equal(a, assign_shards(sched, k, seed + 1))
    # Row order of the frame does not change who sends what.
    shuffled = sched.sample(frac=1.0, random_state=3)
    b = pd.Series(assign_shards(shuffled, k, seed), index=shuffled["request_id"])
    assert (b[sched["request_id"]].to_numpy() == a).all()


def test_one_shard_takes_everything():
    sched = S.build_schedule(small_pack(), point())
    assert (assign_shards(sched, 1, 7) == 0).all()


# -- clocks -------------------------------------------------------------------------------------


def clock(host="a", boot="b1", start=0, end=0, ntp=None):
    s = {"realtime_ns": 0, "monotonic_ns": 0, "offset_ns": start, "uncertainty_ns": 100}
    e = {"realtime_ns": 0, "monotonic_ns": 0, "offset_ns": end, "uncertainty_ns": 100}
    return {"host": host, "boot_id": boot, "start": s, "end": e, "ntp": ntp}


def test_clock_check_same_host_within_and_beyond_tolerance():
    ok = clock_check([clock(start=10, end=20), clock(start=30, end=40)], 1.0)
    assert ok["valid"] is True and ok["reasons"] == [] and ok["hosts"] == 1
    assert ok["same_host_skew"][0]["spread_ms"] == pytest.approx(20e-6)
    skewed = clock_check([clock(), clock(start=3_000_000, end=3_000_000)], 1.0)
    assert skewed["valid"] is False
    assert any("spread 3.000 ms at the start" in r for r in skewed["reasons"])


def test_clock_check_drift_within_one_shard():
    res = clock_check([clock(start=0, end=5_000_000)], 1.0)
    assert res["valid"] is False
    assert res["reasons"] == [
        "shard 0: realtime moved +5.000 ms against the monotonic clock during the run "
        "(tolerance 1.0 ms)"
    ]


def test_clock_check_across_hosts_needs_ntp_evidence():
    unmeasured = clock_check([clock("a", "b1"), clock("b", "b2")], 1.0)
    assert unmeasured["valid"] is None
    assert unmeasured["missing_evidence"] == [
        "skew between a and b: no NTP state (chronyc) on both"
    ]
    ntp = {"system_offset_s": 0.0001, "root_delay_s": 0.0002, "root_dispersion_s": 0.0001}
    far = {"system_offset_s": -0.004, "root_delay_s": 0.0002, "root_dispersion_s": 0.0001}
    good = clock_check([clock("a", "b1", ntp=ntp), clock("b", "b2", ntp=ntp)], 1.0)
    assert good["valid"] is True
    assert good["cross_host_skew"][0]["bound_ms"] == pytest.approx(0.4)
    bad = clock_check([clock("a", "b1", ntp=ntp), clock("b", "b2", ntp=far)], 1.0)
    assert bad["valid"] is False and "NTP bounds their realtime skew only to" in bad["reasons"][0]


def test_clock_sample_is_tight():
    s = clock_sample()
    assert s["uncertainty_ns"] < 1_000_000
    assert abs(s["offset_ns"] - (time.time_ns() - time.perf_counter_ns())) < 50_000_000


# -- rendezvous ---------------------------------------------------------------------------------


def test_rendezvous_gives_every_shard_the_same_start(tmp_path):
    starts: dict[int, int] = {}

    def shard(i: int, delay: float) -> None:
        time.sleep(delay)
        starts[i] = Rendezvous(tmp_path, 3, i, lead_s=0.5, timeout_s=10)()

    threads = [threading.Thread(target=shard, args=(i, 0.1 * i)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(starts.values())) == 1
    ready = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("ready-*.json"))]
    assert starts[0] == max(r["realtime_ns"] for r in ready) + 500_000_000
    assert starts[0] > time.time_ns() - 1_000_000_000


def test_rendezvous_timeout_names_the_missing_shards(tmp_path):
    with pytest.raises(ShardError, match=r"shard 0: only 1 of 2 shards ready in .* after 0.2 s"):
        Rendezvous(tmp_path, 2, 0, lead_s=0.1, timeout_s=0.2)()


# -- series merge -------------------------------------------------------------------------------


def test_client_series_are_summed_per_sample_and_server_series_come_from_shard_0():
    def frame(shard: int, in_flight: list[float], server: bool) -> pd.DataFrame:
        rows = []
        for j, v in enumerate(in_flight):
            t = j * 1_000_000_000 + shard * 3_000  # the shards sample a few us apart
            rows.append((t, 10 + t, "client", "in_flight", v))
            if server:
                rows.append((t, 10 + t, "server", "queue_depth", 1.0))
        return pd.DataFrame(rows, columns=["t_offset_ns", "realtime_ns", "source", "metric",
                                           "value"])  # fmt: skip

    merged = merge_series([frame(0, [1, 2, 3], True), frame(1, [4, 5, 6], False)], 1.0)
    client = merged[merged["source"] == "client"]
    assert client["value"].tolist() == [5.0, 7.0, 9.0]
    assert client["t_offset_ns"].tolist() == [0, 1_000_000_000, 2_000_000_000]
    assert (merged["source"] == "server").sum() == 3


# -- end to end against the simulated engine ----------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same warm point run with 1 and with 2 shards (real shard processes)."""
    out = {}
    for k in (1, 2):
        pack = small_pack(shards=k)
        p = point(cache="warm")
        d = tmp_path_factory.mktemp(f"k{k}")
        sched = S.build_schedule(pack, p)
        sched.to_parquet(d / "schedule.parquet", index=False)
        # One process runs the planned schedule too (no in-run decision, no extension), as a
        # sharded point does: the same population to compare.
        summary = measure_point(pack, p, sched, d, in_run=k > 1)
        out[k] = (pack, p, d, summary)
    return out


def normalized(run):
    pack, p, d, summary = run
    return normalize_point(
        d / "records.jsonl",
        d / "schedule.parquet",
        d / "metrics.parquet",
        summary,
        S.ScheduleInputs.for_point(pack, p),
        p,
    )


@pytest.mark.slow
def test_two_shards_send_the_same_population_as_one(runs):
    one, two = normalized(runs[1]), normalized(runs[2])
    assert set(one["requests"]["request_id"]) == set(two["requests"]["request_id"])
    n = len(pd.read_parquet(runs[2][2] / "schedule.parquet")) + 8  # and 8 prewarm requests
    assert len(two["requests"]) == two["reconciliation"]["expected"] == n
    per = two["reconciliation"]["shards"]["per_shard"]
    assert [x["records"] for x in per] == [x["assigned"] for x in per]
    assert sum(x["records"] for x in per) == n
    assert per[0]["records"] - per[1]["records"] in (7, 8, 9)  # shard 0 also sent the prewarm
    summary = runs[2][3]
    assert summary["shards"]["count"] == 2
    assert summary["shard_clock_valid"] is True
    assert summary["failed"] == 0 and summary["requests_recorded"] == n
    assert summary["server_prefix_hit_rate"] > 0.15  # shard 0's prewarm served both shards
    # Both shards started from one shared start: their t0 stamps agree (one host, one clock).
    recs = pd.read_json(runs[2][2] / "records.jsonl", lines=True)
    recs = recs[recs["phase"] != "prewarm"]  # sent before the clock started
    t0 = recs.groupby("shard")["t0_ns"].first()
    assert abs(int(t0[0]) - int(t0[1])) < 1_000_000
    assert recs.groupby("shard")["t0_realtime_ns"].nunique().max() == 1
    assert recs["t0_realtime_ns"].nunique() == 1
    # The merged client series has both shards' finished requests.
    series = pd.read_parquet(runs[2][2] / "metrics.parquet")
    finished = series[(series["source"] == "client") & (series["metric"] == "finished")]
    assert finished["value"].max() == n
    # The analysis reads a sharded point like any other.
    pack = runs[2][0]
    report = analyze_point(
        two["requests"],
        two["chunks"],
        two["metrics"],
        summary,
        pack_classes(pack),
        pack_gates(pack),
    )
    assert report["shard_clock_valid"] is True
    assert report["classes"]["interactive"]["successful_count"] > 0
    # MLflow: the shard count is a setting, per-shard lateness and CPU are metrics.
    rec = sweep_record(summary)
    assert rec["params"]["client_shards"] == 2
    assert {"shard0_dispatch_lateness_p99_ms", "shard1_client_cpu_s"} <= set(rec["metrics"])
    assert rec["metrics"]["shard_clock_skew_max_ms"] < 1.0
    assert rec["tags"]["capacity_pack.shard_clock_valid"] == "true"
    assert sweep_record(runs[1][3])["params"]["client_shards"] == 1


@pytest.mark.slow
def test_merge_check_refuses_a_record_on_the_wrong_shard(runs, tmp_path):
    pack, p, d, summary = runs[2]
    lines = (d / "records.jsonl").read_text().splitlines()
    rec = json.loads(lines[-1])
    rec["shard"] = 1 - rec["shard"]
    (tmp_path / "records.jsonl").write_text("\n".join([*lines[:-1], json.dumps(rec)]) + "\n")
    for name in ("schedule.parquet", "metrics.parquet"):
        (tmp_path / name).write_bytes((d / name).read_bytes())
    with pytest.raises(NormalizeError, match=r"1 record\(s\) on the wrong shard, e.g. "):
        normalized((pack, p, tmp_path, summary))
    # A record lost between a shard and the merged file: the counts disagree.
    (tmp_path / "records.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(NormalizeError, match=r"scheduled request\(s\) have no record"):
        normalized((pack, p, tmp_path, summary))
    (tmp_path / "records.jsonl").write_text("\n".join([*lines, lines[-1]]) + "\n")
    with pytest.raises(NormalizeError, match=r"recorded more than once"):
        normalized((pack, p, tmp_path, summary))


@pytest.mark.slow
def test_a_shard_that_cannot_start_fails_the_point_with_its_log(tmp_path):
    # The launcher starts shard 1 as `false`: it never reports ready, shard 0 times out.
    pack = small_pack(
        shards=2, shard_launcher=["sh", "-c", 'test {shard} = 0 && exec "$@"', "sh"],
        shard_ready_timeout_seconds=2,
    )  # fmt: skip
    p = point()
    with pytest.raises(ShardError) as err:
        measure_point(pack, p, S.build_schedule(pack, p), tmp_path)
    text = str(err.value)
    assert "shard 0: exit status 1" in text and "only 1 of 2 shards ready" in text
    assert "shard 1: exit status 1" in text
    assert not (tmp_path / "records.jsonl").exists()


@pytest.mark.slow
def test_a_sharded_point_through_snakemake(tmp_path):
    from tests.conftest import run_snakemake as snakemake
    from tests.conftest import write_pack
    from tests.integration.test_pipeline import small_pack as pipeline_pack

    data = pipeline_pack()
    data["client"]["shards"] = 2
    write_pack(tmp_path, data)
    base = "results/pipeline-test"
    report = f"{base}/reports/open-r20/cold/rep0/slo-report.json"
    snakemake(tmp_path, report)
    raw = json.loads((tmp_path / base / "raw/open-r20/cold/rep0/summary.json").read_text())
    assert raw["shards"]["count"] == 2 and raw["shard_clock_valid"] is True
    tables = json.loads((tmp_path / base / "tables/open-r20/cold/rep0/summary.json").read_text())
    per = tables["shards"]["per_shard"]
    assert [p["records"] for p in per] == [p["assigned"] for p in per]
    assert sum(p["records"] for p in per) == tables["expected"] == tables["recorded"]
    slo = json.loads((tmp_path / report).read_text())
    assert slo["shard_clock_valid"] is True
    assert not any("shard clocks" in r for r in slo["verdict_reasons"])
    # The shards' own logs and specs stay beside the point's records.
    shard_dir = tmp_path / base / "raw/open-r20/cold/rep0/shards"
    assert sorted(p.name for p in shard_dir.glob("shard-*.log")) == ["shard-0.log", "shard-1.log"]
    # Each shard sent its own rows' prepared prompts (stage prompts), none fitted in the shard.
    import pandas as pd

    prepared = pd.read_parquet(tmp_path / base / "prompts/open-r20/cold/rep0/prompts.parquet")
    handed = [pd.read_parquet(shard_dir / f"prompts-{i}.parquet") for i in range(2)]
    assert sorted(pd.concat(handed)["request_id"]) == sorted(prepared["request_id"])
    assert [len(h) for h in handed] == [p["assigned"] for p in per]


@pytest.mark.slow
def test_the_in_flight_ceiling_is_shared_out_between_shards(tmp_path):
    pack = small_pack(shards=2, max_in_flight=3)
    p = point(rate=30)
    summary = measure_point(pack, p, S.build_schedule(pack, p), tmp_path)
    assert [x["max_in_flight"] for x in summary["shards"]["per_shard"]] == [2, 2]
    # ~30 RPS of streams lasting 0.4-2 s against a ceiling of 2 per shard: arrivals beyond it
    # are rejected at once, never delayed, and the two shards never hold more than 4.
    assert summary["status_counts"]["rejected"] > 0
    # Local shards split the CPU set before pinning their threads in their own part.
    cpus = sorted(os.sched_getaffinity(0))
    part = len(cpus) // 2
    for i, x in enumerate(summary["shards"]["per_shard"]):
        placed = x["thread_placement"]
        if part >= 2:
            assert placed["pinned"] is True
            assert placed["dispatcher_cpu"] == cpus[(i + 1) * part - 1]
            assert placed["loop_cpus"] == cpus[i * part : (i + 1) * part - 1]
        else:
            assert placed["detail"] == (
                f"not pinned: this shard's part of the CPU set has {part} CPU(s), two are needed"
            )
    series = pd.read_parquet(tmp_path / "metrics.parquet")
    in_flight = series[(series["source"] == "client") & (series["metric"] == "in_flight")]
    assert 0 < in_flight["value"].max() <= 4


@pytest.mark.slow
def test_the_launcher_places_each_shard(tmp_path):
    # One CPU per shard, as docs/scaling.md recommends on a dedicated load generator.
    pack = small_pack(shards=2, shard_launcher=["taskset", "-c", "{shard}"])
    p = point()
    summary = measure_point(pack, p, S.build_schedule(pack, p), tmp_path)
    assert [x["cpu_affinity"] for x in summary["shards"]["per_shard"]] == [[0], [1]]
    # One CPU each: nothing to separate, and each shard says so.
    assert [x["thread_placement"]["detail"] for x in summary["shards"]["per_shard"]] == [
        "not pinned: the process's CPU set has 1 CPU(s), two are needed"
    ] * 2
    assert summary["thread_placement"]["pinned"] is False
    assert summary["shards"]["launcher"] == ["taskset", "-c", "{shard}"]
    assert summary["failed"] == 0


@pytest.mark.slow
def test_skewed_or_unverified_shard_clocks_reach_the_verdict(runs):
    pack, _, _, summary = runs[2]
    tables = normalized(runs[2])
    args = (tables["requests"], tables["chunks"], tables["metrics"])
    skewed = analyze_point(
        *args, {**summary, "shard_clock_valid": False}, pack_classes(pack), pack_gates(pack)
    )
    assert skewed["verdict"] == "inconclusive"
    assert (
        "shard clocks: skew between the client shards beyond its tolerance"
        in (skewed["verdict_reasons"])
    )
    unverified = analyze_point(
        *args, {**summary, "shard_clock_valid": None}, pack_classes(pack), pack_gates(pack)
    )
    assert any(n.startswith("shard clocks unverified") for n in unverified["notes"])
    one = normalized(runs[1])
    single = analyze_point(
        one["requests"], one["chunks"], one["metrics"], runs[1][3],
        pack_classes(runs[1][0]), pack_gates(runs[1][0]),
    )  # fmt: skip
    assert single["shard_clock_valid"] is None
    assert not any(n.startswith("shard clocks") for n in single["notes"])
