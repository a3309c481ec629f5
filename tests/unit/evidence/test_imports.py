"""Imports of AIPerf and vLLM bench per-request exports: tables, definitions, provenance, errors.

The fixtures under tests/data/imports/ follow each tool's documented format (AIPerf
profile_export.jsonl records; a ``vllm bench serve --save-result --save-detailed`` result) with
hand-chosen numbers, so every expected value below is computed by hand in its comment.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from capacity_pack.cli import main
from capacity_pack.evidence.analysis import analyze_point
from capacity_pack.evidence.gates import pack_gates
from capacity_pack.evidence.imports import ExportFormatError, import_aiperf, import_vllm_bench
from capacity_pack.evidence.normalize import ChunksTable, RequestsTable, requests_schema
from capacity_pack.evidence.slo_report import pack_classes
from capacity_pack.io import file_sha256
from capacity_pack.plan.manifest import load_pack
from tests.conftest import pack_data, with_fixed_lengths
from tests.paths import ROOT

DATA = ROOT / "tests" / "data" / "imports"
AIPERF = DATA / "aiperf" / "profile_export.jsonl"
VLLM = DATA / "vllm-bench" / "openai-4.0qps-sim-small-20251007-051320.json"
BASE_NS = 1_759_813_207_000_000_000  # request_start_ns of the AIPerf fixture's first record


def rid(n: int) -> str:
    return f"5f0c8e2a-41d7-4c1b-9e3a-{n:012d}"


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    """The default pack at fixed lengths: the exports' requests are classed by their lengths."""
    path = tmp_path_factory.mktemp("pack") / "pack.yaml"
    path.write_text(yaml.safe_dump(with_fixed_lengths(pack_data()), sort_keys=False))
    return path


@pytest.fixture(scope="module")
def pack(config):
    return load_pack(config)


@pytest.fixture(scope="module")
def aiperf(pack):
    return import_aiperf(AIPERF, workload=pack, point="open-r4")


@pytest.fixture(scope="module")
def vllm(pack):
    return import_vllm_bench(VLLM, workload=pack, point="open-r4", cache_state="warm", repeat=1)


def aiperf_lines() -> list[dict]:
    return [json.loads(line) for line in AIPERF.read_text().splitlines()]


def write_lines(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def vllm_doc() -> dict:
    return json.loads(VLLM.read_text())


def write_doc(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def row(imported, request_id: str) -> pd.Series:
    r = imported.requests
    return r[r["request_id"] == request_id].iloc[0]


def test_both_imports_validate_against_the_point_schemas(aiperf, vllm, pack):
    for imported in (aiperf, vllm):
        schema = requests_schema(pack.class_names, {})
        schema.validate(imported.requests)
        RequestsTable.validate(imported.requests)
        ChunksTable.validate(imported.chunks)
        assert len(imported.requests) == 12  # every request of the export, the failed one too
        assert imported.provenance.status_counts == {"ok": 11, "error": 1}
    assert aiperf.requests["phase"].tolist().count("warmup") == 1
    assert (vllm.requests["phase"] == "measure").all()
    assert set(vllm.requests["cache_state"]) == {"warm"} and set(vllm.requests["repeat"]) == {1}


def test_aiperf_known_request_matches_hand_computed_metrics(aiperf):
    r = row(aiperf, rid(1))
    # ttft 95.0 ms, request_latency 95 + 31 x 9.5 = 389.5 ms, 32 tokens from usage.
    assert r["ttft_ms"] == pytest.approx(95.0)
    assert r["e2e_ms"] == pytest.approx(389.5)
    assert r["tpot_ms"] == pytest.approx((389.5 - 95.0) / 31)  # 9.5
    assert (r["class"], r["status"], r["output_tokens"], r["input_tokens"]) == (
        "interactive",
        "ok",
        32,
        256,
    )
    # Sent at request_start_ns: 1 s after the warm-up record, which opens the run.
    assert r["sent_ns"] == BASE_NS + 1_000_000_000 == r["sent_realtime_ns"]
    assert r["sent_offset_ns"] == 1_000_000_000
    assert r["end_ns"] == BASE_NS + 1_000_000_000 + 389_900_000  # request_end_ns (after usage)
    ck = aiperf.chunks[aiperf.chunks["request_id"] == rid(1)]
    assert len(ck) == 32 == r["chunks"]
    assert ck["arrival_offset_ns"].iloc[0] == 95_000_000
    assert ck["arrival_offset_ns"].iloc[-1] == 389_500_000
    assert ck["gap_ms"].iloc[1:].tolist() == [9.5] * 31
    # No intended send time in AIPerf records: nothing scheduled to compare against.
    assert np.isnan(r["client_delay_ms"]) and r["due_offset_ns"] == 0


def test_aiperf_error_record_becomes_an_error_row(aiperf):
    r = row(aiperf, rid(5))
    assert r["status"] == "error" and r["http_status"] == 503
    assert r["error"] == "ServiceUnavailable: Service Unavailable: engine queue full"
    assert (r["ttft_ms"], r["tpot_ms"], r["e2e_ms"], r["output_tokens"], r["chunks"]) == (
        0,
        0,
        0,
        0,
        0,
    )
    # error_isl 1024 singles out long_context; the terminal stamp is request_end_ns.
    assert r["input_tokens"] == 1024 and r["class"] == "long_context"
    assert r["end_ns"] - r["sent_ns"] == 3_250_000


def test_aiperf_cancelled_and_timeout_records(tmp_path, pack):
    lines = aiperf_lines()
    lines[5]["metadata"].update(was_cancelled=True, cancellation_time_ns=BASE_NS + 2_001_000_000)
    lines[5]["error"] = {"code": 499, "type": "RequestCancellationError", "message": "cancelled"}
    # "Metrics will always be null for failed requests": no input length to match a class by.
    lines[6] = {**lines[6], "metrics": None}
    lines[6]["error"] = {"code": None, "type": "TimeoutError", "message": "read timed out"}
    path = write_lines(tmp_path / "p.jsonl", lines)
    with pytest.raises(ExportFormatError, match=r"line 7 .*\(input unknown, output unknown\)"):
        import_aiperf(path, workload=pack, point="x")
    imported = import_aiperf(path, workload=pack, point="x", class_name="interactive")
    cancelled, timeout = row(imported, rid(5)), row(imported, rid(6))
    assert cancelled["status"] == "cancelled" and cancelled["http_status"] == 499
    assert cancelled["end_ns"] == BASE_NS + 2_001_000_000  # cancellation_time_ns
    assert timeout["status"] == "timeout" and pd.isna(timeout["http_status"])
    assert (timeout["class"], timeout["input_tokens"]) == ("interactive", 256)  # class's fixed
    assert any(e.startswith("input_tokens of 1 request") for e in imported.provenance.estimated)


def test_aiperf_provenance_records_tool_version_and_definitions(aiperf):
    p = aiperf.provenance
    assert (p.tool, p.tool_version) == ("aiperf", "0.14.0")
    assert p.tool_version_source == "profile_export_aiperf.json: aiperf_version"
    assert p.source_sha256 == file_sha256(AIPERF)
    assert "inter_token_latency" in p.definitions["tpot_ms"]
    assert "inter_chunk_latency" in p.definitions["itl (chunks.gap_ms)"]
    assert "usage_completion_tokens" in p.definitions["output_tokens"]
    # One record carries no usage: its count is AIPerf's own output_sequence_length.
    assert p.output_tokens_source == {"usage_completion_tokens": 10, "output_sequence_length": 1}
    assert p.class_assignment == {"input/output lengths": 12}
    assert "metrics.time_to_second_token" in p.unmapped
    assert "metadata.request_ack_ns" in p.unmapped and "metadata.x_request_id" not in p.unmapped
    assert any("chunk token counts" in e for e in p.estimated)
    assert p.timestamps["send"].startswith("exact")
    # Hand: measured ok records with usage read 5 x 96 cached tokens of 4 interactive, 3
    # long_context and 2 generation_heavy prompts.
    assert aiperf.summary["client_cached_token_fraction"] == pytest.approx(
        5 * 96 / (4 * 256 + 3 * 1024 + 2 * 128)
    )


def test_itl_semantics_differ_between_the_tools(aiperf, vllm):
    # AIPerf: inter_token_latency is a per-request average over ITS count (output_sequence_length
    # 49 here, usage says 48): 564 / 48 = 11.75 ms in the file; our TPOT over usage is
    # 564 / 47 = 12.0 ms, and the per-chunk gaps (inter_chunk_latency) are 12.0 ms each.
    line = aiperf_lines()[2]
    assert line["metrics"]["inter_token_latency"]["value"] == pytest.approx(11.75)
    a = row(aiperf, rid(2))
    assert a["output_tokens"] == 48 and a["tpot_ms"] == pytest.approx(12.0)
    gaps = aiperf.chunks.loc[aiperf.chunks["request_id"] == rid(2), "gap_ms"].dropna()
    assert gaps.tolist() == [12.0] * 47
    checks = aiperf.provenance.cross_checks
    assert checks["tpot_vs_aiperf_inter_token_latency_max_abs_ms"] == pytest.approx(0.25)
    assert checks["requests_where_usage_and_aiperf_count_differ"] == 1
    assert checks["aiperf_itl_vs_its_definition_max_abs_ms"] == pytest.approx(0.0, abs=1e-9)
    # vLLM: itls are per-chunk gaps. vllm-00001 streams 48 tokens in 24 chunks, 20 ms apart:
    # every chunk gap is 20 ms, while TPOT = 23 x 20 / 47 = 9.787 ms per token.
    v = row(vllm, "vllm-00001")
    ck = vllm.chunks[vllm.chunks["request_id"] == "vllm-00001"]
    assert len(ck) == 24 and ck["gap_ms"].dropna().to_numpy() == pytest.approx([20.0] * 23)
    assert v["tpot_ms"] == pytest.approx(460.0 / 47)
    assert ck["tokens"].sum() == 48  # not exported: spread evenly, 2 per chunk
    assert "per-chunk" in vllm.provenance.definitions["itl (chunks.gap_ms)"]


def test_vllm_known_request_matches_hand_computed_metrics(vllm):
    r = row(vllm, "vllm-00000")
    # ttft 0.1205 s; itls 30 x 10 ms + 15.5 ms = 315.5 ms -> E2E 436.0 ms, TPOT 315.5 / 31.
    assert r["ttft_ms"] == pytest.approx(120.5)
    assert r["e2e_ms"] == pytest.approx(436.0)
    assert r["tpot_ms"] == pytest.approx(315.5 / 31)
    # Arrival = start_times - queue_times; the run's origin is the first arrival.
    assert r["client_delay_ms"] == pytest.approx(0.021)
    assert r["sent_offset_ns"] == 21_000 and r["due_offset_ns"] == 0
    assert r["ttft_from_scheduled_ms"] == pytest.approx(120.521)
    later = row(vllm, "vllm-00004")
    assert later["sent_offset_ns"] - r["sent_offset_ns"] == pytest.approx(880_000_000, abs=2)
    failed = row(vllm, "vllm-00003")
    assert failed["status"] == "error" and "ServerDisconnectedError" in failed["error"]
    assert (failed["ttft_ms"], failed["e2e_ms"], failed["output_tokens"]) == (0, 0, 0)
    p = vllm.provenance
    assert (p.tool, p.tool_version) == ("vllm-bench", "0.11.0")
    assert p.run["request_rate"] == 4.0 and p.run["num_prompts"] == 12
    assert p.cross_checks["e2e_vs_latencies_max_abs_ms"] == pytest.approx(0.0, abs=1e-6)
    assert "re-tokenized" in p.definitions["output_tokens"]
    assert p.timestamps["realtime"].startswith("estimated")
    # Realtime anchor: date 2025-10-07 05:13:20 (as UTC) minus duration.
    anchor = 1_759_814_000 * 10**9 - round(p.run["duration"] * 1e9)
    assert r["sent_realtime_ns"] - r["sent_offset_ns"] == pytest.approx(anchor, abs=1000)
    assert vllm.summary["offered_rps"] == 4.0


def test_vllm_without_start_times_estimates_send_times(tmp_path, pack):
    doc = vllm_doc()
    for key in ("start_times", "queue_times", "latencies"):
        del doc[key]
    imported = import_vllm_bench(write_doc(tmp_path / "r.json", doc), workload=pack, point="x")
    r = imported.requests.set_index("request_id")
    # Arrival i / request_rate: 250 ms apart.
    assert r.loc["vllm-00005", "sent_offset_ns"] == 5 * 250_000_000
    p = imported.provenance
    assert p.timestamps["send"].startswith("estimated")
    assert any(e.startswith("send times") for e in p.estimated)
    # One slot: each request starts when the previous one ends (the failed one takes no time).
    doc["max_concurrency"] = 1
    serial = import_vllm_bench(write_doc(tmp_path / "c.json", doc), workload=pack, point="x")
    s = serial.requests.set_index("request_id")
    assert s.loc["vllm-00001", "sent_offset_ns"] == 436_000_000
    assert s.loc["vllm-00002", "sent_offset_ns"] == 436_000_000 + 710_000_000
    assert "1-slot simulation" in serial.provenance.timestamps["send"]


def test_class_from_the_export_wins_and_a_wrong_length_is_an_error(tmp_path, pack):
    lines = aiperf_lines()
    lines[1]["metadata"]["class"] = "generation_heavy"
    imported = import_aiperf(write_lines(tmp_path / "p.jsonl", lines), workload=pack, point="x")
    r = row(imported, rid(1))
    assert r["class"] == "generation_heavy" and r["status"] == "error"
    assert "differ from class generation_heavy's fixed length 128" in r["error"]
    assert r["output_tokens_expected"] == 128
    p = imported.provenance
    assert p.class_assignment == {"input/output lengths": 11, "export field": 1}
    assert p.length_mismatch_errors == 1
    lines[1]["metadata"]["class"] = "batch"
    with pytest.raises(ExportFormatError, match=r"line 2 .*field metadata\.class.*'batch'"):
        import_aiperf(write_lines(tmp_path / "q.jsonl", lines), workload=pack, point="x")


def test_unmatched_lengths_need_a_class_name(tmp_path, pack):
    doc = vllm_doc()
    doc["input_lens"][0] = 300
    path = write_doc(tmp_path / "r.json", doc)
    with pytest.raises(ExportFormatError, match=r"request 0 \(input 300, output 32\).*--class"):
        import_vllm_bench(path, workload=pack, point="x")
    imported = import_vllm_bench(path, workload=pack, point="x", class_name="interactive")
    assert row(imported, "vllm-00000")["class"] == "interactive"
    assert imported.provenance.class_assignment == {"input/output lengths": 11, "--class-name": 1}
    with pytest.raises(ExportFormatError, match="'chat' is not a workload class"):
        import_vllm_bench(path, workload=pack, point="x", class_name="chat")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda ls: ls.__setitem__(2, '{"metadata": {'), r"line 3: not valid JSON"),
        (
            lambda ls: ls.__setitem__(1, ls[1].replace('"time_to_first_token"', '"ttft"')),
            r"line 2 \(x_request_id 5f0c8e2a-\S+\): field metrics\.time_to_first_token: missing",
        ),
        (
            lambda ls: ls.__setitem__(4, ls[4].replace('"request_start_ns"', '"start_ns"')),
            r"line 5: field metadata\.request_start_ns: Field required",
        ),
        (
            lambda ls: ls.__setitem__(1, ls[1].replace('"unit": "ms"', '"unit": "minutes"', 1)),
            r"line 2 .*field metrics\.time_to_first_token: unit 'minutes'",
        ),
        (
            lambda ls: ls.__setitem__(
                1, ls[1].replace('"error": null', '"error": null, "error": 1')
            ),
            r"line 2: field 'error' appears twice",
        ),
        (
            lambda ls: ls.__setitem__(3, ls[3].replace('"value": [16.0, ', '"value": [-16.0, ')),
            r"line 4 .*field metrics\.inter_chunk_latency\.value\[0\]: -16\.0",
        ),
        (
            lambda ls: ls.__setitem__(1, ls[1].replace('{"value": 389.5,', '{"value": 89.5,')),
            r"line 2 .*fields metrics\.time_to_first_token, metrics\.request_latency: E2E 89\.500",
        ),
    ],
)
def test_malformed_aiperf_lines_name_file_line_and_field(tmp_path, pack, edit, message):
    lines = AIPERF.read_text().splitlines()
    edit(lines)
    path = tmp_path / "profile_export.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ExportFormatError, match=str(path) + ".*" + message):
        import_aiperf(path, workload=pack, point="x")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["itls"][3].append("x"), r"request 3: field itls\[3\]\[0\]"),
        (lambda d: d.pop("ttfts"), r"field ttfts: Field required \(per-request lists .*detailed"),
        (lambda d: d["output_lens"].pop(), r"field output_lens: 11 entries, but ttfts has 12"),
        (lambda d: d.update(request_rate="fast"), r"field request_rate: 'fast'"),
    ],
)
def test_malformed_vllm_results_name_file_request_and_field(tmp_path, pack, edit, message):
    doc = vllm_doc()
    edit(doc)
    path = write_doc(tmp_path / "result.json", doc)
    with pytest.raises(ExportFormatError, match=str(path) + ".*" + message):
        import_vllm_bench(path, workload=pack, point="x")


def test_analyze_point_runs_on_an_imported_point(vllm, pack):
    report = analyze_point(
        vllm.requests, vllm.chunks, vllm.metrics, vllm.summary, pack_classes(pack), pack_gates(pack)
    )
    assert report["attempted"] == 12 and report["errors_by_status"]["error"] == 1
    # No server metrics in an export: the trend cannot be decided, so no verdict is claimed.
    assert report["queue_trend"] == "inconclusive" and report["verdict"] == "inconclusive"
    # long_context chunk gaps: 23 x 20 ms, 47 x 11.5 ms, 47 x 12 ms; nearest rank
    # ceil(0.5 x 117) = 59th smallest = 12 ms.
    assert report["classes"]["long_context"]["itl_ms"]["p50"] == pytest.approx(12.0)


def test_cli_imports_and_the_seed_analyzer_reads_the_result(tmp_path, config):
    runner = CliRunner()
    out = tmp_path / "imported"
    args = ["import", "aiperf", str(AIPERF), "--config", str(config), "--point", "open-r4"]
    result = runner.invoke(main, [*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "12 requests from aiperf 0.14.0" in result.output
    for name in ("requests.parquet", "chunks.parquet", "requests.csv", "provenance.json"):
        assert (out / name).is_file()
    assert not list(out.glob(".*.tmp"))
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["tool"] == "aiperf" and provenance["definitions"]
    assert pd.read_parquet(out / "requests.parquet").shape[0] == 12
    csv = pd.read_csv(out / "requests.csv")
    assert len(csv) == 11  # measured rows only: the warm-up record is left out, as the seed does
    window = json.loads((out / "summary.json").read_text())["measured_window_s"]
    analyzed = runner.invoke(
        main, ["analyze", str(out / "requests.csv"), str(window), "flat", "--manifest", str(config)]
    )
    assert analyzed.exit_code == 0, analyzed.output
    report = json.loads(analyzed.output)
    assert (report["attempted"], report["failed"]) == (11, 1)
    assert report["classes"]["interactive"]["p50_ttft_ms"] == pytest.approx(100.0)


def test_cli_bad_input_exits_1_naming_file_line_and_field(tmp_path, config):
    bad = tmp_path / "profile_export.jsonl"
    bad.write_text(AIPERF.read_text().replace('"request_latency"', '"latency"', 1))
    result = CliRunner().invoke(
        main,
        [
            "import",
            "aiperf",
            str(bad),
            "--config",
            str(config),
            "--point",
            "p",
            "-o",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 1
    assert f"{bad}: line 1" in result.output and "metrics.request_latency" in result.output
    assert not (tmp_path / "requests.csv").exists()


def test_a_class_certain_to_fail_fails_the_point_whatever_its_sample(vllm, pack):
    # Every request misses a 1 ms TTFT cutoff: a handful of requests is already certain
    # evidence (the confidence sequence's upper end under the gate), so the point fails
    # instead of being inconclusive for want of samples or of a queue trend.
    tight = pack.model_copy(deep=True)
    for c in tight.workload:
        c.request_ttft_cutoff_ms = 1.0
    report = analyze_point(
        vllm.requests, vllm.chunks, vllm.metrics, vllm.summary, pack_classes(tight),
        pack_gates(tight),
    )  # fmt: skip
    certain = [
        c for c, e in report["classes"].items()
        if e["successful_count"] and e["attainment_ci"][1] < 0.95
    ]  # fmt: skip
    assert certain and report["verdict"] == "fail"
    assert report["verdict_reasons"][0].startswith(f"{certain[0]}: attainment at most ")
    assert "under-sampled" in " ".join(report["verdict_reasons"])
