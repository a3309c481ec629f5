"""Each load shape's answer on synthetic request tables whose answer is known by construction.

Arrivals are regular in operational time (u = 0.5, 1.5, ... mapped through the profile's inverse
rate integral), so every window's count is the profile's own; a request passes or fails its SLO
as the test decides, by its TTFT.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from capacity_pack.decide import shapes as S
from capacity_pack.plan.manifest import K6_TEST_TYPES, Experiment
from capacity_pack.plan.schedule import experiment_profile

CUTOFFS = {"a": (100.0, 20.0), "b": (400.0, 30.0)}
NS = 1_000_000_000
WARMUP_END_S = 2.0


def inputs(*experiments: Experiment) -> S.ShapesInputs:
    return S.ShapesInputs(
        experiments=list(experiments), cutoffs=CUTOFFS, attainment_gate=0.95, error_rate_max=0.01
    )


def arrivals(exp: Experiment) -> np.ndarray:
    prof = experiment_profile(exp)
    return prof.inverse(np.arange(0.5, prof.total, 1.0))


def table(t_s: np.ndarray, *, ttft_share=None, status=None, error=None) -> pd.DataFrame:
    """Requests sent at profile times ``t_s`` (classes a, b alternating), TTFT at
    ``ttft_share`` of the class cutoff (default 0.5), TPOT at half its cutoff."""
    n = t_s.size
    cls = np.where(np.arange(n) % 2 == 0, "a", "b")
    ttft_cut = np.where(cls == "a", 100.0, 400.0)
    tpot_cut = np.where(cls == "a", 20.0, 30.0)
    share = np.full(n, 0.5) if ttft_share is None else np.asarray(ttft_share, float)
    status = np.full(n, "ok", dtype=object) if status is None else np.asarray(status, object)
    warm = pd.DataFrame(
        {"phase": ["warmup"], "class": ["a"], "status": ["ok"], "http_status": [200],
         "error": [None], "scheduled_offset_ns": [int(WARMUP_END_S * NS)],
         "sent_offset_ns": [int(WARMUP_END_S * NS)], "ttft_ms": [1.0], "tpot_ms": [1.0]}
    )  # fmt: skip
    offset = np.rint((t_s + WARMUP_END_S) * NS).astype(np.int64)
    measured = pd.DataFrame(
        {
            "phase": "measure",
            "class": cls,
            "status": status,
            "http_status": pd.array(np.where(status == "ok", 200, 500), dtype="Int64"),
            "error": error if error is not None else [None] * n,
            "scheduled_offset_ns": offset,
            "sent_offset_ns": offset,
            "ttft_ms": np.where(status == "ok", share * ttft_cut, np.nan),
            "tpot_ms": np.where(status == "ok", 0.5 * tpot_cut, np.nan),
        }
    )
    return pd.concat([warm, measured], ignore_index=True)


def series(t_s: np.ndarray, **signals: np.ndarray) -> pd.DataFrame:
    rows = [
        pd.DataFrame(
            {
                "t_offset_ns": np.rint((t_s + WARMUP_END_S) * NS).astype(np.int64),
                "realtime_ns": 0,
                "source": "server",
                "metric": name,
                "value": np.asarray(v, float),
            }
        )
        for name, v in signals.items()
    ]
    return pd.concat(rows, ignore_index=True)


def answer(exp: Experiment, req: pd.DataFrame, met=None, report=None, extra=()):
    point = S.PointData(
        key=f"exp-{exp.name}/warm/rep0",
        requests=req,
        metrics=met if met is not None else series(np.array([0.0]), queue_depth=[0]),
        report=report or {"verdict": "pass", "verdict_reasons": [], "classes": {}},
    )
    doc = S.answer_points([point], inputs(exp, *extra))
    return doc["experiments"][0]["points"][0]


def test_every_k6_test_type_has_one_registered_answer():
    assert sorted(S.SHAPES) == sorted(K6_TEST_TYPES)
    assert all(s.question.endswith("?") for s in S.SHAPES.values())


# --- smoke --------------------------------------------------------------------------------------

SMOKE = Experiment(name="smoke", test_type="smoke", segments=[{"duration_s": 10, "rate_rps": 2}])


def test_smoke_every_class_works():
    got = answer(SMOKE, table(arrivals(SMOKE)))
    assert got["works"] is True
    assert got["answer"].startswith("Yes: every class works (a 10/10 ok, b 10/10 ok")


def test_smoke_names_the_failing_class_and_why():
    t = arrivals(SMOKE)
    status = np.full(t.size, "ok", dtype=object)
    status[[1, 3]] = "error"  # two requests of class b
    error = [None] * t.size
    error[1] = error[3] = "engine exploded"
    got = answer(SMOKE, table(t, status=status, error=error))
    assert got["works"] is False
    assert got["classes"]["b"]["failed"] == 2 and got["classes"]["a"]["failed"] == 0
    assert got["answer"] == "No: b failed 2 of 10 (error HTTP 500: engine exploded x2)."


# --- average-load -------------------------------------------------------------------------------

AVERAGE = Experiment(
    name="avg",
    test_type="average-load",
    segments=[
        {"duration_s": 5, "from_rps": 0, "to_rps": 15},
        {"duration_s": 20, "rate_rps": 15},
        {"duration_s": 5, "from_rps": 15, "to_rps": 0},
    ],
)


def test_average_load_states_the_points_verdict_at_the_held_rate():
    report = {
        "verdict": "fail",
        "verdict_reasons": ["class b attainment 0.9 < 0.95"],
        "classes": {"a": {"attainment": 1.0, "attainment_ci": [0.97, 1.0]},
                    "b": {"attainment": 0.9, "attainment_ci": [0.8, 0.95]}},
    }  # fmt: skip
    got = answer(AVERAGE, table(arrivals(AVERAGE)), report=report)
    assert got["expected_load_rps"] == 15
    assert got["verdict"] == "fail"
    assert got["answer"].startswith(
        "At the expected load (15 RPS held) the SLO verdict is **fail**: class b attainment"
    )


# --- stress -------------------------------------------------------------------------------------

STRESS = Experiment(
    name="stress", test_type="stress", segments=[{"duration_s": 36, "from_rps": 0, "to_rps": 36}]
)


def test_stress_curve_degrades_past_a_known_rate():
    """Requests sent above 24 RPS (t > 24 s on a 0-36 RPS ramp over 36 s) miss their TTFT."""
    t = arrivals(STRESS)
    got = answer(STRESS, table(t, ttft_share=np.where(t > 24, 2.0, 0.5)), extra=(AVERAGE,))
    rows = got["windows"]
    assert len(rows) == S.RAMP_WINDOWS
    # Windows of 3 s: [24, 27) is the first whose requests all miss; [21, 24) all pass.
    assert got["first_window_under_gate"] == 8
    assert rows[8]["rate_span_rps"] == pytest.approx([24, 27], abs=1e-6)
    assert rows[7]["classes"]["a"]["attainment"] == 1.0
    assert rows[8]["classes"]["a"]["attainment"] == 0.0
    # The curve's P95 TTFT: half the cutoff before, twice it after.
    assert rows[7]["classes"]["a"]["p95_ttft_ms"] == pytest.approx(50)
    assert rows[8]["classes"]["b"]["p95_ttft_ms"] == pytest.approx(800)
    assert got["expected_load_rps"] == 15
    assert got["summary"]["a"]["base"]["attainment"] == 1.0
    assert got["summary"]["a"]["plateau"]["attainment"] == 0.0
    assert "first falls under the gate" in got["answer"]
    assert "nominal 24-27 RPS" in got["answer"]


def test_stress_without_degradation_says_so():
    got = answer(STRESS, table(arrivals(STRESS)))
    assert got["first_window_under_gate"] is None
    assert "no window falls under the gate" in got["answer"]


# --- spike --------------------------------------------------------------------------------------

SPIKE = Experiment(
    name="spike",
    test_type="spike",
    segments=[{"duration_s": 60, "rate_rps": 10}],
    spike={"at_s": 20, "duration_s": 5, "rate_rps": 50},
)


def spike_queue(recover: bool) -> pd.DataFrame:
    ts = np.arange(0.0, 60.0, 0.5)
    q = np.where(ts < 20, np.where(ts % 5 == 0, 1.0, 0.0), 0.0)  # pre-spike: 0, blips of 1
    rise = (ts >= 20) & (ts <= 26)
    q[rise] = 40 * (ts[rise] - 20) / 6
    fall = (ts > 26) & (ts < 34)
    q[fall] = 40 * (34 - ts[fall]) / 8
    if not recover:
        q[ts > 26] = 40.0
    return series(ts, queue_depth=q)


def test_spike_recovers_at_a_known_time():
    """Requests sent in [20, 31) miss: the last sliding 5 s window (step 1.25 s) holding a miss
    starts at 30 s, so attainment is back from the window at 31.25 s: 6.25 s after the burst's
    end at 25 s. The queue peaks at 40 (t = 26 s) and is back under its pre-spike P95 (1) at
    34 s."""
    t = arrivals(SPIKE)
    got = answer(SPIKE, table(t, ttft_share=np.where((t >= 20) & (t < 31), 3.0, 0.5)),
                 met=spike_queue(recover=True))  # fmt: skip
    assert got["window_s"] == 5
    assert got["attainment_recovery_s"] == pytest.approx(6.25)
    assert got["peak_queue_depth"] == 40 and got["peak_queue_t_s"] == pytest.approx(26)
    assert got["pre_spike_queue"] == 1.0  # the blips: 1 in 5 pre-spike scrapes is 1
    assert got["queue_recovery_s"] == pytest.approx(34 - 25)
    assert got["lowest_attainment"] < 0.95
    assert "back at the gate 6.25 s after the burst" in got["answer"]


def test_spike_that_does_not_recover_says_so():
    t = arrivals(SPIKE)
    got = answer(SPIKE, table(t, ttft_share=np.where(t >= 20, 3.0, 0.5)),
                 met=spike_queue(recover=False))  # fmt: skip
    assert got["attainment_recovered"] is False and got["attainment_recovery_s"] is None
    assert got["queue_recovered"] is False
    assert got["answer"].count("did not recover within the run") == 2
    assert "attainment fell to 0" in got["answer"]


def test_spike_whose_attainment_holds_recovers_at_once():
    got = answer(SPIKE, table(arrivals(SPIKE)), met=spike_queue(recover=True))
    assert got["attainment_recovery_s"] == 0.0
    assert "attainment never fell under the gate" in got["answer"]


# --- soak ---------------------------------------------------------------------------------------

SOAK = Experiment(name="soak", test_type="soak", segments=[{"duration_s": 200, "rate_rps": 10}])


def soak_answer(ttft_share, kv) -> dict:
    t = arrivals(SOAK)
    ts = np.arange(0.0, 200.0, 1.0)
    return answer(SOAK, table(t, ttft_share=ttft_share(t)), met=series(ts, kv_usage=kv(ts)))


def test_soak_without_drift():
    rng = np.random.default_rng(1)
    got = soak_answer(lambda t: rng.uniform(0.3, 0.6, t.size), lambda ts: 0.3 + 0.01 * np.sin(ts))
    assert got["drift"] == []
    assert got["answer"].startswith("No drift over the 200 s soak (Mann-Kendall two-sided")
    assert got["alpha_per_signal"] == pytest.approx(0.0125)


def test_soak_with_injected_latency_and_kv_drift():
    rng = np.random.default_rng(1)
    got = soak_answer(
        lambda t: 0.3 + 0.5 * t / 200 + rng.uniform(0, 0.05, t.size), lambda ts: 0.2 + ts / 500
    )
    assert got["drift"] == ["p95_ttft_share", "kv_usage"]
    ttft = got["signals"]["p95_ttft_share"]
    assert ttft["p_two_sided"] < 0.0125
    # The Theil-Sen change over the run is the injected one (0.5 of the cutoff; KV 0.4).
    assert ttft["change_over_soak"] == pytest.approx(0.5, abs=0.05)
    assert got["signals"]["kv_usage"]["change_over_soak"] == pytest.approx(0.4, abs=0.01)
    assert got["signals"]["error_rate"]["verdict"] == "no drift"
    assert got["answer"].startswith("Drift over the 200 s soak: P95 TTFT / class cutoff +0.5")


def test_soak_significant_but_small_drift_is_not_called_drift():
    got = soak_answer(lambda t: 0.3 + 0.02 * t / 200, lambda ts: np.full(ts.size, 0.3))
    assert got["signals"]["p95_ttft_share"]["verdict"] == "immaterial"
    assert got["drift"] == []
    assert "significant but below materiality" in got["answer"]


# --- breakpoint ---------------------------------------------------------------------------------

BREAK = Experiment(
    name="bp",
    test_type="breakpoint",
    segments=[{"duration_s": 5, "rate_rps": 5}, {"duration_s": 60, "from_rps": 5, "to_rps": 65}],
)


def test_breakpoint_finds_the_window_holding_the_known_rate():
    """Requests sent above 41 RPS (t > 41 s: the ramp adds 1 RPS a second from 5 RPS at 5 s)
    miss; the ramp's 5 s windows: [40, 45) s spans 40-45 RPS and is the first under the gate."""
    prof = experiment_profile(BREAK)
    t = arrivals(BREAK)
    rate = prof.rate_at(t)
    got = answer(BREAK, table(t, ttft_share=np.where(rate > 41, 2.0, 0.5)))
    b = got["break"]
    assert b["rate_span_rps"] == pytest.approx([40, 45], abs=1e-6)
    assert b["last_window_at_gate_rps"] == pytest.approx([35, 40], abs=1e-6)
    assert b["sustained"] is True
    assert b["offered_rps"] == pytest.approx(42.5, abs=0.21)
    assert "first breaks its SLO at about 42.5 RPS" in got["answer"]


def test_breakpoint_that_holds_to_the_top():
    got = answer(BREAK, table(arrivals(BREAK)))
    assert got["break"] is None
    assert "did not break its SLO on the ramp" in got["answer"]


# --- The pack's answers, written ------------------------------------------------------------------


def test_readme_and_plots_for_every_shape(tmp_path):
    exps = [SMOKE, AVERAGE, STRESS, SPIKE, SOAK, BREAK]
    classes = {c: {"attainment": 1.0, "attainment_ci": [0.9, 1.0]} for c in CUTOFFS}
    report = {"verdict": "pass", "verdict_reasons": [], "classes": classes}
    points = [
        S.PointData(f"exp-{e.name}/warm/rep0", table(arrivals(e)), spike_queue(True), report)
        for e in exps
    ]
    doc = S.answer_points(points, inputs(*exps))
    assert [e["test_type"] for e in doc["experiments"]] == [e.test_type for e in exps]
    lines = "\n".join(S.readme_lines(doc))
    for e in doc["experiments"]:
        assert f"### {e['name']} ({e['test_type']}): {e['question']}" in lines
        assert f"]({e['plot']})" in lines
    for path in S.draw(doc, tmp_path):
        assert path.stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(
        f"shape-{e.name}.png" for e in exps
    )
