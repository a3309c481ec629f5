"""The SLO-boundary search as pure logic: tidy rates, brackets, steps, rounds, confirmations."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import yaml

from capacity_pack.artifacts import SloReport
from capacity_pack.decide import search as S
from capacity_pack.plan import schedule as sched
from capacity_pack.plan.manifest import ManifestError, validate_pack
from tests.paths import DEFAULT_CONFIG


def inputs(**over) -> S.SearchInputs:
    base = {
        "initial_rps": [20.0, 30.0, 40.0],
        "resolution_rps": 2.0,
        "resolution_rel": None,
        "min_rps": None,
        "max_rps": None,
        "closed_levels": [1, 8, 32],
        "concurrency": None,
        "max_concurrency": None,
        "repeats": 1,
        "attainment_min": 0.95,
    }
    return S.SearchInputs(**{**base, **over})


def report(point: sched.Point, passes: bool, **extra) -> dict:
    doc = {
        "point": point.point_id,
        "mode": point.mode,
        "cache_state": point.cache_state,
        "repeat": point.repeat,
        "key": point.key,
        "verdict": "pass" if passes else "fail",
        "attempted": 100,
        "successful": 100,
        "classes": {
            "chat": {
                "attainment": 1.0 if passes else 0.5,
                "successful_count": 100,
                "passing_count": 100 if passes else 50,
            }
        },
    }
    if point.mode == "open":
        doc["offered_rps"] = point.rate_rps
    else:
        doc["concurrency"] = point.concurrency
    return doc | extra


def decide_round(reports, *args, **kwargs) -> dict:
    """:func:`S.decide_round` of the tests' report dicts, read as the models it takes."""
    return S.decide_round([SloReport.model_validate(r) for r in reports], *args, **kwargs)


Oracle = Callable[[sched.Point], dict]


def knee(rate_rps: float | None = None, level: int | None = None, tps=None) -> Oracle:
    """Reports of a target passing below `rate_rps` and meeting the SLO up to `level`."""

    def oracle(p: sched.Point) -> dict:
        if p.mode == "open":
            return report(p, p.rate_rps < rate_rps)
        c = p.concurrency
        extra = {
            "output_throughput_tps": tps(c) if tps else 100.0 * min(c, 16),
            "request_throughput_rps": (tps(c) if tps else 100.0 * min(c, 16)) / 50,
        }
        return report(p, c <= level, **extra)

    return oracle


def run(
    inp: S.SearchInputs,
    oracle: Oracle,
    max_rounds: int = 6,
    cache: str = "cold",
    predicted_rps: list[float] | None = None,
):
    """The rounds as the pipeline runs them: measure a round's points, decide its file
    (``predicted_rps``: the preflight's rates a predicted search starts from)."""
    docs, measured, order = [], {}, []
    while True:
        plans = S.plan_rounds(docs, inp, max_rounds, cache)
        if len(plans) == len(docs):
            return docs, plans, order
        for p in plans[-1]["points"]:
            assert p.key not in measured, f"{p.key} measured twice"
            measured[p.key] = oracle(p)
            order.append(p.key)
        docs.append(
            decide_round(
                list(measured.values()), inp, cache, len(docs) + 1, predicted_rps=predicted_rps
            )
        )


def void_at(rate: float, repeats: set[int] | None, **flags) -> Oracle:
    """The knee at 36.7 RPS, but ``rate`` decides nothing at ``repeats`` (None: every one):
    inconclusive, with ``flags`` (``client_bound`` or ``superseded``)."""

    def oracle(p: sched.Point) -> dict:
        doc = report(p, p.rate_rps < 36.7)
        if p.rate_rps == rate and (repeats is None or p.repeat in repeats):
            doc |= {"verdict": "inconclusive", **flags}
        return doc

    return oracle


def rates_of(plan: dict) -> list[float]:
    return [p.rate_rps for p in plan["points"] if p.mode == "open"]


# -- tidy values ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (30, 40, 35),
        (30, 35, 32),
        (32, 35, 33.5),
        (35, 40, 38),
        (36, 38, 37),
        (0.5, 1, 0.8),
        (10, 11, 10.5),
        (1, 1.000002, 1.000001),
        (1, 1.000001, None),
    ],
)
def test_tidy_between_is_inside_and_near_the_midpoint(low, high, expected):
    got = S.tidy_between(low, high)
    assert got == expected
    if got is not None:
        assert low < got < high and abs(got - (low + high) / 2) <= (high - low) / 4
        # A point id prints it as it is (6 decimals at most).
        assert sched.Point(mode="open", rate_rps=got, cache_state="cold", repeat=0).point_id == (
            f"open-r{sched.format_level(got)}"
        )
        assert float(sched.format_level(got)) == got


def test_integer_between():
    assert S.integer_between(1, 4) == 2
    assert S.integer_between(2, 4) == 3
    assert S.integer_between(8, 32) == 20
    assert S.integer_between(2, 3) is None


def test_tidy_keeps_two_significant_digits():
    assert S.tidy(15.0) == 15 and S.tidy(3.75) == 3.8 and S.tidy(80.0) == 80
    assert S.tidy(123.4) == 120 and S.tidy(0.01234) == 0.012


# -- brackets and steps -----------------------------------------------------------------------


def test_bracket_is_the_highest_rate_meeting_the_gates_with_every_lower_one_meeting_them():
    """A rate meets the gates when shown to pass or on its pooled estimate (marginal)."""
    rows = [
        {"offered_rps": 20.0, "status": "pass"},
        {"offered_rps": 30.0, "status": "marginal"},
        {"offered_rps": 35.0, "status": "misses"},
        {"offered_rps": 40.0, "status": "pass"},
    ]
    assert S.bracket(rows, "offered_rps") == (30.0, 35.0)
    assert S.bracket(rows[:1], "offered_rps") == (20.0, None)
    assert S.bracket(rows[2:3], "offered_rps") == (None, 35.0)


def test_what_does_not_meet_the_gates_keeps_the_search_below():
    """Inconclusive, and repeats that cannot be pooled and disagree (analyzed before pooling):
    the search stays below; repeats meeting the gate on the estimate only do not stop it."""
    inp = inputs(initial_rps=[20.0, 30.0])
    for verdicts, meets in (
        (["marginal"], True),
        (["inconclusive"], False),
        (["pass", "fail"], False),
    ):
        reps = [
            {**report(sched.Point(mode="open", rate_rps=30, cache_state="cold", repeat=k), True),
             "verdict": v}
            for k, v in enumerate(verdicts)
        ]  # fmt: skip
        low = report(sched.Point(mode="open", rate_rps=20, cache_state="cold", repeat=0), True)
        doc = decide_round([low, *reps], inp.model_copy(update={"repeats": 2}), "cold", 1)
        if meets:
            assert doc["open"]["bracket"]["pass_rps"] == 30, verdicts
            continue
        assert doc["open"]["bracket"]["pass_rps"] == 20 and doc["open"]["bracket"]["fail_rps"] == 30
        assert doc["open"]["search"]["rates"] == [25]


def test_default_pack_example_converges_within_two_rps_in_four_rounds():
    """20/30/40 with the boundary at 36.7: 35 passes, 38 fails, 36.5 passes: [36.5, 38)."""
    docs, plans, _ = run(inputs(), knee(36.7))
    assert [rates_of(p) for p in plans] == [[20, 30, 40], [35], [38], [36.5]]
    final = docs[-1]["open"]["bracket"]
    assert (final["pass_rps"], final["fail_rps"]) == (36.5, 38) and final["within_resolution"]
    assert docs[-1]["open"]["search"]["rates"] == []
    assert "within the resolution" in docs[-1]["open"]["search"]["why"]


@pytest.mark.parametrize("boundary", [0.7, 3.3, 12.0, 21.5, 29.9, 33.3, 39.1, 44.0, 97.0, 170.0])
def test_search_brackets_the_boundary_within_the_resolution(boundary):
    docs, plans, order = run(inputs(max_rps=150), knee(boundary), max_rounds=12)
    b = docs[-1]["open"]["bracket"]
    assert len(order) == len(set(order))
    if boundary > 150:  # above the bound: every rate passes, the search says so
        assert b["pass_rps"] == 150 and b["fail_rps"] is None
        assert "highest allowed rate" in docs[-1]["open"]["search"]["why"]
        return
    if boundary <= 2.5:  # below the lower bound (20 / 8)
        assert b["pass_rps"] is None and b["fail_rps"] == 2.5
        assert "lowest allowed rate" in docs[-1]["open"]["search"]["why"]
        return
    assert b["pass_rps"] < boundary <= b["fail_rps"]
    assert b["fail_rps"] - b["pass_rps"] <= 2
    # Each bisection at least quarters off the bracket: never more than log_{4/3}(width/2) + 2.
    assert len(plans) <= 12


def test_downward_and_upward_steps_halve_and_double():
    docs, plans, _ = run(inputs(), knee(7.0))
    assert [rates_of(p) for p in plans][:3] == [[20, 30, 40], [10], [5]]
    docs, plans, _ = run(inputs(), knee(100.0))
    assert [rates_of(p) for p in plans][:3] == [[20, 30, 40], [80], [160]]
    assert docs[1]["open"]["search"]["direction"] == "up"


def test_relative_resolution():
    docs, _, _ = run(inputs(resolution_rps=None, resolution_rel=0.05), knee(36.5))
    b = docs[-1]["open"]["bracket"]
    assert b["fail_rps"] - b["pass_rps"] <= 0.05 * b["pass_rps"] + 1e-9
    assert b["pass_rps"] < 36.5 <= b["fail_rps"]


def test_a_pass_above_a_failure_never_moves_the_bracket():
    def oracle(p):
        return report(p, p.rate_rps != 30)  # 30 fails, 40 passes

    docs, _, _ = run(inputs(), oracle)
    b = docs[-1]["open"]["bracket"]
    assert b["pass_rps"] < 30 <= b["fail_rps"] == 30


# -- rounds and max_rounds ----------------------------------------------------------------------


def test_max_rounds_stops_the_search_and_raising_it_only_adds_rounds():
    docs3, plans3, order3 = run(inputs(), knee(36.7), max_rounds=3)
    assert len(plans3) == 3 and rates_of(plans3[-1]) == [38]
    assert docs3[-1]["open"]["search"]["rates"] == [36.5]  # proposed, not taken
    docs4, plans4, order4 = run(inputs(), knee(36.7), max_rounds=4)
    # Every round file of the shorter search is the same file in the longer one.
    assert docs4[: len(docs3)] == docs3
    assert order4[: len(order3)] == order3 and order4[len(order3) :] == ["open-r36.5/cold/rep0"]
    summary = S.summarize(docs3, inputs(), 3, "cold")
    assert "max_rounds (3)" in summary["open"]["stopped"]
    assert summary["open"]["search_rounds"] == 3


def test_round_files_do_not_depend_on_max_rounds():
    """decide_round takes no max_rounds, and the round rule's params hold none."""
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    a = S.SearchInputs.of(validate_pack(copy.deepcopy(data), "a"))
    data["sweep"]["search"]["max_rounds"] = 7
    b = S.SearchInputs.of(validate_pack(data, "b"))
    assert a.canonical_json() == b.canonical_json()
    assert "max_rounds" not in a.canonical_json()


def test_confirmation_spends_the_repeats_on_the_bracket_passing_end():
    """Only the passing end is repeated: a rate passes when every repeat passes, so the
    failing end, already not passing, cannot move the bracket whatever it shows again."""
    docs, plans, order = run(inputs(repeats=3), knee(36.7))
    assert plans[-1]["kinds"]["open"] == "confirm"
    assert order[-2:] == ["open-r36.5/cold/rep1", "open-r36.5/cold/rep2"]
    assert all(k.endswith("rep0") for k in order[:-2])
    assert docs[-1]["open"]["confirm"] == []


def test_a_confirmation_that_fails_the_pass_rate_continues_the_search_below():
    def oracle(p):  # 36.5 passes once, then fails: the boundary is really below it
        if p.rate_rps == 36.5:
            return report(p, p.repeat == 0)
        return report(p, p.rate_rps < 35.8)

    docs, plans, order = run(inputs(repeats=2), oracle)
    kinds = [p["kinds"]["open"] for p in plans]
    assert kinds == ["search", "search", "search", "search", "confirm", "confirm"]
    # The confirmation moved the bracket down to [35, 36.5), which is then confirmed too.
    assert order[-2:] == ["open-r36.5/cold/rep1", "open-r35/cold/rep1"]
    b = docs[-1]["open"]["bracket"]
    assert (b["pass_rps"], b["fail_rps"]) == (35, 36.5)
    # Finer: [35, 36.5) is wider than 0.5, so the search goes on below 36.5 (within
    # max_rounds) and confirms its new bracket in its turn.
    docs, plans, order = run(inputs(repeats=2, resolution_rps=0.5), oracle, max_rounds=8)
    kinds = [p["kinds"]["open"] for p in plans]
    assert kinds == ["search"] * 6 + ["confirm", "search", "search", "confirm"]
    assert order[-3:] == ["open-r35.8/cold/rep0", "open-r35.5/cold/rep0", "open-r35.5/cold/rep1"]
    b = docs[-1]["open"]["bracket"]
    assert (b["pass_rps"], b["fail_rps"], b["width_rps"]) == (35.5, 35.8, 0.3)
    assert b["within_resolution"]


def test_a_client_bound_rate_is_measured_again_not_bisected_below():
    """40 RPS is client-bound at repeat 0 (no server result): the next round measures it
    again at repeat 1, and the search then finds the same bracket as with a steady client."""

    docs, plans, order = run(
        inputs(initial_rps=[30.0, 40.0, 50.0]), void_at(40, {0}, client_bound=True)
    )
    assert order[3] == "open-r40/cold/rep1"
    assert docs[0]["open"]["search"]["direction"] == "retry"
    assert "client-bound" in docs[0]["open"]["search"]["why"]
    steady, steady_plans, _ = run(inputs(initial_rps=[30.0, 40.0, 50.0]), knee(36.7))
    assert docs[-1]["open"]["bracket"] == steady[-1]["open"]["bracket"]
    assert docs[-1]["open"]["bracket"]["pass_rps"] == 36.5
    # The search, in round order: the retry then the same bisections as the steady one.
    assert [p["kinds"]["open"] for p in plans] == ["search"] * len(plans)
    assert len(plans) == len(steady_plans) + 1


def test_an_always_client_bound_rate_is_retried_within_its_allowance_then_named():
    docs, plans, order = run(
        inputs(initial_rps=[30.0, 40.0, 50.0], extra_repeats=2),
        void_at(40, None, client_bound=True),
    )
    assert [k for k in order if k.startswith("open-r40/")] == [
        "open-r40/cold/rep0", "open-r40/cold/rep1", "open-r40/cold/rep2",
    ]  # fmt: skip
    # Then the bracket below it is searched as before, and the round says why.
    assert (
        "decided nothing (client-bound) in all 3 measurements" in docs[3]["open"]["search"]["why"]
    )
    assert docs[3]["open"]["search"]["direction"] == "bisect"
    b = docs[-1]["open"]["bracket"]
    assert b["pass_rps"] == 36.5 and b["within_resolution"]


def test_a_superseded_rate_is_measured_again_like_a_client_bound_one():
    """A changed gate left 40 RPS repeat 0 undecided (stopped in run by the old gate's
    decision): the search measures it again at repeat 1 before it bisects below it."""

    docs, _, order = run(inputs(initial_rps=[30.0, 40.0, 50.0]), void_at(40, {0}, superseded=True))
    assert order[3] == "open-r40/cold/rep1"
    first = docs[0]["open"]
    assert first["search"]["direction"] == "retry"
    assert "another gate" in first["search"]["why"]
    row = next(r for r in first["tested"] if r["offered_rps"] == 40)
    assert row["void_why"] == {"0": "superseded"} and row["deciding_repeats"] == []
    assert docs[-1]["open"]["bracket"]["pass_rps"] == 36.5


def test_a_disturbed_rate_is_measured_again_and_the_round_says_the_host_was_busy():
    """Other work on the host disturbed 40 RPS at repeat 0 (capacity_pack.measure.host): like
    a client-bound rate, it is measured again at repeat 1; a repeat both client-bound and
    disturbed is named by its cause, the host."""

    docs, _, order = run(
        inputs(initial_rps=[30.0, 40.0, 50.0]),
        void_at(40, {0}, disturbed=True, client_bound=True),
    )
    assert order[3] == "open-r40/cold/rep1"
    first = docs[0]["open"]
    assert first["search"]["direction"] == "retry"
    assert "other work on the host disturbed the point" in first["search"]["why"]
    row = next(r for r in first["tested"] if r["offered_rps"] == 40)
    assert row["void_why"] == {"0": "disturbed"}
    assert docs[-1]["open"]["bracket"]["pass_rps"] == 36.5


def test_a_rate_that_decided_nothing_is_measured_again_after_max_rounds_too():
    """The last search round's rate is client-bound: a retry round measures it again (as a
    confirmation would be), though the search rounds are spent."""

    docs, plans, order = run(
        inputs(), void_at(38, {0}, client_bound=True), max_rounds=3
    )  # 20/30/40, 35, 38
    assert [p["kinds"]["open"] for p in plans] == ["search", "search", "search", "retry"]
    assert order[-1] == "open-r38/cold/rep1"
    assert (docs[-1]["open"]["bracket"]["pass_rps"], docs[-1]["open"]["bracket"]["fail_rps"]) == (
        35,
        38,
    )


def test_a_confirmation_counts_server_results_only():
    """Repeat 1 of the bracket's passing end is client-bound: repeat 2 confirms it instead,
    and the rate's status is taken over its server results."""

    docs, plans, order = run(inputs(repeats=2), void_at(36.5, {1}, client_bound=True))
    assert [k for k in order if k.startswith("open-r36.5/")] == [
        "open-r36.5/cold/rep0", "open-r36.5/cold/rep1", "open-r36.5/cold/rep2",
    ]  # fmt: skip
    row = next(r for r in docs[-1]["open"]["tested"] if r["offered_rps"] == 36.5)
    assert row["status"] == "pass" and row["void_repeats"] == [1]
    assert row["deciding_repeats"] == [0, 2]
    assert docs[-1]["open"]["bracket"]["pass_rps"] == 36.5 and docs[-1]["open"]["confirm"] == []


def test_cold_and_warm_are_searched_independently():
    def oracle(p):
        return report(p, p.rate_rps < (36.7 if p.cache_state == "cold" else 31.0))

    cold, _, _ = run(inputs(), oracle, cache="cold")
    warm, _, order = run(inputs(), oracle, cache="warm")
    assert cold[-1]["open"]["bracket"]["pass_rps"] == 36.5
    warm_bracket = warm[-1]["open"]["bracket"]
    assert 29 <= warm_bracket["pass_rps"] < 31 <= warm_bracket["fail_rps"]
    assert all("/warm/" in k for k in order)


# -- the closed loop ----------------------------------------------------------------------------


def closed_inputs(**over):
    from capacity_pack.plan.manifest import ConcurrencySearch

    return inputs(concurrency=ConcurrencySearch(resolution=1), max_concurrency=64, **over)


def test_closed_loop_search_finds_the_largest_level_meeting_the_slo():
    docs, plans, _ = run(closed_inputs(), knee(36.7, level=13))
    levels = [[p.concurrency for p in plan["points"] if p.mode == "closed"] for plan in plans]
    assert levels[0] == [1, 8, 32]
    assert levels[1:] == [[20], [14], [11], [12], [13]]
    b = docs[-1]["closed"]["bracket"]
    assert (b["pass_concurrency"], b["fail_concurrency"]) == (13, 14) and b["within_resolution"]
    # Both loops run in the same rounds and stop on their own.
    assert docs[-1]["open"]["bracket"]["pass_rps"] == 36.5


def test_closed_loop_doubles_up_to_its_bound_and_stops_when_one_fails():
    docs, plans, _ = run(closed_inputs(), knee(36.5, level=1000))
    assert docs[-1]["closed"]["bracket"]["pass_concurrency"] == 64
    assert "highest allowed level (64)" in docs[-1]["closed"]["search"]["why"]
    docs, _, _ = run(closed_inputs(), knee(36.5, level=0))
    assert docs[-1]["closed"]["bracket"]["fail_concurrency"] == 1
    assert "lowest tested level (1)" in docs[-1]["closed"]["search"]["why"]


def test_saturation_is_the_last_doubling_raising_throughput_under_ten_percent():
    rows = [
        {"concurrency": 1, "output_throughput_tps": 100.0},
        {"concurrency": 8, "output_throughput_tps": 700.0},
        {"concurrency": 16, "output_throughput_tps": 760.0},
        {"concurrency": 24, "output_throughput_tps": 800.0},
    ]
    sat = S.saturation(rows)
    assert sat["saturated"] is False  # 800 vs 700 at 8 (<= 24 / 2): +14 %
    assert sat["from"]["concurrency"] == 8 and sat["gain"] == pytest.approx(800 / 700 - 1)
    rows[-1]["output_throughput_tps"] = 760.0
    assert S.saturation(rows)["saturated"] is True
    assert S.saturation(rows[:1])["saturated"] is None


def test_saturation_is_recorded_without_a_closed_loop_search():
    pts = [sched.Point(mode="closed", concurrency=c, cache_state="cold", repeat=0) for c in (1, 8)]
    oracle = knee(36.5, level=8, tps=lambda c: 100.0 * c)
    doc = decide_round([oracle(p) for p in pts], inputs(), "cold", 1)
    assert doc["closed"]["saturation"]["saturated"] is False
    assert "search" not in doc["closed"]


def test_auto_derives_round_one_from_the_closed_loop_throughput():
    inp = inputs(initial_rps=None)
    oracle = knee(36.5, level=8, tps=lambda c: 250.0 * min(c, 8))  # 40 RPS at saturation
    docs = []
    measured = [
        oracle(sched.Point(mode="closed", concurrency=c, cache_state="cold", repeat=0))
        for c in (1, 8, 32)
    ]
    plans = S.plan_rounds(docs, inp, 6, "cold")
    assert plans[0]["points"] == []  # round 1: the declared closed loop only
    docs.append(decide_round(measured, inp, "cold", 1))
    assert docs[0]["open"]["search"]["direction"] == "auto"
    plans = S.plan_rounds(docs, inp, 6, "cold")
    assert rates_of(plans[1]) == [20, 30, 40]
    assert plans[1]["kinds"]["open"] == "search"


# -- the pack's schema and points -------------------------------------------------------------


def pack_with_search(**search):
    """The default pack with declared round-1 rates and ``search``."""
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    data["sweep"]["open_loop_rps"] = [30, 40, 50]
    data["sweep"]["search"] = search
    return data


@pytest.mark.parametrize(
    ("search", "sweep", "message"),
    [
        ({}, {}, "exactly one of resolution_rps and resolution_rel"),
        ({"resolution_rps": 1, "resolution_rel": 0.1}, {}, "exactly one"),
        ({"resolution_rps": 1, "initial": [5, 10]}, {}, "both name round 1's rates"),
        ({"resolution_rps": 1}, {"open_loop_rps": []}, "round 1 is sweep.open_loop_rps"),
        (
            {"resolution_rps": 1, "initial": "auto"},
            {"open_loop_rps": [], "closed_loop_concurrency": []},
            "closed_loop_concurrency is empty",
        ),
        ({"resolution_rps": 1, "min_rps": 35}, {}, "above round 1's lowest rate"),
        ({"resolution_rps": 1, "max_rps": 35}, {}, "below round 1's highest rate"),
        ({"resolution_rps": 1, "max_rounds": 0}, {}, "max_rounds"),
        (
            {"resolution_rps": 1, "concurrency": {"max_concurrency": 16}},
            {},
            "below the highest level",
        ),
    ],
)
def test_invalid_searches_name_the_field(search, sweep, message):
    data = pack_with_search(**search)
    data["sweep"].update(sweep)
    with pytest.raises(ManifestError, match=message):
        validate_pack(data, "pack.yaml")


def test_searched_points_are_not_fixed_but_are_found():
    pack = validate_pack(pack_with_search(resolution_rps=2), "pack.yaml")
    ids = {p.point_id for p in sched.points(pack)}
    assert ids == {"closed-c1", "closed-c8", "closed-c32", "exp-spike_smoke"}
    assert sched.find_point(pack, "open-r35", "cold", 1).rate_rps == 35
    assert sched.find_point(pack, "open-r5", "warm", 0).rate_rps == 5
    # sweep.repeats 2 and extra_repeats 2: a rate's repeats 0..3, a level's 0..1.
    assert sched.find_point(pack, "open-r35", "cold", 3).repeat == 3
    for point_id, repeat in (("open-r201", 0), ("open-r3.7", 0), ("open-r35", 4)):
        with pytest.raises(ManifestError, match="no point"):
            sched.find_point(pack, point_id, "cold", repeat)
    searched = validate_pack(
        pack_with_search(resolution_rps=2, concurrency={"resolution": 2}), "pack.yaml"
    )
    assert {p.point_id for p in sched.points(searched)} == {"exp-spike_smoke"}
    assert sched.find_point(searched, "closed-c100", "cold", 0).concurrency == 100
    with pytest.raises(ManifestError):
        sched.find_point(searched, "closed-c129", "cold", 0)


def test_the_default_pack_searches_from_the_predicted_bracket():
    pack = validate_pack(yaml.safe_load(DEFAULT_CONFIG.read_text()), "default")
    inp = S.SearchInputs.of(pack)
    assert inp.predicted and inp.initial_rps is None and inp.resolution_rps <= 2
    # Round 1 is the closed loop; the open loop starts in round 2 from the preflight file.
    assert [p.point_id for p in S.first_round(inp, "cold")] == [
        "closed-c1", "closed-c8", "closed-c32",
    ]  # fmt: skip


def run_predicted(start: list[float], oracle: Oracle, max_rounds: int = 8):
    """:func:`run` of a search that starts from the predicted rates ``start``."""
    inp = inputs(initial_rps=None, predicted=True, closed_levels=[])
    return run(inp, oracle, max_rounds, predicted_rps=start)


def test_a_predicted_bracket_within_the_resolution_is_measured_at_its_ends_only():
    doc = {"brackets": [{"cache_state": "cold", "pass_rps": 35.0, "fail_rps": 36.5}]}
    assert S.predicted_rates(doc, "cold", 2.0) == [35.0, 36.5]
    assert S.predicted_rates(doc, "cold", 1.0) == [35.0, 35.8, 36.5]
    assert S.predicted_rates(doc, "cold") == [35.0, 35.8, 36.5]


@pytest.mark.parametrize(
    ("boundary", "path"),
    [
        (36.0, [[], [35, 36.5]]),  # the prediction holds: no step out of it
        (40.0, [[], [35, 36.5], [38], [42], [40]]),  # +2 (to 2 digits), then +4, then bisect
        (30.0, [[], [35, 36.5], [33], [29], [31]]),  # -2, then -4, then bisect
        (12.0, [[], [35, 36.5], [33], [29], [21], [5], [15], [10], [12]]),
    ],
)
def test_a_predicted_search_steps_out_one_resolution_then_doubles(boundary, path):
    docs, plans, _ = run_predicted([35.0, 36.5], knee(boundary), max_rounds=12)
    assert [rates_of(p) for p in plans] == path
    b = docs[-1]["open"]["bracket"]
    assert b["pass_rps"] < boundary <= b["fail_rps"] and b["width_rps"] <= 2
    assert {d["open"]["search"]["direction"] for d in docs[1:-1]} <= {"up", "down", "bisect"}


def test_pooled_steps_measure_every_repeat_of_a_new_rate_at_once():
    """With pooled_steps each rate the search measures runs repeats 0 and 1 in one round and is
    decided on them pooled, so there is no confirmation round."""

    def oracle(p):
        # 46.5 passes on repeat 0 only: pooled with repeat 1 it does not meet the gate.
        passes = p.rate_rps < 46.5 or (p.rate_rps == 46.5 and p.repeat == 0)
        return report(p, passes)

    inp = inputs(initial_rps=None, predicted=True, closed_levels=[], repeats=2, pooled_steps=True)
    docs, plans, _ = run(inp, oracle, 8, predicted_rps=[45.0, 46.5])
    assert [sorted(p.key for p in plan["points"]) for plan in plans] == [
        [],
        [
            "open-r45/cold/rep0",
            "open-r45/cold/rep1",
            "open-r46.5/cold/rep0",
            "open-r46.5/cold/rep1",
        ],
    ]
    b = docs[-1]["open"]["bracket"]
    assert (b["pass_rps"], b["fail_rps"]) == (45, 46.5) and docs[-1]["open"]["confirm"] == []
    assert '"pooled_steps":true' in inp.canonical_json()
    assert "pooled_steps" not in inputs().canonical_json()
