"""The SLO-boundary search: from the reports of the points measured so far to the next round.

Per cache state, round by round, the open-loop rate (and optionally the closed-loop level)
bracket [pass_rps, fail_rps) is narrowed: bisect to the tidy rate near the midpoint
(:func:`tidy_between`), halve / double (or :func:`gallop` from a prediction) outside it, stop
within the resolution. A rate is decided on its deciding repeats pooled; a failing end that
decides nothing is retried at the next repeat index; confirmations spend the remaining repeats
on the bracket's ends. :func:`decide_round` maps rounds 1..k to round k's file, :func:`plan_rounds`
applies ``max_rounds`` to the files in order (so raising it only adds rounds), :func:`summarize`
writes the whole search. Pure functions: each round runs as a Snakemake checkpoint.

Method: docs/search.md (every section: status and bracket, retries, the next rate, repeats,
the closed loop and its saturation check, rounds as checkpoints).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.artifacts import SloReport
from capacity_pack.decide.bracket import bracket, resolution_of, within
from capacity_pack.decide.capacity import meets_latency_gates
from capacity_pack.decide.pooled import deciding_reports, rate_status, void
from capacity_pack.io import canonical_json
from capacity_pack.plan.limits import MIN_OPEN_LOOP_RPS
from capacity_pack.plan.manifest import ConcurrencySearch, Pack, search_rate_bounds
from capacity_pack.plan.schedule import Point
from capacity_pack.vocab.words import bracket_text

#: Saturation: the last doubling of concurrency raised output throughput by less than this.
SATURATION_GAIN = 0.10
#: ``initial: auto``: round 1's rates as fractions of the closed-loop saturation throughput.
AUTO_FRACTIONS = (0.5, 0.75, 1.0)
#: Digits of a rate the search derives by halving, doubling or from a throughput.
SIGNIFICANT_DIGITS = 2
#: A safety stop: confirmation rounds never outnumber search rounds by more than this.
MAX_EXTRA_ROUNDS = 8
FORMAT = "capacity-pack/search-round/v1"
SUMMARY_FORMAT = "capacity-pack/search/v1"

Loop = Literal["open", "closed"]


class SearchInputs(BaseModel):
    """Exactly what a round's decision reads: the search settings except ``max_rounds`` (which
    only :func:`plan_rounds` reads), the repeats, the closed-loop attainment gate and the
    declared closed-loop levels. Its canonical JSON is the round rule's ``inputs`` param."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    initial_rps: list[float] | None = Field(
        description="Round 1's rates; None: 'auto' or 'predicted'."
    )
    predicted: bool = Field(
        default=False,
        description="'predicted': the first open-loop rates are the preflight prediction's.",
    )
    pooled_steps: bool = Field(
        default=False, description="A search step measures every repeat of its rates."
    )
    resolution_rps: float | None
    resolution_rel: float | None
    min_rps: float | None
    max_rps: float | None
    closed_levels: list[int] = Field(description="sweep.closed_loop_concurrency.")
    concurrency: ConcurrencySearch | None = Field(description="The closed-loop search, if any.")
    max_concurrency: int | None = Field(description="Its upward bound (None: no search).")
    repeats: int = Field(ge=1)
    extra_repeats: int = Field(default=2, ge=0, description="sweep.search.extra_repeats.")
    attainment_min: float

    @classmethod
    def of(cls, pack: Pack) -> SearchInputs:
        sweep, search = pack.sweep, pack.sweep.search
        if search is None:
            raise ValueError("the pack has no sweep.search")
        return cls(
            initial_rps=sweep.search_initial_rps,
            predicted=search.initial == "predicted",
            pooled_steps=search.pooled_steps,
            resolution_rps=search.resolution_rps,
            resolution_rel=search.resolution_rel,
            min_rps=search.min_rps,
            max_rps=search.max_rps,
            closed_levels=list(sweep.closed_loop_concurrency),
            concurrency=search.concurrency,
            max_concurrency=sweep.concurrency_bound,
            repeats=sweep.repeats,
            extra_repeats=search.extra_repeats,
            attainment_min=pack.acceptance.class_slo_attainment_min,
        )

    def canonical_json(self) -> str:
        # Without 'predicted' and 'pooled_steps' the params are as they were before they
        # existed: no search round of an existing pack reruns for them.
        unset = {k for k in ("predicted", "pooled_steps") if not getattr(self, k)}
        return canonical_json(self.model_dump(mode="json", exclude=unset or None))


# --- Tidy numbers ---


def _ladder(width: float) -> Iterable[float]:
    """Steps 5, 2, 1 x 10^k from the first below ``width`` down to 1e-6 (6 decimals)."""
    k = math.floor(math.log10(width)) if width > 0 else -6
    for exp in range(k, -7, -1):
        for mant in (5, 2, 1):
            step = mant * 10.0**exp
            if step < width:
                yield step


def tidy_between(low: float, high: float) -> float | None:
    """A tidy value strictly between ``low`` and ``high`` near the midpoint: the multiple of the
    coarsest step of the 1-2-5 ladder nearest the midpoint that lies strictly inside and within
    an eighth of the width of the midpoint; None when none does (below 6 decimals)."""
    width = high - low
    if width <= 0:
        return None
    mid, tolerance = (low + high) / 2, width / 8
    for step in _ladder(width):
        value = round(round(mid / step) * step, 6)
        if low < value < high and abs(value - mid) <= tolerance + 1e-9:
            return value
    return None


def integer_between(low: int, high: int) -> int | None:
    """The integer midpoint floor((low + high) / 2) when it lies strictly inside."""
    mid = (low + high) // 2
    return mid if low < mid < high else None


def tidy(value: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """``value`` to ``digits`` significant digits, at most 6 decimals (a point id's)."""
    if value <= 0:
        return value
    places = digits - 1 - math.floor(math.log10(value))
    return round(value, max(min(places, 6), -15))


# --- The tables of one cache state ---


def rate_rows(reports: Sequence[SloReport]) -> list[dict[str, Any]]:
    """One row per tested open-loop rate: its status over the repeats that decide it
    (:func:`capacity_pack.decide.pooled.deciding_reports`: a client-bound or superseded
    repeat is set aside when another decides), every measured repeat, and the void ones."""
    by_rate: dict[float, list[SloReport]] = defaultdict(list)
    for r in reports:
        if r.mode == "open":
            by_rate[float(r.offered_rps)].append(r)
    rows = []
    for rate in sorted(by_rate):
        reps = sorted(by_rate[rate], key=lambda r: r.repeat)
        why = {r.repeat: v for r in reps if (v := void(r))}
        rows.append(
            {
                "offered_rps": rate,
                "status": rate_status(deciding_reports(reps)),
                "repeats": [r.repeat for r in reps],
                "verdicts": [r.verdict for r in reps],
                "void_repeats": sorted(why),
                "void_why": {str(k): v for k, v in why.items()},
                "deciding_repeats": [r.repeat for r in reps if not void(r)],
            }
        )
    return rows


def level_rows(reports: Sequence[SloReport], attainment_min: float) -> list[dict[str, Any]]:
    """One row per tested closed-loop level: whether it meets the SLO, its mean throughputs."""
    by_level: dict[int, list[SloReport]] = defaultdict(list)
    for r in reports:
        if r.mode == "closed":
            by_level[r.concurrency].append(r)
    rows = []
    for level in sorted(by_level):
        reps = sorted(by_level[level], key=lambda r: r.repeat)
        meets = all(meets_latency_gates(r, attainment_min) for r in reps)
        rows.append(
            {
                "concurrency": level,
                "meets_slo": meets,
                "status": "pass" if meets else "fail",
                "repeats": [r.repeat for r in reps],
                "output_throughput_tps": _mean(r.output_throughput_tps for r in reps),
                "request_throughput_rps": _mean(r.request_throughput_rps for r in reps),
            }
        )
    return rows


def _mean(values: Iterable[Any]) -> float | None:
    x = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.mean(x)) if x else None


def saturation(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The closed-loop curve's throughput-flattening check (docs/search.md, "The closed
    loop")."""
    rule = (
        f"saturated when T(c_max) < {1 + SATURATION_GAIN:.2f} x T(c'), c' the highest tested "
        "level <= c_max / 2 (T: mean output tokens/s)"
    )
    usable = [r for r in rows if r["output_throughput_tps"] is not None]
    if not usable:
        return {"saturated": None, "rule": rule, "reason": "no closed-loop throughput"}
    top = usable[-1]
    below = [r for r in usable if r["concurrency"] * 2 <= top["concurrency"]]
    if not below or not below[-1]["output_throughput_tps"]:
        return {
            "saturated": None,
            "rule": rule,
            "reason": f"no tested level at or below half of {top['concurrency']}",
        }
    ref = below[-1]
    gain = top["output_throughput_tps"] / ref["output_throughput_tps"] - 1
    return {
        "saturated": bool(gain < SATURATION_GAIN),
        "rule": rule,
        "from": {"concurrency": ref["concurrency"], "tps": ref["output_throughput_tps"]},
        "to": {"concurrency": top["concurrency"], "tps": top["output_throughput_tps"]},
        "gain": gain,
    }


# --- One loop's step ---


def rate_step(
    rows: Sequence[dict[str, Any]], inputs: SearchInputs, first: Sequence[float]
) -> tuple[list[float], str, str]:
    """(next rates, direction, why): the open-loop search step on ``rows``; ``first`` is
    round 1's rates (the bounds derive from them)."""
    tested = {row["offered_rps"] for row in rows}
    low_bound, high_bound = search_rate_bounds(inputs.min_rps, inputs.max_rps, first)
    low, high = bracket(rows, "offered_rps")
    if low is None and high is None:
        return [], "none", "no open-loop rate tested"
    if low is None:
        assert high is not None
        if high <= low_bound:
            return [], "none", f"the lowest allowed rate ({low_bound:g} RPS) does not pass"
        rate = tidy(high / 2)
        if inputs.predicted:
            rate = gallop(high, -1, sum(r < min(first) for r in tested), inputs)
        return _fresh(
            [max(rate, low_bound)],
            tested,
            "down",
            f"the lowest tested rate ({high:g} RPS) does not pass",
        )
    if high is None:
        if low >= high_bound:
            return [], "none", f"the highest allowed rate ({high_bound:g} RPS) passes"
        rate = tidy(low * 2)
        if inputs.predicted:
            rate = gallop(low, +1, sum(r > max(first) for r in tested), inputs)
        return _fresh(
            [min(rate, high_bound)], tested, "up", f"every tested rate passes, up to {low:g} RPS"
        )
    width, res = high - low, resolution_of(inputs, low)
    assert res is not None
    span = bracket_text(low, high)
    if within(width, res):
        return [], "none", f"the bracket {span} is within the resolution ({res:g} RPS)"
    mid = tidy_between(low, high)
    if mid is None:
        return [], "none", f"no rate with 6 decimals lies inside {span}"
    why = f"the bracket {span} is wider than the resolution ({res:g} RPS)"
    return _fresh([mid], tested, "bisect", why)


def gallop(rate: float, sign: int, steps: int, inputs: SearchInputs) -> float:
    """A predicted search's step out of its start: ``rate`` +- resolution x 2^steps (``steps``:
    the rates already tested beyond round 1's on that side), to 2 significant digits, never
    through zero: doubling from the prediction rather than halving (docs/search.md, "The next
    rate")."""
    res = resolution_of(inputs, rate)
    assert res is not None
    step = res * 2**steps
    if sign < 0 and rate - step <= 0:
        return tidy(rate / 2)
    return tidy(rate + sign * step)


def _fresh(values: list[float], tested: set, direction: str, why: str):
    new = [v for v in values if v not in tested]
    if not new:
        return [], "none", f"{why}, but the next value ({values[0]:g}) is already tested"
    return new, direction, why


def level_step(rows: Sequence[dict[str, Any]], inputs: SearchInputs) -> tuple[list[int], str, str]:
    """(next levels, direction, why): the closed-loop search step on ``rows``."""
    assert inputs.concurrency is not None and inputs.max_concurrency is not None
    tested = {row["concurrency"] for row in rows}
    low, high = bracket(rows, "concurrency")
    if low is None and high is None:
        return [], "none", "no closed-loop level tested"
    if low is None:
        return [], "none", f"the lowest tested level ({high}) does not meet the SLO"
    if high is None:
        if low >= inputs.max_concurrency:
            return [], "none", f"the highest allowed level ({inputs.max_concurrency}) meets the SLO"
        level = min(int(low) * 2, inputs.max_concurrency)
        why = f"every tested level meets the SLO, up to {low:g}"
        return _fresh([level], tested, "up", why)
    res = inputs.concurrency.resolution
    if high - low <= res:
        return [], "none", f"the bracket [{low:g}, {high:g}) is within {res} workers"
    mid = integer_between(int(low), int(high))
    if mid is None:
        return [], "none", f"no level lies strictly inside [{low:g}, {high:g})"
    why = f"the bracket [{low:g}, {high:g}) is wider than {res} workers"
    return _fresh([int(mid)], tested, "bisect", why)


def auto_rates(levels: Sequence[dict[str, Any]]) -> tuple[list[float], str]:
    """``initial: auto``: round 1's rates from the closed-loop saturation request throughput."""
    best = max((r["request_throughput_rps"] or 0.0 for r in levels), default=0.0)
    if best <= 0:
        return [], "no closed-loop request throughput to derive round 1's rates from"
    rates = sorted({max(MIN_OPEN_LOOP_RPS, tidy(f * best)) for f in AUTO_FRACTIONS})
    fractions = ", ".join(f"{f:g}" for f in AUTO_FRACTIONS)
    return rates, f"{fractions} x the closed-loop saturation throughput {best:.4g} RPS"


def predicted_rates(
    preflight: dict[str, Any], cache_state: str, resolution_rps: float | None = None
) -> list[float]:
    """``initial: predicted``: round 1's rates from a preflight file: the cache state's predicted
    bracket's ends and the tidy rate near its midpoint (the ends only when within
    ``resolution_rps``); with one end, that end and half or twice it; none without a bracket."""
    entry = next(
        (b for b in preflight.get("brackets") or [] if b["cache_state"] == cache_state), {}
    )
    low, high = entry.get("pass_rps"), entry.get("fail_rps")
    if low is not None and high is not None:
        narrow = bool(within(high - low, resolution_rps))
        rates = [low, high] if narrow else [low, tidy_between(low, high), high]
    elif high is not None:
        rates = [max(MIN_OPEN_LOOP_RPS, tidy(high / 2)), high]
    elif low is not None:
        rates = [low, tidy(low * 2)]
    else:
        rates = []
    return sorted({float(r) for r in rates if r is not None})


def confirmation(
    rows: Sequence[dict[str, Any]],
    key: str,
    ends: Sequence[float | None],
    repeats: int,
    retries: int = 0,
) -> list[dict[str, Any]]:
    """The repeats the values ``ends`` (the bracket's passing end) still need: as many new
    repeat indices (the lowest not measured) as the value has fewer than ``repeats`` deciding
    repeats, within ``repeats + retries`` measurements of it (a client-bound or superseded
    repeat decides nothing)."""
    out = []
    for value in ends:
        if value is None:
            continue
        row = next(r for r in rows if r[key] == value)
        missing = _new_repeats(row, repeats, retries)
        if missing:
            out.append({key: value, "repeats": missing})
    return out


def _undecided(rows: Sequence[dict[str, Any]], rate: float | None) -> float | None:
    """``rate`` unless its status is ``fail`` (shown to fail, or another gate failed: no
    repeat can make it meet the gates)."""
    row = next((r for r in rows if r["offered_rps"] == rate), None)
    return None if row is None or row["status"] == "fail" else rate


def _new_repeats(row: dict[str, Any], repeats: int, retries: int) -> list[int]:
    have = len(row.get("deciding_repeats", row["repeats"]))
    room = repeats + retries - len(row["repeats"])
    want = min(max(0, repeats - have), max(0, room))
    return _unused_repeats(row, repeats + retries)[:want]


def _unused_repeats(row: dict[str, Any], limit: int) -> list[int]:
    """The repeat indices below ``limit`` not measured yet for ``row``'s value, in order."""
    return [k for k in range(limit) if k not in row["repeats"]]


#: Why a void repeat decided nothing, in words (capacity_pack.decide.pooled.void's kinds).
VOID_WORDS = {
    "client-bound": "the client fell behind its schedule, no server result",
    "disturbed": "other work on the host disturbed the point, not the target's result",
    "superseded": "stopped in run under another gate and undecided at this one",
}


def void_retry(
    rows: Sequence[dict[str, Any]], fail_rps: float | None, repeats: int, extra: int
) -> tuple[list[dict[str, Any]], str | None]:
    """(the retry, why): when the bracket's failing end has no repeat that decides it (each
    client-bound, disturbed, or superseded by a changed gate), it is measured again at the
    next repeat index, within ``repeats + extra`` measurements, rather than taken as not
    passing."""
    if fail_rps is None:
        return [], None
    row = next(r for r in rows if r["offered_rps"] == fail_rps)
    if row["deciding_repeats"] or not row["void_repeats"]:
        return [], None
    fresh = _unused_repeats(row, repeats + extra)
    n = len(row["repeats"])
    kinds = sorted(set(row["void_why"].values()))
    if not fresh:
        return [], (
            f"{fail_rps:g} RPS decided nothing ({' or '.join(kinds)}) in all {n} measurements "
            "the search may spend on it: the bracket is a lower bound"
        )
    listed = ", ".join(f"{k} {row['void_why'][str(k)]}" for k in row["void_repeats"])
    why = (
        f"{fail_rps:g} RPS decided nothing (repeat {listed}: "
        + "; ".join(VOID_WORDS.get(k, k) for k in kinds)
        + "): measured again"
    )
    return [{"offered_rps": fail_rps, "repeats": [fresh[0]]}], why


# --- A round's file ---


def decide_round(
    reports: Sequence[SloReport],
    inputs: SearchInputs,
    cache_state: str,
    round_index: int,
    measured: Sequence[str] = (),
    predicted_rps: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Round ``round_index``'s file from the reports of rounds 1..k of ``cache_state`` (and the
    declared closed-loop points): per loop the tested table, the bracket, the search step and
    the confirmation the next round may take (:func:`plan_rounds` chooses); ``measured``: the
    keys of the points this round measured (shown as they are)."""
    mine = [r for r in reports if r.cache_state == cache_state]
    first, why_first = _first_rates(mine, inputs, predicted_rps)
    return {
        "format": FORMAT,
        "cache_state": cache_state,
        "round": round_index,
        "measured": list(measured),
        "first_round_rps": first,
        "first_round_why": why_first,
        "open": _open_part(rate_rows(mine), inputs, first, why_first),
        "closed": _closed_part(level_rows(mine, inputs.attainment_min), inputs),
        "next": (
            "round k+1 takes a loop's 'search' while that loop has run fewer than "
            "sweep.search.max_rounds search rounds, else its 'confirm'; the search is done "
            "when no loop has either"
        ),
    }


def _first_rates(
    mine: Sequence[SloReport], inputs: SearchInputs, predicted_rps: Sequence[float] | None
) -> tuple[list[float] | None, str]:
    """(round 1's open-loop rates, where they come from): declared, predicted, or derived
    from the declared closed-loop levels (``initial: auto``)."""
    first, why_first = inputs.initial_rps, "sweep.search.initial (or sweep.open_loop_rps)"
    if first is None and inputs.predicted:
        first = sorted(predicted_rps or [])
        why_first = "the ends and midpoint of the preflight prediction's bracket"
        if not first:
            why_first = "the preflight prediction gave no bracket to start from"
    elif first is None:
        # The declared levels' repeat 0 only: the same rates in every round, however far the
        # closed-loop search has gone since.
        declared = [
            r
            for r in mine
            if r.mode == "closed" and r.concurrency in inputs.closed_levels and r.repeat == 0
        ]
        first, why_first = auto_rates(level_rows(declared, inputs.attainment_min))
    return first, why_first


def _open_part(
    rates: list[dict[str, Any]], inputs: SearchInputs, first: list[float] | None, why_first: str
) -> dict[str, Any]:
    """The open loop's part of a round file: tested rates, bracket, step, confirmation."""
    open_doc: dict[str, Any] = {"tested": rates, "bracket": None, "confirm": []}
    if not rates:
        derived = "predicted" if inputs.predicted else "auto"
        direction = derived if first and inputs.initial_rps is None else "none"
        open_doc["search"] = {"rates": first if direction == derived else [],
                              "direction": direction, "why": why_first}  # fmt: skip
        return open_doc
    step, direction, why = rate_step(rates, inputs, first or [r["offered_rps"] for r in rates])
    low, high = bracket(rates, "offered_rps")
    retries = inputs.extra_repeats
    retry, why_retry = void_retry(rates, high, inputs.repeats, retries)
    if retry:
        step, direction, why = [], "retry", why_retry
    elif why_retry:
        why = f"{why}; {why_retry}"
    res = resolution_of(inputs, low)
    both = low is not None and high is not None
    return open_doc | {
        "bracket": {
            "pass_rps": low,
            "fail_rps": high,
            "width_rps": round(high - low, 6) if both else None,
            "resolution_rps": res,
            "within_resolution": bool(both and res and within(high - low, res)),
        },
        "search": {"rates": step, "retry": retry, "direction": direction, "why": why},
        # Both ends, the failing one unless it is shown to fail: a rate is decided on its
        # repeats pooled, so another repeat of either end can move the bracket.
        "confirm": confirmation(
            rates, "offered_rps", (low, _undecided(rates, high)), inputs.repeats, retries
        ),
    }


def _closed_part(levels: list[dict[str, Any]], inputs: SearchInputs) -> dict[str, Any]:
    """The closed loop's part of a round file: tested levels, saturation and, with a
    closed-loop search, its bracket, step and confirmation."""
    closed_doc: dict[str, Any] = {"tested": levels, "saturation": saturation(levels)}
    if inputs.concurrency is None:
        return closed_doc
    step_c, direction_c, why_c = level_step(levels, inputs)
    low_c, high_c = bracket(levels, "concurrency")
    return closed_doc | {
        "bracket": {
            "pass_concurrency": low_c,
            "fail_concurrency": high_c,
            "resolution": inputs.concurrency.resolution,
            "within_resolution": bool(
                low_c is not None
                and high_c is not None
                and high_c - low_c <= inputs.concurrency.resolution
            ),
        },
        "search": {"levels": step_c, "direction": direction_c, "why": why_c},
        "confirm": confirmation(levels, "concurrency", (low_c,), inputs.repeats),
    }


# --- Rounds, in order ---


def first_round(inputs: SearchInputs, cache_state: str) -> list[Point]:
    """Round 1's points: the initial rates (none with 'auto') and, with a closed-loop search,
    the declared levels; repeat 0 each."""
    pts = [
        Point(mode="open", rate_rps=r, cache_state=cache_state, repeat=0)
        for r in inputs.initial_rps or []
    ]
    if inputs.concurrency is not None:
        pts += [
            Point(mode="closed", concurrency=c, cache_state=cache_state, repeat=0)
            for c in inputs.closed_levels
        ]
    return pts


def _step_points(doc: dict[str, Any], loop: Loop, kind: str, repeats: int = 1) -> list[Point]:
    """The points of ``loop``'s step ``kind`` in round file ``doc``; a search step's new
    open-loop rates at repeats 0..``repeats``-1."""
    part = doc[loop]
    cache = doc["cache_state"]
    retries = [
        Point(mode="open", rate_rps=item["offered_rps"], cache_state=cache, repeat=k)
        for item in part["search"].get("retry") or []
        for k in item["repeats"]
    ]
    if kind == "retry":
        return retries
    if kind == "search":
        if loop == "open":
            return [
                Point(mode="open", rate_rps=r, cache_state=cache, repeat=k)
                for r in part["search"]["rates"]
                for k in range(repeats)
            ] + retries
        return [
            Point(mode="closed", concurrency=c, cache_state=cache, repeat=0)
            for c in part["search"]["levels"]
        ]
    out: list[Point] = []
    for item in part.get("confirm") or []:
        where = (
            {"mode": "open", "rate_rps": item["offered_rps"]}
            if loop == "open"
            else {"mode": "closed", "concurrency": int(item["concurrency"])}
        )
        out += [Point(**where, cache_state=cache, repeat=rep) for rep in item["repeats"]]
    return out


def plan_rounds(
    docs: Sequence[dict[str, Any]], inputs: SearchInputs, max_rounds: int, cache_state: str
) -> list[dict[str, Any]]:
    """The plans of rounds 1..n from round files 1..len(docs) (in order): round 1's, then one
    per file while the search goes on, each ``{"round", "kinds": {loop: kind}, "points"}``
    (kind ``search``, ``retry``, ``confirm`` or None). ``len(plans) == len(docs)``: the search
    is done; ``len(docs) + 1``: round len(docs)+1 is to measure ``plans[-1]["points"]``."""
    kinds: dict[str, str | None] = {
        "open": "search" if inputs.initial_rps else None,
        "closed": "search" if inputs.concurrency is not None else None,
    }
    plans = [{"round": 1, "kinds": kinds, "points": first_round(inputs, cache_state)}]
    searched = {loop: int(kind == "search") for loop, kind in kinds.items()}
    for k, doc in enumerate(docs, start=1):
        if len(plans) != k:
            break
        kinds, pts = {}, []
        for loop in ("open", "closed"):
            kind = _kind(doc.get(loop) or {}, loop, searched[loop] < max_rounds)
            kinds[loop] = kind
            if kind is not None:
                pts += _step_points(doc, loop, kind, inputs.repeats if inputs.pooled_steps else 1)
        if pts and k < max_rounds + MAX_EXTRA_ROUNDS:
            for loop, kind in kinds.items():
                searched[loop] += int(kind == "search")
            plans.append({"round": k + 1, "kinds": kinds, "points": _unique(pts)})
    return plans


def _kind(part: dict[str, Any], loop: Loop, may_search: bool) -> str | None:
    if "search" not in part:
        return None
    step = part["search"]
    if may_search and (step.get("rates" if loop == "open" else "levels") or step.get("retry")):
        return "search"
    if step.get("retry"):
        # Past max_rounds a rate that decided nothing is still measured again (as a
        # confirmation is): it refines nothing, it stands in for a measurement.
        return "retry"
    return "confirm" if part.get("confirm") else None


def _unique(pts: Iterable[Point]) -> list[Point]:
    seen: dict[str, Point] = {}
    for p in pts:
        seen.setdefault(p.key, p)
    return list(seen.values())


def searched_points(plans: Sequence[dict[str, Any]]) -> list[Point]:
    """Every point of the planned rounds, once, in round order."""
    return _unique(p for plan in plans for p in plan["points"])


def summarize(
    docs: Sequence[dict[str, Any]], inputs: SearchInputs, max_rounds: int, cache_state: str
) -> dict[str, Any]:
    """The whole search of one cache state from its round files 1..n (the search done at n):
    what each round measured and as what, why each loop stopped, its final bracket."""
    plans = plan_rounds(docs, inputs, max_rounds, cache_state)
    if len(plans) != len(docs):
        raise ValueError(f"the {cache_state} search is not done after {len(docs)} rounds")
    last = docs[-1]
    out: dict[str, Any] = {
        "format": SUMMARY_FORMAT,
        "cache_state": cache_state,
        "max_rounds": max_rounds,
        "rounds": [
            {
                "round": plan["round"],
                "kinds": plan["kinds"],
                "points": [p.key for p in plan["points"]],
            }
            for plan in plans
        ],
    }
    for loop, unit in (("open", "rates"), ("closed", "levels")):
        part = last[loop]
        searched = sum(plan["kinds"][loop] == "search" for plan in plans)
        entry = {k: part[k] for k in ("tested", "bracket", "saturation") if k in part}
        if "search" in part:
            step = part["search"]
            entry["search_rounds"] = searched
            pending = step[unit] or [
                f"{item['offered_rps']:g} RPS repeat {k}"
                for item in step.get("retry") or []
                for k in item["repeats"]
            ]
            entry["stopped"] = (
                f"max_rounds ({max_rounds}) search rounds ran; the next would measure "
                f"{pending} ({step['why']})"
                if pending
                else step["why"]
            )
        out[loop] = entry
    return out
