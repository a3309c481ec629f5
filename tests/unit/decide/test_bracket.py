"""The capacity bracket, defined once: the walk, the resolution, and compare's evidence bracket."""

from __future__ import annotations

import math

import pytest

from capacity_pack.decide.bracket import (
    bracket,
    centred_resolution,
    evidence_bracket,
    evidence_disjoint,
    meets_gates,
    resolution_of,
    within,
)


def rows(*statuses: str, start: float = 10.0) -> list[dict]:
    return [{"offered_rps": start + 10 * k, "status": s} for k, s in enumerate(statuses)]


def test_the_walk_stops_at_the_first_value_not_meeting_the_gates():
    assert [meets_gates(s) for s in ("pass", "marginal", "misses", "fail", None)] == [
        True, True, False, False, False,
    ]  # fmt: skip
    assert bracket(rows("pass", "marginal", "fail", "pass"), "offered_rps") == (20.0, 30.0)
    assert bracket(rows("pass", "pass"), "offered_rps") == (20.0, None)
    assert bracket(rows("inconclusive", "pass"), "offered_rps") == (None, 10.0)
    assert bracket([], "offered_rps") == (None, None)


class _Search:
    def __init__(self, **kw):
        self.__dict__.update(kw)


@pytest.mark.parametrize(
    ("settings", "pass_rps", "expected"),
    [
        (None, 30.0, None),
        ({"resolution_rps": 2}, None, 2.0),
        ({"resolution_rps": 2.0, "resolution_rel": 0.1}, 30.0, 2.0),
        ({"resolution_rel": 0.1}, 30.0, 3.0),
        ({"resolution_rel": 0.1}, None, None),
        (_Search(resolution_rps=None, resolution_rel=0.05), 40.0, 2.0),
        (_Search(resolution_rps=1.5), 40.0, 1.5),
    ],
)
def test_the_resolution_is_absolute_or_relative_to_the_passing_rate(settings, pass_rps, expected):
    got = resolution_of(settings, pass_rps)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_a_centred_bracket_has_the_searchs_resolution_at_its_passing_end():
    assert centred_resolution({"resolution_rps": 2.0}, 36.0) == 2.0
    w = centred_resolution({"resolution_rel": 0.05}, 36.0)
    # w = rel x (its passing end): the resolution_of the bracket [c - w/2, c + w/2).
    assert w == pytest.approx(resolution_of({"resolution_rel": 0.05}, 36.0 - w / 2))
    assert centred_resolution(None, 36.0) is None


def test_within_the_resolution_allows_decimal_rounding():
    assert within(0.30000000000000004, 0.3) is True
    assert within(2.5, 2.0) is False
    assert within(None, 2.0) is None and within(2.0, None) is None


def test_the_evidence_bracket_skips_rates_not_shown_to_fail():
    sel = {"capacity_rps": 25.0, "rates": [
        {"offered_rps": r, "status": s}
        for r, s in ((25, "pass"), (30, "inconclusive"), (35, "misses"), (40, "fail"))
    ]}  # fmt: skip
    e = evidence_bracket(sel)
    assert e == {"low": 25.0, "high": 40.0, "capacity_rps": 25.0}
    # The search bracket of the same rates ends at the next rate, whatever its status.
    assert bracket(sel["rates"], "offered_rps") == (25.0, 30.0)
    assert evidence_bracket({"capacity_rps": None, "rates": []}) == {
        "low": 0.0, "high": math.inf, "capacity_rps": None,
    }  # fmt: skip
    assert evidence_bracket(None) is None
    assert evidence_disjoint(e, {"low": 0.0, "high": 25.0})
    assert not evidence_disjoint(e, {"low": 30.0, "high": math.inf})
