"""Instant evaluation of a parsed expression over a :class:`~.store.SeriesStore`.

:func:`evaluate` returns, at one time ``t``, a list of ``(labels, value)`` (``labels`` a dict,
``__name__`` included where kept) or a float for a scalar expression.

Selectors (https://prometheus.io/docs/prometheus/latest/querying/basics/):
  - An instant selector takes each series' latest sample in ``[t - lookback, t]`` (lookback 5
    minutes by default, Prometheus' ``--query.lookback-delta``) unless a staleness marker follows
    it; a range selector ``[d]`` takes the samples in ``[t - d, t]``; ``offset o`` shifts ``t``
    back by ``o``. Both windows include their left end as in Prometheus 2.x (the ``promtool``
    the tests compare with); ``left_open=True`` gives Prometheus 3's ``(t - d, t]`` (see its
    migration guide, https://prometheus.io/docs/prometheus/latest/migration/).
  - Functions (except ``last_over_time``), ``bool`` comparisons, arithmetic and aggregations
    drop the metric name; see :mod:`.functions` and :mod:`.binary` for their definitions.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from capacity_pack.drills.promql.binary import (
    scalar_binary,
    scalar_vector_binary,
    set_operation,
    vector_binary,
)
from capacity_pack.drills.promql.errors import PromQLError
from capacity_pack.drills.promql.functions import (
    RANGE_IMPLS,
    Window,
    absent_labels,
    aggregate,
    elementwise,
    histogram_quantile,
    over_time,
    per_series_quantile,
)
from capacity_pack.drills.promql.labels import Labels, check_unique, drop_name
from capacity_pack.drills.promql.lexer import NS_PER_S
from capacity_pack.drills.promql.nodes import (
    SCALAR,
    SET_OPERATORS,
    VECTOR,
    Aggregation,
    BinaryOp,
    Call,
    MatrixSelector,
    Node,
    NumberLiteral,
    Paren,
    UnaryOp,
    VectorSelector,
)
from capacity_pack.drills.promql.parser import parse
from capacity_pack.drills.promql.store import SeriesStore

DEFAULT_LOOKBACK_NS = 300 * NS_PER_S

# What an expression yields at one time: a scalar or an instant vector.
Value = float | list[tuple[Labels, float]]


class _Evaluator:
    """Evaluates nodes recursively at one time ``t`` over one store."""

    def __init__(self, store: SeriesStore, t_ns: int, lookback_ns: int, left_open: bool):
        self.store = store
        self.t = int(t_ns)
        self.lookback = int(lookback_ns)
        self.left_open = left_open

    def eval(self, node: Node) -> Value:
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
                return check_unique([(drop_name(ls), -v) for ls, v in value])
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

    def windows(self, msel: MatrixSelector) -> list[Window]:
        end = self.t - msel.selector.offset_ns
        start = end - msel.range_ns
        out = []
        for block, sids in self.store.select(msel.selector.matchers):
            lo = block.position(
                block.sample_key, sids, start, "right" if self.left_open else "left"
            )
            hi = block.position(block.sample_key, sids, end, "right")
            out.append(Window(block, sids, lo, hi, start, end, msel.range_ns))
        return out

    # -- functions ----------------------------------------------------------------------------

    def call(self, node: Call) -> Value:
        name, args = node.func, node.args
        if name in RANGE_IMPLS or name == "quantile_over_time":
            impl = RANGE_IMPLS.get(name)
            if impl is None:
                phi = self.scalar(args[0])
                impl = partial(over_time, reduce=partial(per_series_quantile, phi))
            assert isinstance(args[-1], MatrixSelector)
            keep_name = name == "last_over_time"
            out = []
            for win in self.windows(args[-1]):
                mask, values = impl(win)
                sets = win.block.labelsets if keep_name else win.block.bare_labelsets
                for s, val in zip(win.sids[mask], values, strict=True):
                    out.append((sets[s], float(val)))
            return check_unique(out)
        if name == "absent_over_time":
            assert isinstance(args[0], MatrixSelector)
            if any(np.any(w.hi > w.lo) for w in self.windows(args[0])):
                return []
            return [(absent_labels(args[0]), 1.0)]
        if name == "absent":
            return [] if self.vector(args[0]) else [(absent_labels(args[0]), 1.0)]
        if name == "histogram_quantile":
            phi = self.scalar(args[0])
            return check_unique(histogram_quantile(phi, self.vector(args[1])))
        if name == "time":
            return self.t / NS_PER_S
        if name == "vector":
            return [((), self.scalar(args[0]))]
        if name == "scalar":
            vec = self.vector(args[0])
            return vec[0][1] if len(vec) == 1 else math.nan
        vec = self.vector(args[0])
        return elementwise(name, vec, [self.scalar(a) for a in args[1:]])

    # -- aggregation --------------------------------------------------------------------------

    def aggregate(self, node: Aggregation) -> list[tuple[Labels, float]]:
        vec = self.vector(node.expr)
        param = self.scalar(node.param) if node.param is not None else math.nan
        return aggregate(node.op, vec, param, node.grouping, node.without)

    # -- binary operators ---------------------------------------------------------------------

    def binary(self, node: BinaryOp) -> Value:
        lhs, rhs = self.eval(node.lhs), self.eval(node.rhs)
        op = node.op
        if isinstance(lhs, float) and isinstance(rhs, float):
            return scalar_binary(op, lhs, rhs)
        if isinstance(lhs, list) and isinstance(rhs, list):
            assert node.matching is not None
            if op in SET_OPERATORS:
                return set_operation(op, lhs, rhs, node.matching)
            return check_unique(vector_binary(op, lhs, rhs, node.matching, node.return_bool))
        return scalar_vector_binary(op, lhs, rhs, node.return_bool)


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
    result = evaluate_node(node, store, t_ns, lookback_ns, left_open)
    if isinstance(result, list):
        return [(dict(labels), value) for labels, value in result]
    return result


def evaluate_node(
    node: Node, store: SeriesStore, t_ns: int, lookback_ns: int, left_open: bool
) -> Value:
    """:func:`evaluate` without parsing or converting labels to dicts (for rules)."""
    if node.type not in (SCALAR, VECTOR):
        raise PromQLError(f"expression must be an instant vector or a scalar, not a {node.type}")
    return _Evaluator(store, t_ns, lookback_ns, left_open).eval(node)
