"""Binary operators between scalars and instant vectors.

Semantics of https://prometheus.io/docs/prometheus/latest/querying/operators/:

- Arithmetic (``+ - * / % ^ atan2``; ``%`` is Go's ``math.Mod``, the dividend's sign, NaN for
  ``x % 0``) drops the metric name. A filtering comparison keeps the left-hand sample, or the
  vector's own sample when the other side is a scalar; with ``bool`` it yields 0 or 1 and drops
  the name.
- One-to-one matching pairs samples whose labels agree on all labels but the name (or the
  ``on``/``ignoring`` lists) and keeps only the ``on`` labels (drops the ``ignoring`` ones) in its
  result. ``group_left``/``group_right`` pair many samples with one, copying the listed labels
  from the "one" side (an empty value removes the label). Duplicate series on the "one" side, or
  two results with one label set, are errors as in Prometheus.
- ``and``/``or``/``unless`` match many-to-many on the same signatures and keep samples unchanged.
"""

from __future__ import annotations

import numpy as np

from capacity_pack.drills.promql.errors import PromQLError
from capacity_pack.drills.promql.labels import Labels, check_unique, drop_name, format_labels
from capacity_pack.drills.promql.nodes import COMPARISONS, VectorMatching


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


def apply_op(op: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, keep): a comparison yields its left operand and the comparison's outcome."""
    with np.errstate(all="ignore"):
        if op in _CMP_UFUNCS:
            keep = _CMP_UFUNCS[op](a, b)
            return np.broadcast_to(a, keep.shape), keep
        values = _ARITH_UFUNCS[op](a, b)
        return values, np.ones(np.shape(values), dtype=bool)


def scalar_binary(op: str, lhs: float, rhs: float) -> float:
    """Two scalars (a comparison between them needs ``bool``, so it yields 1 or 0)."""
    values, keep = apply_op(op, np.float64(lhs), np.float64(rhs))
    if op in COMPARISONS:
        return 1.0 if bool(keep) else 0.0
    return float(values)


def scalar_vector_binary(
    op: str,
    lhs: float | list[tuple[Labels, float]],
    rhs: float | list[tuple[Labels, float]],
    return_bool: bool,
) -> list[tuple[Labels, float]]:
    """A scalar and an instant vector, either way round: the operation on every sample."""
    scalar_left = isinstance(lhs, float)
    vec = rhs if scalar_left else lhs
    scalar = lhs if scalar_left else rhs
    assert isinstance(vec, list) and isinstance(scalar, float)
    vals = np.array([v for _, v in vec], dtype=float)
    a, b = (np.float64(scalar), vals) if scalar_left else (vals, np.float64(scalar))
    values, keep = apply_op(op, a, b)
    out: list[tuple[Labels, float]] = []
    if op not in COMPARISONS:
        out = [(drop_name(ls), float(x)) for (ls, _), x in zip(vec, values, strict=True)]
    elif return_bool:
        out = [(drop_name(ls), float(k)) for (ls, _), k in zip(vec, keep, strict=True)]
    else:
        # The vector's own sample survives the filter, whichever side the scalar is on.
        out = [s for s, k in zip(vec, keep, strict=True) if k]
    return check_unique(out)


def set_operation(
    op: str,
    lhs: list[tuple[Labels, float]],
    rhs: list[tuple[Labels, float]],
    matching: VectorMatching,
) -> list[tuple[Labels, float]]:
    """``and``/``or``/``unless``: samples of one side kept or dropped by signature."""
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


def vector_binary(
    op: str,
    lhs: list[tuple[Labels, float]],
    rhs: list[tuple[Labels, float]],
    matching: VectorMatching,
    return_bool: bool,
) -> list[tuple[Labels, float]]:
    """Arithmetic or comparison between two vectors, matched one-to-one or via group_x."""
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
    values, keep = apply_op(op, a, b)
    drop_name = op not in COMPARISONS or return_bool
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
