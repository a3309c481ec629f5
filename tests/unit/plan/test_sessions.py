"""Multi-turn session schedules: seeded turns and think times, growing prompts, cold/warm pairs."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from capacity_pack.measure.payload import RequestBuilder
from capacity_pack.measure.settings import LoadSettings
from capacity_pack.plan import schedule as S
from capacity_pack.plan import sessions as P
from capacity_pack.plan.manifest import ManifestError, validate_pack
from capacity_pack.plan.schedule_table import validate_schedule
from tests.paths import DEFAULT, ROOT

SESSIONS = ROOT / "config" / "packs" / "sessions.yaml"


def data(path: Path = SESSIONS) -> dict:
    return yaml.safe_load(path.read_text())


def pack_with(turns, think=None, arrivals: int = 40, mix=None) -> object:
    d = data()
    d["client"]["initial_scheduled_requests"] = arrivals
    chat = d["workload"][0]
    chat["session"]["turns"] = turns
    if think is not None:
        chat["session"]["think_time"] = think
    if mix is not None:
        plain = copy.deepcopy(chat)
        plain.pop("session")
        plain.update(name="oneshot", mix=mix, input_tokens=200, output_tokens=16)
        chat["mix"] = 1 - mix
        d["workload"].append(plain)
    return validate_pack(d)


def point(cache: str = "warm", rate: float = 2.0, repeat: int = 0) -> S.Point:
    return S.Point(mode="open", rate_rps=rate, cache_state=cache, repeat=repeat)


def sessions_of(frame: pd.DataFrame) -> dict[int, pd.DataFrame]:
    s = frame[frame["session"] >= 0]
    return {int(k): g.sort_values("turn") for k, g in s.groupby("session")}


def test_schedules_are_seeded_and_valid():
    pack = pack_with({"distribution": "geometric", "mean": 3, "max": 6})
    a, b = S.build_schedule(pack, point()), S.build_schedule(pack, point())
    pd.testing.assert_frame_equal(a, b)
    validate_schedule(a, ["chat"], "sessions")
    other = data()
    other["client"]["request_schedule_seed"] += 1
    c = S.build_schedule(validate_pack(other), point())
    assert not a["turn"].equals(c["turn"]) or not a["think_ns"].equals(c["think_ns"])
    # Each session's rows are contiguous, turns 0..K-1 in order, offsets those of turn 0.
    for g in sessions_of(a).values():
        assert g["seq"].diff().dropna().eq(1).all()
        assert g["turn"].tolist() == list(range(len(g)))
        assert g["scheduled_offset_ns"].nunique() == 1
        assert g["think_ns"].iloc[0] == 0


def test_extension_blocks_keep_the_schedule_a_prefix():
    pack = pack_with({"distribution": "geometric", "mean": 3, "max": 6})
    short = S.build_schedule(pack, point())
    longer = S.build_schedule(pack, point(), extension_blocks=2)
    assert len(longer) > len(short)
    pd.testing.assert_frame_equal(longer.iloc[: len(short)], short)
    assert longer["session"].max() > short["session"].max()


def test_fixed_turns_and_fixed_think_time():
    pack = pack_with(3, {"distribution": "fixed", "mean_s": 0.5})
    frame = S.build_schedule(pack, point())
    groups = sessions_of(frame)
    assert {len(g) for g in groups.values()} == {3}
    later = frame[frame["turn"] > 0]
    assert (later["think_ns"] == 500_000_000).all()


def test_geometric_turns_and_exponential_think_times_match_their_distributions():
    turns = {"distribution": "geometric", "mean": 4, "max": 10}
    pack = pack_with(turns, {"distribution": "exponential", "mean_s": 2.0}, arrivals=4000)
    frame = S.build_schedule(pack, point(rate=50))
    k = np.array([len(g) for g in sessions_of(frame).values()])
    expected = P.mean_turns(pack.workload[0].session)
    # E[min(G, 10)] for p = 1/4: (1 - 0.75^10) / 0.25 = 3.775.
    assert expected == pytest.approx(3.7747, abs=1e-3)
    assert k.max() <= 10 and k.min() >= 1
    assert k.mean() == pytest.approx(expected, rel=0.05)
    think_s = frame.loc[frame["turn"] > 0, "think_ns"].to_numpy() / 1e9
    assert think_s.mean() == pytest.approx(2.0, rel=0.05)
    # Exponential: coefficient of variation 1.
    assert think_s.std() / think_s.mean() == pytest.approx(1.0, rel=0.08)
    clipped = pack_with(turns, {"mean_s": 2.0, "max_s": 1.0}, arrivals=400)
    capped = S.build_schedule(clipped, point(rate=50))
    assert capped["think_ns"].max() <= 1_000_000_000


def test_each_turn_grows_by_the_previous_answer_and_a_new_user_message():
    pack = pack_with({"distribution": "geometric", "mean": 4, "max": 8})
    system = pack.prompts.prefix.prefix_tokens
    for g in sessions_of(S.build_schedule(pack, point())).values():
        inp, out, user = (g[c].to_numpy() for c in ("input_tokens", "output_tokens", "user_tokens"))
        assert inp[0] == system + user[0]
        assert (inp[1:] == inp[:-1] + out[:-1] + user[1:]).all()


def builder() -> RequestBuilder:
    return RequestBuilder(
        LoadSettings(
            base_url="http://127.0.0.1:1",
            model="sim-small",
            mode="open",
            request_timeout_s=5,
            prefix_revision="sessions-system-prompts-v1",
        )
    )


@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_turn_k_prompt_starts_with_turn_k_minus_1_prompt_and_answer(cache):
    """The prompts the client sends: turn 0 from the schedule row, each later turn the
    conversation so far (as :meth:`Run._session` builds it) plus the new user message."""
    import httpx

    pack = pack_with(4)
    frame = S.build_schedule(pack, point(cache))
    g = next(iter(sessions_of(frame).values()))
    b = builder()
    rows = g.to_dict("records")
    contents = [b.prompt(rows[0])]
    prev = contents[0]
    assert len(prev.split()) == rows[0]["input_tokens"]
    with httpx.Client() as client:
        for k in range(1, len(rows)):
            answer = " ".join(f"ans{k}w{j}" for j in range(rows[k - 1]["output_tokens"]))
            contents += [answer, P.user_message(rows[k]["prompt_seed"], rows[k]["user_tokens"])]
            request = b.session_request(client, rows[k], contents)
            prompt = __import__("json").loads(request.content)["prompt"]
            assert prompt.startswith(prev + " " + answer + " ")
            assert len(prompt.split()) == rows[k]["input_tokens"]
            prev = prompt
    if cache == "cold":
        # A system prompt of its own: the session's first word encodes its turn-0 seed.
        assert contents[0].startswith(f"Ticket-{rows[0]['prompt_seed']:016x}:")


def test_cold_and_warm_send_the_same_sessions():
    pack = pack_with({"distribution": "geometric", "mean": 4, "max": 8})
    cold, warm = S.build_schedule(pack, point("cold")), S.build_schedule(pack, point("warm"))
    same = ["session", "turn", "think_ns", "user_tokens", "output_tokens", "input_tokens"]
    pd.testing.assert_frame_equal(cold[same], warm[same])
    assert (cold["prefix_id"] == -1).all() and (cold["prefix_tokens"] == 0).all()
    # Warm: every turn of a session carries the system prompt its turn 0 drew.
    assert (warm.groupby("session")["prefix_id"].nunique() == 1).all()
    assert (warm["prefix_id"] >= 0).all()


def test_mixed_packs_and_packs_without_sessions():
    pack = pack_with(2, arrivals=100, mix=0.4)
    frame = S.build_schedule(pack, point())
    plain = frame[frame["class"] == "oneshot"]
    assert (plain["session"] == -1).all() and (plain["turn"] == -1).all()
    assert (plain["input_tokens"] == 200).all()
    measured = frame[frame["phase"] == "measure"]
    arrivals = measured[measured["turn"] <= 0]
    assert (arrivals["class"] == "oneshot").sum() == 40  # the mix counts arrivals
    assert len(measured) == 40 + 2 * 60
    summary = S.summarize(frame, S.ScheduleInputs.for_point(pack, point()), point())
    assert summary["session_classes"]["chat"]["sessions"] == 60
    assert summary["requests_per_arrival_expected"] == pytest.approx(1 + 0.6 * (2 - 1))
    # A pack without session classes keeps its schedule columns exactly.
    default = validate_pack(yaml.safe_load(DEFAULT.read_text()))
    assert list(S.build_schedule(default, point(rate=30))) == S.COLUMNS
    assert "session" not in default.workload[0].model_dump()


def test_session_packs_refuse_shards_and_empty_sessions():
    d = data()
    d["client"]["shards"] = 2
    with pytest.raises(ManifestError, match="need client.shards: 1"):
        validate_pack(d)
    d = data()
    d["workload"][0]["session"]["turns"] = 0
    with pytest.raises(ManifestError, match="at least one turn"):
        validate_pack(d)
    # The per-point bound counts a session's turns: 2e6 arrivals x up to 100 turns.
    d = data()
    d["workload"][0]["session"]["turns"] = {"distribution": "geometric", "mean": 4, "max": 100}
    d["sweep"]["open_loop_rps"] = [200_000]
    with pytest.raises(ManifestError, match=r"sessions of up to 100 turns\), above the bound"):
        validate_pack(d)
