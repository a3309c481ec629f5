"""The twin's validation: capacity error against the measured bracket, the trust verdict and
the README table."""

from __future__ import annotations

import pytest

from capacity_pack.artifacts import TwinValidation
from capacity_pack.twin.validate import (
    capacity_error,
    predicted_capacity,
    readme_lines,
    validate,
)


def state(pass_rps, fail_rps, rates=()):
    return {
        "bracket": {"pass_rps": pass_rps, "fail_rps": fail_rps},
        "rates": [
            {
                "offered_rps": rate,
                "variation": {
                    "classes": {
                        name: {"attainment": {"pooled": {"value": value}}}
                        for name, value in att.items()
                    }
                },
            }
            for rate, att in rates
        ],
    }


@pytest.mark.parametrize(
    ("predicted", "pass_m", "fail_m", "error"),
    [
        (5.2, 5.0, 6.0, 0.0),  # inside the measured bracket
        (6.6, 5.0, 6.0, 0.6 / 5.0),  # above its failing end, relative to the passing end
        (4.0, 5.0, 6.0, 1.0 / 5.0),
        (9.0, 5.0, None, 0.0),  # every tested rate passed: at least 5
        (3.0, None, 4.0, 0.0),  # nothing passed: below 4
        (5.0, None, 4.0, 0.25),
        (None, 5.0, 6.0, None),
        (5.0, None, None, None),
    ],
)
def test_capacity_error_is_the_distance_to_the_measured_bracket(predicted, pass_m, fail_m, error):
    got = capacity_error(predicted, pass_m, fail_m)
    assert got == pytest.approx(error) if error is not None else got is None


def test_predicted_capacity_is_the_bracket_midpoint_or_its_one_end():
    assert predicted_capacity(5.0, 6.0) == 5.5
    assert predicted_capacity(5.0, None) == 5.0
    assert predicted_capacity(None, 4.0) == 4.0
    assert predicted_capacity(None, None) is None


def test_validate_trusts_a_twin_inside_the_tolerance_and_compares_attainment():
    prediction = {"cache_states": {"cold": {"pass_rps": 38.0, "fail_rps": 40.0}}}
    capacity = {
        "open_loop": {
            "cold": state(36.0, 38.0, [(36.0, {"a": 0.97, "b": 0.99}), (38.0, {"a": 0.93})])
        }
    }
    predicted_att = {"cold": {36.0: {"a": 0.99, "b": 0.99}, 38.0: {"a": 0.96}}}
    v = validate(prediction, capacity, 0.15, predicted_att)
    (s,) = v["states"]
    assert s["predicted"]["capacity_rps"] == 39.0
    assert s["capacity_error_rel"] == pytest.approx(1.0 / 36.0)
    assert v["trusted"] is True and "within 15%" in v["why"]
    assert s["attainment_error_max_abs"] == pytest.approx(0.03)
    assert s["sentence"] == "cold: the twin predicts 39 RPS ([38, 40) RPS), measured [36, 38) RPS"
    table = "\n".join(readme_lines(v))
    assert "| cold | 39 RPS ([38, 40) RPS) | [36, 38) RPS | 2.8% | 0.030 |" in table
    # The document is what its model (twin/validation.json's) reads back.
    assert TwinValidation.parse(v, "validation.json").dump() == v


def test_validate_labels_a_twin_outside_the_tolerance_untrusted_with_why():
    prediction = {
        "cache_states": {
            "cold": {"pass_rps": 60.0, "fail_rps": 64.0},
            "warm": {"pass_rps": 40.0, "fail_rps": 42.0},
        }
    }
    capacity = {"open_loop": {"cold": state(36.0, 38.0), "warm": state(40.0, 42.0)}}
    v = validate(prediction, capacity, 0.15)
    assert v["trusted"] is False
    assert v["why"] == "cold: capacity error 66.7% > tolerance 15%"
    assert "**untrusted**" in "\n".join(readme_lines(v))


def test_an_untrusted_twin_names_the_calibrations_largest_misfit():
    """Why the twin is off, from its own calibration: the closed-loop metric it replays worst
    (the llama.cpp pack's, 2026-12-03: TPOT at concurrency 4, median error 31 %)."""
    residuals = [
        {"point": "closed-c1/cold/rep0", "concurrency": 1,
         "ttft_median_rel_error": 0.061, "tpot_median_rel_error": 0.116},
        {"point": "closed-c4/cold/rep0", "concurrency": 4, "tpot_median_rel_error": 0.315},
    ]  # fmt: skip
    prediction = {
        "cache_states": {"cold": {"pass_rps": 0.8, "fail_rps": 1.0}},
        "calibration": {"residuals": residuals},
    }
    capacity = {"open_loop": {"cold": state(1.1, 1.5)}}
    v = validate(prediction, capacity, 0.15)
    assert v["trusted"] is False
    assert v["why"] == (
        "cold: capacity error 18.2% > tolerance 15%; the calibrated model's largest misfit to "
        "the closed loop is TPOT at concurrency 4 (median error 32%)"
    )
    assert v["largest_misfit"]["point"] == "closed-c4/cold/rep0"
    assert TwinValidation.parse(v, "validation.json").dump() == v
    # A trusted twin's why is its error alone.
    inside = {"cold": {"pass_rps": 1.1, "fail_rps": 1.5}}
    trusted = validate({**prediction, "cache_states": inside}, capacity)
    assert trusted["trusted"] and "misfit" not in trusted["why"]


def test_validate_without_a_measured_bracket_trusts_nothing():
    v = validate({"cache_states": {"cold": {"pass_rps": 5.0, "fail_rps": 6.0}}}, {"open_loop": {}})
    assert v["trusted"] is False and v["states"] == []
    assert v["why"] == "no cache state has both a predicted and a measured bracket"


def test_an_open_bracket_is_in_the_brackets_words():
    """A bracket with one end reads as the console and the README read it (capacity_pack.vocab.
    words.bracket_text): at least its passing end, or below its failing end."""
    prediction = {"cache_states": {"cold": {"pass_rps": 64.0, "fail_rps": None}}}
    capacity = {"open_loop": {"cold": state(None, 2.0)}}
    (s,) = validate(prediction, capacity, 0.15)["states"]
    assert s["sentence"] == "cold: the twin predicts 64 RPS (at least 64 RPS), measured below 2 RPS"
    assert "| cold | 64 RPS (at least 64 RPS) | below 2 RPS |" in "\n".join(
        readme_lines(validate(prediction, capacity, 0.15))
    )
