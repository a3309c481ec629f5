"""The gates of a pack, one object each.

The SLO predicate they count (a request within its class's TTFT and TPOT cutoffs) is
:mod:`capacity_pack.vocab.slo`'s.

**The gates.** Each :class:`Gate` carries the ``acceptance`` field of the manifest it reads (its
threshold), the :class:`Statistic` it judges (what is measured, its unit, how it is estimated),
its check and the words of its failure. The per-point analysis, the drill analysis, the alert
thresholds and the gate tables of the docs iterate over :data:`GATES`:

- ``sample_size``, per class: successful_c >= ``min_successful_samples_per_class``; below it the
  class is under-sampled and the point is *inconclusive*, not failed;
- ``class_attainment``, per class, judged only on an adequate sample: attainment_c >=
  ``class_slo_attainment_min``; a pass is *marginal* when the Wilson interval's lower bound of
  attainment_c is under the threshold (it holds on the point estimate only);
- ``class_error_rate`` (optional), per class: (attempted_c - successful_c) / attempted_c <=
  ``per_class_error_rate_max``;
- ``all_attempt_attainment`` (optional), per class: passing_c / attempted_c >=
  ``all_attempt_attainment_min``;
- ``error_rate``, per point: failed / attempted <= ``error_rate_max``, failed being every
  non-``ok`` status;
- ``queue_trend``, per point: the Mann-Kendall queue trend (see
  :mod:`capacity_pack.evidence.statistics`) equals ``queue_trend_required`` (``flat``); an
  undecided trend makes the point *inconclusive*.

A check's outcome is ``pass``, ``marginal`` (a pass on the point estimate only), ``fail`` or
``inconclusive``; a statistic that could not be measured (no attempts, no successes) fails its
gate without a failure message. An optional gate whose field is unset (None) is off. The fields
of ``acceptance`` that are not gates (:data:`NOT_GATES`) say what else reads them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

PASS, MARGINAL, FAIL, INCONCLUSIVE = "pass", "marginal", "fail", "inconclusive"
_OPS: dict[str, Callable[[Any, Any], Any]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
}


# ---------------------------------------------------------------------------------------------
# The gates
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Statistic:
    """What a gate judges: the report key holding it, its unit and how it is estimated."""

    key: str
    unit: str
    estimate: str


@dataclass(frozen=True)
class Gate:
    """One acceptance gate. ``message`` and ``marginal_message`` are format strings over
    ``cls`` (the class, per-class gates), ``value`` (the statistic) and ``threshold``; ``phrase``
    over ``threshold``."""

    name: str
    field: str  # the acceptance field holding the threshold
    scope: Literal["class", "point"]
    statistic: Statistic
    op: Literal[">=", "<=", "=="]
    message: str
    phrase: str  # the pass rule in words, over ``threshold``: "at least {threshold} successful..."
    # The threshold of the analysis of a request log with no manifest (capacity-pack analyze).
    default: Any
    # The report's boolean for this gate per class (None: the point's gate_pass combines it).
    passes_key: str | None = None
    optional: bool = False  # off while its field is None
    requires: str | None = None  # judged only when the gate of that name passes
    undecided: tuple[Any, ...] = ()  # statistic values that make the outcome inconclusive
    inconclusive_on_fail: bool = False  # a failure means too little evidence, not a failure
    interval_key: str | None = None  # the statistic's interval: a pass under its bound is marginal
    marginal_message: str | None = None

    def threshold(self, gates: Gates | Any) -> Any:
        """The threshold in ``gates`` (a :class:`Gates` or a manifest ``acceptance``)."""
        return gates[self.field] if isinstance(gates, Gates) else getattr(gates, self.field)

    def holds(self, value: Any, threshold: Any) -> Any:
        """value <op> threshold, elementwise for arrays and Series; None never holds."""
        if value is None:
            return False
        return _OPS[self.op](value, threshold)

    def judged(self, stats: Mapping[str, Any], gates: Gates) -> bool:
        return self.requires is None or GATE[self.requires].passed(stats, gates)

    def check(self, stats: Mapping[str, Any], gates: Gates) -> str:
        """The outcome on one class's statistics (per-class gates) or the point's."""
        if not self.judged(stats, gates):
            return INCONCLUSIVE
        value, threshold = stats.get(self.statistic.key), self.threshold(gates)
        if value in self.undecided:
            return INCONCLUSIVE
        if not self.holds(value, threshold):
            return INCONCLUSIVE if self.inconclusive_on_fail else FAIL
        if self.interval_key is not None and self.interval_key in stats:
            interval = stats[self.interval_key]
            bound = (interval[0] if self.op == ">=" else interval[1]) if interval else 0.0
            if not self.holds(bound, threshold):
                return MARGINAL
        return PASS

    def passed(self, stats: Mapping[str, Any], gates: Gates) -> bool:
        return self.check(stats, gates) in (PASS, MARGINAL)

    def failure(self, stats: Mapping[str, Any], gates: Gates, cls: str | None = None) -> str | None:
        """The failure in words; None when it passed, was not judged, or has no measured value."""
        value = stats.get(self.statistic.key)
        if value is None or not self.judged(stats, gates) or self.passed(stats, gates):
            return None
        return self.message.format(cls=cls, value=value, threshold=self.threshold(gates))

    def marginal(
        self, stats: Mapping[str, Any], gates: Gates, cls: str | None = None
    ) -> str | None:
        """Why a pass is marginal, in words; None unless the outcome is marginal."""
        if self.marginal_message is None or self.check(stats, gates) != MARGINAL:
            return None
        interval = stats[self.interval_key]
        bound = (interval[0] if self.op == ">=" else interval[1]) if interval else 0.0
        return self.marginal_message.format(cls=cls, value=bound, threshold=self.threshold(gates))


_ATTAINMENT_ESTIMATE = (
    "passing_c / successful_c over the class's measured ok requests, a request passing when it "
    "meets its class SLO; a time-uniform confidence sequence at acceptance.attainment_confidence "
    "(capacity_pack.binomial)"
)
GATES: tuple[Gate, ...] = (
    Gate(
        name="class_attainment",
        field="class_slo_attainment_min",
        scope="class",
        statistic=Statistic("attainment", "fraction of successful requests", _ATTAINMENT_ESTIMATE),
        op=">=",
        message="{cls}: attainment {value:.4f} < {threshold}",
        phrase="joint TTFT+TPOT attainment >= {threshold} among successful requests (with "
        "its confidence sequence's lower bound above it too)",
        default=0.95,
        passes_key="class_slo_pass",
        requires="sample_size",
        interval_key="attainment_ci",
        marginal_message="{cls}: attainment confidence-sequence lower bound {value:.4f} < "
        "{threshold}",
    ),
    Gate(
        name="sample_size",
        field="min_successful_samples_per_class",
        scope="class",
        statistic=Statistic(
            "successful_count", "requests", "count of the class's measured requests with status ok"
        ),
        op=">=",
        message="{cls}: {value} successful < {threshold}",
        phrase="at least {threshold} successful requests",
        default=2000,
        passes_key="sample_adequate",
        inconclusive_on_fail=True,
    ),
    Gate(
        name="class_error_rate",
        field="per_class_error_rate_max",
        scope="class",
        statistic=Statistic(
            "error_rate",
            "fraction of attempts",
            "(attempted_c - successful_c) / attempted_c over the class's measured requests",
        ),
        op="<=",
        message="{cls}: error rate {value:.4f} > {threshold}",
        phrase="an error rate <= {threshold}",
        default=None,
        passes_key="per_class_error_gate_pass",
        optional=True,
    ),
    Gate(
        name="all_attempt_attainment",
        field="all_attempt_attainment_min",
        scope="class",
        statistic=Statistic(
            "all_attempt_attainment",
            "fraction of attempts",
            "passing_c / attempted_c: failed requests count as misses",
        ),
        op=">=",
        message="{cls}: all-attempt attainment {value:.4f} < {threshold}",
        phrase="attainment over all attempts >= {threshold}",
        default=None,
        passes_key="all_attempt_attainment_gate_pass",
        optional=True,
    ),
    Gate(
        name="error_rate",
        field="error_rate_max",
        scope="point",
        statistic=Statistic(
            "error_rate",
            "fraction of attempts",
            "failed / attempted over the point's measured requests, failed = every non-ok status",
        ),
        op="<=",
        message="error rate {value:.4f} > {threshold}",
        phrase="the global error rate is <= {threshold}",
        default=0.01,
    ),
    Gate(
        name="queue_trend",
        field="queue_trend_required",
        scope="point",
        statistic=Statistic(
            "queue_trend",
            "flat, growing or inconclusive",
            "Mann-Kendall test with Theil-Sen slope on the server's queue depth and the client's "
            "due-but-unsent backlog over the steady window; growing if either grows",
        ),
        op="==",
        message="queue trend {value}",
        phrase="the queue trend is {threshold} (Mann-Kendall on queue depth and the client "
        "backlog)",
        default="flat",
        undecided=("inconclusive",),
    ),
)
GATE: dict[str, Gate] = {g.name: g for g in GATES}
CLASS_GATES = tuple(g for g in GATES if g.scope == "class")
POINT_GATES = tuple(g for g in GATES if g.scope == "point")
SAMPLE_SIZE = GATE["sample_size"]
CLASS_ATTAINMENT = GATE["class_attainment"]
ERROR_RATE = GATE["error_rate"]

# The acceptance fields that are not gates, with what reads them (and the analysis default of
# those the analysis reads).
NOT_GATES: dict[str, str] = {
    "p99_min_samples": "reporting: P99 is withheld below this many successful requests of a class",
    "target_utilization": "planning: the utilization the replica plan sizes for",
    "attainment_confidence": "statistics: the confidence of the attainment bound (a confidence "
    "sequence) behind class_attainment's marginal check and the sweep's in-run decisions",
}
ANALYSIS_DEFAULTS: dict[str, Any] = {g.field: g.default for g in GATES} | {
    "p99_min_samples": 10_000,
    "attainment_confidence": 0.95,
}


@dataclass(frozen=True)
class Gates:
    """A pack's gate thresholds (and the analysis's reporting thresholds), by acceptance field;
    with no values, those of a request log analysed without a manifest."""

    values: Mapping[str, Any] = field(default_factory=lambda: dict(ANALYSIS_DEFAULTS))

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def active(self, scope: str) -> tuple[Gate, ...]:
        """The gates of ``scope`` that are on (an optional gate is off while unset)."""
        return tuple(
            g for g in GATES if g.scope == scope and not (g.optional and self[g.field] is None)
        )

    @classmethod
    def of(cls, acceptance: Any) -> Gates:
        """From a manifest's ``acceptance`` (a model or a mapping)."""
        if isinstance(acceptance, Mapping):
            return cls({name: acceptance.get(name) for name in ANALYSIS_DEFAULTS})
        return cls({name: getattr(acceptance, name) for name in ANALYSIS_DEFAULTS})


def pack_gates(pack: Any) -> Gates:
    """The gate thresholds of a :class:`~capacity_pack.plan.manifest.Pack`."""
    return Gates.of(pack.acceptance)


# ---------------------------------------------------------------------------------------------
# The gates in words (docs/reading.md's gate table is this table; a test keeps them equal)
# ---------------------------------------------------------------------------------------------


def markdown_table() -> str:
    """One row per gate: field, scope, statistic, pass rule, what a failure makes the point."""
    lines = [
        "| gate | `acceptance` field | per | statistic (unit) | passes when | otherwise |",
        "|---|---|---|---|---|---|",
    ]
    for g in GATES:
        if g.inconclusive_on_fail:
            otherwise = "inconclusive"
        elif g.undecided:
            values = " or ".join(map(str, g.undecided))
            otherwise = f"fail; inconclusive when {g.statistic.key} is {values}"
        else:
            otherwise = "fail"
        if g.marginal_message:
            side = "lower" if g.op == ">=" else "upper"
            otherwise += f"; marginal when its interval's {side} bound does not pass"
        notes = []
        if g.requires:
            notes.append(f"judged once `{g.requires}` passes")
        if g.optional:
            notes.append("off while unset")
        when = f"{g.statistic.key} {g.op} threshold" + (f" ({'; '.join(notes)})" if notes else "")
        lines.append(
            f"| `{g.name}` | `{g.field}` | {g.scope} | {g.statistic.key} ({g.statistic.unit}): "
            f"{g.statistic.estimate} | {when} | {otherwise} |"
        )
    lines += ["", "Other `acceptance` fields, not gates:", ""]
    lines += [f"- `{name}`: {what}" for name, what in NOT_GATES.items()]
    return "\n".join(lines)
