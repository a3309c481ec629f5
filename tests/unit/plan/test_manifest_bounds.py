"""Bad pack input gets one error naming the file and field: encodings, dates, non-finite and
out-of-bound numbers, mutable revisions by pattern, and a hash for every manifest section."""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from capacity_pack.io import sha256_of_obj
from capacity_pack.plan.limits import is_mutable_revision
from capacity_pack.plan.lint import lint_data, lint_file
from capacity_pack.plan.manifest import (
    SECTIONS,
    ManifestError,
    Pack,
    freeze,
    load_pack,
    load_yaml,
    validate_pack,
)
from tests.conftest import pack_data, write_pack
from tests.paths import DEFAULT, ROOT


def refused(data: dict, *expected: str) -> str:
    """The error of validating ``data`` (lint raises the same one); it names every ``expected``."""
    with pytest.raises(ManifestError) as err:
        validate_pack(data, "pack.yaml")
    message = str(err.value)
    assert message.startswith("pack.yaml: invalid pack configuration")
    for text in expected:
        assert text in message
    with pytest.raises(ManifestError) as again:
        lint_data(data, "pack.yaml")
    assert str(again.value) == message
    return message


def test_a_file_that_is_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "pack.yaml"
    text = DEFAULT.read_bytes()
    offset = text.index(b"sim-small-r1")
    path.write_bytes(text[:offset] + b"\xff\xfe" + text[offset:])
    for read in (load_yaml, load_pack, lint_file):
        with pytest.raises(ManifestError) as err:
            read(path)
        assert str(err.value) == f"{path} is not UTF-8 text (byte {offset})"


def test_cutoff_must_be_an_iso_date():
    data = pack_data()
    data["cutoff"] = 0
    assert "cutoff: expected a date as YYYY-MM-DD, not int (got 0)" in refused(data)
    for bad in (20261129, "20261129", "2026-11-29T10:00", datetime.datetime(2026, 11, 29), True):
        data["cutoff"] = bad
        refused(data, "cutoff")
    data["cutoff"] = "2026-02-30"
    refused(data, "cutoff")
    for good in ("2026-11-29", datetime.date(2026, 11, 29)):
        data["cutoff"] = good
        assert validate_pack(data).cutoff == datetime.date(2026, 11, 29)


def test_an_impossible_yaml_date_is_a_yaml_error_with_its_line(tmp_path):
    path = tmp_path / "pack.yaml"
    path.write_text(DEFAULT.read_text().replace("cutoff: 2026-11-29", "cutoff: 2026-02-30"))
    line = 1 + DEFAULT.read_text().splitlines().index("cutoff: 2026-11-29")
    with pytest.raises(ManifestError) as err:
        load_pack(path)
    assert str(err.value).startswith(f"{path}: not valid YAML: ")
    assert f"(line {line}, column 9)" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_numbers_must_be_finite(value):
    data = pack_data()
    data["sweep"]["open_loop_rps"] = [value]
    refused(data, "sweep.open_loop_rps.0: Input should be a finite number")
    data = pack_data()
    data["engine"]["config"]["gpu_memory_utilization"] = value
    refused(data, "engine.config.gpu_memory_utilization")


def test_a_huge_rate_names_its_bound():
    data = pack_data()
    data["sweep"]["open_loop_rps"] = [20, 1e308]
    refused(data, "sweep.open_loop_rps: [1] = 1e+308", "at most 1,000,000 requests per second")


def test_a_tiny_rate_is_refused():
    data = pack_data()
    data["sweep"]["open_loop_rps"] = [1e-9]
    refused(data, "sweep.open_loop_rps.0", "greater than or equal to 0.001")


def test_a_trillion_requests_names_its_bound():
    data = pack_data()
    data["client"]["initial_scheduled_requests"] = 10**12
    data["client"].pop("class_schedule_counts")
    refused(data, "client.initial_scheduled_requests: must be at most 100,000,000 requests")


def test_a_point_of_rate_times_duration_is_bounded_too():
    data = pack_data()
    data["client"].update(minimum_duration_seconds=2e6, maximum_duration_seconds=2e6)
    data["sweep"]["open_loop_rps"] = [100_000]
    refused(data, "sweep.open_loop_rps 100000", "above the bound of 100,000,000 requests per point")


@pytest.mark.parametrize(
    ("section", "field", "value", "bound"),
    [
        ("client", "request_timeout_seconds", 1e9, "2,592,000 seconds (30 days)"),
        ("client", "warmup_seconds", 3e6, "2,592,000 seconds (30 days)"),
        ("plan", "peak_rps", 1e7, "1,000,000 requests per second"),
        ("sweep", "repeats", 10_000, "1,000 repeats"),
        ("client", "arrival_cv", 1e6, "less than or equal to 10"),
        ("client", "request_schedule_seed", 2**64, "less than or equal to 9223372036854775807"),
    ],
)
def test_bounds_name_the_field_and_the_bound(section, field, value, bound):
    data = pack_data()
    data[section][field] = value
    refused(data, f"{section}.{field}", bound)


def test_token_lengths_are_bounded():
    data = pack_data()
    data["workload"][0]["output_tokens"] = 10**9
    refused(data, "workload.0.output_tokens", "10,000,000 tokens")
    data = pack_data()
    data["workload"][0]["input_tokens"] = {"distribution": "lognormal", "p50": 1e8, "p95": 2e8,
                                          "max": 3e8}  # fmt: skip
    refused(data, "workload.0.input_tokens.p50: Input should be less than or equal to 10000000")


def test_duplicate_keys_and_non_mappings_are_refused(tmp_path):
    path = tmp_path / "pack.yaml"
    text = DEFAULT.read_text()
    path.write_text(text.replace("cutoff: 2026-11-29", "cutoff: 2026-11-29\ncutoff: 2026-11-30"))
    with pytest.raises(ManifestError, match=r"found duplicate key 'cutoff' \(line \d+"):
        load_pack(path)
    for body, kind in (("- a\n- b\n", "list"), ("", "NoneType"), ("42\n", "int")):
        path.write_text(body)
        for read in (load_pack, lint_file):
            with pytest.raises(
                ManifestError, match=f"expected a mapping at the top level, got {kind}"
            ):
                read(path)


@pytest.mark.parametrize(
    ("value", "mutable"),
    [
        ("latest", True),
        ("v2-latest", True),
        ("latest_v2", True),
        ("nightly-2026", True),
        ("main", True),
        ("origin/main", True),
        ("HEAD~1", True),
        ("release:dev", True),
        ("1.0.dev", True),
        ("stable", True),
        ("r1-*", True),
        ("", True),
        ("v2.1", False),
        ("development-free", False),
        ("mainline", False),
        ("1.0.dev3", False),
        ("nightly2026", False),
        ("continuous-batching-v1", False),
        ("0c1e570", False),
    ],
)
def test_mutable_revisions_by_word(value, mutable):
    assert is_mutable_revision(value) is mutable


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("engine", "scheduler"), "latest"),
        (("engine", "version"), "v2-latest"),
        (("model", "revision"), "nightly-2026"),
        (("model", "precision"), "fp8-main"),
        (("request", "chat_template"), "chatml-head"),
        (("prompts", "corpus_revision"), "dev"),
    ],
)
def test_freeze_and_lint_refuse_every_revision_like_field(path, value):
    data = pack_data()
    data[path[0]][path[1]] = value
    field = ".".join(path)
    with pytest.raises(ManifestError, match=f"{field} = {value!r}"):
        freeze(validate_pack(data), "pack.yaml")
    findings = lint_data(data, "pack.yaml")
    assert [f.code for f in findings] == ["mutable-versions"]
    assert f"{field} = {value!r}" in findings[0].message


def test_every_section_is_hashed_failure_included():
    assert set(SECTIONS) == set(Pack.model_fields)
    doc = freeze(load_pack(DEFAULT))
    assert doc["section_sha256"]["failure"] == sha256_of_obj(doc["manifest"]["failure"])
    data = pack_data(shipped=True)
    data["failure"]["duration_s"] = 31
    changed = freeze(validate_pack(data))
    diff = {k for k in SECTIONS if changed["section_sha256"][k] != doc["section_sha256"][k]}
    assert diff == {"failure"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "capacity_pack", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_cli_lint_and_freeze_refuse_bad_input_in_one_line(tmp_path):
    """Each case: lint and freeze both exit 1, one line on stderr naming the file, no traceback,
    nothing written."""

    def pack_file(name: str, section: str | None, field: str, value) -> Path:
        data = pack_data()
        (data[section] if section else data)[field] = value
        (tmp_path / name).mkdir()
        return write_pack(tmp_path / name, data)

    inf = pack_file("inf", "sweep", "open_loop_rps", [float("inf")])
    zero = pack_file("zero", None, "cutoff", 0)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"pack:\n  name: \xc3\x28\n")
    for config, expected in (
        (inf, "sweep.open_loop_rps.0: Input should be a finite number"),
        (zero, "cutoff: expected a date"),
        (binary, f"{binary} is not UTF-8 text (byte 14)"),
    ):
        out = tmp_path / "frozen.json"
        for args in (("lint", str(config)), ("freeze", str(config), "-o", str(out))):
            res = cli(*args)
            assert res.returncode == 1, (args, res.stdout, res.stderr)
            assert expected in res.stderr and str(config) in res.stderr
            assert len(res.stderr.strip().splitlines()) == 1, res.stderr
            assert "Traceback" not in res.stderr and "no findings" not in res.stdout
            assert not out.exists()


def test_frozen_manifest_lints_as_its_pack(tmp_path):
    path = tmp_path / "frozen.json"
    import json

    path.write_text(json.dumps(freeze(load_pack(DEFAULT))))
    assert lint_file(path) == []
    assert load_pack(path).pack.name == "rehearsal-sim"


def test_a_missing_manifest_in_a_frozen_document_is_an_error(tmp_path):
    path = Path(tmp_path / "frozen.yaml")
    path.write_text(yaml.safe_dump({"format": "capacity-pack/frozen-manifest/v1"}))
    with pytest.raises(ManifestError, match="expected a mapping at the top level"):
        load_pack(path)
