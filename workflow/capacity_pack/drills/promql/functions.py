"""PromQL's functions and aggregations over numpy arrays.

Range-vector functions (:data:`RANGE_IMPLS`) work on a :class:`Window`, the samples of many
series of one block in ``[start, end]``, vectorized over the series where the definition allows;
each returns a mask of the series that yield a sample and their values. Definitions follow
https://prometheus.io/docs/prometheus/latest/querying/functions/:

- ``rate``/``increase``/``delta`` need two samples in the range. For ``rate`` and ``increase`` a
  counter reset (a value below its predecessor) adds the predecessor back. The result "is
  extrapolated to the ends of the range": with ``n`` samples from ``tf`` to ``tl`` and an average
  interval ``avg = (tl - tf) / (n - 1)``, each end is extended by its distance to the range
  boundary when that distance is under ``1.1 * avg``, else by ``avg / 2`` (the series is taken to
  start or end there; Prometheus commit "promql: Limit extrapolation of delta/rate/increase",
  issue #581). A counter's start is never extrapolated below zero: the distance back to where a
  straight line through the samples reaches zero, ``(tl - tf) * first / increase``, caps the
  start's extension, as current Prometheus does (before 2.51 it was compared with the full
  distance to the range start instead, which differs only when the zero point falls between half
  and 1.1 sample intervals before the first sample). ``increase = (last - first + resets) *
  (tl - tf + ext_start + ext_end) / (tl - tf)``; ``rate`` divides by the range in seconds.
- ``irate``/``idelta`` use the last two samples (``irate`` treats a drop as a reset);
  ``deriv`` is the least-squares slope; ``changes``, ``resets`` and ``*_over_time`` reduce the
  window (``min``/``max`` ignore NaN unless every value is NaN, as Prometheus' loops do).

Instant-vector functions: ``histogram_quantile`` groups ``le`` buckets by their other labels,
makes the counts monotonic (scrapes of cumulative buckets are not atomic), interpolates linearly
inside the bucket holding the rank ``phi * total``, takes the lower bound of the ``+Inf`` bucket
when the rank falls there, and yields NaN without a ``+Inf`` bucket or observations;
``quantile``/``quantile_over_time`` interpolate at rank ``phi * (n - 1)``; ``absent`` reports the
labels of the argument's equality matchers. Math functions, ``clamp*`` and ``round`` apply per
sample and drop the metric name.

Aggregations (see
https://prometheus.io/docs/prometheus/latest/querying/operators/#aggregation-operators) group by
the ``by`` labels, or all labels but the ``without`` ones and the name; ``sum`` adds in input
order; ``topk``/``bottomk`` keep whole samples, NaN ranking last.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from capacity_pack.drills.promql.errors import PromQLError
from capacity_pack.drills.promql.labels import Labels, check_unique, drop_name
from capacity_pack.drills.promql.lexer import NS_PER_S
from capacity_pack.drills.promql.nodes import MatrixSelector, Node, VectorSelector
from capacity_pack.drills.promql.store import Block


@dataclass
class Window:
    """The samples of ``sids`` in ``[start, end]``: series ``i`` is ``block.v[lo[i]:hi[i]]``."""

    block: Block
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


def _extrapolated(win: Window, counter: bool, per_second: bool) -> tuple[np.ndarray, np.ndarray]:
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


def _instant_delta(win: Window, per_second: bool) -> tuple[np.ndarray, np.ndarray]:
    b = win.block
    keep = (win.hi - win.lo) >= 2
    hi = win.hi[keep]
    last, prev = b.v[hi - 1], b.v[hi - 2]
    if not per_second:
        return keep, last - prev
    # irate treats a drop as a counter reset: the increase is the new value itself.
    delta = np.where(last < prev, last, last - prev)
    return keep, delta / ((b.t[hi - 1] - b.t[hi - 2]) / NS_PER_S)


def _deriv(win: Window) -> tuple[np.ndarray, np.ndarray]:
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


def over_time(win: Window, reduce: Callable) -> tuple[np.ndarray, np.ndarray]:
    """``reduce(values, lo, hi)`` over each series with at least one sample in the window."""
    keep = win.hi > win.lo
    return keep, reduce(win.block.v, win.lo[keep], win.hi[keep])


RANGE_IMPLS: dict[str, Callable[[Window], tuple[np.ndarray, np.ndarray]]] = {
    "rate": partial(_extrapolated, counter=True, per_second=True),
    "increase": partial(_extrapolated, counter=True, per_second=False),
    "delta": partial(_extrapolated, counter=False, per_second=False),
    "irate": partial(_instant_delta, per_second=True),
    "idelta": partial(_instant_delta, per_second=False),
    "deriv": _deriv,
    **{name: partial(over_time, reduce=fn) for name, fn in _OVER_TIME.items()},
}


def quantile(phi: float, values: Sequence[float] | np.ndarray) -> float:
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


def histogram_quantile(phi: float, vec: list[tuple[Labels, float]]) -> list[tuple[Labels, float]]:
    """One quantile per bucket group (labels but ``le`` and the name); bad ``le`` skipped."""
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


def absent_labels(node: Node) -> Labels:
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


def per_series_quantile(phi: float, v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``quantile_over_time``'s reduction."""
    return _per_series(partial(quantile, phi), v, lo, hi)


def aggregate_values(op: str, values: np.ndarray, param: float) -> float:
    """One group's value for the aggregations other than topk/bottomk."""
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
        return quantile(param, values)
    raise PromQLError(f"aggregation {op!r} is not implemented")  # pragma: no cover


MATH_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
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


def elementwise(
    name: str, vec: list[tuple[Labels, float]], params: list[float]
) -> list[tuple[Labels, float]]:
    """A function applied to each sample's value (math, clamp*, round); the name is dropped."""
    values = np.array([v for _, v in vec], dtype=float)
    with np.errstate(all="ignore"):
        if name in MATH_FUNCTIONS:
            result = MATH_FUNCTIONS[name](values)
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
    return check_unique([(drop_name(ls), float(r)) for (ls, _), r in zip(vec, result, strict=True)])


def aggregate(
    op: str,
    vec: list[tuple[Labels, float]],
    param: float,
    grouping: tuple[str, ...],
    without: bool,
) -> list[tuple[Labels, float]]:
    """``op`` over the groups of ``vec`` that ``by (grouping)`` / ``without (grouping)`` form.

    topk/bottomk keep the chosen samples with all their labels; the others yield one sample per
    group labelled by the group's labels.
    """
    names = frozenset(grouping)
    groups: dict[Labels, list[tuple[Labels, float]]] = {}
    for labels, value in vec:
        if without:
            key = tuple(p for p in labels if p[0] != "__name__" and p[0] not in names)
        else:
            key = tuple(p for p in labels if p[0] in names)
        groups.setdefault(key, []).append((labels, value))
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
        out.append((key, aggregate_values(op, values, param)))
    return out
