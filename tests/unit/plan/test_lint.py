"""The seed's six benchmark anti-patterns, as named findings."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from capacity_pack.plan.lint import lint_data, lint_file
from tests.conftest import pack_data
from tests.paths import ROOT

BROKEN = ROOT / "tests" / "data" / "broken-benchmark.yaml"
SIX = {
    "concurrency-only-load",
    "too-few-requests",
    "uncontrolled-prefix-cache",
    "no-warmup",
    "mean-only-reporting",
    "mutable-versions",
}


def test_seed_broken_config_yields_all_six_findings():
    findings = lint_file(BROKEN)
    assert {f.code for f in findings} == SIX
    assert len(findings) == 6
    assert all(f.reason and f.message for f in findings)


@pytest.mark.parametrize(
    "pack",
    ["config/config.yaml", "config/packs/tutorial-70b.yaml", "config/packs/k6-load-shapes.yaml"],
)
def test_shipped_packs_are_clean(pack):
    assert lint_file(ROOT / pack) == []


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (
            lambda d: (
                d["sweep"].__setitem__("open_loop_rps", []),
                d.__setitem__("experiments", []),
            ),
            "concurrency-only-load",
        ),
        (
            lambda d: d["acceptance"].__setitem__("min_successful_samples_per_class", 5000),
            "too-few-requests",
        ),
        (lambda d: d["prompts"].__setitem__("source", "repeat"), "uncontrolled-prefix-cache"),
        (
            lambda d: d.__setitem__(
                "target",
                {"kind": "openai", "base_url": "http://127.0.0.1:8000", "cache_reset": "none"},
            ),
            "uncontrolled-prefix-cache",
        ),
        (lambda d: d["client"].__setitem__("warmup_seconds", 0), "no-warmup"),
        (lambda d: d["report"].__setitem__("latency_statistics", ["mean"]), "mean-only-reporting"),
        (lambda d: d["model"].__setitem__("revision", "latest"), "mutable-versions"),
    ],
)
def test_each_finding_on_a_pack(mutate, code):
    data = pack_data()
    mutate(data)
    assert [f.code for f in lint_data(data, "pack.yaml")] == [code]


def test_fixing_the_broken_benchmark_clears_findings():
    data = yaml.safe_load(BROKEN.read_text())
    data.update(
        load_mode="both",
        request_rate=20.0,
        request_count=22_000,
        prompts="synthetic_unique",
        warmup_seconds=60,
        report=["p50_ttft", "p95_ttft"],
        model_revision="r1",
        engine_version="0.11.0",
    )
    assert lint_data(data, "fixed.yaml") == []


def test_cli_lint_exit_codes():
    bad = subprocess.run(
        [sys.executable, "-m", "capacity_pack", "lint", str(BROKEN)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1
    for code in SIX:
        assert code in bad.stdout
    good = subprocess.run(
        [sys.executable, "-m", "capacity_pack", "lint", "config/config.yaml"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert good.returncode == 0, good.stdout + good.stderr


def test_unknown_key_in_plain_description_is_named(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("load_mode: open_loop\nrequst_count: 5\n")
    res = subprocess.run(
        [sys.executable, "-m", "capacity_pack", "lint", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "requst_count" in res.stderr
