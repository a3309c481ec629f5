"""A multi-turn session pack through the real pipeline against the simulated engine.

The shipped ``config/packs/sessions.yaml``, shrunk to one rate (3 sessions/s), cold and warm:
each session resends its conversation, so the prefix-cache hit rate rises with the turn index
(warm: from the shared system prompts' share at turn 0; cold: from zero, no session sharing a
block with another), and the SLO reports and the pack README show TTFT and the hit rate by turn.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from tests.conftest import run_snakemake, write_pack
from tests.paths import ROOT

pytestmark = pytest.mark.slow

SESSIONS = ROOT / "config" / "packs" / "sessions.yaml"


def session_pack() -> dict:
    data = yaml.safe_load(SESSIONS.read_text())
    data["pack"]["name"] = "sessions-test"
    data["client"].update(
        initial_scheduled_requests=16,
        minimum_duration_seconds=4,
        maximum_duration_seconds=10,
        warmup_seconds=0.5,
    )
    chat = data["workload"][0]
    chat["session"] = {
        "turns": {"distribution": "geometric", "mean": 4, "max": 6},
        "think_time": {"distribution": "exponential", "mean_s": 0.3},
    }
    # A gate a few seconds of load can decide (as tests.conftest.small_pack_data's).
    data["acceptance"].update(class_slo_attainment_min=0.6, min_successful_samples_per_class=20)
    data["sweep"].update(open_loop_rps=[3], cache_states=["cold", "warm"], repeats=1)
    return data


def pooled_hit(turns: list[dict], keep) -> float:
    """Cached / prompt tokens pooled over the turns ``keep`` selects (weights by prompt size)."""
    chosen = [t for t in turns if keep(t["turn"]) and t["prefix_hit_rate"] is not None]
    prompt = sum(t["mean_prompt_tokens"] * t["successful"] for t in chosen)
    cached = sum(t["prefix_hit_rate"] * t["mean_prompt_tokens"] * t["successful"] for t in chosen)
    return cached / prompt


def test_session_pack_hit_rate_rises_with_the_turn_and_ttft_by_turn_is_reported(tmp_path):
    write_pack(tmp_path, session_pack())
    run_snakemake(tmp_path)
    results = tmp_path / "results" / "sessions-test"
    turns = {}
    for cache in ("cold", "warm"):
        report = json.loads(
            (results / "reports" / "open-r3" / cache / "rep0" / "slo-report.json").read_text()
        )
        section = report["sessions"]
        assert section["rate_unit"].startswith("sessions/s")
        chat = section["classes"]["chat"]
        assert chat["sessions"] >= 10 and chat["sessions_ended_early"] == 0
        rows = chat["turns"]
        assert [t["turn"] for t in rows] == list(range(len(rows))) and len(rows) >= 4
        for t in rows:
            # TTFT by turn index, from the successful turns.
            assert t["successful"] > 0 and 0 < t["p50_ttft_ms"] <= t["p95_ttft_ms"]
        turns[cache] = rows
        tables = results / "tables" / "open-r3" / cache / "rep0"
        table = pd.read_parquet(tables / "requests.parquet")
        measured = table[table["phase"] == "measure"]
        assert measured["turn"].notna().all() and measured["session"].notna().all()
        schedule = json.loads(
            (results / "schedules" / "open-r3" / cache / "rep0" / "summary.json").read_text()
        )
        assert schedule["session_classes"]["chat"]["sessions"] >= 10

    cold, warm = turns["cold"], turns["warm"]
    # Across sessions, cold: no block of one session's prompt is another's.
    assert cold[0]["prefix_hit_rate"] < 0.02
    # Warm turn 0 reuses a prewarmed system prompt (96 of its ~150 tokens).
    assert warm[0]["prefix_hit_rate"] > 0.3
    for rows in (cold, warm):
        first = rows[0]["prefix_hit_rate"]
        # Every later turn resends the conversation: more reuse than turn 0 ...
        assert all(t["prefix_hit_rate"] > first for t in rows[1:])
        # ... and more the longer the conversation already is.
        assert pooled_hit(rows, lambda k: k >= 3) > pooled_hit(rows, lambda k: k == 1)

    readme = (results / "pack" / "README.md").read_text()
    section = readme.split("## Sessions by turn", 1)[1].split("\n## ", 1)[0]
    assert "| point | turn | turns ok | prefix hit rate | P50 TTFT ms | P95 TTFT ms |" in section
    assert "| warm 3/s | 0 |" in section and "| cold 3/s | 3 |" in section
    assert (results / "pack" / "sessions.png").stat().st_size > 10_000
