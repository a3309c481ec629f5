"""The PromQL syntax tree and the language's tables.

Each node knows its result type (``scalar``, ``instant vector``, ``range vector``; see
https://prometheus.io/docs/prometheus/latest/querying/basics/#expression-language-data-types) so
the parser can reject at parse time what Prometheus rejects: ``rate`` of an instant vector,
arithmetic on a range vector, and so on. ``pos`` is a node's offset
in the expression text, for error messages; it takes no part in equality.

Tables (the subset supported):
  - :data:`FUNCTIONS`: each function's argument types, result type and optional trailing
    arguments, after https://prometheus.io/docs/prometheus/latest/querying/functions/.
  - :data:`AGGREGATIONS` (``sum min max avg count group stddev stdvar topk bottomk quantile``);
    ``topk bottomk quantile`` take a scalar parameter first.
  - :data:`PRECEDENCE` of the binary operators, lowest first as in
    https://prometheus.io/docs/prometheus/latest/querying/operators/#binary-operator-precedence:
    ``or`` < ``and unless`` < comparisons < ``+ -`` < ``* / % atan2`` < ``^`` (right-associative).
  - :data:`KEYWORDS` that cannot start an expression.

:class:`VectorMatching` records ``on``/``ignoring`` and ``group_left``/``group_right``
(https://prometheus.io/docs/prometheus/latest/querying/operators/#vector-matching); set operators
always match many-to-many.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from capacity_pack.drills.promql.errors import PromQLError

SCALAR = "scalar"
VECTOR = "instant vector"
MATRIX = "range vector"


@dataclass(frozen=True)
class Node:
    """An expression node; ``pos`` is its offset in the expression text (not compared)."""

    pos: int = field(default=0, compare=False, kw_only=True)

    @property
    def type(self) -> str:
        raise NotImplementedError

    def children(self) -> tuple[Node, ...]:
        return ()

    def walk(self) -> Iterator[Node]:
        """This node and all below it, depth first."""
        yield self
        for child in self.children():
            yield from child.walk()


@dataclass(frozen=True)
class NumberLiteral(Node):
    value: float

    @property
    def type(self) -> str:
        return SCALAR


@dataclass(frozen=True)
class LabelMatcher:
    """``name op "value"``; regex matchers are anchored at both ends as in Prometheus."""

    name: str
    op: str
    value: str
    regex: re.Pattern[str] | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.op not in ("=", "!=", "=~", "!~"):
            raise PromQLError(f"unknown label matcher operator {self.op!r}")
        if self.op in ("=~", "!~"):
            try:
                object.__setattr__(self, "regex", re.compile(self.value))
            except re.error as err:
                raise PromQLError(f"invalid regular expression {self.value!r}: {err.msg}") from err

    def matches(self, value: str) -> bool:
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        assert self.regex is not None
        return (self.regex.fullmatch(value) is not None) == (self.op == "=~")


@dataclass(frozen=True)
class VectorSelector(Node):
    """``name{matchers} offset d``; a given name is also the first matcher (``__name__=``)."""

    name: str | None
    matchers: tuple[LabelMatcher, ...]
    offset_ns: int = 0

    @property
    def type(self) -> str:
        return VECTOR


@dataclass(frozen=True)
class MatrixSelector(Node):
    selector: VectorSelector
    range_ns: int

    @property
    def type(self) -> str:
        return MATRIX

    def children(self) -> tuple[Node, ...]:
        return (self.selector,)


@dataclass(frozen=True)
class Call(Node):
    func: str
    args: tuple[Node, ...]

    @property
    def type(self) -> str:
        return FUNCTIONS[self.func].returns

    def children(self) -> tuple[Node, ...]:
        return self.args


@dataclass(frozen=True)
class Aggregation(Node):
    """``op [by|without (grouping)] ([param,] expr)``; no grouping clause means one group."""

    op: str
    expr: Node
    param: Node | None = None
    grouping: tuple[str, ...] = ()
    without: bool = False

    @property
    def type(self) -> str:
        return VECTOR

    def children(self) -> tuple[Node, ...]:
        return (self.expr,) if self.param is None else (self.param, self.expr)


@dataclass(frozen=True)
class VectorMatching:
    """How two vectors' samples pair up.

    ``card`` is ``one-to-one``, ``many-to-one`` (group_left), ``one-to-many`` (group_right) or
    ``many-to-many`` (set operators). ``on`` selects whether ``labels`` is an on() or an
    ignoring() list; ``include`` holds the group_x labels copied from the "one" side.
    """

    card: str
    on: bool = False
    labels: tuple[str, ...] = ()
    include: tuple[str, ...] = ()


@dataclass(frozen=True)
class BinaryOp(Node):
    op: str
    lhs: Node
    rhs: Node
    return_bool: bool = False
    matching: VectorMatching | None = None

    @property
    def type(self) -> str:
        return SCALAR if self.lhs.type == self.rhs.type == SCALAR else VECTOR

    def children(self) -> tuple[Node, ...]:
        return (self.lhs, self.rhs)


@dataclass(frozen=True)
class UnaryOp(Node):
    op: str
    expr: Node

    @property
    def type(self) -> str:
        return self.expr.type

    def children(self) -> tuple[Node, ...]:
        return (self.expr,)


@dataclass(frozen=True)
class Paren(Node):
    expr: Node

    @property
    def type(self) -> str:
        return self.expr.type

    def children(self) -> tuple[Node, ...]:
        return (self.expr,)


@dataclass(frozen=True)
class FunctionSpec:
    """Argument types, result type and how many trailing arguments may be left out."""

    args: tuple[str, ...]
    returns: str
    optional: int = 0


_RANGE_FUNCTION_NAMES = (
    "rate irate increase delta idelta deriv changes resets avg_over_time min_over_time "
    "max_over_time sum_over_time count_over_time last_over_time present_over_time "
    "stddev_over_time stdvar_over_time absent_over_time"
).split()
# Elementwise functions of one instant vector; functions.MATH_FUNCTIONS implements them.
MATH_FUNCTION_NAMES = ("abs", "ceil", "floor", "exp", "ln", "log2", "log10", "sqrt", "sgn")
FUNCTIONS: dict[str, FunctionSpec] = {
    **{name: FunctionSpec((MATRIX,), VECTOR) for name in _RANGE_FUNCTION_NAMES},
    **{name: FunctionSpec((VECTOR,), VECTOR) for name in MATH_FUNCTION_NAMES},
    "quantile_over_time": FunctionSpec((SCALAR, MATRIX), VECTOR),
    "histogram_quantile": FunctionSpec((SCALAR, VECTOR), VECTOR),
    "clamp": FunctionSpec((VECTOR, SCALAR, SCALAR), VECTOR),
    "clamp_min": FunctionSpec((VECTOR, SCALAR), VECTOR),
    "clamp_max": FunctionSpec((VECTOR, SCALAR), VECTOR),
    "round": FunctionSpec((VECTOR, SCALAR), VECTOR, optional=1),
    "time": FunctionSpec((), SCALAR),
    "vector": FunctionSpec((SCALAR,), VECTOR),
    "scalar": FunctionSpec((VECTOR,), SCALAR),
    "absent": FunctionSpec((VECTOR,), VECTOR),
}

AGGREGATIONS = "sum min max avg count group stddev stdvar topk bottomk quantile".split()
PARAM_AGGREGATIONS = ("topk", "bottomk", "quantile")
SET_OPERATORS = ("and", "or", "unless")
COMPARISONS = ("==", "!=", ">", "<", ">=", "<=")
PRECEDENCE = {
    "or": 1,
    "and": 2,
    "unless": 2,
    **dict.fromkeys(COMPARISONS, 3),
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
    "atan2": 5,
    "^": 6,
}
# Words the lexer of Prometheus reserves; they cannot start an expression.
KEYWORDS = set(
    "and or unless atan2 by without on ignoring group_left group_right bool offset".split()
)
