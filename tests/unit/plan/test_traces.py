"""Trace layouts (capacity-pack, Mooncake JSONL, Azure CSV): parsing, bad rows, sha256 pins,
verbatim replay's points and schedules, block-hash prompts, and the shipped samples."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from capacity_pack.evidence.trace_replay import under_sampled_reasons
from capacity_pack.io import file_sha256
from capacity_pack.plan import schedule as S
from capacity_pack.plan import schedule_table as T
from capacity_pack.plan.lint import lint_notes, lint_pack
from capacity_pack.plan.manifest import ManifestError, freeze, load_pack, validate_pack
from capacity_pack.plan.prompts import build_prompt
from capacity_pack.plan.traces import TraceError, native_rate, read_trace, verbatim_rates
from tests.paths import ROOT

PACK = ROOT / "config" / "packs" / "trace-replay.yaml"
MOONCAKE = ROOT / "config" / "traces" / "mooncake-sample.jsonl"
AZURE = ROOT / "config" / "traces" / "azure-sample.csv"
RULES = [("short", 2048), ("long", None)]


def pack_data(**trace) -> dict:
    d = yaml.safe_load(PACK.read_text())
    d["client"]["trace"]["path"] = str(MOONCAKE)
    d["client"]["trace"].update(trace)
    return d


def write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def one_line_error(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    return text


# --- parsers: good rows ----------------------------------------------------------------------


def test_mooncake_rows_parse_as_recorded(tmp_path):
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 1000, "input_length": 700, "output_length": 9, "hash_ids": [0, 1]},
            {"timestamp": 1250, "input_length": 3000, "output_length": 40, "hash_ids": [0, 2]},
            "",  # blank lines are skipped
            {"timestamp": 3000, "input_length": 12, "output_length": 1, "hash_ids": [7]},
        ],
    )
    t = read_trace(path, "mooncake", class_rules=RULES)
    assert t["offset_s"].tolist() == [0.0, 0.25, 2.0]  # ms from the first arrival
    assert t["input_tokens"].tolist() == [700, 3000, 12]
    assert t["output_tokens"].tolist() == [9, 40, 1]
    assert t["hash_ids"].tolist() == [[0, 1], [0, 2], [7]]
    assert t["class"].tolist() == ["short", "long", "short"]
    assert t["row"].tolist() == [1, 2, 4]  # the file's lines
    assert native_rate(t) == pytest.approx(2 / 2.0)


def test_azure_rows_parse_date_times(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,4808,10\n"
        "2023-11-16 18:15:50.7487410,3180,8\n"
        "2023-11-16 18:15:46.1805900,110,27\n"  # out of order: sorted, stably
    )
    t = read_trace(path, "azure", class_rules=[("all", None)])
    np.testing.assert_allclose(t["offset_s"], [0.0, 0.5, 4.568151], atol=1e-9)
    assert t["input_tokens"].tolist() == [110, 4808, 3180]
    assert t["output_tokens"].tolist() == [27, 10, 8]
    assert t["row"].tolist() == [3, 1, 2]


def test_azure_2024_offsets_with_a_utc_offset(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,100,5\n"
        "2024-05-10 00:00:01.009930+00:00,200,6\n"
    )
    t = read_trace(path, "azure", class_rules=[("all", None)])
    assert t["offset_s"].tolist() == [0.0, 1.0]


def test_shipped_samples_parse():
    moon = read_trace(MOONCAKE, "mooncake", class_rules=RULES)
    azure = read_trace(AZURE, "azure", class_rules=RULES)
    assert len(moon) == len(azure) == 300
    assert moon["offset_s"].iloc[-1] == pytest.approx(60.0, abs=0.001)
    assert azure["offset_s"].iloc[-1] == pytest.approx(60.0, abs=1e-6)
    # Each request's hash ids cover its prompt in 512-token blocks, the last one partial.
    assert all(
        len(h) == math.ceil(n / 512)
        for h, n in zip(moon["hash_ids"], moon["input_tokens"], strict=True)
    )
    firsts = moon["hash_ids"].map(lambda h: h[0])
    assert firsts.nunique() < 10 < len(moon)  # a few shared system prompts


def test_trace_sample_command_writes_the_shipped_bytes(tmp_path):
    for fmt, seed, shipped in (("mooncake", 20261203, MOONCAKE), ("azure", 20261204, AZURE)):
        out = tmp_path / shipped.name
        subprocess.run(
            [sys.executable, "-m", "capacity_pack", "trace-sample", fmt, str(out),
             "--rows", "300", "--seconds", "60", "--seed", str(seed)],
            check=True, capture_output=True,
        )  # fmt: skip
        assert file_sha256(out) == file_sha256(shipped)


# --- parsers: bad rows -------------------------------------------------------------------------


GOOD = {"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("{not json", "line 2: not a JSON object"),
        ("[1, 2]", "line 2: not a JSON object"),
        ({**GOOD, "timestamp": -5}, "line 2, field 'timestamp': -5"),
        ({**GOOD, "timestamp": "noon"}, "line 2, field 'timestamp'"),
        ({**GOOD, "input_length": 0}, "line 2, field 'input_length': 0"),
        ({**GOOD, "output_length": 2.5}, "line 2, field 'output_length': 2.5"),
        ({k: v for k, v in GOOD.items() if k != "output_length"}, "field 'output_length': None"),
        ({**GOOD, "hash_ids": [1, -2]}, "line 2, field 'hash_ids'"),
        ({**GOOD, "hash_ids": [1, 2]}, "line 2, field 'hash_ids': 2 blocks of 512 tokens"),
    ],
)
def test_bad_mooncake_rows_name_file_and_line(tmp_path, row, expected):
    path = write_lines(tmp_path / "bad.jsonl", [{**GOOD, "timestamp": 100}, row])
    with pytest.raises(TraceError) as err:
        read_trace(path, "mooncake", class_rules=RULES)
    text = one_line_error(err)
    assert text.startswith(f"{path}: ") and expected in text


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("yesterday,10,2", "row 2, column 'TIMESTAMP': 'yesterday' is not a date-time"),
        ("2023-11-16 18:15:47.0,0,2", "row 2, column 'ContextTokens': 0"),
        ("2023-11-16 18:15:47.0,10,many", "row 2, column 'GeneratedTokens': 'many'"),
    ],
)
def test_bad_azure_rows_name_file_and_row(tmp_path, row, expected):
    path = tmp_path / "bad.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,5,1\n{row}\n")
    with pytest.raises(TraceError) as err:
        read_trace(path, "azure", class_rules=RULES)
    text = one_line_error(err)
    assert text.startswith(f"{path}: ") and expected in text


def test_azure_missing_column_is_named(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.0,5\n")
    with pytest.raises(TraceError) as err:
        read_trace(path, "azure", class_rules=RULES)
    assert "missing column(s) ['GeneratedTokens']" in one_line_error(err)


def test_a_row_matching_no_class_rule_is_named(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [GOOD, {**GOOD, "timestamp": 5, "input_length": 900,
                                                      "hash_ids": [0, 1]}])  # fmt: skip
    with pytest.raises(TraceError) as err:
        read_trace(path, "mooncake", class_rules=[("short", 512)])
    assert "line 2: input length 900 matches no class rule (short <= 512)" in one_line_error(err)


def test_pack_with_a_bad_trace_row_fails_validation_in_one_line(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [GOOD, {**GOOD, "timestamp": "x"}])
    with pytest.raises(ManifestError) as err:
        validate_pack(pack_data(path=str(path)), "pack.yaml")
    text = one_line_error(err)
    assert text.startswith("pack.yaml: invalid pack configuration: client.trace")
    assert f"{path}: line 2, field 'timestamp'" in text


def test_sha256_mismatch_is_refused(tmp_path):
    with pytest.raises(ManifestError) as err:
        validate_pack(pack_data(sha256="0" * 64), "pack.yaml")
    text = one_line_error(err)
    assert f"has sha256 {file_sha256(MOONCAKE)} but the manifest pins {'0' * 64}" in text


# --- the manifest -------------------------------------------------------------------------------


def test_frozen_manifest_pins_the_trace_and_its_verbatim_rates():
    doc = freeze(validate_pack(pack_data()))
    trace = doc["manifest"]["client"]["trace"]
    assert trace["sha256"] == file_sha256(MOONCAKE)
    assert trace["format"] == "mooncake" and trace["replay"] == "verbatim"
    assert trace["time_scales"] == [1.0, 0.5]
    rates = verbatim_rates(read_trace(MOONCAKE, "mooncake", class_rules=RULES), [1.0, 0.5])
    assert doc["manifest"]["sweep"]["open_loop_rps"] == rates == [4.983, 9.967]
    shown = doc["derived"]["trace"]
    assert (
        shown["rows"] == 300
        and shown["block_hashes"]
        and shown["native_rps"] == pytest.approx(4.983, abs=5e-4)
    )
    assert shown["classes"]["long"]["requests"] == 80
    assert shown["classes"]["long"]["input_tokens"]["max"] == 5103
    assert shown["classes"]["short"]["input_tokens"]["max"] <= 2048
    # The frozen manifest validates again as it is (the filled rates are the trace's).
    assert validate_pack(doc["manifest"]).sweep.open_loop_rps == rates


def test_azure_pack_with_class_rules_freezes(tmp_path):
    d = pack_data(path=str(AZURE), format="azure", time_scales=[1.0])
    pack = validate_pack(d)
    assert pack.client.trace.sha256 == file_sha256(AZURE)
    assert pack.sweep.open_loop_rps == [round(299 / 60.0, 3)]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"sweep": {"search": {"resolution_rps": 1, "initial": [4, 8]}}}, "search bisects"),
        ({"sweep": {"cache_states": ["cold", "warm"]}}, "measure it cold"),
        (
            {
                "trace": {"replay": "stretch", "time_scales": [1.0]},
                "sweep": {"cache_states": ["warm"], "open_loop_rps": [5.0]},
            },
            "measure it cold",
        ),
        ({"sweep": {"open_loop_rps": [5.0]}}, "a verbatim trace's rates are its own"),
        ({"trace": {"classes": []}}, "declare class rules"),
        ({"trace": {"time_scales": [1.0, 1.0]}}, "time_scales has duplicates"),
        ({"trace": {"replay": "stretch"}}, "time_scales apply to replay 'verbatim' only"),
    ],
)
def test_verbatim_pack_refusals(edit, expected):
    d = pack_data(**edit.get("trace", {}))
    d["sweep"].update(edit.get("sweep", {}))
    if "cache_states" in edit.get("sweep", {}):
        d["prompts"]["prefix"] = {"shared_prefixes": 2, "prefix_tokens": 16, "revision": "p-v1"}
    with pytest.raises(ManifestError) as err:
        validate_pack(d, "pack.yaml")
    assert expected in one_line_error(err)


# --- verbatim schedules ----------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_verbatim_schedule_sends_the_trace_as_recorded(scale):
    pack = validate_pack(pack_data())
    trace = read_trace(MOONCAKE, "mooncake", class_rules=RULES)
    rate = verbatim_rates(trace, [scale])[0]
    point = next(p for p in S.points(pack) if p.rate_rps == rate)
    frame = T.validate_schedule(S.build_schedule(pack, point), pack.class_names, "s")
    assert len(frame) == 300  # every row, no more
    raw = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    order = np.argsort([r["timestamp"] for r in raw], kind="stable")
    expected_ns = [round(raw[i]["timestamp"] * 1e6 * scale) for i in order]
    assert frame["scheduled_offset_ns"].tolist() == expected_ns
    assert frame["input_tokens"].tolist() == [raw[i]["input_length"] for i in order]
    assert frame["output_tokens"].tolist() == [raw[i]["output_length"] for i in order]
    blocks = [" ".join(map(str, raw[i]["hash_ids"])) for i in order]
    assert frame["prefix_blocks"].tolist() == blocks
    assert (frame["prefix_id"] == -1).all()
    warm = frame["scheduled_offset_ns"] < pack.client.warmup_seconds * 1e9
    assert (frame["phase"] == np.where(warm, "warmup", "measure")).all()
    # Extension blocks never come: the trace is all there is.
    assert S.build_schedule(pack, point, extension_blocks=3).equals(S.build_schedule(pack, point))
    summary = S.summarize(frame, S.ScheduleInputs.for_point(pack, point), point)
    assert summary["trace"]["time_scale"] == scale
    assert summary["trace"]["class_rows"] == {"short": 220, "long": 80}


def test_a_rate_that_is_not_a_time_scale_has_no_verbatim_schedule():
    pack = validate_pack(pack_data())
    with pytest.raises(ManifestError) as err:
        S.build_schedule(pack, S.Point(mode="open", rate_rps=7.0, cache_state="cold", repeat=0))
    assert "open-r7: not a rate of the verbatim trace" in one_line_error(err)


def test_the_shipped_trace_pack_lints_clean_and_lists_its_points():
    d = yaml.safe_load(PACK.read_text())
    assert d["client"]["trace"]["path"] == "config/traces/mooncake-sample.jsonl"
    pack = validate_pack(pack_data())
    assert [p.key for p in S.points(pack)] == ["open-r4.983/cold/rep0", "open-r9.967/cold/rep0"]


# --- block-hash prompts ------------------------------------------------------------------------


def prompt(blocks: str, n: int, seed: int = 1) -> str:
    return build_prompt(
        input_tokens=n, prompt_seed=seed, prefix_id=-1, prefix_tokens=0, prefix_revision=None,
        cold_unique_prefix_tokens=8, prefix_blocks=blocks, block_tokens=512,
    )  # fmt: skip


def test_equal_leading_hash_ids_send_byte_identical_prefixes():
    a, b = prompt("0 1 2", 1300, seed=1), prompt("0 1 9", 1100, seed=2)
    wa, wb = a.split(" "), b.split(" ")
    assert len(wa) == 1300 and len(wb) == 1100  # exact lengths, the last block partial
    assert wa[:1024] == wb[:1024]  # blocks 0 and 1 shared
    assert wa[1024:1100] != wb[1024:1100]  # block 2 vs 9
    assert " ".join(wa[:1024]) == " ".join(wb[:1024])
    # A prompt longer than its blocks ends in its own words; a shorter one is cut in a block.
    longer = prompt("0", 600, seed=3).split(" ")
    assert longer[:512] == wa[:512] and len(longer) == 600
    assert prompt("5", 100).split(" ") == prompt("5 6", 100, seed=9).split(" ")[:100]


def test_other_hash_ids_share_nothing():
    assert prompt("3", 512).split(" ")[:16] != prompt("4", 512).split(" ")[:16]


# --- the SLO report's words ---------------------------------------------------------------------


def test_under_sampled_class_of_a_verbatim_trace_says_why():
    report = {"under_sampled_classes": ["long"], "classes": {"long": {"successful_count": 41}}}
    trace = {"replay": "verbatim", "class_rows": {"long": 44, "short": 256}}
    assert under_sampled_reasons(report, trace, 50) == [
        "long: under-sampled, 41 successful of 50 needed; a verbatim trace is never extended "
        "(it holds 44 long requests)"
    ]
    assert under_sampled_reasons(report, {**trace, "replay": "stretch"}, 50) == []
    assert under_sampled_reasons(report, None, 50) == []


def test_load_pack_reads_the_shipped_pack_from_the_checkout(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert load_pack(PACK).client.trace.sha256 == file_sha256(MOONCAKE)


# --- lint and the command line ------------------------------------------------------------------


def test_lint_notes_a_verbatim_trace_short_of_samples_and_refuses_nothing():
    d = pack_data(time_scales=[0.25])
    d["acceptance"]["min_successful_samples_per_class"] = 100
    pack = validate_pack(d)
    assert lint_pack(pack) == []  # no quota findings: the rows are the trace's
    first, second = lint_notes(pack)
    assert "never extended, never stopped early, never bisected by a search" in first
    assert second.startswith(f"client.trace at time scale 0.25 ({pack.sweep.open_loop_rps[0]:g}")
    assert "'long'" in second and "'short'" not in second and "never extended" in second
    shipped = first.replace("[0.25]", "[1.0, 0.5]").replace("[19.933]", "[4.983, 9.967]")
    assert lint_notes(validate_pack(pack_data())) == [shipped]


def test_freeze_command_fails_in_one_line_on_a_bad_row(tmp_path):
    trace = write_lines(tmp_path / "t.jsonl", [GOOD, {**GOOD, "timestamp": 5, "input_length": 0}])
    config = tmp_path / "pack.yaml"
    config.write_text(yaml.safe_dump(pack_data(path=str(trace))))
    res = subprocess.run(
        [sys.executable, "-m", "capacity_pack", "freeze", str(config), "-o", str(tmp_path / "f")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode != 0 and not (tmp_path / "f").exists()
    assert "Traceback" not in res.stderr
    assert f"{trace}: line 2, field 'input_length': 0 is not a positive whole number" in res.stderr


def test_an_azure_trace_stretched_to_a_declared_rate():
    d = pack_data(path=str(AZURE), format="azure", replay="stretch", time_scales=[1.0])
    d["sweep"]["open_loop_rps"] = [10.0]
    pack = validate_pack(d)
    point = S.Point(mode="open", rate_rps=10.0, cache_state="cold", repeat=0)
    frame = T.validate_schedule(S.build_schedule(pack, point), pack.class_names, "s")
    offsets = frame["scheduled_offset_ns"].to_numpy() / 1e9
    assert (len(frame) - 1) / offsets[-1] == pytest.approx(10.0, rel=1e-6)
    trace = read_trace(AZURE, "azure", class_rules=RULES)
    assert frame["input_tokens"].tolist() == trace["input_tokens"].tolist()
    assert frame["output_tokens"].tolist() == trace["output_tokens"].tolist()
    assert frame["class"].tolist() == trace["class"].tolist()
    assert (frame["prefix_blocks"] == "").all()
