"""The six benchmark anti-patterns of a broken capacity benchmark, and the extra checks, as
named findings."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from capacity_pack.plan import lint
from capacity_pack.plan.lint import lint_data, lint_file
from tests.conftest import pack_data
from tests.paths import ROOT

BROKEN = ROOT / "tests" / "data" / "broken-benchmark.yaml"
SIX = {
    "concurrency-only-load",
    "too-few-requests",
    "uncontrolled-prefix-cache",
    "mean-only-reporting",
    "missing-operational-evidence",
    "mutable-versions",
}
EXTRA = {"no-warmup", "single-run", "unvalidated-token-counts"}


def test_seed_broken_config_yields_all_six_findings():
    findings = lint_file(BROKEN)
    assert {f.code for f in findings if not f.extra} == SIX
    assert {f.code for f in findings if f.extra} == EXTRA
    assert len(findings) == 9
    assert all(f.reason and f.message for f in findings)
    assert set(lint.SIX) == SIX and set(lint.EXTRA) == EXTRA
    assert set(lint.REASONS) == SIX | EXTRA | set(lint.PACK_EXTRA)


def test_the_broken_benchmark_lacks_operational_evidence():
    (finding,) = [f for f in lint_file(BROKEN) if f.code == "missing-operational-evidence"]
    assert finding.message == (
        "report ['mean_latency', 'total_tokens_per_second'] names no errors, queue growth, "
        "cancellations, cache state"
    )
    assert "queue growth" in finding.reason and not finding.extra


@pytest.mark.parametrize(
    "pack",
    [
        "config/config.yaml",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "config" / "packs").glob("*.yaml")),
    ],
)
def test_shipped_packs_are_clean(pack):
    """Every pack the project ships, the example vLLM and SGLang packs included."""
    assert lint_file(ROOT / pack) == []


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (
            lambda d: (
                d["sweep"].__setitem__("open_loop_rps", []),
                d["sweep"].pop("search"),  # no searched rates either
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
        (lambda d: d["engine"].__setitem__("scheduler", "v2-latest"), "mutable-versions"),
        (
            lambda d: d["acceptance"].__setitem__("error_rate_max", 1),
            "missing-operational-evidence",
        ),
        (
            lambda d: (d["pack"].__setitem__("size", "full"), d["sweep"].__setitem__("repeats", 1)),
            "single-run",
        ),
        (lambda d: d["request"].__setitem__("include_usage", False), "unvalidated-token-counts"),
        (
            lambda d: d["acceptance"].__setitem__("class_slo_attainment_min", 0.999),
            "undecidable-gate",
        ),
    ],
)
def test_each_finding_on_a_pack(mutate, code):
    data = pack_data()
    mutate(data)
    findings = lint_data(data, "pack.yaml")
    assert [f.code for f in findings] == [code]
    assert findings[0].extra is (code in EXTRA or code in lint.PACK_EXTRA)


def test_a_gate_no_sample_can_meet_is_refused_with_the_numbers():
    # Like the real-engine pack as it was: 0.5 and 1 RPS, 24 requests, a small sample gate,
    # 120 s at most: no class could ever collect the 81 successes that pass 0.95.
    data = pack_data()
    data["sweep"]["open_loop_rps"] = [0.5, 1]
    data["client"].update(initial_scheduled_requests=24, maximum_duration_seconds=120)
    data["client"].pop("class_schedule_counts")
    data["acceptance"]["min_successful_samples_per_class"] = 4
    findings = lint_data(data, "pack.yaml")
    assert [f.code for f in findings] == ["undecidable-gate"]
    message = findings[0].message
    assert "lowest rate 0.5 RPS" in message and "at least 81 successful" in message
    assert "'generation_heavy': 12" in message  # 0.5 x 0.2 x 120 s
    # Long enough points, or a gate the sample can meet, clear it.
    data["client"]["maximum_duration_seconds"] = 900
    assert lint_data(data, "pack.yaml") == []
    data["client"]["maximum_duration_seconds"] = 120
    data["acceptance"].update(class_slo_attainment_min=0.5)
    assert lint_data(data, "pack.yaml") == []


def test_a_sample_gate_below_the_decision_sample_is_a_note():
    from capacity_pack.plan.manifest import validate_pack

    data = pack_data()
    data["acceptance"]["min_successful_samples_per_class"] = 10
    notes = lint.lint_notes(validate_pack(data, "pack.yaml"))
    assert len(notes) == 1 and "10 is below 81" in notes[0]
    data["acceptance"]["min_successful_samples_per_class"] = 81
    assert lint.lint_notes(validate_pack(data, "pack.yaml")) == []


def test_a_rehearsal_pack_may_run_once():
    data = pack_data()
    data["sweep"]["repeats"] = 1
    assert lint_data(data, "pack.yaml") == []


def test_fixing_the_broken_benchmark_clears_findings():
    data = yaml.safe_load(BROKEN.read_text())
    data.update(
        load_mode="both",
        request_rate=20.0,
        request_count=22_000,
        prompts="synthetic_unique",
        warmup_seconds=60,
        report=["p50_ttft", "p95_ttft", "error_rate", "queue_trend", "cancelled", "cache_state"],
        model_revision="r1",
        engine_version="0.11.0",
        repeats=3,
        tokenizer_revision="t1",
    )
    assert lint_data(data, "fixed.yaml") == []


@pytest.mark.slow
def test_cli_lint_exit_codes():
    bad = subprocess.run(
        [sys.executable, "-m", "capacity_pack", "lint", str(BROKEN)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1
    for code in SIX:
        assert f"{code}: " in bad.stdout
    for code in EXTRA:
        assert f"{code} (extra: not one of the six anti-patterns): " in bad.stdout
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


def test_cli_lint_reports_what_freeze_refuses(tmp_path):
    """An unknown cache reset: freeze refuses it (the engines' registry), so lint does too."""
    data = pack_data()
    data["target"] = {"kind": "openai", "base_url": "http://127.0.0.1:8000", "cache_reset": "nope"}
    path = tmp_path / "pack.yaml"
    path.write_text(yaml.safe_dump(data))
    for args in (["lint", str(path)], ["freeze", str(path), "-o", str(tmp_path / "f.json")]):
        res = subprocess.run(
            [sys.executable, "-m", "capacity_pack", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 1 and "target.cache_reset" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr and "no findings" not in res.stdout
