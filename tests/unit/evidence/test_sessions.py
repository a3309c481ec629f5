"""The per-turn section of a session point's SLO report, and reconciliation of turns never sent."""

from __future__ import annotations

import pandas as pd
import pytest

from capacity_pack.decide import sessions as D
from capacity_pack.evidence import sessions as E
from capacity_pack.evidence.normalize import NormalizeError, reconcile
from capacity_pack.evidence.slo_report import ClassSpec

CHAT = ClassSpec("chat", ttft_cutoff_ms=100, tpot_cutoff_ms=20, expected_output_tokens=None)


def turns_frame() -> pd.DataFrame:
    """Two sessions of three turns and one request outside any session; session 1's turn 2
    failed; cached tokens absent where none were cached (as engines report them)."""
    rows = [
        # session, turn, status, ttft, prompt, cached
        (0, 0, "ok", 50.0, 100, None),
        (0, 1, "ok", 40.0, 200, 160),
        (0, 2, "ok", 120.0, 300, 288),
        (1, 0, "ok", 70.0, 100, None),
        (1, 1, "ok", 60.0, 220, 176),
        (1, 2, "error", 0.0, None, None),
        (None, None, "ok", 10.0, 50, None),
    ]
    return pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(len(rows))],
            "class": ["chat"] * 6 + ["other"],
            "phase": "measure",
            "session": pd.array([r[0] for r in rows], dtype="Int64"),
            "turn": pd.array([r[1] for r in rows], dtype="Int64"),
            "status": [r[2] for r in rows],
            "ttft_ms": [r[3] for r in rows],
            "tpot_ms": 10.0,
            "prompt_tokens": pd.array([r[4] for r in rows], dtype="Int64"),
            "cached_tokens": pd.array([r[5] for r in rows], dtype="Int64"),
        }
    )


def test_per_turn_ttft_attainment_and_hit_rate():
    summary = {
        "session_turns_not_sent": [
            {"request_id": "r9", "session": 1, "turn": 3, "kind": "session_ended", "reason": "x"}
        ]
    }
    section = E.per_turn(turns_frame(), [CHAT], summary)
    assert section["rate_unit"].startswith("sessions/s")
    chat = section["classes"]["chat"]
    assert chat["sessions"] == 2 and chat["sessions_ended_early"] == 1
    assert chat["turns_not_sent"] == {"session_ended": 1}
    t0, t1, t2 = chat["turns"]
    # Turn 0: nothing cached (absent reads 0 because the point reports cached tokens).
    assert t0["prefix_hit_rate"] == 0.0
    assert t1["prefix_hit_rate"] == pytest.approx((160 + 176) / (200 + 220))
    assert t2["prefix_hit_rate"] == pytest.approx(288 / 300)
    assert (t0["p50_ttft_ms"], t0["p95_ttft_ms"]) == (50.0, 70.0)  # nearest rank
    assert (t2["attempted"], t2["successful"], t2["passing"]) == (2, 1, 0)
    assert t2["attainment"] == 0.0 and t1["attainment"] == 1.0
    assert t1["mean_prompt_tokens"] == 210.0
    lines = D.readme_lines([{"sessions": section, "cache_state": "warm", "offered_rps": 2.0}])
    assert "| warm 2/s | 1 | 2/2 | 0.800 | 40.0 | 60.0 | 210 |" in lines


def test_no_cached_tokens_reported_means_no_hit_rate():
    frame = turns_frame()
    frame["cached_tokens"] = pd.array([None] * len(frame), dtype="Int64")
    section = E.per_turn(frame, [CHAT], {})
    assert {t["prefix_hit_rate"] for t in section["classes"]["chat"]["turns"]} == {None}


def test_turns_never_sent_are_the_only_absent_ids_allowed():
    expected = pd.DataFrame(
        {"request_id": ["a", "b", "c", "d"], "seq": [0, 1, 2, 3], "block": 1, "phase": "measure"}
    )
    records = pd.DataFrame({"request_id": ["a", "b"]})
    facts = reconcile(records, expected, "src", not_sent=["c", "d"])
    assert facts["session_turns_not_sent"] == 2 and facts["expected"] == 4
    with pytest.raises(NormalizeError, match="no record"):
        reconcile(records, expected, "src", not_sent=["c"])
    with pytest.raises(NormalizeError, match="never sent, but they have a record"):
        reconcile(pd.DataFrame({"request_id": ["a", "b", "c"]}), expected, "src", not_sent=["c"])
