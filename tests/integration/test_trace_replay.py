"""A trace pack through the real pipeline: the shipped Mooncake-style sample replayed verbatim
against the simulated engine over 127.0.0.1, its send times against the trace's timestamps and
its lengths against the trace's, exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from capacity_pack.io import file_sha256
from capacity_pack.plan.schedule import format_level
from capacity_pack.plan.traces import read_trace, verbatim_rates
from tests.conftest import run_snakemake, write_pack
from tests.paths import ROOT

PACK = ROOT / "config" / "packs" / "trace-replay.yaml"
MOONCAKE = ROOT / "config" / "traces" / "mooncake-sample.jsonl"
SCALE = 0.25  # the 60 s sample in 15 s


@pytest.mark.slow
def test_trace_pack_replays_the_sample_as_recorded(tmp_path):
    data = yaml.safe_load(PACK.read_text())
    data["pack"]["name"] = "trace-it"
    data["client"]["trace"].update(path=str(MOONCAKE), time_scales=[SCALE])
    # The sample holds 80 long requests: a gate of 100 leaves the class under-sampled.
    data["acceptance"]["min_successful_samples_per_class"] = 100
    write_pack(tmp_path, data)
    run_snakemake(tmp_path)
    out = tmp_path / "results" / "trace-it"

    frozen = json.loads((out / "manifest" / "frozen.json").read_text())["manifest"]
    assert frozen["client"]["trace"]["sha256"] == file_sha256(MOONCAKE)
    assert frozen["client"]["trace"]["time_scales"] == [SCALE]
    trace = read_trace(MOONCAKE, "mooncake", class_rules=[("short", 2048), ("long", None)])
    (rate,) = verbatim_rates(trace, [SCALE])
    assert frozen["sweep"]["open_loop_rps"] == [rate]

    point = out / "raw" / f"open-r{format_level(rate)}" / "cold" / "rep0"
    summary = json.loads((point / "summary.json").read_text())
    records = [json.loads(line) for line in (point / "records.jsonl").read_text().splitlines()]
    records.sort(key=lambda r: r["seq"])
    assert [r["seq"] for r in records] == list(range(len(trace)))  # every row, once, no more
    raw = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    order = np.argsort([r["timestamp"] for r in raw], kind="stable")
    rows = [raw[i] for i in order]

    # Send times: due at the trace's timestamp x the time scale (to the ns), sent within the
    # dispatch lateness the client's health report states.
    due = np.array([r["due_ns"] - r["t0_ns"] for r in records])
    expected = np.array([round(r["timestamp"] * 1e6 * SCALE) for r in rows])
    np.testing.assert_array_equal(due, expected)
    late_ns = np.array([r["sent_ns"] - r["due_ns"] for r in records])
    worst_ns = summary["dispatch_lateness_ms"]["max"] * 1e6
    assert (late_ns >= 0).all() and late_ns.max() <= worst_ns + 1e3  # the report rounds to 1 us
    # Lengths: the prompt the engine counted and the tokens received are the trace's.
    assert all(r["status"] == "ok" for r in records)
    assert [r["input_tokens"] for r in records] == [r["input_length"] for r in rows]
    assert [r["prompt_tokens"] for r in records] == [r["input_length"] for r in rows]
    assert [r["output_tokens"] for r in records] == [r["output_length"] for r in rows]
    assert summary["trace_replay"]["time_scale"] == SCALE
    # Shared leading hash ids are shared prompt blocks: the engine's prefix cache reuses them.
    assert summary["server_prefix_hit_rate"] > 0.3

    report = json.loads(
        (
            out / "reports" / f"open-r{format_level(rate)}" / "cold" / "rep0" / "slo-report.json"
        ).read_text()
    )
    assert report["verdict"] == "inconclusive"
    why = "long: under-sampled, {} successful of 100 needed; a verbatim trace is never extended"
    n_long = report["classes"]["long"]["successful_count"]
    assert any(r.startswith(why.format(n_long)) for r in report["verdict_reasons"])
    assert "a verbatim trace is never extended" in (out / "pack" / "README.md").read_text()
