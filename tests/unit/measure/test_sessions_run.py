"""Multi-turn sessions against the real simulated engine over 127.0.0.1: dependent turns sent
after their predecessor and its think time, carrying its answer; a failed turn ends its session."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from capacity_pack.measure.records import read_records
from capacity_pack.measure.run import run_point
from capacity_pack.measure.settings import LoadSettings
from capacity_pack.plan import schedule as S
from capacity_pack.plan.manifest import validate_pack
from tests.paths import ROOT
from tests.unit.measure.test_loadgen import settings as loadgen_settings
from tests.unit.measure.test_loadgen import sim

SESSIONS = ROOT / "config" / "packs" / "sessions.yaml"


def schedule(cache: str, turns=3, arrivals: int = 12, rate: float = 6.0) -> pd.DataFrame:
    d = yaml.safe_load(SESSIONS.read_text())
    d["client"].update(
        initial_scheduled_requests=arrivals, warmup_seconds=0, minimum_duration_seconds=1
    )
    d["workload"][0]["output_tokens"] = 24
    d["workload"][0]["session"].update(
        turns=turns, think_time={"distribution": "exponential", "mean_s": 0.2}
    )
    pack = validate_pack(d)
    point = S.Point(mode="open", rate_rps=rate, cache_state=cache, repeat=0)
    return S.build_schedule(pack, point)


def settings(base_url: str, **kw) -> LoadSettings:
    kw.setdefault("prefix_revision", "sessions-system-prompts-v1")
    kw.setdefault("scrape_metrics", False)
    return loadgen_settings(base_url, **kw)


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_turns_follow_their_predecessor_and_reuse_the_conversation(tmp_path, mode):
    sched = schedule("cold")
    with sim() as s:
        kw = {"mode": "closed", "concurrency": 3} if mode == "closed" else {}
        summary = run_point(sched, settings(s.base_url, **kw), tmp_path / "r.jsonl")
    recs = pd.DataFrame(read_records(tmp_path / "r.jsonl")).set_index("request_id")
    assert len(recs) == len(sched) and (recs["status"] == "ok").all()
    assert summary["session_turns_not_sent"] == []
    rows = sched.set_index("request_id")
    assert (recs["session"] == rows.loc[recs.index, "session"]).all()
    assert (recs["turn"] == rows.loc[recs.index, "turn"]).all()
    # The server counted exactly the planned prompt: the whole conversation was resent.
    assert (recs["prompt_tokens"] == rows.loc[recs.index, "input_tokens"]).all()
    for _, g in recs.sort_values("turn").groupby("session"):
        ends, sends = g["end_ns"].to_numpy(), g["sent_ns"].to_numpy()
        think = rows.loc[g.index, "think_ns"].to_numpy()
        # Turn k is sent its think time after turn k-1 ended (never before).
        assert (sends[1:] >= ends[:-1] + think[1:]).all()
        if mode == "open":
            due = g["due_ns"].to_numpy()
            assert (due[1:] == ends[:-1] + think[1:]).all()
            assert ((sends[1:] - due[1:]) < 50e6).all()
        cached = g["cached_tokens"].fillna(0).to_numpy()
        # Cold: nothing of turn 0 is cached; each later turn reuses the earlier conversation
        # (its full 16-token blocks: prompt and the streamed answer).
        assert cached[0] == 0
        prev = g["prompt_tokens"].to_numpy()[:-1] + g["output_tokens"].to_numpy()[:-1]
        assert (cached[1:] >= (prev // 16) * 16 - 16).all() and (cached[1:] > 0).all()


def test_a_failed_turn_ends_its_session_and_the_rest_are_listed(tmp_path):
    sched = schedule("cold", turns=4, arrivals=10)
    with sim("--fault-error-rate", "0.5", "--fault-error-status", "500") as s:
        summary = run_point(sched, settings(s.base_url), tmp_path / "r.jsonl")
    recs = pd.DataFrame(read_records(tmp_path / "r.jsonl"))
    skipped = pd.DataFrame(summary["session_turns_not_sent"])
    assert len(skipped) and set(skipped["kind"]) == {"session_ended"}
    assert summary["session_turns_not_sent_by"]["session_ended"] == len(skipped)
    # Every scheduled turn is either recorded or listed as never sent, never both.
    assert set(recs["request_id"]) | set(skipped["request_id"]) == set(sched["request_id"])
    assert not set(recs["request_id"]) & set(skipped["request_id"])
    for session, g in recs.groupby("session"):
        g = g.sort_values("turn")
        failed = g[g["status"] != "ok"]
        mine = skipped[skipped["session"] == session]
        if failed.empty:
            assert mine.empty
            continue
        # The session stops at its first failed turn; the rest say why.
        k = int(failed["turn"].iloc[0])
        assert int(g["turn"].max()) == k
        assert sorted(mine["turn"]) == list(range(k + 1, 4))
        assert mine["reason"].str.startswith(f"turn {k} ended error: HTTP 500").all()
