"""The in-run decision of an open-loop rate point: stop it as soon as its verdict is certain.

Per class c, over its finished measured requests: n_c successful, k_c of them meeting the SLO
(:func:`capacity_pack.vocab.slo.meets_slo` on the client's stamps: TTFT = f - s,
TPOT = ((e - s) - (f - s)) / (O - 1) for O > 1, else 0). A *look* (every ``look_interval_s``)
judges each class with n_c >= ``min_samples`` by the time-uniform confidence sequence of its
attainment (:func:`capacity_pack.binomial.sequential_outcome`) at the effective sample
k_c / deff_c of n_c / deff_c (:func:`capacity_pack.binomial.design_effect`: requests that share
a queue miss together). After the minimum duration: a class ``fail`` stops the point (fail);
every class ``pass`` at its sample gate stops it (pass); a class that cannot meet the gate by
the maximum duration even if every request still to come met the SLO,
(k_c + n_c' - n_c) / n_c' < gate with n_c' = n_c (T - w) / (t - w), stops it (futile:
non-binding, it never makes a pass); otherwise it goes on and extends (:func:`wants_extension`:
the next precommitted block is appended once the queued arrivals cover less than
:func:`extension_lead_ns`). A stop ends the arrivals only; requests in flight finish. The
sequence covers the true attainment at every n at once (Ville's inequality), so looking often
does not raise the error rate. The method, its error rates and its history: docs/metrics.md,
"In-run decisions".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.binomial import (
    Outcome,
    confidence_sequence,
    design_effect,
    effective_counts,
    quick_outcome,
)
from capacity_pack.measure.records import Attempt
from capacity_pack.vocab import latency
from capacity_pack.vocab.slo import within_cutoffs

NS = 1_000_000_000
#: A look's verdict on the point: the class outcomes' plus ``futile`` (cannot pass in time).
Decision = Literal["pass", "fail", "futile", "undecided"]
#: Successful measured requests a class needs before a look judges it (a floor on noise in
#: the earliest samples; the sequence is valid without it).
MIN_LOOK_SAMPLES = 20
#: Seconds between looks.
LOOK_INTERVAL_S = 0.25
#: The next block is decided once the queued arrivals cover less than this many seconds...
EXTEND_LEAD_S = 2.0
#: ...or this fraction of the last block's span, whichever is longer.
EXTEND_LEAD_FRACTION = 0.2


class SequentialSettings(BaseModel):
    """What the in-run decision reads: each class's SLO cutoffs, the attainment gate and its
    confidence, the least samples before a class is judged, the minimum duration."""

    model_config = ConfigDict(extra="forbid")

    cutoffs: dict[str, tuple[float, float]] = Field(
        description="Per class: (TTFT cutoff ms, TPOT cutoff ms), the SLO predicate's cutoffs."
    )
    attainment_min: float = Field(gt=0, le=1, description="acceptance.class_slo_attainment_min.")
    confidence: float = Field(gt=0, lt=1, description="acceptance.attainment_confidence.")
    minimum_duration_s: float = Field(
        ge=0, description="No stop, either way, before this many seconds from the clock's start."
    )
    min_samples: int = Field(
        default=MIN_LOOK_SAMPLES, ge=1, description="Successful requests before a class is judged."
    )
    maximum_duration_s: float | None = Field(
        default=None,
        gt=0,
        description="The arrivals' cut from the clock's start: warm-up + maximum duration.",
    )
    warmup_s: float = Field(default=0.0, ge=0, description="Warm-up from the clock's start.")
    look_interval_s: float = Field(default=LOOK_INTERVAL_S, gt=0, description="Between looks.")


def meets_slo(a: Attempt, cutoffs: tuple[float, float]) -> bool:
    """The SLO predicate on one request's client stamps (the module docstring's formula)."""
    if a.status != "ok" or a.first_token_ns is None or a.last_token_ns is None:
        return False
    ttft = latency.ttft_ms(a.sent_ns, a.first_token_ns)
    e2e = latency.e2e_ms(a.sent_ns, a.last_token_ns)
    tpot = latency.tpot_ms(e2e, ttft, sum(a.chunk_tokens))
    return within_cutoffs(ttft, tpot, cutoffs)


@dataclass
class _Class:
    n: int = 0  # successful measured requests
    passed: int = 0  # of them, meeting the SLO
    # Send stamp and SLO outcome of each, for the design effect (outcomes in send order).
    sent_ns: list[int] = field(default_factory=list)
    met: list[bool] = field(default_factory=list)

    def design_effect(self) -> float:
        return design_effect(self.met, self.sent_ns)


@dataclass
class Decider:
    """The running counts and the looks of one point (the loop's thread only).

    A look is O(classes) and cheap (:func:`capacity_pack.binomial.quick_outcome`); the bounds
    and the reason, which need the root search, are worked out once, for the summary, from
    the counts the deciding (or the last) look saw."""

    settings: SequentialSettings
    sample_gate: int | None = None
    classes: dict[str, _Class] = field(init=False)
    looks: int = 0
    decision: Decision = "undecided"
    at_offset_ns: int | None = None
    # The counts and outcomes the last look judged: {class: (n, passed, outcome)}, and the
    # design effect each was judged at.
    seen: dict[str, tuple[int, int, Outcome]] = field(default_factory=dict)
    deff: dict[str, float] = field(default_factory=dict)
    # The class a futile look found, its projected count and the upper end it was given.
    futile_class: tuple[str, float, float] | None = None

    def __post_init__(self) -> None:
        self.classes = {c: _Class() for c in self.settings.cutoffs}
        # Runs the bounds once now, before the clock starts: a first import at a look stalls
        # the arrivals for a few hundred milliseconds (measured: p99 lateness 100-300 ms when
        # the first futility look imported scipy's root search mid-run, since replaced).
        quick_outcome(1, 2, 0.5)
        confidence_sequence(1, 3, 0.5, 0.5)

    def record(self, a: Attempt) -> None:
        """One finished measured request (O(1) but its chunk count)."""
        c = self.classes.get(a.klass)
        if c is not None and a.status == "ok":
            met = meets_slo(a, self.settings.cutoffs[a.klass])
            c.n += 1
            c.passed += met
            c.sent_ns.append(a.sent_ns)
            c.met.append(met)

    def look(self, offset_ns: int) -> Decision:
        """Judge every class now (``offset_ns`` from the clock's start); the point's outcome."""
        s = self.settings
        self.looks += 1
        self.at_offset_ns = offset_ns
        seen = {}
        for name, c in self.classes.items():
            judged = c.n >= s.min_samples
            deff = c.design_effect() if judged else 1.0
            k, n = effective_counts(c.passed, c.n, deff)
            outcome = quick_outcome(k, n, s.attainment_min, s.confidence)
            seen[name] = (c.n, c.passed, outcome if judged else "undecided")
            self.deff[name] = deff
        self.seen = seen
        outcomes = [o for _, _, o in seen.values()]
        if offset_ns < s.minimum_duration_s * NS:
            self.decision = "undecided"  # no stop, either way, before the minimum window
        elif "fail" in outcomes:
            self.decision = "fail"
        elif all(o == "pass" for o in outcomes) and all(
            n >= (self.sample_gate or 0) for n, _, _ in seen.values()
        ):
            self.decision = "pass"
        elif self._futile(offset_ns):
            self.decision = "futile"
        else:
            self.decision = "undecided"
        return self.decision

    def _futile(self, offset_ns: int) -> bool:
        """Whether some judged class cannot meet the gate by the maximum duration even if every
        request still to come met its SLO (module docstring); records it in
        :attr:`futile_class`."""
        s = self.settings
        if s.maximum_duration_s is None:
            return False
        t, end = offset_ns / NS, s.maximum_duration_s
        if t >= end or t <= s.warmup_s:
            return False
        for name, (n, passed, outcome) in self.seen.items():
            if outcome != "undecided" or n < s.min_samples:
                continue
            final = n * (end - s.warmup_s) / (t - s.warmup_s)
            if (passed + (final - n)) / final < s.attainment_min:
                self.futile_class = (name, final, 1.0)
                return True
        return False

    def _bounds(self, name: str) -> tuple[float, float]:
        n, passed, _ = self.seen[name]
        s = self.settings
        k, m = effective_counts(passed, n, self.deff.get(name, 1.0))
        cs = confidence_sequence(k, m, s.confidence, s.attainment_min)
        return cs if cs is not None else (0.0, 1.0)

    def _bound_words(self, name: str, side: str, op: str) -> str:
        low, high = self._bounds(name)
        bound = low if side == "lower" else high
        return (
            f"{name}: attainment {side} bound {bound:.4f} {op} {self.settings.attainment_min} "
            f"after {self.seen[name][0]} requests (design effect {self.deff.get(name, 1.0):.2f})"
        )

    def reason(self) -> str:
        """The last look's outcome in one line."""
        s, seen = self.settings, self.seen
        if not seen:
            return "no look: the point ended before its first"
        if self.decision == "fail":
            name = next(k for k, (_, _, o) in seen.items() if o == "fail")
            return self._bound_words(name, "upper", "<")
        if self.decision == "futile" and self.futile_class is not None:
            name, final, high = self.futile_class
            n, passed, _ = seen[name]
            return (
                f"futile: {name} cannot meet the gate by the maximum duration "
                f"{s.maximum_duration_s - s.warmup_s:g} s: even if all its about {final - n:.0f} "
                f"remaining requests met the SLO, its attainment at {final:.0f} requests would "
                f"be {(passed + high * (final - n)) / final:.4f} < {s.attainment_min}"
            )
        if self.decision == "pass":
            low = min(seen, key=lambda k: self._bounds(k)[0])
            return (
                f"every class passes, the lowest {self._bound_words(low, 'lower', '>=')}; "
                f"sample gate {self.sample_gate or 0} met, minimum duration "
                f"{s.minimum_duration_s:g} s reached"
            )
        for name, (n, _, outcome) in seen.items():
            if n < s.min_samples:
                return f"{name}: {n} successful < {s.min_samples}, the least a look judges"
            if outcome != "pass":
                low, high = self._bounds(name)
                return (
                    f"{name}: attainment bounds [{low:.4f}, {high:.4f}] straddle "
                    f"{s.attainment_min} after {n} requests"
                )
            if self.sample_gate is not None and n < self.sample_gate:
                return f"{name}: passes, but {n} successful < the sample gate {self.sample_gate}"
        return f"every class passes; the minimum duration {s.minimum_duration_s:g} s not reached"

    def summary(self) -> dict[str, Any]:
        """The summary's ``sequential`` entry, at the counts the last look judged."""
        per_class = {}
        for name, (n, passed, outcome) in self.seen.items():
            low, high = self._bounds(name) if n else (None, None)
            per_class[name] = {
                "n": n,
                "passed": passed,
                "low": low,
                "high": high,
                "outcome": outcome,
                "design_effect": self.deff.get(name, 1.0),
            }
        s = self.settings
        return {
            "decision": self.decision,
            "at_offset_ns": self.at_offset_ns,
            "looks": self.looks,
            "per_class": per_class,
            "reason": self.reason(),
            "method": "confidence sequence (beta-binomial mixture, time-uniform) at the "
            "batch-means effective sample",
            "gate": s.attainment_min,
            "confidence": s.confidence,
            "min_samples": s.min_samples,
            "sample_gate": self.sample_gate,
        }


def extension_lead_ns(block_span_ns: int) -> int:
    """How long before the last queued arrival the next block is decided."""
    return max(int(EXTEND_LEAD_S * NS), int(EXTEND_LEAD_FRACTION * block_span_ns))


def projected_short(
    scheduled: dict[str, int], ok: dict[str, int], terminal: dict[str, int], gate: int | None
) -> list[str]:
    """Classes projected below the sample gate at the schedule's end: ok_c x scheduled_c /
    terminal_c (every scheduled request assumed successful before any has ended)."""
    if gate is None:
        return []
    short = []
    for klass, n in scheduled.items():
        done = terminal.get(klass, 0)
        projected = n * (ok.get(klass, 0) / done) if done else n
        if projected < gate:
            short.append(klass)
    return short


def wants_extension(
    decider: Decider | None, outcome: Decision, projected_short_classes: list[str]
) -> bool:
    """Whether a look near the end of the queued arrivals appends the next block: undecided
    (with an in-run decision), or some class projected short of its sample gate."""
    if decider is not None:
        return outcome == "undecided"
    return bool(projected_short_classes)
