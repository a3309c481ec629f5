"""Arrival trace files: their three layouts, reading one into arrivals, verbatim replay's rates.

Layouts (``client.trace.format``): ``capacity-pack`` (CSV or parquet: ``offset_s``, ``class``,
optional lengths), ``mooncake`` (JSON Lines: ``timestamp`` ms, ``input_length``,
``output_length``, ``hash_ids`` of ``block_tokens``-token blocks) and ``azure`` (CSV:
``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``). :func:`read_trace` gives one row per
request, stably sorted, ``offset_s`` = t_i - t_0, classes by the first rule whose
``max_input_tokens`` holds the input; every bad row is a one-line :class:`TraceError`
naming file, row and field. Verbatim replay: t'_i = s (t_i - t_0), the trace's rate
r = (n - 1) / (t_{n-1} - t_0) and the point's r / s rounded to :data:`RATE_DECIMALS`
(:func:`verbatim_rates`); :func:`trace_summary` is the manifest's ``derived.trace``.
Method: docs/metrics.md, 'Trace replay'; docs/packs.md, 'Trace replay'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.errors import StatedError
from capacity_pack.vocab.percentile import rank_index

FORMATS = ("capacity-pack", "mooncake", "azure")
# Mooncake's released traces hash prompts in blocks of 512 tokens.
MOONCAKE_BLOCK_TOKENS = 512
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
RATE_DECIMALS = 3
_READ_CACHE: dict[tuple[Any, ...], pd.DataFrame] = {}


class TraceError(StatedError, ValueError):
    """A trace file that cannot be replayed; the message names the file, row and field."""


def read_trace(
    path: str | Path,
    fmt: str,
    *,
    class_rules: Sequence[tuple[str, int | None]] = (),
    time_column: str = "offset_s",
    class_column: str = "class",
    input_column: str | None = "input_tokens",
    output_column: str | None = "output_tokens",
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    sha256: str | None = None,
) -> pd.DataFrame:
    """The trace's requests, sorted by arrival (see the module docstring for the columns).

    ``sha256``, when given, keys an in-process cache: the file is parsed once per process.
    """
    key = (
        str(path), fmt, tuple(class_rules), time_column, class_column, input_column,
        output_column, block_tokens, sha256,
    )  # fmt: skip
    if sha256 is not None and key in _READ_CACHE:
        return _READ_CACHE[key].copy()
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: trace file does not exist")
    if fmt == "capacity-pack":
        out = _read_capacity_pack(path, time_column, class_column, input_column, output_column)
    elif fmt == "mooncake":
        out = _read_mooncake(path, block_tokens)
    elif fmt == "azure":
        out = _read_azure(path)
    else:
        raise TraceError(f"{path}: unknown trace format {fmt!r}; expected one of {FORMATS}")
    if fmt != "capacity-pack":
        out.insert(1, "class", assign_classes(out, class_rules, path, fmt))
    if len(out) < 2:
        raise TraceError(f"{path}: a trace needs at least two arrivals, found {len(out)}")
    out = out.sort_values("offset_s", kind="stable").reset_index(drop=True)
    out["offset_s"] -= out["offset_s"].iloc[0]
    if float(out["offset_s"].iloc[-1]) <= 0:
        raise TraceError(f"{path}: every arrival has the same time; no rate to replay")
    if sha256 is not None:
        _READ_CACHE[key] = out
    return out.copy()


def _row_word(fmt: str) -> str:
    return "line" if fmt == "mooncake" else "row"


def _shown(value: Any) -> str:
    """A cell as the file has it (numpy scalars as plain numbers)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _lengths(values: pd.Series, path: Path, column: str, rows: np.ndarray) -> np.ndarray:
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    bad = ~(numbers >= 1) | (numbers % 1 != 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(
            f"{path}: row {int(rows[i])}, column {column!r}: {_shown(values.iloc[i])} is not a "
            "positive whole number of tokens"
        )
    return numbers.astype(np.int64)


def _read_table(path: Path) -> pd.DataFrame:
    try:
        if path.suffix in {".parquet", ".pq"}:
            return pd.read_parquet(path)
        return pd.read_csv(path)
    except (ValueError, OSError, pd.errors.ParserError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TraceError(f"{path}: cannot read the trace as a table: {first}") from None


def _read_capacity_pack(
    path: Path,
    time_column: str,
    class_column: str,
    input_column: str | None,
    output_column: str | None,
) -> pd.DataFrame:
    raw = _read_table(path)
    missing = [c for c in (time_column, class_column) if c not in raw.columns]
    if missing:
        raise TraceError(f"{path}: missing column(s) {missing}; columns: {list(raw.columns)}")
    rows = np.arange(1, len(raw) + 1)
    offset = pd.to_numeric(raw[time_column], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(offset) | (offset < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(
            f"{path}: row {i + 1}, column {time_column!r}: {_shown(raw[time_column].iloc[i])} "
            "is not a non-negative number of seconds"
        )
    out = pd.DataFrame({"offset_s": offset, "class": raw[class_column].astype(str).to_numpy()})
    for col, name in ((input_column, "input_tokens"), (output_column, "output_tokens")):
        if col is not None and col in raw.columns:
            out[name] = _lengths(raw[col], path, col, rows)
    out["row"] = rows
    return out


def _read_azure(path: Path) -> pd.DataFrame:
    raw = _read_table(path)
    missing = [c for c in AZURE_COLUMNS if c not in raw.columns]
    if missing:
        raise TraceError(
            f"{path}: missing column(s) {missing} of the Azure LLM inference trace layout "
            f"{list(AZURE_COLUMNS)}; columns: {list(raw.columns)}"
        )
    rows = np.arange(1, len(raw) + 1)
    stamps = pd.to_datetime(
        raw["TIMESTAMP"].astype(str), format="ISO8601", errors="coerce", utc=True
    )
    if stamps.isna().any():
        i = int(np.argmax(stamps.isna().to_numpy()))
        raise TraceError(
            f"{path}: row {i + 1}, column 'TIMESTAMP': {raw['TIMESTAMP'].iloc[i]!r} is not a "
            "date-time (expected e.g. '2023-11-16 18:15:46.6805900')"
        )
    # The parsed unit follows the text (us for six fractional digits, ns for seven): fix it.
    ns = stamps.dt.as_unit("ns").astype("int64").to_numpy()
    return pd.DataFrame(
        {
            "offset_s": (ns - ns.min()) / 1e9,
            "input_tokens": _lengths(raw["ContextTokens"], path, "ContextTokens", rows),
            "output_tokens": _lengths(raw["GeneratedTokens"], path, "GeneratedTokens", rows),
            "row": rows,
        }
    )


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _read_mooncake(path: Path, block_tokens: int) -> pd.DataFrame:
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    hashes: list[list[int]] = []
    lines: list[int] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not UTF-8 text (byte {err.start})") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}: line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise TraceError(f"{where}: not a JSON object ({err.msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: not a JSON object")
        ts = obj.get("timestamp")
        if (
            not isinstance(ts, int | float)
            or isinstance(ts, bool)
            or not math.isfinite(ts)
            or ts < 0
        ):
            raise TraceError(
                f"{where}, field 'timestamp': {ts!r} is not a non-negative number of milliseconds"
            )
        n_in, n_out = obj.get("input_length"), obj.get("output_length")
        for name, value in (("input_length", n_in), ("output_length", n_out)):
            if not _whole(value, 1):
                raise TraceError(
                    f"{where}, field {name!r}: {value!r} is not a positive whole number of tokens"
                )
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or not all(_whole(h, 0) for h in ids):
            raise TraceError(
                f"{where}, field 'hash_ids': expected a list of non-negative integers, "
                f"got {json.dumps(ids)[:60]}"
            )
        if len(ids) > math.ceil(n_in / block_tokens):
            raise TraceError(
                f"{where}, field 'hash_ids': {len(ids)} blocks of {block_tokens} tokens, more than "
                f"input_length {n_in} fills ({math.ceil(n_in / block_tokens)})"
            )
        times.append(ts / 1000.0)
        inputs.append(n_in)
        outputs.append(n_out)
        hashes.append(ids)
        lines.append(lineno)
    return pd.DataFrame(
        {
            "offset_s": np.asarray(times, dtype=float) - (min(times) if times else 0.0),
            "input_tokens": np.asarray(inputs, dtype=np.int64),
            "output_tokens": np.asarray(outputs, dtype=np.int64),
            "hash_ids": pd.Series(hashes, dtype=object),
            "row": np.asarray(lines, dtype=np.int64),
        }
    )


def assign_classes(
    trace: pd.DataFrame, rules: Sequence[tuple[str, int | None]], path: Path, fmt: str
) -> np.ndarray:
    """Each request's class: the first rule (name, max_input_tokens) whose bound is at least
    its input length, or that has no bound."""
    if not rules:
        raise TraceError(f"{path}: a {fmt} trace has no class column: declare class rules")
    n = trace["input_tokens"].to_numpy(np.int64)
    classes = np.full(len(trace), None, dtype=object)
    open_rows = np.ones(len(trace), dtype=bool)
    for name, bound in rules:
        hit = open_rows & (True if bound is None else n <= bound)
        classes[hit] = name
        open_rows &= ~hit
    if open_rows.any():
        i = int(np.argmax(open_rows))
        shown = ", ".join(f"{c} <= {b}" if b is not None else c for c, b in rules)
        raise TraceError(
            f"{path}: {_row_word(fmt)} {int(trace['row'].iloc[i])}: input length {int(n[i])} "
            f"matches no class rule ({shown})"
        )
    return classes


def native_rate(trace: pd.DataFrame) -> float:
    """The trace's own mean rate: (n - 1) / (t_{n-1} - t_0), requests per second."""
    return (len(trace) - 1) / float(trace["offset_s"].iloc[-1])


def verbatim_rates(trace: pd.DataFrame, time_scales: Sequence[float]) -> list[float]:
    """The open-loop rate of each declared factor: r / s at :data:`RATE_DECIMALS` decimals."""
    rate = native_rate(trace)
    return [round(rate / s, RATE_DECIMALS) for s in time_scales]


def block_ids_text(ids: Sequence[int]) -> str:
    """The schedule's form of a request's hash ids: space-separated decimal integers."""
    return " ".join(str(int(h)) for h in ids)


def check_classes(trace: pd.DataFrame, names: Sequence[str], path: str | Path, fmt: str) -> None:
    """Every request's class is one of the pack's ``names``, or a one-line error naming the
    first row that is not."""
    unknown = ~trace["class"].isin(list(names)).to_numpy()
    if unknown.any():
        i = int(np.argmax(unknown))
        column = "class" if fmt == "capacity-pack" else "class rule"
        raise TraceError(
            f"{path}: {_row_word(fmt)} {int(trace['row'].iloc[i])}, {column}: unknown class "
            f"{trace['class'].iloc[i]!r}; expected one of {list(names)}"
        )


def trace_summary(trace: pd.DataFrame, names: Sequence[str]) -> dict[str, Any]:
    """What the frozen manifest shows of a trace: rows, span, own rate, and per class its
    requests and the lengths it sends (mean and nearest-rank p50/p95/p99/max), or None for a
    length the file does not give."""
    classes: dict[str, Any] = {}
    for c in names:
        rows = trace[trace["class"] == c]
        entry: dict[str, Any] = {"requests": len(rows)}
        for col in ("input_tokens", "output_tokens"):
            if col not in trace.columns or rows.empty:
                entry[col] = None
                continue
            v = np.sort(rows[col].to_numpy(np.int64))
            entry[col] = {
                "mean": float(v.mean()),
                **{f"p{q}": int(v[rank_index(q / 100, v.size)]) for q in (50, 95, 99)},
                "max": int(v[-1]),
            }
        classes[c] = entry
    return {
        "rows": len(trace),
        "span_s": float(trace["offset_s"].iloc[-1]),
        "native_rps": native_rate(trace),
        "block_hashes": "hash_ids" in trace.columns,
        "classes": classes,
    }
