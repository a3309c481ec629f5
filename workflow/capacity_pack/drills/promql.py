"""A PromQL subset and Prometheus alerting-rule evaluation over the scrapes of a load test.

The pack ships Prometheus alerting rules for the servers' metrics. To say which of those alerts
would have fired during a drill, and when, this module evaluates the *same* rule files over the
series the load generator scraped, with Prometheus' semantics rather than an approximation.

Data (:class:`SeriesStore`)
  A long table ``t_ns, metric, labels, value`` (``labels`` is the sample's label text, e.g.
  ``{engine="0",model_name="m"}``) plus the times of every successful scrape. Each series
  (metric name + label set) is indexed once into sorted numpy arrays, so a selector costs a few
  vectorized binary searches per metric at each evaluation time. A series present in one scrape
  and absent from a later successful scrape gets a staleness marker at that later scrape, as
  Prometheus writes one: instant selectors stop seeing it there (lookback notwithstanding) until it
  reappears, and range selectors skip markers. Failed scrapes are not in the list and so mark
  nothing (Prometheus would mark the target's series stale there as well). Empty label values mean
  "no such label", as in Prometheus; duplicate samples of a series at one time keep the first.

Language (:func:`parse`, a recursive-descent parser into the AST classes below)
  Number literals (decimal, hex, scientific, ``Inf``, ``NaN``); vector selectors with ``=``,
  ``!=``, ``=~``, ``!~`` matchers (regexes fully anchored; the name may be given as a
  ``__name__`` matcher); range selectors ``[30s]``, ``[1m30s]``, ``[500ms]`` (units ms s m h d w
  y); ``offset`` (negative allowed); the functions in ``FUNCTIONS``; the aggregations ``sum min
  max avg count group stddev stdvar topk bottomk quantile`` with ``by``/``without`` before or
  after the arguments; binary operators with Prometheus' precedence (``^`` right-associative and
  binding tighter than unary minus, then ``* / % atan2``, ``+ -``, comparisons, ``and unless``,
  ``or``), the ``bool`` modifier, ``on``/``ignoring`` and ``group_left``/``group_right``. Anything
  else (subqueries, ``@``, ``count_values``, other functions, string-valued expressions) raises
  :class:`PromQLError` with the position and what was expected, as does every parse-time type
  error Prometheus reports (e.g. ``rate`` of an instant vector, scalar comparisons without
  ``bool``).

Evaluation (:func:`evaluate`)
  - An instant selector takes each series' latest sample in ``[t - lookback, t]`` (5 minutes by
    default) unless a staleness marker follows it; a range selector takes the samples in
    ``[t - range, t]``. Both windows include their left end as in Prometheus 2.x (the ``promtool``
    installed here); ``left_open=True`` gives Prometheus 3's ``(t - range, t]``.
  - ``rate``/``increase``/``delta`` need two samples in the range. Counter resets (a value below
    its predecessor) add the predecessor back. The result is extrapolated from the first and last
    sample to the range's boundaries when they lie within 1.1 average sample intervals of them,
    else by half an interval; a counter's start is never extrapolated below zero. The zero point
    caps the extrapolation that rule chose, as current Prometheus does; Prometheus before 2.51
    compared it with the full distance to the range start instead, which differs only when the
    zero point falls between half and 1.1 sample intervals before the first sample.
  - ``histogram_quantile`` interpolates linearly inside the bucket holding the rank, takes the
    lower bound of the ``+Inf`` bucket when the rank falls there, and yields NaN without a
    ``+Inf`` bucket or observations.
  - Arithmetic, functions (except ``last_over_time``), ``bool`` comparisons and aggregations drop
    the metric name; a filtering comparison keeps the left-hand sample, or the vector's sample
    when the other side is a scalar. One-to-one matching uses all labels but the name, or the
    ``on``/``ignoring`` lists, and keeps only the ``on`` labels (drops the ``ignoring`` ones) in
    its result, as Prometheus does.
  - A result is a list of ``(labels, value)`` with ``labels`` a dict (``__name__`` included where
    kept), or a float for a scalar expression.

Rules (:func:`load_rules`, :func:`evaluate_alerts`, :func:`alert_timeline`)
  ``load_rules`` checks a rule file the way ``promtool check rules`` does (required and unknown
  fields, durations, expressions, label and annotation names, string values, unique group names)
  and also rejects duplicate alert names within a group, duplicate YAML keys, recording rules and
  ``limit`` (this evaluator cannot honour them); each error names the group, the rule and the
  problem. ``evaluate_alerts`` runs Prometheus' alert state machine at every evaluation time: an
  instance (expression labels without the name, plus the rule's labels) becomes pending when the
  expression first returns it, fires once it has been continuously active for ``for`` (at once for
  ``for: 0s``), stays firing for ``keep_firing_for`` after it vanishes, and resolves at the first
  evaluation without it; a pending instance that vanishes ends without firing. Label templates are
  not expanded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

NS_PER_S = 1_000_000_000
DEFAULT_LOOKBACK_NS = 300 * NS_PER_S
# Prometheus' default global evaluation_interval, for groups that state none.
DEFAULT_EVAL_INTERVAL_NS = 60 * NS_PER_S

SCALAR = "scalar"
VECTOR = "instant vector"
MATRIX = "range vector"

# A label set as a tuple of (name, value) pairs sorted by name: hashable, cheap to compare.
Labels = tuple[tuple[str, str], ...]

_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class PromQLError(ValueError):
    """A malformed or unsupported expression (with its position), or an evaluation error."""

    def __init__(self, message: str, expr: str | None = None, pos: int | None = None):
        self.message = message
        self.expr = expr
        self.pos = pos
        super().__init__(self._render())

    def _render(self) -> str:
        if self.expr is None or self.pos is None:
            return self.message
        start = self.expr.rfind("\n", 0, self.pos) + 1
        end = self.expr.find("\n", self.pos)
        end = len(self.expr) if end < 0 else end
        line = self.expr.count("\n", 0, self.pos) + 1
        col = self.pos - start + 1
        return (
            f"{self.message} at position {self.pos} (line {line}, column {col})\n"
            f"    {self.expr[start:end]}\n    {' ' * (col - 1)}^"
        )


class RuleFileError(ValueError):
    """A rule file that ``promtool check rules`` (or this evaluator) would reject; lists all."""

    def __init__(self, source: str, errors: Sequence[str]):
        self.source = source
        self.errors = list(errors)
        lines = "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(f"{source}: {len(self.errors)} error(s) in the rule file:\n{lines}")


# ---------------------------------------------------------------------------------------------
# Durations and label text


_DURATION_UNITS = {
    "y": 365 * 86400 * NS_PER_S,
    "w": 7 * 86400 * NS_PER_S,
    "d": 86400 * NS_PER_S,
    "h": 3600 * NS_PER_S,
    "m": 60 * NS_PER_S,
    "s": NS_PER_S,
    "ms": 1_000_000,
}
_DURATION_RE = re.compile("".join(rf"(?:([0-9]+){unit})?" for unit in _DURATION_UNITS))


def parse_duration(text: str) -> int:
    """A Prometheus duration (``1h30m``, ``500ms``, ``0``) in nanoseconds.

    Units are y w d h m s ms, each at most once and in that order, as Prometheus requires.
    """
    if text == "0":
        return 0
    m = _DURATION_RE.fullmatch(text)
    if not text or m is None:
        raise ValueError(f"not a valid duration string: {text!r}")
    return sum(
        int(g) * unit
        for g, unit in zip(m.groups(), _DURATION_UNITS.values(), strict=True)
        if g is not None
    )


_LABEL_PAIR_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*', re.S)
_EXPOSITION_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


def _unescape_label_value(raw: str, text: str) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1) not in _EXPOSITION_ESCAPES:
            raise ValueError(f"invalid escape \\{m.group(1)} in label text {text!r}")
        return _EXPOSITION_ESCAPES[m.group(1)]

    return re.sub(r"\\(.)", one, raw, flags=re.S)


def parse_labels(text: str) -> dict[str, str]:
    """Label text as exposed (``{a="x",b="y\\"z"}``, or empty) -> dict; raises ValueError."""
    body = text.strip()
    if not body:
        return {}
    if len(body) < 2 or body[0] != "{" or body[-1] != "}":
        raise ValueError(f"label text must be enclosed in braces: {text!r}")
    body = body[1:-1]
    out: dict[str, str] = {}
    pos = 0
    while True:
        m = _LABEL_PAIR_RE.match(body, pos)
        if m is None:
            if body[pos:].strip():
                raise ValueError(f"malformed label text {text!r} at {body[pos:]!r}")
            return out
        name = m.group(1)
        if name in out:
            raise ValueError(f"duplicate label {name!r} in {text!r}")
        out[name] = _unescape_label_value(m.group(2), text)
        pos = m.end()
        if pos == len(body):
            return out
        if body[pos] != ",":
            raise ValueError(f"expected ',' between labels in {text!r}")
        pos += 1


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_labels(labels: Mapping[str, str] | Labels) -> str:
    """Canonical label text: sorted by name, values escaped; ``""`` for no labels."""
    items = sorted(labels.items() if isinstance(labels, Mapping) else labels)
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in items) + "}"


def _drop_name(labels: Labels) -> Labels:
    return tuple(p for p in labels if p[0] != "__name__")


# ---------------------------------------------------------------------------------------------
# AST


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
_MATH_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs,
    "ceil": np.ceil,
    "floor": np.floor,
    "exp": np.exp,
    "ln": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "sqrt": np.sqrt,
    "sgn": np.sign,
}
FUNCTIONS: dict[str, FunctionSpec] = {
    **{name: FunctionSpec((MATRIX,), VECTOR) for name in _RANGE_FUNCTION_NAMES},
    **{name: FunctionSpec((VECTOR,), VECTOR) for name in _MATH_FUNCTIONS},
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
_PARAM_AGGREGATIONS = ("topk", "bottomk", "quantile")
_SET_OPERATORS = ("and", "or", "unless")
_COMPARISONS = ("==", "!=", ">", "<", ">=", "<=")
_PRECEDENCE = {
    "or": 1,
    "and": 2,
    "unless": 2,
    **dict.fromkeys(_COMPARISONS, 3),
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
    "atan2": 5,
    "^": 6,
}
# Words the lexer of Prometheus reserves; they cannot start an expression.
_KEYWORDS = set(
    "and or unless atan2 by without on ignoring group_left group_right bool offset".split()
)


# ---------------------------------------------------------------------------------------------
# Lexer


@dataclass(frozen=True)
class _Token:
    kind: str  # num, dur, str, ident, op, eof
    text: str
    pos: int
    value: Any = None


_IDENT_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_DURATION_TOKEN_RE = re.compile(r"(?:[0-9]+(?:ms|[smhdwy]))+")
_HEX_RE = re.compile(r"0[xX][0-9a-fA-F]+")
_FLOAT_RE = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_OPERATORS = ("==", "!=", "=~", "!~", "<=", ">=", *"(){}[],=<>+-*/%^@")
_STRING_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
}


def _is_ident_char(ch: str) -> bool:
    return bool(ch) and (ch in "_:" or ("a" <= ch.lower() <= "z") or "0" <= ch <= "9")


def _lex_string(expr: str, start: int) -> tuple[str, int]:
    quote = expr[start]
    if quote == "`":
        end = expr.find("`", start + 1)
        if end < 0:
            raise PromQLError("unterminated raw string", expr, start)
        return expr[start + 1 : end], end + 1
    out: list[str] = []
    i = start + 1
    while True:
        if i >= len(expr) or expr[i] == "\n":
            raise PromQLError("unterminated quoted string", expr, start)
        ch = expr[i]
        if ch == quote:
            return "".join(out), i + 1
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        esc = expr[i + 1 : i + 2]
        if esc in _STRING_ESCAPES:
            out.append(_STRING_ESCAPES[esc])
            i += 2
        elif esc == quote:
            out.append(quote)
            i += 2
        elif esc and esc in "01234567":
            digits = expr[i + 1 : i + 4]
            if not re.fullmatch(r"[0-7]{3}", digits) or int(digits, 8) > 255:
                raise PromQLError("invalid octal escape in string", expr, i)
            out.append(chr(int(digits, 8)))
            i += 4
        elif esc and esc in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[esc]
            digits = expr[i + 2 : i + 2 + width]
            if not re.fullmatch(rf"[0-9a-fA-F]{{{width}}}", digits):
                raise PromQLError(f"invalid \\{esc} escape in string", expr, i)
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code < 0xE000:
                raise PromQLError("escape sequence is an invalid Unicode code point", expr, i)
            out.append(chr(code))
            i += 2 + width
        else:
            raise PromQLError(f"unknown escape sequence \\{esc}", expr, i)


def _lex(expr: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(expr)
    while i < n:
        ch = expr[i]
        if ch.isspace():
            i += 1
        elif ch == "#":
            nl = expr.find("\n", i)
            i = n if nl < 0 else nl
        elif ch in "\"'`":
            value, end = _lex_string(expr, i)
            tokens.append(_Token("str", expr[i:end], i, value))
            i = end
        elif "0" <= ch <= "9" or (ch == "." and "0" <= expr[i + 1 : i + 2] <= "9"):
            m = _DURATION_TOKEN_RE.match(expr, i)
            # A colon may follow a duration: it opens a subquery step (reported as unsupported).
            after = expr[m.end() : m.end() + 1] if m else ""
            if m and (after == ":" or not _is_ident_char(after)):
                try:
                    value = parse_duration(m.group())
                except ValueError:
                    raise PromQLError(
                        f"bad duration {m.group()!r}: units must run from y to ms, each once",
                        expr,
                        i,
                    ) from None
                tokens.append(_Token("dur", m.group(), i, value))
                i = m.end()
                continue
            m = _HEX_RE.match(expr, i) or _FLOAT_RE.match(expr, i)
            assert m is not None
            if _is_ident_char(expr[m.end() : m.end() + 1]) or expr[m.end() : m.end() + 1] == ".":
                raise PromQLError("bad number or duration syntax", expr, i)
            text = m.group()
            value = float(int(text, 16)) if text[:2].lower() == "0x" else float(text)
            tokens.append(_Token("num", text, i, value))
            i = m.end()
        elif _is_ident_char(ch):
            m = _IDENT_RE.match(expr, i)
            assert m is not None
            tokens.append(_Token("ident", m.group(), i))
            i = m.end()
        else:
            op = next((o for o in _OPERATORS if expr.startswith(o, i)), None)
            if op is None:
                raise PromQLError(f"unexpected character {ch!r}", expr, i)
            tokens.append(_Token("op", op, i))
            i += len(op)
    tokens.append(_Token("eof", "", n))
    return tokens


# ---------------------------------------------------------------------------------------------
# Parser


def _describe(tok: _Token) -> str:
    return "end of input" if tok.kind == "eof" else f'"{tok.text}"'


class _Parser:
    def __init__(self, expr: str):
        self.expr = expr
        self.tokens = _lex(expr)
        self.i = 0

    def error(self, message: str, pos: int) -> PromQLError:
        return PromQLError(message, self.expr, pos)

    def peek(self, k: int = 0) -> _Token:
        return self.tokens[min(self.i + k, len(self.tokens) - 1)]

    def next(self) -> _Token:
        tok = self.peek()
        if tok.kind != "eof":
            self.i += 1
        return tok

    def at_op(self, text: str) -> bool:
        tok = self.peek()
        return tok.kind == "op" and tok.text == text

    def at_word(self, *words: str) -> bool:
        tok = self.peek()
        return tok.kind == "ident" and tok.text.lower() in words

    def expect_op(self, text: str, context: str) -> _Token:
        tok = self.peek()
        if not (tok.kind == "op" and tok.text == text):
            raise self.error(f'expected "{text}" {context}, found {_describe(tok)}', tok.pos)
        return self.next()

    def parse(self) -> Node:
        if self.peek().kind == "eof":
            raise self.error("empty expression", 0)
        node = self.binary(0)
        tok = self.peek()
        if tok.kind != "eof":
            raise self.error(
                f"expected an operator or end of input, found {_describe(tok)}", tok.pos
            )
        return node

    # -- binary operators: precedence climbing ---------------------------------------------

    def binary_operator(self) -> str | None:
        tok = self.peek()
        if tok.kind == "op" and tok.text in _PRECEDENCE:
            return tok.text
        if tok.kind == "ident" and tok.text.lower() in ("and", "or", "unless", "atan2"):
            return tok.text.lower()
        return None

    def binary(self, min_prec: int) -> Node:
        lhs = self.unary()
        while True:
            op = self.binary_operator()
            if op is None or _PRECEDENCE[op] < min_prec:
                return lhs
            optok = self.next()
            return_bool, matching = self.modifiers(op)
            # Only ^ is right-associative: its right operand may contain another ^.
            rhs = self.binary(_PRECEDENCE[op] + (0 if op == "^" else 1))
            lhs = self.make_binary(op, lhs, rhs, return_bool, matching, optok.pos)

    def modifiers(self, op: str) -> tuple[bool, VectorMatching | None]:
        return_bool = False
        if self.at_word("bool"):
            tok = self.next()
            if op not in _COMPARISONS:
                raise self.error("bool modifier can only be used on comparison operators", tok.pos)
            return_bool = True
        if self.at_word("group_left", "group_right"):
            tok = self.peek()
            raise self.error(f"{tok.text} needs a preceding on(...) or ignoring(...)", tok.pos)
        if not self.at_word("on", "ignoring"):
            return return_bool, None
        on = self.next().text.lower() == "on"
        labels = self.label_list("on" if on else "ignoring")
        card, include = "one-to-one", ()
        if self.at_word("group_left", "group_right"):
            gtok = self.next()
            word = gtok.text.lower()
            card = "many-to-one" if word == "group_left" else "one-to-many"
            if self.at_op("("):
                include = self.label_list(word)
            clash = sorted(set(include) & set(labels)) if on else []
            if clash:
                raise self.error(
                    f"label {clash[0]!r} must not occur in ON and GROUP clause at once", gtok.pos
                )
        return return_bool, VectorMatching(card, on, labels, include)

    def make_binary(
        self,
        op: str,
        lhs: Node,
        rhs: Node,
        return_bool: bool,
        matching: VectorMatching | None,
        pos: int,
    ) -> Node:
        for side in (lhs, rhs):
            if side.type not in (SCALAR, VECTOR):
                raise self.error(
                    "binary expression must contain only scalar and instant vector types, "
                    f"got {side.type}",
                    side.pos,
                )
        both_vectors = lhs.type == VECTOR and rhs.type == VECTOR
        if op in _SET_OPERATORS:
            if not both_vectors:
                raise self.error(
                    f"set operator {op!r} not allowed in binary scalar expression", pos
                )
            if matching is not None and matching.card != "one-to-one":
                raise self.error(f"no grouping allowed for {op!r} operation", pos)
        if op in _COMPARISONS and lhs.type == rhs.type == SCALAR and not return_bool:
            raise self.error("comparisons between scalars must use the bool modifier", pos)
        if matching is not None and not both_vectors:
            raise self.error("vector matching is only allowed between instant vectors", pos)
        if both_vectors:
            matching = matching or VectorMatching("one-to-one")
            if op in _SET_OPERATORS:
                matching = replace(matching, card="many-to-many")
        return BinaryOp(op, lhs, rhs, return_bool, matching, pos=pos)

    # -- unary, postfix, primary ------------------------------------------------------------

    def unary(self) -> Node:
        tok = self.peek()
        if tok.kind == "op" and tok.text in ("+", "-"):
            self.next()
            # Unary minus binds like * (so -a^b is -(a^b) and -a*b is (-a)*b), as in Prometheus.
            operand = self.binary(_PRECEDENCE["^"])
            if operand.type not in (SCALAR, VECTOR):
                raise self.error(
                    f"unary expression only allowed on scalars and instant vectors, got "
                    f"{operand.type}",
                    tok.pos,
                )
            if tok.text == "+":
                return operand
            if isinstance(operand, NumberLiteral):
                return NumberLiteral(-operand.value, pos=tok.pos)
            return UnaryOp("-", operand, pos=tok.pos)
        return self.postfix()

    def postfix(self) -> Node:
        node = self.primary()
        if self.at_op("["):
            btok = self.next()
            if not isinstance(node, VectorSelector):
                raise self.error(
                    "ranges are only allowed for vector selectors (subqueries are not supported)",
                    btok.pos,
                )
            dtok = self.peek()
            if dtok.kind != "dur":
                raise self.error(
                    f"expected a duration such as 5m in the range, found {_describe(dtok)}",
                    dtok.pos,
                )
            self.next()
            if dtok.value <= 0:
                raise self.error("range duration must be greater than 0", dtok.pos)
            after = self.peek()
            if after.kind == "ident" and after.text.startswith(":"):
                raise self.error("subqueries are not supported", after.pos)
            self.expect_op("]", "to close the range selector")
            node = MatrixSelector(node, dtok.value, pos=node.pos)
        if self.at_word("offset"):
            otok = self.next()
            if not isinstance(node, VectorSelector | MatrixSelector):
                raise self.error(
                    "offset modifier must follow an instant or range vector selector", otok.pos
                )
            sign = 1
            if self.at_op("-"):
                self.next()
                sign = -1
            dtok = self.peek()
            if dtok.kind != "dur":
                raise self.error(
                    f"expected a duration after offset, found {_describe(dtok)}", dtok.pos
                )
            self.next()
            if isinstance(node, MatrixSelector):
                node = replace(node, selector=replace(node.selector, offset_ns=sign * dtok.value))
            else:
                node = replace(node, offset_ns=sign * dtok.value)
        if self.at_op("@"):
            raise self.error("the @ modifier is not supported", self.peek().pos)
        return node

    def primary(self) -> Node:
        tok = self.peek()
        if tok.kind == "num":
            self.next()
            return NumberLiteral(tok.value, pos=tok.pos)
        if tok.kind == "dur":
            raise self.error(
                f"unexpected duration {tok.text!r}: durations belong in range selectors and "
                "after offset",
                tok.pos,
            )
        if tok.kind == "str":
            raise self.error("string literals are only supported as label matcher values", tok.pos)
        if tok.kind == "op" and tok.text == "(":
            self.next()
            inner = self.binary(0)
            self.expect_op(")", f"to close the parenthesis opened at position {tok.pos}")
            return Paren(inner, pos=tok.pos)
        if tok.kind == "op" and tok.text == "{":
            return self.selector(None, tok.pos)
        if tok.kind == "ident":
            low = tok.text.lower()
            if low in ("inf", "nan"):
                self.next()
                return NumberLiteral(float(low), pos=tok.pos)
            if low == "count_values":
                raise self.error("aggregation count_values is not supported", tok.pos)
            if low in AGGREGATIONS:
                return self.aggregation()
            nxt = self.peek(1)
            if nxt.kind == "op" and nxt.text == "(":
                return self.call()
            if low in _KEYWORDS:
                raise self.error(
                    f"unexpected keyword {tok.text!r}, expected an expression", tok.pos
                )
            self.next()
            return self.selector(tok.text, tok.pos)
        if tok.kind == "eof":
            raise self.error("unexpected end of input, expected an expression", tok.pos)
        raise self.error(f"unexpected {_describe(tok)}, expected an expression", tok.pos)

    def selector(self, name: str | None, pos: int) -> VectorSelector:
        matchers: list[LabelMatcher] = []
        brace_pos = pos
        if self.at_op("{"):
            brace_pos = self.next().pos
            while not self.at_op("}"):
                ltok = self.next()
                if ltok.kind != "ident" or not _LABEL_NAME_RE.fullmatch(ltok.text):
                    raise self.error(
                        f"expected a label name in the label matchers, found {_describe(ltok)}",
                        ltok.pos,
                    )
                otok = self.next()
                if otok.kind != "op" or otok.text not in ("=", "!=", "=~", "!~"):
                    raise self.error(
                        f"expected one of = != =~ !~ after label {ltok.text!r}, found "
                        f"{_describe(otok)}",
                        otok.pos,
                    )
                vtok = self.next()
                if vtok.kind != "str":
                    raise self.error(
                        f"expected a quoted string as the value for label {ltok.text!r}, found "
                        f"{_describe(vtok)}",
                        vtok.pos,
                    )
                try:
                    matchers.append(LabelMatcher(ltok.text, otok.text, vtok.value))
                except PromQLError as err:
                    raise self.error(err.message, vtok.pos) from None
                if self.at_op(","):
                    self.next()
                elif not self.at_op("}"):
                    tok = self.peek()
                    raise self.error(
                        f'expected "," or "}}" in the label matchers, found {_describe(tok)}',
                        tok.pos,
                    )
            self.next()
        if name is not None:
            if any(m.name == "__name__" for m in matchers):
                raise self.error("metric name must not be set twice", brace_pos)
            matchers.insert(0, LabelMatcher("__name__", "=", name))
        if all(m.matches("") for m in matchers):
            raise self.error(
                "vector selector must contain at least one matcher that does not match the "
                "empty string",
                brace_pos,
            )
        return VectorSelector(name, tuple(matchers), pos=pos)

    def label_list(self, context: str) -> tuple[str, ...]:
        self.expect_op("(", f"after {context}")
        names: list[str] = []
        while not self.at_op(")"):
            tok = self.next()
            if tok.kind != "ident" or not _LABEL_NAME_RE.fullmatch(tok.text):
                raise self.error(
                    f"expected a label name in the {context} list, found {_describe(tok)}", tok.pos
                )
            names.append(tok.text)
            if self.at_op(","):
                self.next()
            elif not self.at_op(")"):
                tok = self.peek()
                raise self.error(
                    f'expected "," or ")" in the {context} list, found {_describe(tok)}', tok.pos
                )
        self.next()
        return tuple(names)

    def call(self) -> Call:
        ftok = self.next()
        name = ftok.text
        spec = FUNCTIONS.get(name)
        if spec is None:
            raise self.error(f"unknown or unsupported function {name!r}", ftok.pos)
        self.next()
        args: list[Node] = []
        if not self.at_op(")"):
            args.append(self.binary(0))
            while self.at_op(","):
                self.next()
                args.append(self.binary(0))
        self.expect_op(")", f"to close the call to {name}()")
        most = len(spec.args)
        least = most - spec.optional
        if not least <= len(args) <= most:
            wanted = str(most) if least == most else f"{least} to {most}"
            raise self.error(
                f"expected {wanted} argument(s) in call to {name}(), got {len(args)}", ftok.pos
            )
        for arg, want in zip(args, spec.args, strict=False):
            if arg.type != want:
                raise self.error(
                    f"expected type {want} in call to function {name!r}, got {arg.type}", arg.pos
                )
        return Call(name, tuple(args), pos=ftok.pos)

    def aggregation(self) -> Aggregation:
        atok = self.next()
        op = atok.text.lower()
        grouping: tuple[str, ...] = ()
        without = grouped = False
        if self.at_word("by", "without"):
            without = self.next().text.lower() == "without"
            grouping = self.label_list("without" if without else "by")
            grouped = True
        self.expect_op("(", f"after the aggregation {op}")
        param = None
        if op in _PARAM_AGGREGATIONS:
            param = self.binary(0)
            self.expect_op(",", f"after the parameter of {op}")
        expr = self.binary(0)
        self.expect_op(")", f"to close {op}(...)")
        while self.at_word("by", "without"):
            tok = self.next()
            if grouped:
                raise self.error(f"{op} has two grouping clauses", tok.pos)
            without = tok.text.lower() == "without"
            grouping = self.label_list("without" if without else "by")
            grouped = True
        if param is not None and param.type != SCALAR:
            raise self.error(
                f"expected type scalar as the parameter of {op}, got {param.type}", param.pos
            )
        if expr.type != VECTOR:
            raise self.error(
                f"expected type instant vector in aggregation expression, got {expr.type}",
                expr.pos,
            )
        return Aggregation(op, expr, param, grouping, without, pos=atok.pos)


def parse(expr: str) -> Node:
    """Parse a PromQL expression of the supported subset; raises :class:`PromQLError`."""
    return _Parser(expr).parse()


def selected_metrics(expr: str | Node) -> set[str]:
    """Metric names the expression's selectors name exactly (regex name matchers excluded)."""
    node = parse(expr) if isinstance(expr, str) else expr
    return {
        m.value
        for n in node.walk()
        if isinstance(n, VectorSelector)
        for m in n.matchers
        if m.name == "__name__" and m.op == "="
    }


# ---------------------------------------------------------------------------------------------
# Storage


@dataclass
class _Block:
    """All series of one metric name in CSR form: series ``i`` is ``t[off[i]:off[i+1]]``.

    Every sample and staleness marker time is replaced by its rank in ``times`` and keyed
    ``series * width + rank + 1``; the keys of the whole block are then sorted, so the last sample
    at or before ``q`` of many series at once is a single ``searchsorted``.
    """

    name: str
    labelsets: list[Labels]
    bare_labelsets: list[Labels]
    t: np.ndarray
    v: np.ndarray
    off: np.ndarray
    marker_t: np.ndarray
    marker_off: np.ndarray
    times: np.ndarray
    sample_key: np.ndarray
    marker_key: np.ndarray
    resets: np.ndarray
    _columns: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return len(self.times) + 1

    def position(self, keys: np.ndarray, sids: np.ndarray, q: int, side: str) -> np.ndarray:
        """Per series, the index just past its entries at or before ``q`` (side="right") or
        strictly before ``q`` (side="left")."""
        rank = int(np.searchsorted(self.times, q, side=side))
        return np.searchsorted(keys, sids * self.width + rank, side="right")

    def match(self, matcher: LabelMatcher) -> np.ndarray:
        if matcher.name not in self._columns:
            col = np.array([dict(ls).get(matcher.name, "") for ls in self.labelsets], dtype=object)
            uniq, inverse = np.unique(col, return_inverse=True)
            self._columns[matcher.name] = (uniq, inverse)
        uniq, inverse = self._columns[matcher.name]
        hits = np.fromiter((matcher.matches(u) for u in uniq), dtype=bool, count=len(uniq))
        return hits[inverse]


class SeriesStore:
    """Scraped series indexed for PromQL evaluation; build it with :meth:`from_frame`."""

    def __init__(self, blocks: dict[str, _Block], scrape_t_ns: np.ndarray):
        self._blocks = blocks
        self.scrape_t_ns = scrape_t_ns
        self._select_cache: dict[tuple[LabelMatcher, ...], list[tuple[_Block, np.ndarray]]] = {}

    @classmethod
    def from_frame(
        cls, samples: pd.DataFrame, scrape_t_ns: Sequence[int] | np.ndarray | None = None
    ) -> SeriesStore:
        """Index ``samples`` (``t_ns, metric, labels, value``) once.

        ``scrape_t_ns`` lists every successful scrape; a series absent from one after being
        present is stale from that scrape on. Without it, every distinct sample time counts as a
        scrape.
        """
        missing = {"t_ns", "metric", "labels", "value"} - set(samples.columns)
        if missing:
            raise ValueError(f"samples lack column(s) {sorted(missing)}")
        t = samples["t_ns"].to_numpy(dtype=np.int64)
        v = samples["value"].to_numpy(dtype=np.float64)
        metric = samples["metric"].astype(str).to_numpy(dtype=object)
        label_text = samples["labels"].fillna("").astype(str).to_numpy(dtype=object)
        scrapes = np.unique(
            np.asarray(scrape_t_ns if scrape_t_ns is not None else t, dtype=np.int64)
        )
        if len(t) == 0:
            return cls({}, scrapes)

        # Different texts of one label set (order, spacing) must land in one series.
        text_codes, texts = pd.factorize(label_text)
        canon_index: dict[Labels, int] = {}
        text_to_canon = np.empty(len(texts), dtype=np.int64)
        for i, text in enumerate(texts):
            try:
                parsed = parse_labels(text)
            except ValueError as err:
                raise ValueError(f"samples: {err}") from None
            parsed.pop("__name__", None)
            labels = tuple(sorted((k, val) for k, val in parsed.items() if val != ""))
            text_to_canon[i] = canon_index.setdefault(labels, len(canon_index))
        canon_list = list(canon_index)
        metric_codes, metric_names = pd.factorize(metric)
        n_canon = len(canon_list)
        series_key = metric_codes.astype(np.int64) * n_canon + text_to_canon[text_codes]
        uniq_keys, sid = np.unique(series_key, return_inverse=True)
        order = np.lexsort((t, sid))
        t, v, sid = t[order], v[order], sid[order]
        first = np.ones(len(t), dtype=bool)
        first[1:] = (sid[1:] != sid[:-1]) | (t[1:] != t[:-1])
        t, v, sid = t[first], v[first], sid[first]
        n_series = len(uniq_keys)
        off = np.searchsorted(sid, np.arange(n_series + 1))

        # A marker goes at the first scrape after a sample unless the series has a sample there.
        nxt = np.searchsorted(scrapes, t, side="right")
        has_next = nxt < len(scrapes)
        nxt_t = scrapes[np.minimum(nxt, len(scrapes) - 1)]
        next_sample_t = np.empty_like(t)
        next_sample_t[:-1] = t[1:]
        last_of_series = np.zeros(len(t), dtype=bool)
        last_of_series[off[1:] - 1] = True
        is_marker = has_next & (last_of_series | (nxt_t < next_sample_t))
        marker_t, marker_sid = nxt_t[is_marker], sid[is_marker]

        series_metric = uniq_keys // n_canon
        series_canon = uniq_keys % n_canon
        metric_bounds = np.searchsorted(series_metric, np.arange(len(metric_names) + 1))
        blocks: dict[str, _Block] = {}
        for m, name in enumerate(metric_names):
            s0, s1 = int(metric_bounds[m]), int(metric_bounds[m + 1])
            a, b = int(off[s0]), int(off[s1])
            bt, bv, bsid = t[a:b], v[a:b], sid[a:b] - s0
            ma, mb = np.searchsorted(marker_sid, [s0, s1])
            bmt, bmsid = marker_t[ma:mb], marker_sid[ma:mb] - s0
            times = np.unique(np.concatenate([bt, bmt]))
            width = len(times) + 1
            bare = [canon_list[c] for c in series_canon[s0:s1]]
            same_series = np.zeros(len(bt), dtype=bool)
            same_series[1:] = bsid[1:] == bsid[:-1]
            dropped = np.zeros(len(bt), dtype=bool)
            dropped[1:] = bv[1:] < bv[:-1]
            blocks[name] = _Block(
                name=name,
                labelsets=[tuple(sorted((*ls, ("__name__", name)))) for ls in bare],
                bare_labelsets=bare,
                t=bt,
                v=bv,
                off=off[s0 : s1 + 1] - a,
                marker_t=bmt,
                marker_off=np.searchsorted(bmsid, np.arange(s1 - s0 + 1)),
                times=times,
                sample_key=bsid * width + np.searchsorted(times, bt) + 1,
                marker_key=bmsid * width + np.searchsorted(times, bmt) + 1,
                resets=np.nonzero(same_series & dropped)[0],
            )
        return cls(blocks, scrapes)

    @property
    def metric_names(self) -> list[str]:
        return sorted(self._blocks)

    @property
    def series_count(self) -> int:
        return sum(len(b.labelsets) for b in self._blocks.values())

    def select(self, matchers: tuple[LabelMatcher, ...]) -> list[tuple[_Block, np.ndarray]]:
        """The series matching all matchers, per metric block (time-independent, cached)."""
        cached = self._select_cache.get(matchers)
        if cached is not None:
            return cached
        exact = [m.value for m in matchers if m.name == "__name__" and m.op == "="]
        if exact:
            block = self._blocks.get(exact[0])
            candidates = [block] if block is not None else []
        else:
            candidates = list(self._blocks.values())
        out = []
        for block in candidates:
            if not all(m.matches(block.name) for m in matchers if m.name == "__name__"):
                continue
            mask = np.ones(len(block.labelsets), dtype=bool)
            for m in matchers:
                if m.name != "__name__":
                    mask &= block.match(m)
            sids = np.nonzero(mask)[0]
            if len(sids):
                out.append((block, sids))
        self._select_cache[matchers] = out
        return out


# ---------------------------------------------------------------------------------------------
# Range-vector functions (vectorized over the series of one block)


@dataclass
class _Window:
    """The samples of ``sids`` in ``[start, end]``: series ``i`` is ``block.v[lo[i]:hi[i]]``."""

    block: _Block
    sids: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    start: int
    end: int
    range_ns: int


def _segments(ufunc: np.ufunc, values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``ufunc`` reduced over each non-empty ``values[lo[i]:hi[i]]``."""
    if len(lo) == 0:
        return np.empty(0)
    idx = np.empty(2 * len(lo), dtype=np.intp)
    idx[0::2] = lo
    idx[1::2] = hi
    # reduceat reduces idx[j]:idx[j+1]; the odd slots only bound the even ones.
    return ufunc.reduceat(np.append(values, 0.0), idx)[0::2]


def _per_series(
    fn: Callable[[np.ndarray], float], values: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    return np.array([fn(values[a:b]) for a, b in zip(lo, hi, strict=True)], dtype=float)


def _extrapolated(win: _Window, counter: bool, per_second: bool) -> tuple[np.ndarray, np.ndarray]:
    b = win.block
    n = win.hi - win.lo
    keep = n >= 2
    lo, hi, n = win.lo[keep], win.hi[keep], n[keep]
    first, last = b.v[lo], b.v[hi - 1]
    result = last - first
    if counter and len(b.resets):
        r0 = np.searchsorted(b.resets, lo + 1)
        r1 = np.searchsorted(b.resets, hi)
        # Added one by one in time order, so the sum rounds as Prometheus' loop does.
        for k in np.nonzero(r1 > r0)[0]:
            for i in b.resets[r0[k] : r1[k]]:
                result[k] += b.v[i - 1]
    tf, tl = b.t[lo], b.t[hi - 1]
    sampled = (tl - tf) / NS_PER_S
    avg = sampled / (n - 1)
    threshold = avg * 1.1
    to_start = (tf - win.start) / NS_PER_S
    to_end = (win.end - tl) / NS_PER_S
    to_start = np.where(to_start < threshold, to_start, avg / 2)
    to_end = np.where(to_end < threshold, to_end, avg / 2)
    if counter:
        with np.errstate(divide="ignore", invalid="ignore"):
            to_zero = sampled * (first / result)
        cap = (result > 0) & (first >= 0) & (to_zero < to_start)
        to_start = np.where(cap, to_zero, to_start)
    factor = (sampled + to_start + to_end) / sampled
    if per_second:
        factor = factor / (win.range_ns / NS_PER_S)
    return keep, result * factor


def _instant_delta(win: _Window, per_second: bool) -> tuple[np.ndarray, np.ndarray]:
    b = win.block
    keep = (win.hi - win.lo) >= 2
    hi = win.hi[keep]
    last, prev = b.v[hi - 1], b.v[hi - 2]
    if not per_second:
        return keep, last - prev
    # irate treats a drop as a counter reset: the increase is the new value itself.
    delta = np.where(last < prev, last, last - prev)
    return keep, delta / ((b.t[hi - 1] - b.t[hi - 2]) / NS_PER_S)


def _deriv(win: _Window) -> tuple[np.ndarray, np.ndarray]:
    b = win.block
    keep = (win.hi - win.lo) >= 2

    def slope(bounds: tuple[int, int]) -> float:
        x = (b.t[bounds[0] : bounds[1]] - b.t[bounds[0]]) / NS_PER_S
        y = b.v[bounds[0] : bounds[1]]
        dx = x - x.mean()
        return float((dx * (y - y.mean())).sum() / (dx * dx).sum())

    pairs = zip(win.lo[keep], win.hi[keep], strict=True)
    return keep, np.array([slope(p) for p in pairs], dtype=float)


def _changes(values: np.ndarray) -> float:
    prev, cur = values[:-1], values[1:]
    return float(np.count_nonzero((prev != cur) & ~(np.isnan(prev) & np.isnan(cur))))


def _resets(values: np.ndarray) -> float:
    return float(np.count_nonzero(values[1:] < values[:-1]))


_OVER_TIME: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "sum_over_time": lambda v, lo, hi: _segments(np.add, v, lo, hi),
    "avg_over_time": lambda v, lo, hi: _segments(np.add, v, lo, hi) / (hi - lo),
    "min_over_time": lambda v, lo, hi: _segments(np.fmin, v, lo, hi),
    "max_over_time": lambda v, lo, hi: _segments(np.fmax, v, lo, hi),
    "count_over_time": lambda v, lo, hi: (hi - lo).astype(float),
    "last_over_time": lambda v, lo, hi: v[hi - 1],
    "present_over_time": lambda v, lo, hi: np.ones(len(lo)),
    "stddev_over_time": lambda v, lo, hi: _per_series(np.std, v, lo, hi),
    "stdvar_over_time": lambda v, lo, hi: _per_series(np.var, v, lo, hi),
    "changes": lambda v, lo, hi: _per_series(_changes, v, lo, hi),
    "resets": lambda v, lo, hi: _per_series(_resets, v, lo, hi),
}


def _over_time(win: _Window, reduce: Callable) -> tuple[np.ndarray, np.ndarray]:
    keep = win.hi > win.lo
    return keep, reduce(win.block.v, win.lo[keep], win.hi[keep])


_RANGE_IMPLS: dict[str, Callable[[_Window], tuple[np.ndarray, np.ndarray]]] = {
    "rate": partial(_extrapolated, counter=True, per_second=True),
    "increase": partial(_extrapolated, counter=True, per_second=False),
    "delta": partial(_extrapolated, counter=False, per_second=False),
    "irate": partial(_instant_delta, per_second=True),
    "idelta": partial(_instant_delta, per_second=False),
    "deriv": _deriv,
    **{name: partial(_over_time, reduce=fn) for name, fn in _OVER_TIME.items()},
}


# ---------------------------------------------------------------------------------------------
# Instant-vector helpers


def _quantile(phi: float, values: Sequence[float] | np.ndarray) -> float:
    """Prometheus' quantile: rank phi * (n - 1), linear between the neighbouring values."""
    if len(values) == 0 or math.isnan(phi):
        return math.nan
    if phi < 0:
        return -math.inf
    if phi > 1:
        return math.inf
    ordered = np.sort(np.asarray(values, dtype=float))
    rank = phi * (len(ordered) - 1)
    lower = max(0, math.floor(rank))
    upper = min(len(ordered) - 1, lower + 1)
    weight = rank - math.floor(rank)
    return float(ordered[lower] * (1 - weight) + ordered[upper] * weight)


def _div(a: float, b: float) -> float:
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(a) / np.float64(b))


def _bucket_quantile(phi: float, buckets: list[tuple[float, float]]) -> float:
    if math.isnan(phi):
        return math.nan
    if phi < 0:
        return -math.inf
    if phi > 1:
        return math.inf
    buckets = sorted(buckets, key=lambda b: b[0])
    if buckets[-1][0] != math.inf:
        return math.nan
    bounds: list[float] = []
    counts: list[float] = []
    for bound, count in buckets:
        # Equal bounds (e.g. "1" and "1.0") are one bucket.
        if bounds and bounds[-1] == bound:
            counts[-1] += count
        else:
            bounds.append(bound)
            counts.append(count)
    # Scrapes of cumulative buckets are not atomic; a smaller count above a larger one is noise.
    for i in range(1, len(counts)):
        counts[i] = max(counts[i], counts[i - 1])
    if len(bounds) < 2:
        return math.nan
    total = counts[-1]
    if total == 0:
        return math.nan
    rank = phi * total
    b = next((i for i in range(len(counts) - 1) if counts[i] >= rank), len(counts) - 1)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * _div(rank, count)


def _histogram_quantile(phi: float, vec: list[tuple[Labels, float]]) -> list[tuple[Labels, float]]:
    groups: dict[Labels, list[tuple[float, float]]] = {}
    for labels, value in vec:
        le = next((val for key, val in labels if key == "le"), None)
        try:
            bound = float(le) if le is not None else None
        except ValueError:
            bound = None
        if bound is None:
            continue
        key = tuple(p for p in labels if p[0] not in ("le", "__name__"))
        groups.setdefault(key, []).append((bound, value))
    return [(key, _bucket_quantile(phi, buckets)) for key, buckets in groups.items()]


def _absent_labels(node: Node) -> Labels:
    """Labels of absent()'s sample: the arg's equality matchers, unless a name is constrained
    twice (Prometheus cannot know which value to report then)."""
    if isinstance(node, MatrixSelector):
        node = node.selector
    if not isinstance(node, VectorSelector):
        return ()
    values: dict[str, str] = {}
    ambiguous: set[str] = set()
    for m in node.matchers:
        if m.name == "__name__":
            continue
        if m.op == "=" and m.name not in values:
            values[m.name] = m.value
        else:
            ambiguous.add(m.name)
    return tuple(sorted((k, v) for k, v in values.items() if k not in ambiguous and v != ""))


def _signature(labels: Labels, on: bool, names: frozenset[str]) -> Labels:
    if on:
        return tuple(p for p in labels if p[0] in names)
    return tuple(p for p in labels if p[0] != "__name__" and p[0] not in names)


_CMP_UFUNCS = {
    "==": np.equal,
    "!=": np.not_equal,
    ">": np.greater,
    "<": np.less,
    ">=": np.greater_equal,
    "<=": np.less_equal,
}
_ARITH_UFUNCS = {
    "+": np.add,
    "-": np.subtract,
    "*": np.multiply,
    "/": np.divide,
    "%": np.fmod,  # C fmod = Go math.Mod: the sign of the dividend, NaN for x % 0
    "^": np.power,
    "atan2": np.arctan2,
}


def _apply(op: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, keep): a comparison yields its left operand and the comparison's outcome."""
    with np.errstate(all="ignore"):
        if op in _CMP_UFUNCS:
            keep = _CMP_UFUNCS[op](a, b)
            return np.broadcast_to(a, keep.shape), keep
        values = _ARITH_UFUNCS[op](a, b)
        return values, np.ones(np.shape(values), dtype=bool)


def _unique(vec: list[tuple[Labels, float]]) -> list[tuple[Labels, float]]:
    seen: set[Labels] = set()
    for labels, _ in vec:
        if labels in seen:
            raise PromQLError(
                f"vector cannot contain metrics with the same labelset {format_labels(labels)}"
            )
        seen.add(labels)
    return vec


# ---------------------------------------------------------------------------------------------
# Evaluator

_Value = float | list[tuple[Labels, float]]


class _Evaluator:
    def __init__(self, store: SeriesStore, t_ns: int, lookback_ns: int, left_open: bool):
        self.store = store
        self.t = int(t_ns)
        self.lookback = int(lookback_ns)
        self.left_open = left_open

    def eval(self, node: Node) -> _Value:
        match node:
            case NumberLiteral():
                return float(node.value)
            case Paren():
                return self.eval(node.expr)
            case VectorSelector():
                return self.instant(node)
            case Call():
                return self.call(node)
            case Aggregation():
                return self.aggregate(node)
            case BinaryOp():
                return self.binary(node)
            case UnaryOp():
                value = self.eval(node.expr)
                if isinstance(value, float):
                    return -value
                return _unique([(_drop_name(ls), -v) for ls, v in value])
        raise PromQLError(f"a {node.type} can only be a function argument")

    def scalar(self, node: Node) -> float:
        value = self.eval(node)
        assert isinstance(value, float)
        return value

    def vector(self, node: Node) -> list[tuple[Labels, float]]:
        value = self.eval(node)
        assert isinstance(value, list)
        return value

    # -- selectors ----------------------------------------------------------------------------

    def instant(self, sel: VectorSelector) -> list[tuple[Labels, float]]:
        q = self.t - sel.offset_ns
        oldest = q - self.lookback
        out: list[tuple[Labels, float]] = []
        for block, sids in self.store.select(sel.matchers):
            end = block.position(block.sample_key, sids, q, "right")
            has = end > block.off[sids]
            idx = np.where(has, end - 1, 0)
            ts = block.t[idx]
            ok = has & ((ts > oldest) if self.left_open else (ts >= oldest))
            if len(block.marker_t):
                mend = block.position(block.marker_key, sids, q, "right")
                mhas = mend > block.marker_off[sids]
                mts = block.marker_t[np.where(mhas, mend - 1, 0)]
                ok &= ~(mhas & (mts > ts))
            for s, i in zip(sids[ok], idx[ok], strict=True):
                out.append((block.labelsets[s], float(block.v[i])))
        return out

    def windows(self, msel: MatrixSelector) -> list[_Window]:
        end = self.t - msel.selector.offset_ns
        start = end - msel.range_ns
        out = []
        for block, sids in self.store.select(msel.selector.matchers):
            lo = block.position(
                block.sample_key, sids, start, "right" if self.left_open else "left"
            )
            hi = block.position(block.sample_key, sids, end, "right")
            out.append(_Window(block, sids, lo, hi, start, end, msel.range_ns))
        return out

    # -- functions ----------------------------------------------------------------------------

    def call(self, node: Call) -> _Value:
        name, args = node.func, node.args
        if name in _RANGE_IMPLS or name == "quantile_over_time":
            impl = _RANGE_IMPLS.get(name)
            if impl is None:
                phi = self.scalar(args[0])
                impl = partial(_over_time, reduce=partial(_per_series_quantile, phi))
            assert isinstance(args[-1], MatrixSelector)
            keep_name = name == "last_over_time"
            out = []
            for win in self.windows(args[-1]):
                mask, values = impl(win)
                sets = win.block.labelsets if keep_name else win.block.bare_labelsets
                for s, val in zip(win.sids[mask], values, strict=True):
                    out.append((sets[s], float(val)))
            return _unique(out)
        if name == "absent_over_time":
            assert isinstance(args[0], MatrixSelector)
            if any(np.any(w.hi > w.lo) for w in self.windows(args[0])):
                return []
            return [(_absent_labels(args[0]), 1.0)]
        if name == "absent":
            return [] if self.vector(args[0]) else [(_absent_labels(args[0]), 1.0)]
        if name == "histogram_quantile":
            phi = self.scalar(args[0])
            return _unique(_histogram_quantile(phi, self.vector(args[1])))
        if name == "time":
            return self.t / NS_PER_S
        if name == "vector":
            return [((), self.scalar(args[0]))]
        if name == "scalar":
            vec = self.vector(args[0])
            return vec[0][1] if len(vec) == 1 else math.nan
        vec = self.vector(args[0])
        values = np.array([v for _, v in vec], dtype=float)
        params = [self.scalar(a) for a in args[1:]]
        with np.errstate(all="ignore"):
            if name in _MATH_FUNCTIONS:
                result = _MATH_FUNCTIONS[name](values)
            elif name == "clamp":
                if params[0] > params[1]:
                    return []
                result = np.maximum(params[0], np.minimum(params[1], values))
            elif name == "clamp_min":
                result = np.maximum(values, params[0])
            elif name == "clamp_max":
                result = np.minimum(values, params[0])
            elif name == "round":
                inverse = 1.0 / (params[0] if params else 1.0)
                result = np.floor(values * inverse + 0.5) / inverse
            else:  # pragma: no cover - the parser admits only known functions
                raise PromQLError(f"function {name!r} is not implemented")
        return _unique([(_drop_name(ls), float(r)) for (ls, _), r in zip(vec, result, strict=True)])

    # -- aggregation --------------------------------------------------------------------------

    def aggregate(self, node: Aggregation) -> list[tuple[Labels, float]]:
        vec = self.vector(node.expr)
        param = self.scalar(node.param) if node.param is not None else math.nan
        names = frozenset(node.grouping)
        groups: dict[Labels, list[tuple[Labels, float]]] = {}
        for labels, value in vec:
            if node.without:
                key = tuple(p for p in labels if p[0] != "__name__" and p[0] not in names)
            else:
                key = tuple(p for p in labels if p[0] in names)
            groups.setdefault(key, []).append((labels, value))
        op = node.op
        if op in ("topk", "bottomk"):
            if math.isnan(param) or param < 1:
                return []
            k = int(min(param, len(vec)))
            top = op == "topk"
            out = []
            for members in groups.values():
                # NaN ranks last either way, as in Prometheus.
                ranked = sorted(members, key=lambda s: (math.isnan(s[1]), -s[1] if top else s[1]))
                out.extend(ranked[:k])
            return out
        out = []
        for key, members in groups.items():
            values = np.array([v for _, v in members], dtype=float)
            out.append((key, _aggregate_values(op, values, param)))
        return out

    # -- binary operators ---------------------------------------------------------------------

    def binary(self, node: BinaryOp) -> _Value:
        lhs, rhs = self.eval(node.lhs), self.eval(node.rhs)
        op = node.op
        if isinstance(lhs, float) and isinstance(rhs, float):
            values, keep = _apply(op, np.float64(lhs), np.float64(rhs))
            if op in _COMPARISONS:
                return 1.0 if bool(keep) else 0.0
            return float(values)
        if isinstance(lhs, list) and isinstance(rhs, list):
            assert node.matching is not None
            if op in _SET_OPERATORS:
                return _set_operation(op, lhs, rhs, node.matching)
            return _unique(_vector_binary(op, lhs, rhs, node.matching, node.return_bool))
        scalar_left = isinstance(lhs, float)
        vec = rhs if scalar_left else lhs
        scalar = lhs if scalar_left else rhs
        assert isinstance(vec, list) and isinstance(scalar, float)
        vals = np.array([v for _, v in vec], dtype=float)
        a, b = (np.float64(scalar), vals) if scalar_left else (vals, np.float64(scalar))
        values, keep = _apply(op, a, b)
        out: list[tuple[Labels, float]] = []
        if op not in _COMPARISONS:
            out = [(_drop_name(ls), float(x)) for (ls, _), x in zip(vec, values, strict=True)]
        elif node.return_bool:
            out = [(_drop_name(ls), float(k)) for (ls, _), k in zip(vec, keep, strict=True)]
        else:
            # The vector's own sample survives the filter, whichever side the scalar is on.
            out = [s for s, k in zip(vec, keep, strict=True) if k]
        return _unique(out)


def _per_series_quantile(phi: float, v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return _per_series(partial(_quantile, phi), v, lo, hi)


def _aggregate_values(op: str, values: np.ndarray, param: float) -> float:
    if op == "sum":
        total = 0.0
        for x in values:
            total += float(x)
        return total
    if op == "avg":
        return float(values.sum() / len(values))
    if op == "count":
        return float(len(values))
    if op == "group":
        return 1.0
    if op == "min":
        return float(np.fmin.reduce(values))
    if op == "max":
        return float(np.fmax.reduce(values))
    if op == "stddev":
        return float(np.std(values))
    if op == "stdvar":
        return float(np.var(values))
    if op == "quantile":
        return _quantile(param, values)
    raise PromQLError(f"aggregation {op!r} is not implemented")  # pragma: no cover


def _set_operation(
    op: str,
    lhs: list[tuple[Labels, float]],
    rhs: list[tuple[Labels, float]],
    matching: VectorMatching,
) -> list[tuple[Labels, float]]:
    names = frozenset(matching.labels)

    def sig(labels: Labels) -> Labels:
        return _signature(labels, matching.on, names)

    if op == "or":
        left = {sig(ls) for ls, _ in lhs}
        return lhs + [s for s in rhs if sig(s[0]) not in left]
    right = {sig(ls) for ls, _ in rhs}
    if op == "and":
        return [s for s in lhs if sig(s[0]) in right]
    return [s for s in lhs if sig(s[0]) not in right]


def _vector_binary(
    op: str,
    lhs: list[tuple[Labels, float]],
    rhs: list[tuple[Labels, float]],
    matching: VectorMatching,
    return_bool: bool,
) -> list[tuple[Labels, float]]:
    if not lhs or not rhs:
        return []
    names = frozenset(matching.labels)
    swapped = matching.card == "one-to-many"
    # Pair from the "many" side; the other side must be unique per signature.
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    by_sig: dict[Labels, tuple[Labels, float]] = {}
    for labels, value in one:
        sig = _signature(labels, matching.on, names)
        if sig in by_sig:
            side = "left" if swapped else "right"
            raise PromQLError(
                f"found duplicate series for the match group {format_labels(sig) or '{}'} on the "
                f"{side} hand-side of the operation: [{format_labels(by_sig[sig][0])}, "
                f"{format_labels(labels)}]; many-to-many matching not allowed: matching labels "
                "must be unique on one side"
            )
        by_sig[sig] = (labels, value)
    pairs = []
    for labels, value in many:
        sig = _signature(labels, matching.on, names)
        other = by_sig.get(sig)
        if other is not None:
            pairs.append((sig, (labels, value), other))
    if not pairs:
        return []
    many_vals = np.array([p[1][1] for p in pairs], dtype=float)
    one_vals = np.array([p[2][1] for p in pairs], dtype=float)
    a, b = (one_vals, many_vals) if swapped else (many_vals, one_vals)
    values, keep = _apply(op, a, b)
    drop_name = op not in _COMPARISONS or return_bool
    out: list[tuple[Labels, float]] = []
    matched: dict[Labels, set[Labels]] = {}
    for (sig, (labels, _), (one_labels, _)), value, kept in zip(pairs, values, keep, strict=True):
        if return_bool:
            value = 1.0 if kept else 0.0
        elif not kept:
            continue
        result = dict(labels)
        if drop_name:
            result.pop("__name__", None)
        if matching.card == "one-to-one":
            if matching.on:
                result = {k: v for k, v in result.items() if k in names}
            else:
                result = {k: v for k, v in result.items() if k not in names}
        one_dict = dict(one_labels)
        for name in matching.include:
            if one_dict.get(name):
                result[name] = one_dict[name]
            else:
                result.pop(name, None)
        result_labels = tuple(sorted(result.items()))
        seen = matched.setdefault(sig, set())
        if matching.card == "one-to-one":
            if seen:
                raise PromQLError(
                    "multiple matches for labels: many-to-one matching must be explicit "
                    f"(group_left/group_right); match group {format_labels(sig) or '{}'}"
                )
        elif result_labels in seen:
            raise PromQLError(
                "multiple matches for labels: grouping labels must ensure unique matches; "
                f"match group {format_labels(sig) or '{}'}"
            )
        seen.add(result_labels)
        out.append((result_labels, float(value)))
    return out


def evaluate(
    expr: str | Node,
    store: SeriesStore,
    t_ns: int,
    *,
    lookback_ns: int = DEFAULT_LOOKBACK_NS,
    left_open: bool = False,
) -> list[tuple[dict[str, str], float]] | float:
    """Evaluate ``expr`` at ``t_ns``: a list of ``(labels, value)`` or, for a scalar, a float."""
    node = parse(expr) if isinstance(expr, str) else expr
    result = _evaluate_node(node, store, t_ns, lookback_ns, left_open)
    if isinstance(result, list):
        return [(dict(labels), value) for labels, value in result]
    return result


def _evaluate_node(
    node: Node, store: SeriesStore, t_ns: int, lookback_ns: int, left_open: bool
) -> _Value:
    if node.type not in (SCALAR, VECTOR):
        raise PromQLError(f"expression must be an instant vector or a scalar, not a {node.type}")
    return _Evaluator(store, t_ns, lookback_ns, left_open).eval(node)


# ---------------------------------------------------------------------------------------------
# Rule files


@dataclass(frozen=True)
class AlertRule:
    """One alerting rule, validated; ``node`` is the parsed ``expr``."""

    alert: str
    expr: str
    for_s: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    group: str = ""
    keep_firing_for_s: float = 0.0
    interval_s: float | None = None
    node: Node = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.node is None:
            object.__setattr__(self, "node", parse(self.expr))

    @property
    def for_ns(self) -> int:
        return round(self.for_s * NS_PER_S)

    @property
    def keep_firing_for_ns(self) -> int:
        return round(self.keep_firing_for_s * NS_PER_S)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys, as Prometheus' YAML decoding does."""


def _construct_unique_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)

_GROUP_FIELDS = {"name", "interval", "rules", "limit"}
_RULE_FIELDS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


def _duration_field(value: Any, what: str, errors: list[str], where: str) -> float:
    # YAML reads "for: 0" as an int; Prometheus accepts it (and only it) without a unit.
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(text, str):
        try:
            return parse_duration(text) / NS_PER_S
        except ValueError:
            pass
    errors.append(f"{where}: {what}: {value!r} is not a valid duration (e.g. 30s, 5m, 1h30m)")
    return 0.0


def _string_map(value: Any, what: str, errors: list[str], where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errors.append(f"{where}: {what} must be a mapping of names to strings")
        return {}
    out = {}
    for key, val in value.items():
        if not isinstance(key, str) or not _LABEL_NAME_RE.fullmatch(key):
            errors.append(f"{where}: invalid {what} name {key!r}")
        elif what == "labels" and key == "__name__":
            errors.append(f"{where}: labels must not set __name__")
        elif not isinstance(val, str):
            errors.append(f"{where}: {what} {key!r} must be a string, got {val!r}")
        else:
            out[key] = val
    return out


def _validate_rule(
    rule: Any, where: str, group: str, interval_s: float | None, errors: list[str]
) -> AlertRule | None:
    if not isinstance(rule, Mapping):
        errors.append(f"{where}: a rule must be a mapping")
        return None
    alert = rule.get("alert")
    if isinstance(alert, str) and alert:
        where = f"{where} (alert {alert!r})"
    before = len(errors)
    unknown = sorted(map(str, set(rule) - _RULE_FIELDS))
    if unknown:
        errors.append(f"{where}: unknown field(s) {', '.join(unknown)}")
    if "record" in rule and "alert" in rule:
        errors.append(f"{where}: only one of 'record' and 'alert' may be set")
        return None
    if "record" in rule:
        errors.append(f"{where}: recording rules are not supported by this evaluator")
        return None
    if not isinstance(alert, str) or not alert.strip():
        errors.append(f"{where}: 'alert' must be set to a non-empty string")
    expr = rule.get("expr")
    node = None
    if expr is None or (isinstance(expr, str) and not expr.strip()):
        errors.append(f"{where}: field 'expr' must be set")
    elif not isinstance(expr, str):
        errors.append(f"{where}: 'expr' must be a string, got {expr!r}")
    else:
        try:
            node = parse(expr)
            if node.type not in (SCALAR, VECTOR):
                raise PromQLError(
                    f"expression must be an instant vector or scalar, not {node.type}"
                )
        except PromQLError as err:
            errors.append(f"{where}: expr: {err}")
    for_s = _duration_field(rule.get("for", "0"), "for", errors, where)
    keep_s = _duration_field(rule.get("keep_firing_for", "0"), "keep_firing_for", errors, where)
    labels = _string_map(rule.get("labels"), "labels", errors, where)
    annotations = _string_map(rule.get("annotations"), "annotations", errors, where)
    if len(errors) > before or node is None:
        return None
    return AlertRule(
        alert=alert,
        expr=expr,
        for_s=for_s,
        labels=labels,
        annotations=annotations,
        group=group,
        keep_firing_for_s=keep_s,
        interval_s=interval_s,
        node=node,
    )


def load_rules(source: str | Path | Mapping[str, Any]) -> list[AlertRule]:
    """Alerting rules of a Prometheus rule file (a path, or the already-loaded mapping).

    Raises :class:`RuleFileError` listing every problem, each naming group, rule and problem.
    """
    if isinstance(source, Mapping):
        origin, doc = "rule file", source
    else:
        origin = str(source)
        try:
            doc = yaml.load(Path(source).read_text(), Loader=_StrictLoader)
        except yaml.YAMLError as err:
            raise RuleFileError(origin, [f"invalid YAML: {err}"]) from None
    errors: list[str] = []
    rules: list[AlertRule] = []
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise RuleFileError(origin, ["the file must be a mapping with a 'groups' list"])
    unknown = sorted(map(str, set(doc) - {"groups"}))
    if unknown:
        errors.append(f"unknown top-level field(s) {', '.join(unknown)}")
    groups = doc.get("groups") or []
    if not isinstance(groups, list):
        raise RuleFileError(origin, [*errors, "'groups' must be a list"])
    names: set[str] = set()
    for gi, group in enumerate(groups):
        where = f"group {gi + 1}"
        if not isinstance(group, Mapping):
            errors.append(f"{where}: a group must be a mapping")
            continue
        name = group.get("name")
        if not isinstance(name, str) or not name:
            errors.append(f"{where}: 'name' must be a non-empty string")
            name = ""
        else:
            where = f"group {name!r}"
            if name in names:
                errors.append(f"{where}: group name repeated in the same file")
            names.add(name)
        unknown = sorted(map(str, set(group) - _GROUP_FIELDS))
        if unknown:
            errors.append(f"{where}: unknown field(s) {', '.join(unknown)}")
        interval_s = None
        if group.get("interval") is not None:
            interval_s = _duration_field(group["interval"], "interval", errors, where) or None
        limit = group.get("limit", 0)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            errors.append(f"{where}: 'limit' must be a non-negative integer")
        elif limit:
            errors.append(f"{where}: 'limit' is not supported by this evaluator")
        group_rules = group.get("rules") or []
        if not isinstance(group_rules, list):
            errors.append(f"{where}: 'rules' must be a list")
            continue
        seen: dict[str, int] = {}
        for ri, rule in enumerate(group_rules):
            rwhere = f"{where}, rule {ri + 1}"
            parsed = _validate_rule(rule, rwhere, name, interval_s, errors)
            alert = rule.get("alert") if isinstance(rule, Mapping) else None
            if isinstance(alert, str) and alert:
                if alert in seen:
                    errors.append(
                        f"{rwhere} (alert {alert!r}): duplicate alert name in the group "
                        f"(also rule {seen[alert]})"
                    )
                    continue
                seen[alert] = ri + 1
            if parsed is not None:
                rules.append(parsed)
    if errors:
        raise RuleFileError(origin, errors)
    return rules


# ---------------------------------------------------------------------------------------------
# Alert evaluation


@dataclass
class _Instance:
    pending_t: int
    firing_t: int | None = None
    max_value: float = math.nan
    value: float = math.nan
    keep_since: int | None = None


def _eval_times(rule: AlertRule, store: SeriesStore, eval_t_ns: Any) -> np.ndarray:
    if eval_t_ns is not None:
        return np.unique(np.asarray(eval_t_ns, dtype=np.int64))
    scrapes = store.scrape_t_ns
    if len(scrapes) == 0:
        return np.empty(0, dtype=np.int64)
    step = round(rule.interval_s * NS_PER_S) if rule.interval_s else DEFAULT_EVAL_INTERVAL_NS
    return np.arange(scrapes[0], scrapes[-1] + 1, step, dtype=np.int64)


def _instance_labels(labels: Labels, static: Mapping[str, str]) -> str:
    out = {k: v for k, v in labels if k not in ("__name__", "alertname")}
    for key, value in static.items():
        # An empty value removes the label, as setting it to "" does in Prometheus.
        if value:
            out[key] = value
        else:
            out.pop(key, None)
    return format_labels(out)


def _run_rule(
    rule: AlertRule,
    store: SeriesStore,
    times: np.ndarray,
    lookback_ns: int,
    left_open: bool,
    timeline: list[dict[str, Any]] | None,
) -> list[dict[str, Any]]:
    active: dict[str, _Instance] = {}
    episodes: list[dict[str, Any]] = []
    for_ns, keep_ns = rule.for_ns, rule.keep_firing_for_ns

    def close(key: str, inst: _Instance, resolved: int | None) -> None:
        episodes.append(
            {
                "alert": rule.alert,
                "labels": key,
                "pending_t_ns": inst.pending_t,
                "firing_t_ns": inst.firing_t,
                "resolved_t_ns": resolved,
                "max_value": inst.max_value,
                "group": rule.group,
            }
        )

    for t in times.tolist():
        try:
            result = _evaluate_node(rule.node, store, t, lookback_ns, left_open)
            vec = [((), result)] if isinstance(result, float) else result
            current: dict[str, float] = {}
            for labels, value in vec:
                key = _instance_labels(labels, rule.labels)
                if key in current:
                    raise PromQLError(
                        f"vector contains metrics with the same labelset {key or '{}'} after "
                        "applying alert labels"
                    )
                current[key] = value
        except PromQLError as err:
            raise PromQLError(
                f"alert {rule.alert!r} (group {rule.group!r}) at t_ns={t}: {err}"
            ) from err
        for key, value in current.items():
            inst = active.get(key)
            if inst is None:
                inst = active[key] = _Instance(pending_t=t)
            inst.value = value
            inst.keep_since = None
            if not math.isnan(value) and not value <= inst.max_value:
                inst.max_value = value
        for key in [k for k in active if k not in current]:
            inst = active[key]
            if inst.firing_t is not None and keep_ns > 0:
                if inst.keep_since is None:
                    inst.keep_since = t
                if t - inst.keep_since < keep_ns:
                    continue
            close(key, active.pop(key), t)
        for key, inst in active.items():
            if inst.firing_t is None and t - inst.pending_t >= for_ns:
                inst.firing_t = t
            if timeline is not None:
                timeline.append(
                    {
                        "t_ns": t,
                        "alert": rule.alert,
                        "labels": key,
                        "state": "pending" if inst.firing_t is None else "firing",
                        "value": inst.value,
                        "group": rule.group,
                    }
                )
    for key, inst in active.items():
        close(key, inst, None)
    return episodes


_EPISODE_COLUMNS = [
    "alert",
    "labels",
    "pending_t_ns",
    "firing_t_ns",
    "resolved_t_ns",
    "max_value",
    "group",
]


def evaluate_alerts(
    rules: Sequence[AlertRule],
    store: SeriesStore,
    eval_t_ns: Sequence[int] | np.ndarray | None = None,
    *,
    lookback_ns: int = DEFAULT_LOOKBACK_NS,
    left_open: bool = False,
) -> pd.DataFrame:
    """One row per alert instance episode (pending until resolved), with Prometheus semantics.

    ``eval_t_ns`` are the rule evaluation times; without them each rule is evaluated every group
    ``interval`` (1m when the group states none) from the first to the last scrape. Times are
    nullable ``Int64``: ``firing_t_ns`` is missing for an episode that never fired,
    ``resolved_t_ns`` for one still active at the last evaluation.
    """
    rows: list[dict[str, Any]] = []
    for rule in rules:
        times = _eval_times(rule, store, eval_t_ns)
        rows.extend(_run_rule(rule, store, times, lookback_ns, left_open, None))
    df = pd.DataFrame(rows, columns=_EPISODE_COLUMNS)
    for col in ("pending_t_ns", "firing_t_ns", "resolved_t_ns"):
        df[col] = df[col].astype("Int64")
    df["max_value"] = df["max_value"].astype(float)
    return df.sort_values(["pending_t_ns", "alert", "labels"], kind="stable").reset_index(drop=True)


def alert_timeline(
    rules: Sequence[AlertRule],
    store: SeriesStore,
    eval_t_ns: Sequence[int] | np.ndarray | None = None,
    *,
    lookback_ns: int = DEFAULT_LOOKBACK_NS,
    left_open: bool = False,
) -> pd.DataFrame:
    """Every active instance at every evaluation: ``t_ns, alert, labels, state, value, group``.

    ``state`` is ``pending`` or ``firing``; ``value`` is the expression's latest value (kept while
    ``keep_firing_for`` holds a vanished instance).
    """
    rows: list[dict[str, Any]] = []
    for rule in rules:
        times = _eval_times(rule, store, eval_t_ns)
        _run_rule(rule, store, times, lookback_ns, left_open, rows)
    df = pd.DataFrame(rows, columns=["t_ns", "alert", "labels", "state", "value", "group"])
    df["t_ns"] = df["t_ns"].astype(np.int64)
    return df.sort_values(["t_ns", "alert", "labels"], kind="stable").reset_index(drop=True)
