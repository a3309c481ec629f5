"""The pack schema, its freeze (hashes, refusals) and the CLI around them."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from capacity_pack.io import sha256_of_obj
from capacity_pack.plan.manifest import (
    SECTIONS,
    ManifestError,
    freeze,
    load_frozen,
    load_pack,
    stratified_counts,
    validate_pack,
)
from tests.conftest import with_fixed_lengths
from tests.paths import DEFAULT, ROOT, TUTORIAL


def raw(path: Path = DEFAULT) -> dict:
    return yaml.safe_load(path.read_text())


def test_tutorial_reproduces_the_seed_manifest():
    pack = load_pack(TUTORIAL)
    assert pack.weighted_mean_tokens() == (2406.4, 243.2)
    assert pack.class_counts(22_000) == {
        "interactive": 15_400,
        "long_context": 4_400,
        "generation_heavy": 2_200,
    }
    # Around the engine model's predicted boundary, not the illustrative 16-28 RPS.
    assert pack.sweep.open_loop_rps == [0.2, 0.3, 0.4, 0.5]
    assert pack.acceptance.min_successful_samples_per_class == 2000
    assert pack.pack.size == "full"


def test_default_pack_is_labelled_rehearsal():
    doc = freeze(load_pack(DEFAULT))
    assert doc["manifest"]["pack"]["size"] == "rehearsal"
    assert "REHEARSAL" in doc["derived"]["pack_label"]


def test_frozen_manifest_reports_weighted_means_and_length_stats():
    doc = freeze(load_pack(TUTORIAL))
    assert doc["derived"]["weighted_mean_input_tokens"] == 2406.4
    assert doc["derived"]["weighted_mean_output_tokens"] == 243.2
    stats = doc["derived"]["length_stats"]["long_context"]["input_tokens"]
    assert stats == {
        "mean": 8192.0,
        "p50": 8192,
        "p95": 8192,
        "p99": 8192,
        "max": 8192,
        "fixed": True,
    }
    assert doc["derived"]["fixed_length_classes"] == [
        "interactive",
        "long_context",
        "generation_heavy",
    ]


def test_freeze_hashes_whole_and_each_section():
    doc = freeze(load_pack(DEFAULT))
    assert doc["sha256"] == sha256_of_obj(doc["manifest"])
    assert set(doc["section_sha256"]) == set(SECTIONS)
    for name, digest in doc["section_sha256"].items():
        assert digest == sha256_of_obj(doc["manifest"][name])
    # Canonical: the same content in another key order freezes to the same hash.
    data = raw()
    reordered = dict(reversed(list(data.items())))
    assert freeze(validate_pack(reordered))["sha256"] == doc["sha256"]


def test_changing_one_section_changes_only_its_hash():
    base = freeze(validate_pack(raw()))
    data = raw()
    data["acceptance"]["class_slo_attainment_min"] = 0.99
    changed = freeze(validate_pack(data))
    assert changed["sha256"] != base["sha256"]
    diff = {k for k in SECTIONS if changed["section_sha256"][k] != base["section_sha256"][k]}
    assert diff == {"acceptance"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (("model", "revision"), "latest"),
        (("model", "tokenizer_revision"), "main"),
        (("engine", "version"), "HEAD"),
        (("engine", "version"), ""),
        (("model", "revision"), "r1-*"),
        (("model", "revision"), "master"),
    ],
)
def test_freeze_refuses_mutable_revisions_naming_the_field(field, value):
    data = raw()
    data[field[0]][field[1]] = value
    with pytest.raises(ManifestError) as err:
        freeze(validate_pack(data))
    assert ".".join(field) in str(err.value)


def test_load_frozen_detects_edits(tmp_path):
    doc = freeze(load_pack(DEFAULT))
    path = tmp_path / "frozen.json"
    path.write_text(json.dumps(doc))
    pack, again = load_frozen(path)
    assert again["sha256"] == doc["sha256"] and pack.pack.name == "rehearsal-sim"
    doc["manifest"]["client"]["request_schedule_seed"] += 1
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="does not match its sha256"):
        load_frozen(path)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["workload"][0].__setitem__("mix", 0.6), "mix must sum to 1"),
        (lambda d: d["client"].__setitem__("automatic_retries", True), "automatic retries"),
        (
            lambda d: d["workload"][0].__setitem__("request_ttft_cutoff_ms", -5),
            "workload.0.request_ttft_cutoff_ms",
        ),
        (
            lambda d: d["client"].__setitem__("class_schedule_counts", {"interactive": 1}),
            "class_schedule_counts",
        ),
        (lambda d: d["engine"].__setitem__("version", 1.0), "engine.version"),
        (lambda d: d["sweep"].__setitem__("closed_loop_concurrency", [4, 8]), "must include 1"),
        (lambda d: d.__setitem__("surprise", 1), "surprise"),
        (lambda d: d["target"].__setitem__("kind", "grpc"), "target"),
        (lambda d: d["engine"]["placement"].__setitem__("gpus", 3), "tp x pp x dp"),
        # Found by test_pack_properties: a state named twice would be one point id twice.
        (
            lambda d: d.__setitem__(
                "experiments",
                [
                    {
                        "name": "soak",
                        "test_type": "soak",
                        "cache_states": ["warm", "warm"],
                        "segments": [{"duration_s": 10, "rate_rps": 1}],
                    }
                ],
            ),
            "experiments.0: cache_states has duplicates",
        ),
    ],
)
def test_invalid_configs_name_the_field(mutate, expected):
    data = raw()
    mutate(data)
    with pytest.raises(ManifestError) as err:
        validate_pack(data, "my-pack.yaml")
    message = str(err.value)
    assert message.startswith("my-pack.yaml: invalid pack configuration")
    assert expected in message


def test_largest_remainder_counts_are_exact():
    assert stratified_counts(22_000, {"a": 0.7, "b": 0.2, "c": 0.1}) == {
        "a": 15_400,
        "b": 4_400,
        "c": 2_200,
    }
    counts = stratified_counts(10, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    assert sum(counts.values()) == 10 and sorted(counts.values()) == [3, 3, 4]
    assert counts["a"] == 4  # ties go to the first class


def test_length_distributions(tmp_path):
    data = with_fixed_lengths(raw())
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("tokens\n" + "\n".join(str(v) for v in [10, 20, 30, 40, 1000]) + "\n")
    data["workload"][0]["input_tokens"] = {
        "distribution": "lognormal",
        "p50": 300,
        "p95": 900,
        "max": 4096,
    }
    data["workload"][0]["output_tokens"] = {"distribution": "empirical", "path": str(lengths)}
    doc = freeze(validate_pack(data))
    stats = doc["derived"]["length_stats"]["interactive"]
    assert stats["input_tokens"]["p50"] == 300 and stats["input_tokens"]["p95"] == 900
    assert stats["input_tokens"]["max"] == 4096 and not stats["input_tokens"]["fixed"]
    assert 300 < stats["input_tokens"]["mean"] < 900
    assert stats["output_tokens"] == {
        "mean": 220.0,
        "p50": 30,
        "p95": 1000,
        "p99": 1000,
        "max": 1000,
        "fixed": False,
    }
    # The data file's content is pinned into the manifest hash.
    pinned = doc["manifest"]["workload"][0]["output_tokens"]["sha256"]
    assert len(pinned) == 64
    assert doc["derived"]["fixed_length_classes"] == ["long_context", "generation_heavy"]
    lengths.write_text("tokens\n5\n")
    again = copy.deepcopy(doc["manifest"])
    with pytest.raises(ManifestError, match="the file changed"):
        validate_pack(again)


def test_empirical_file_with_bad_row_names_file_and_row(tmp_path):
    data = raw()
    lengths = tmp_path / "bad.csv"
    lengths.write_text("tokens\n10\n-3\n")
    data["workload"][1]["input_tokens"] = {"distribution": "empirical", "path": str(lengths)}
    with pytest.raises(ManifestError) as err:
        validate_pack(data)
    assert "bad.csv: row 2" in str(err.value) and "workload.1.input_tokens" in str(err.value)


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "capacity_pack", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_freeze_and_schema(tmp_path):
    out = tmp_path / "frozen.json"
    res = cli("freeze", str(DEFAULT), "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["sha256"] in res.stdout
    schema_out = tmp_path / "schema.json"
    assert cli("schema", "-o", str(schema_out)).returncode == 0
    schema = json.loads(schema_out.read_text())
    assert schema["title"] == "capacity-pack configuration"
    assert {
        "model",
        "engine",
        "client",
        "workload",
        "acceptance",
        "target",
        "sweep",
        "plan",
    } <= set(schema["properties"])


def test_cli_freeze_refusal_writes_nothing(tmp_path):
    data = raw()
    data["model"]["revision"] = "latest"
    config = tmp_path / "pack.yaml"
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "frozen.json"
    res = cli("freeze", str(config), "-o", str(out))
    assert res.returncode == 1
    assert "model.revision" in res.stderr and "Traceback" not in res.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [config]
