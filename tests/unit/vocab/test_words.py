"""The words of a decision: one status table, one bracket rendering, one decision sentence."""

from __future__ import annotations

import pytest

from capacity_pack.vocab.words import (
    SHOWN_FAIL,
    SHOWN_PASS,
    STATUS_WORDS,
    UNDECIDED,
    bracket_text,
    decision_sentence,
    rate_status_words,
    status_words,
)


def test_every_status_has_its_words_and_an_unknown_one_reads_as_itself():
    assert list(STATUS_WORDS) == ["pass", "marginal", "misses", "fail", "inconsistent",
                                  "inconclusive"]  # fmt: skip
    assert status_words("pass") == "is shown to pass" == f"is {SHOWN_PASS}"
    assert status_words("marginal") == "meets every gate on the pooled estimate"
    assert status_words("misses") == "misses the attainment gate on the pooled estimate"
    assert status_words("fail") == "fails"
    assert status_words("inconsistent") == "is inconsistent between its repeats"
    assert status_words("inconclusive") == "is inconclusive"
    assert status_words("queued") == "is queued"
    assert status_words(None) == "has no status"
    assert (SHOWN_FAIL, UNDECIDED) == ("shown to fail", "cannot decide at this sample size")


def test_a_rate_with_its_status_and_why():
    assert rate_status_words(36, "fail", "interactive TTFT (repeat 0)") == (
        "36 RPS fails: interactive TTFT (repeat 0)"
    )
    assert rate_status_words(34.5, "pass") == "34.5 RPS is shown to pass"


@pytest.mark.parametrize(
    ("ends", "text"),
    [
        ((34.0, 36.0), "[34, 36) RPS"),
        ((0.5, 0.56), "[0.5, 0.56) RPS"),
        ((34.0, None), "at least 34 RPS"),
        ((None, 36.0), "below 36 RPS"),
        ((None, None), "no bracket"),
    ],
)
def test_the_bracket_in_words(ends, text):
    assert bracket_text(*ends) == text


def test_the_decision_sentence_states_the_capacity_and_its_bracket():
    assert decision_sentence("cold", 34.0, 36.0, True) == (
        "cold: SLO-compliant capacity [34, 36) RPS, taken as 34 RPS"
    )
    # Without a search there is no resolution to reach: the sentence does not say.
    assert decision_sentence("cold", 34.0, 36.0) == decision_sentence("cold", 34.0, 36.0, True)
    assert decision_sentence("warm", 34.0, 40.0, False) == (
        "warm: SLO-compliant capacity [34, 40) RPS, taken as 34 RPS; the bracket is wider than "
        "the search's resolution"
    )
    assert decision_sentence("cold", 34.0, None) == (
        "cold: SLO-compliant capacity at least 34 RPS, taken as 34 RPS; the highest rate tested "
        "meets every gate, so the true capacity may be higher"
    )
    assert decision_sentence("cold", None, 30.0) == (
        "cold: no SLO-compliant capacity, below 30 RPS (the lowest rate tested does not meet "
        "every gate)"
    )
    assert decision_sentence("cold", None, None) == (
        "cold: no SLO-compliant capacity, no bracket (no open-loop points)"
    )


def test_the_words_module_imports_only_the_standard_library():
    import ast
    from pathlib import Path

    import capacity_pack.vocab.words as words

    tree = ast.parse(Path(words.__file__).read_text())
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    assert imported <= {"__future__"}
