"""The capacity stage sizes KV from the contexts sent at the capacity point: requests tables
whose lengths are drawn from the pack's lognormal classes, through ``stages.capacity.run``."""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
import pytest

from capacity_pack.decide.report import render_readme
from capacity_pack.evidence.normalize import RequestsTable
from capacity_pack.plan.manifest import freeze, sample_lengths, validate_pack
from capacity_pack.stages import capacity as capacity_stage
from capacity_pack.tables import validate_table
from tests.unit.decide.test_capacity import report
from tests.unit.decide.test_sizing_tail import tail_pack_data

KV_BYTES_PER_TOKEN = 131_072  # 32 layers x 8 KV heads x 128 x 2 (K, V) x bf16
NS = 1_000_000_000


def tail_pack(memory_gb: float = 80.0):
    data = tail_pack_data("tail-stage")
    data["workload"][0]["output_tokens"] = {"distribution": "lognormal", "p50": 64, "p95": 256,
                                            "max": 1024}  # fmt: skip
    data["plan"]["memory"] = {
        "accelerator_memory_gb": memory_gb, "margin_gb": 2.0, "weights_gb": 16.0,
        "overhead_gb": 4.0, "memory_utilization": 0.9, "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
    }  # fmt: skip
    return validate_pack(data)


def requests_table(pack, rate: float, key: str, n: int, seed: int) -> pd.DataFrame:
    """A valid requests table of ``n`` measured requests at ``rate`` (lengths drawn from the
    pack's classes; time in system grows with the lengths), 2 % failed, plus warm-up rows at
    the longest contexts, which are not part of the measured load."""
    rng = np.random.default_rng(seed)
    point, cache, rep = key.split("/")
    classes, inputs, outputs = [], [], []
    for c in pack.workload:
        k = pack.class_counts(n)[c.name]
        classes += [c.name] * k
        inputs.append(sample_lengths(c.input_tokens, rng, k))
        outputs.append(sample_lengths(c.output_tokens, rng, k))
    inp, out = np.concatenate(inputs), np.concatenate(outputs)
    warm = 5
    classes = [pack.workload[0].name] * warm + classes
    inp = np.concatenate([np.full(warm, 30_000), inp])
    out = np.concatenate([np.full(warm, 1024), out])
    m = inp.size
    order = rng.permutation(m - warm) + warm
    idx = np.concatenate([np.arange(warm), order])
    cls = np.asarray(classes)[idx]
    inp, out = inp[idx], out[idx]
    ok = rng.random(m) >= 0.02
    received = np.where(ok, out, 0)
    ttft = 20.0 + 0.01 * inp
    tpot = np.full(m, 8.0)
    e2e = np.where(ok, ttft + tpot * np.maximum(out - 1, 0), 0.0)
    ttft, tpot = np.where(ok, ttft, 0.0), np.where(ok, tpot, 0.0)
    sched = (np.arange(m) * NS / rate).astype(np.int64)
    sent = 10 * NS + sched
    # A failed request still held its KV until the error came back, halfway through.
    held_ms = np.where(ok, e2e, 0.5 * (20.0 + 0.01 * inp + 8.0 * np.maximum(out - 1, 0)))
    end = sent + (held_ms * 1e6).astype(np.int64)
    phase = np.where(np.arange(m) < warm, "warmup", "measure")
    frame = pd.DataFrame({
        "request_id": [f"{key}-{i}" for i in range(m)], "class": cls, "point": point,
        "cache_state": cache, "repeat": int(rep[3:]), "phase": phase, "block": 0,
        "seq": np.arange(m), "status": np.where(ok, "ok", "error"),
        "http_status": pd.array(np.where(ok, 200, 500), dtype="Int64"),
        "error": pd.array([None if o else "HTTP 500" for o in ok], dtype=object),
        "input_tokens": inp, "output_tokens_expected": out, "output_tokens": received,
        # The server's prompt count (7 template tokens more) where it answered; absent on errors.
        "prompt_tokens": pd.Series(inp + 7, dtype="Int64").where(ok, pd.NA),
        "cached_tokens": pd.array(np.zeros(m, dtype=np.int64), dtype="Int64"),
        "scheduled_offset_ns": sched, "due_offset_ns": sched, "sent_offset_ns": sched,
        "client_delay_ms": 0.0, "ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e,
        "ttft_from_scheduled_ms": ttft, "e2e_from_scheduled_ms": e2e,
        "chunks": received, "sent_ns": sent, "end_ns": end,
        "sent_realtime_ns": sent, "end_realtime_ns": end,
        "warmup": phase == "warmup",
    })  # fmt: skip
    return validate_table(frame, RequestsTable, f"{key}/requests.parquet")


def expected_sent(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Contexts and times in system of the measured rows, row by row."""
    contexts, durations = [], []
    for row in frame.itertuples(index=False):
        if row.phase == "warmup":
            continue
        prompt = row.input_tokens if pd.isna(row.prompt_tokens) else row.prompt_tokens
        contexts.append(prompt + max(row.output_tokens_expected, row.output_tokens))
        durations.append((row.end_ns - row.sent_ns) / NS)
    return np.array(contexts), np.array(durations)


def nearest_rank(values: np.ndarray, p: float) -> int:
    s = np.sort(values)
    return int(s[int(np.ceil(p * s.size)) - 1])


def run_stage(tmp_path, pack):
    """Reports at 10, 20 (two repeats) and 30 RPS: 10 and 20 pass, 30 fails; a table each."""
    reports, tables, frames = [], [], {}
    points = [(10, 0, "pass"), (20, 0, "pass"), (20, 1, "pass"), (30, 0, "fail")]
    for seed, (rate, rep, verdict) in enumerate(points):
        doc = report(rate, rep, verdict, reasons=() if verdict == "pass" else
                     ["interactive: attainment 0.7 < 0.6"])  # fmt: skip
        path = tmp_path / "reports" / doc["key"] / "slo-report.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(doc))
        reports.append(path)
        frame = requests_table(pack, rate, doc["key"], 600, seed)
        table = tmp_path / "tables" / doc["key"] / "requests.parquet"
        table.parent.mkdir(parents=True)
        frame.to_parquet(table)
        tables.append(table)
        frames[doc["key"]] = frame
    cap, plan = capacity_stage.run(
        pack=json.dumps(pack.model_dump(mode="json")), reports=reports, tables=tables,
        capacity=tmp_path / "capacity.json", plan=tmp_path / "plan.json",
        log=logging.getLogger("test"),
    )  # fmt: skip
    assert json.loads((tmp_path / "plan.json").read_text()) == plan.dump()
    return cap.dump(), plan.dump(), frames


def test_the_plan_sizes_from_the_contexts_sent_at_the_capacity_point(tmp_path):
    pack = tail_pack()
    cap, plan, frames = run_stage(tmp_path, pack)
    assert cap["open_loop"]["cold"]["capacity_rps"] == 20
    keys = ["open-r20/cold/rep0", "open-r20/cold/rep1"]
    sent = [expected_sent(frames[k]) for k in keys]
    contexts = np.concatenate([s[0] for s in sent])
    durations = np.concatenate([s[1] for s in sent])
    ctx = plan["contexts"]
    assert ctx["source"] == "measured" and ctx["points"] == keys
    assert "1200 measured requests" in ctx["label"]
    # Both repeats' measured rows (warm-up rows at 31K tokens left out), failed ones at the
    # length they asked for, prompts at the server's count where it gave one.
    assert ctx["requests"] == contexts.size == 1200
    assert ctx["p95_tokens"] == plan["p95_context_tokens"] == nearest_rank(contexts, 0.95)
    assert ctx["max_tokens"] == plan["max_context_tokens"] == contexts.max() < 30_000
    assert ctx["p50_tokens"] == nearest_rank(contexts, 0.50)
    # The memory plan sizes KV per request at the sent P95; the max is reported beside it.
    assert plan["memory"]["kv_bytes_per_request"] == KV_BYTES_PER_TOKEN * ctx["p95_tokens"]
    assert ctx["kv_bytes_per_request_max"] == KV_BYTES_PER_TOKEN * ctx["max_tokens"]
    one = plan["fit_probe_one_request_at_max_context"]
    assert one["context_tokens"] == ctx["max_tokens"]
    assert one["kv_gb"] == pytest.approx(KV_BYTES_PER_TOKEN * ctx["max_tokens"] / 1e9)
    assert one["budget_gb"] == pytest.approx(80 * 0.9 - 2) and one["verdict"] == "fits"
    # The fit at the planned concurrency: 60 RPS peak over the replicas carrying it, each
    # request in flight for its measured time in system (Little's law).
    conc = plan["fit_probe_at_planned_concurrency"]
    load = plan["required_replicas"] - pack.plan.redundancy_replicas - pack.plan.warm_pool_replicas
    assert conc["load_replicas"] == load
    assert conc["rate_per_replica_rps"] == pytest.approx(pack.plan.peak_rps / load)
    assert conc["mean_time_in_system_s"] == pytest.approx(durations.mean())
    assert conc["in_flight_mean"] == pytest.approx(conc["rate_per_replica_rps"] * durations.mean())
    assert conc["kv_mean_gb"] == pytest.approx(
        conc["rate_per_replica_rps"] * (durations * contexts).mean() * KV_BYTES_PER_TOKEN / 1e9
    )
    assert conc["duration_weighted"] and conc["contexts_source"] == "measured"
    # The P95 of the KV held exceeds its mean and what one P95 request alone holds.
    assert conc["kv_gb"] > conc["kv_mean_gb"] > 0
    assert conc["kv_gb"] > plan["memory"]["kv_bytes_per_request"] / 1e9
    need = 16.0 + conc["kv_gb"] + 4.0
    assert conc["need_gb"] == pytest.approx(need)
    assert conc["headroom_gb"] == pytest.approx(80 * 0.9 - 2 - need)
    assert conc["verdict"] == "fits"
    # The pack README's replica plan says it, with the numbers.
    readme = render_readme(freeze(pack), cap, plan, None, [])
    section = readme.split("## Replica plan")[1].split("\n## ")[0]
    assert f"**P95 {ctx['p95_tokens']}**" in section and f"**max {ctx['max_tokens']}**" in section
    assert "sent at the capacity point (1200 measured requests" in section
    assert "Fit probe at the planned concurrency" in section and "**fits**" in section
    assert f"P95 {conc['in_flight_p95']} as a Poisson count" in section


def test_the_fit_at_concurrency_catches_what_one_request_does_not(tmp_path):
    # Memory for the weights, the overhead, the margin and 60 % of the P95 KV held at the
    # load of the first plan: one request at the max context fits; the memory plan, sized at
    # the P95 context per request, adds replicas (bound by memory), and the probe still finds
    # the P95 of the KV held on each of them over the budget.
    probe = run_stage(tmp_path / "a", tail_pack())[1]["fit_probe_at_planned_concurrency"]
    memory = (16.0 + 4.0 + 2.0 + 0.6 * probe["kv_gb"]) / 0.9
    cap, plan, _ = run_stage(tmp_path / "b", tail_pack(memory))
    assert plan["fit_probe_one_request_at_max_context"]["verdict"] == "fits"
    assert plan["bound_by"] == "memory" and plan["required_replicas"] > probe["load_replicas"] + 1
    conc = plan["fit_probe_at_planned_concurrency"]
    assert conc["rate_per_replica_rps"] < probe["rate_per_replica_rps"]
    assert conc["verdict"] == "does-not-fit" and conc["headroom_gb"] < 0
    assert conc["need_gb"] == pytest.approx(16.0 + conc["kv_gb"] + 4.0)
    readme = render_readme(freeze(tail_pack(memory)), cap, plan, None, [])
    assert "**does-not-fit**" in readme.split("## Replica plan")[1]


def test_without_tables_the_plan_says_it_drew_from_the_manifest(tmp_path):
    from tests.unit.decide.decided import build_capacity, build_plan

    pack = tail_pack()
    reports = [report(r, 0, "pass") for r in (10, 20)] + [report(30, 0, "fail")]
    plan = build_plan(build_capacity(reports, pack), reports, pack)
    ctx = plan["contexts"]
    assert ctx["source"] == "manifest" and "no measured requests table" in ctx["label"]
    conc = plan["fit_probe_at_planned_concurrency"]
    assert not conc["duration_weighted"] and "no requests table" in conc["time_in_system_source"]
    # E[S] stands in as the largest class P95 E2E at the capacity point (0.9 s in these reports).
    assert conc["mean_time_in_system_s"] == pytest.approx(0.9)
