"""The words of a decision: a rate's status, the capacity bracket, and the decision sentence.

Every surface that states a capacity (the console's closing lines, the pack's README and HTML
page, the MLflow parent run's description, ``capacity-pack compare``, the twin's validation, the
preflight prediction and the search's round files) words it here, so that they state one
decision in one wording.

**Statuses.** :data:`STATUS_WORDS` is the one table of the verdict words: each verdict a
measured point or a rate can get (``pass``, ``marginal``, ``misses``, ``fail``,
``inconsistent``, ``inconclusive``; ``capacity_pack.decide.pooled`` defines them) and the
predicate a sentence puts after the rate ("36 RPS fails"). :data:`SHOWN_PASS`,
:data:`SHOWN_FAIL` and :data:`UNDECIDED` are a class's pooled attainment against its gate: its
confidence interval wholly at or over the gate, wholly under it, or across it.

**The bracket** [a, b): a = pass_rps, the highest tested rate meeting every gate with every
lower tested rate meeting them, b = fail_rps, the lowest tested rate above it
(``capacity_pack.decide.bracket`` computes it). :func:`bracket_text` writes it ``[a, b) RPS``;
with its passing end only, ``at least a RPS`` (no tested rate above a); with its failing end
only, ``below b RPS`` (the lowest tested rate does not meet the gates); with neither,
``no bracket``.

**The decision sentence.** :func:`decision_sentence` states one cache state's capacity and its
bracket: ``cold: SLO-compliant capacity [34, 36) RPS, taken as 34 RPS`` (the capacity the plan
sizes with is the bracket's passing end), and when the bracket is open or wider than the
search's resolution, so; ``cold: no SLO-compliant capacity, below 30 RPS (...)`` when no rate
meets the gates. A surface may add its own detail around it (the README the evidence at each
end, compare the difference between two packs), never another wording of it.
"""

from __future__ import annotations

#: A class's pooled attainment against its gate: the lower end of its confidence interval at or
#: over the gate, the upper end under it, or neither.
SHOWN_PASS, SHOWN_FAIL, UNDECIDED = (
    "shown to pass",
    "shown to fail",
    "cannot decide at this sample size",
)

#: Every verdict word, in the order of the definitions, as the predicate after its rate.
STATUS_WORDS: dict[str, str] = {
    "pass": f"is {SHOWN_PASS}",
    "marginal": "meets every gate on the pooled estimate",
    "misses": "misses the attainment gate on the pooled estimate",
    "fail": "fails",
    "inconsistent": "is inconsistent between its repeats",
    "inconclusive": "is inconclusive",
}


def status_words(status: str | None) -> str:
    """A status as the predicate after its rate (:data:`STATUS_WORDS`); a word outside the
    table as ``is <word>``."""
    if status is None:
        return "has no status"
    return STATUS_WORDS.get(status, f"is {status}")


def rate_status_words(rate_rps: float, status: str | None, why: str | None = None) -> str:
    """``36 RPS fails: interactive TTFT (repeat 0)``: a tested rate, its status and why."""
    text = f"{rate_rps:g} RPS {status_words(status)}"
    return f"{text}: {why}" if why else text


def bracket_text(pass_rps: float | None, fail_rps: float | None) -> str:
    """The bracket: ``[a, b) RPS``, ``at least a RPS``, ``below b RPS`` or ``no bracket``."""
    if pass_rps is not None and fail_rps is not None:
        return f"[{pass_rps:g}, {fail_rps:g}) RPS"
    if pass_rps is not None:
        return f"at least {pass_rps:g} RPS"
    if fail_rps is not None:
        return f"below {fail_rps:g} RPS"
    return "no bracket"


def decision_sentence(
    cache_state: str,
    pass_rps: float | None,
    fail_rps: float | None,
    reached: bool | None = None,
) -> str:
    """The one sentence stating a cache state's capacity and its bracket (module docstring);
    ``reached``: whether the bracket is within the search's resolution (None: no search)."""
    span = bracket_text(pass_rps, fail_rps)
    if pass_rps is None:
        why = (
            "the lowest rate tested does not meet every gate"
            if fail_rps is not None
            else "no open-loop points"
        )
        return f"{cache_state}: no SLO-compliant capacity, {span} ({why})"
    text = f"{cache_state}: SLO-compliant capacity {span}, taken as {pass_rps:g} RPS"
    if fail_rps is None:
        text += "; the highest rate tested meets every gate, so the true capacity may be higher"
    elif reached is False:
        text += "; the bracket is wider than the search's resolution"
    return text
