"""Per-class SLO analysis: the seed's analyzer, reproduced exactly, and the pipeline's extensions.

The seed's ``analyze_slo.py`` semantics (section "Build the SLO Analyzer"), vectorized:

- validation, first failing row in file order, with the seed's messages: request IDs non-empty and
  unique; a known class; a recognized terminal status (ok, error, timeout, rejected, cancelled);
  on ``ok`` rows finite non-negative latencies, the class's fixed output length, and
  |E2E - (TTFT + TPOT x (O - 1))| <= 0.5 ms;
- nearest-rank percentiles: the value at index max(0, ceil(p n) - 1) of the sorted sample;
- per class c: attainment_c = passing_c / successful_c, where passing means TTFT <= cutoff and
  TPOT <= cutoff (joint, per request); sample_adequate = successful_c >= gate (2,000);
  P99 withheld below 10,000 successful rows; class_slo_pass = adequate and attainment >= 0.95;
- error_rate = failed / attempted; observed_goodput = passing / T; request_throughput =
  successful / T; output_throughput = sum(successful output tokens) / T;
- capacity_gate_pass = every class passes, error_rate <= 1%, and the queue trend is flat.

Extensions (:func:`analyze_point`), computed over the measured window of a point (warm-up and
prewarm requests excluded; T from the first measured send to the last measured terminal event,
so the drain is included):

- Wilson score interval for each class's attainment (z for the stated confidence):
  centre = (p + z^2/2n) / (1 + z^2/n), half = z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n);
- MLPerf LoadGen early stopping for P99: with h of n requests over the cutoff, the percentile is
  proven at confidence c when BinomCDF(h; n, 1 - 0.99) <= 1 - c; the bound is the smallest such n;
- queue trend: Mann-Kendall on the server's queue depth and the client's due-but-unsent backlog
  over the steady-state window (between the first and the last measured scheduled arrival):
  S = sum_{i<j} sign(x_j - x_i), Var(S) with the tie correction, Z = (S - sign(S)) / sqrt(Var S);
  ``growing`` when Z > z_0.95 and the Theil-Sen slope times the window exceeds one request,
  ``flat`` otherwise, ``inconclusive`` with fewer than 8 samples;
- Little's Law over the population of all terminal requests in the steady window: L_obs is the
  time-average of in-flight requests (intervals clipped to the window), lambda the completion
  rate in the window, W their mean time to terminal status; the gap |L_obs - lambda W| / L_obs
  is flagged above 10%;
- labels: ``pass``; ``marginal`` when a gate holds only on the point estimate (a class's
  attainment CI lower bound under the threshold); ``fail``; ``inconclusive``
  when a class is under-sampled, the queue trend cannot be decided, or the client was the
  bottleneck (dispatch lateness above its bound), which makes the point invalid as a server result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from capacity_pack.plan.manifest import Acceptance, WorkloadClass

STATUSES = ("ok", "error", "timeout", "rejected", "cancelled")
SEED_CUTOFFS = {
    "interactive": {"ttft_ms": 500, "tpot_ms": 40},
    "long_context": {"ttft_ms": 2500, "tpot_ms": 50},
    "generation_heavy": {"ttft_ms": 800, "tpot_ms": 45},
}
SEED_OUTPUTS = {"interactive": 128, "long_context": 256, "generation_heavy": 1024}
SEED_COLUMNS = ["request_id", "class", "ttft_ms", "tpot_ms", "e2e_ms", "output_tokens", "status"]


class AnalysisError(ValueError):
    """Input the analyzer refuses; the message names the file, row and rule."""


@dataclass(frozen=True)
class ClassSpec:
    name: str
    ttft_cutoff_ms: float
    tpot_cutoff_ms: float
    expected_output_tokens: int | None  # None: not a fixed-length class


@dataclass(frozen=True)
class Gates:
    class_slo_attainment_min: float = 0.95
    min_successful_samples_per_class: int = 2000
    error_rate_max: float = 0.01
    p99_min_samples: int = 10_000
    per_class_error_rate_max: float | None = None
    all_attempt_attainment_min: float | None = None


def seed_classes() -> list[ClassSpec]:
    return [
        ClassSpec(n, c["ttft_ms"], c["tpot_ms"], SEED_OUTPUTS[n]) for n, c in SEED_CUTOFFS.items()
    ]


def pack_classes(pack) -> list[ClassSpec]:
    """Class specs from a :class:`~capacity_pack.plan.manifest.Pack` (fixed lengths if fixed)."""
    return [
        ClassSpec(
            c.name,
            c.request_ttft_cutoff_ms,
            c.request_tpot_cutoff_ms,
            c.output_tokens if isinstance(c.output_tokens, int) else None,
        )
        for c in pack.workload
    ]


def pack_gates(pack) -> Gates:
    a = pack.acceptance
    return Gates(
        class_slo_attainment_min=a.class_slo_attainment_min,
        min_successful_samples_per_class=a.min_successful_samples_per_class,
        error_rate_max=a.error_rate_max,
        p99_min_samples=a.p99_min_samples,
        per_class_error_rate_max=a.per_class_error_rate_max,
        all_attempt_attainment_min=a.all_attempt_attainment_min,
    )


# ---------------------------------------------------------------------------------------------
# Reading and validating a requests table (the seed's rules)
# ---------------------------------------------------------------------------------------------


def read_requests_csv(path: str | Path) -> pd.DataFrame:
    """The seed's requests.csv with every column as text (pyarrow): the exact path's input."""
    import pyarrow.csv as pacsv

    path = Path(path)
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(block_size=_BLOCK_BYTES),
            convert_options=pacsv.ConvertOptions(
                column_types={c: "string" for c in SEED_COLUMNS},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
            memory_pool=_memory_pool(),
        )
    except FileNotFoundError:
        raise AnalysisError(f"{path}: no such file") from None
    except Exception as err:  # pyarrow's parse errors name the row; keep their text
        raise AnalysisError(f"{path}: not a readable CSV: {err}") from None
    missing = [c for c in SEED_COLUMNS if c not in table.column_names]
    if missing:
        raise AnalysisError(
            f"{path}: missing column(s) {missing}; expected the header {','.join(SEED_COLUMNS)}"
        )
    return table.select(SEED_COLUMNS).to_pandas()


def _memory_pool():
    """jemalloc, else the system allocator, for the large arrays: pyarrow's default (mimalloc)
    spent three times their system time first-touching a 10-million-row table (1.1-1.4 s
    against 0.35-0.4 s, on a 2-core VM), for no gain in user time."""
    import pyarrow as pa

    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.system_memory_pool()


# Large blocks: fewer chunks to stitch together, still one block per core from ~20 MB up.
_BLOCK_BYTES = 8 << 20
_TASK_ROWS = 1 << 19  # rows per task of the fast path: enough tasks to balance two threads
# Read as null in the typed columns. A null on an ok row sends the file to the exact path (the
# seed cannot parse it either); on failed rows, which the seed never parses, it keeps common
# blanks and NA spellings on the fast path.
_NULLS = ["", "NA", "N/A", "n/a", "NULL", "null", "None", "#N/A", "-"]
# Python's float() and int() grammar for ASCII text (docs: "Built-in Functions", float): spaces,
# a sign, digits with single underscores between them, point and exponent, or inf, infinity,
# nan in any case.
_WS = r"[ \t\n\r\x0b\x0c]*"
_DIGITS = r"[0-9](?:_?[0-9])*"
_EXP = rf"(?:[eE][+-]?{_DIGITS})?"
_NUMBER = rf"(?:(?:{_DIGITS})?\.{_DIGITS}{_EXP}|{_DIGITS}\.?{_EXP}|(?i:inf|infinity|nan))"
_FLOAT_RE = rf"^{_WS}[+-]?{_NUMBER}{_WS}$"
_INT_RE = rf"^{_WS}[+-]?{_DIGITS}{_WS}$"
_MIX = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio, odd: multiplying permutes uint64


@dataclass
class _ClassSample:
    """The successful requests of one class: latencies in no particular order, how many pass
    both cutoffs, and their output tokens."""

    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    passed: int
    tokens: int


@dataclass
class _SeedSummary:
    """What the seed's report is computed from; ``samples`` follows the order of ``classes``."""

    attempted: int
    successful: int
    samples: list[_ClassSample]


def _fast_seed_summary(path: Path, classes: list[ClassSpec]) -> _SeedSummary | None:
    """The summary of a requests.csv on which every seed rule holds, or None.

    pyarrow parses the file typed (request_id as bytes, class, status and output_tokens
    dictionary-encoded, latencies float64; multi-threaded). None at the first doubt: a file
    pyarrow cannot read this way (a latency outside its number grammar, a missing column), any
    rule failing on any row, a null on an ok row, or two equal ID hashes; the caller then runs
    the exact path (:func:`validate_seed_table`), which words the error. pyarrow's floats are a
    subset of Python's float() with the same (correctly rounded) values, except NaN payloads
    ("nan(1)"), which read as NaN here and fail the finite-latency rule; output_tokens go through
    :func:`_parse_numbers` once per distinct value. So whatever passes here passes the seed, with
    the same values.

    Then two threads (pyarrow and numpy release the GIL) share the work, in tasks of about
    ``_TASK_ROWS`` rows: the ID check; the other rules, which also count each task's successful
    rows per class; then, each task's share of a class's buffer known, the gathering of the
    successful latencies straight to their place.
    """
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.csv as pacsv

    text = pa.dictionary(pa.int32(), pa.string())
    # output_tokens as text, dictionary-encoded, for Python's int() on each distinct value:
    # pyarrow's integers include hexadecimal ones.
    types = {"request_id": pa.binary(), "class": text, "status": text, "output_tokens": text}
    types |= {c: pa.float64() for c in ("ttft_ms", "tpot_ms", "e2e_ms")}
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(block_size=_BLOCK_BYTES),
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                include_columns=SEED_COLUMNS,
                null_values=_NULLS,
                strings_can_be_null=False,
                check_utf8=False,  # IDs are checked once below; class and status must match
            ),
            memory_pool=_memory_pool(),
        )
    except Exception:  # the exact path reads the file again and words the error
        return None
    tasks: list[list] = []
    rows = 0
    for batch in table.drop_columns(["request_id"]).to_batches():
        if not tasks or rows >= _TASK_ROWS:
            tasks.append([])
            rows = 0
        tasks[-1].append(batch)
        rows += batch.num_rows
    with ThreadPoolExecutor(2) as pool:
        ids_ok = pool.submit(_ids_valid, table.column("request_id"))
        checked = [f.result() for f in [pool.submit(_check_batches, t, classes) for t in tasks]]
        if any(c is None for c in checked):
            return None
        counts = np.array([c[1] for c in checked], np.int64).reshape(len(tasks), len(classes))
        starts = np.cumsum(counts, axis=0) - counts  # each task's first row in each class
        buffers = [[np.empty(total) for _ in range(3)] for total in counts.sum(axis=0)]
        gathered = [
            pool.submit(_gather_batches, t, c[0], first, buffers, classes)
            for t, c, first in zip(tasks, checked, starts, strict=True)
        ]
        passed = np.zeros(len(classes), np.int64)
        for g in gathered:
            passed += g.result()
        if not ids_ok.result():
            return None
    tokens = [sum(c[2][i] for c in checked) for i in range(len(classes))]
    samples = [_ClassSample(*b, int(p), t) for b, p, t in zip(buffers, passed, tokens, strict=True)]
    return _SeedSummary(table.num_rows, int(counts.sum()), samples)


def _check_batches(
    batches: list, classes: list[ClassSpec]
) -> tuple[list[np.ndarray], list[int], list[int]] | None:
    """The rules other than the IDs' over ``batches`` (record batches, one per parsed block,
    ~150k rows, so temporaries stay in the CPU cache). Returns each batch's row classes (index
    in ``classes``, -1 for a failed row), and per class the successful rows and their output
    tokens; None when a rule fails."""
    import pyarrow.compute as pc

    names = [c.name for c in classes]
    fixed = _expected_outputs(classes)
    codes, counts, tokens = [], [0] * len(classes), [0] * len(classes)
    for batch in batches:
        code = _codes(batch.column("class"), names)
        status = _codes(batch.column("status"), list(STATUSES))
        if (code < 0).any() or (status < 0).any():
            return None
        ok = status == 0
        values = []
        for column in ("ttft_ms", "tpot_ms", "e2e_ms"):
            array = batch.column(column)
            if array.null_count:
                if (ok & pc.is_null(array).to_numpy(zero_copy_only=False)).any():
                    return None
                array = array.fill_null(0)
            values.append(array.to_numpy())
        ttft, tpot, e2e = values
        tokens_text = batch.column("output_tokens")
        entries, unparsed = _parse_numbers(
            tokens_text.dictionary, np.ones(len(tokens_text.dictionary), bool), integer=True
        )
        which = tokens_text.indices.to_numpy()
        if (ok & unparsed[which]).any():
            return None
        out = entries[which]  # float64: exact for any plausible length (< 2^53)
        with np.errstate(invalid="ignore"):
            # NaN propagates through minimum and maximum and fails both comparisons.
            low, high = np.minimum(ttft, tpot), np.maximum(ttft, tpot)
            good = (np.minimum(low, e2e, out=low) >= 0) & (np.maximum(high, e2e, out=high) < np.inf)
            expected = fixed[code]
            good &= (out == expected) | (expected < 0)
            gap = np.subtract(out, 1, dtype=float)  # as Python: float(O - 1), exact
            gap *= tpot
            gap += ttft
            np.subtract(e2e, gap, out=gap)
            good &= np.abs(gap, out=gap) <= 0.5
        if not (good | ~ok).all():
            return None
        code[~ok] = -1  # from here on, a row's class counts only if it succeeded
        codes.append(code)
        for i in range(len(classes)):
            mine = code == i
            k = int(np.count_nonzero(mine))
            counts[i] += k
            # Every successful output of a fixed-length class has that length (checked above).
            tokens[i] += k * int(fixed[i]) if fixed[i] >= 0 else int(out.sum(where=mine))
    return codes, counts, tokens


def _gather_batches(
    batches: list,
    codes: list[np.ndarray],
    starts: np.ndarray,
    buffers: list[list[np.ndarray]],
    classes: list[ClassSpec],
) -> list[int]:
    """Copy each class's successful TTFT, TPOT and E2E of ``batches`` (rows classed by
    ``codes``) into ``buffers`` from row ``starts[class]`` on; returns per class how many pass
    both cutoffs."""
    at, passed = starts.copy(), [0] * len(classes)
    for batch, code in zip(batches, codes, strict=True):
        ttft, tpot, e2e = (
            batch.column(c).to_numpy(zero_copy_only=False) for c in ("ttft_ms", "tpot_ms", "e2e_ms")
        )
        for i, c in enumerate(classes):
            mine = code == i
            k = int(np.count_nonzero(mine))
            if k == 0:
                continue
            x, y, z = (buffer[at[i] : at[i] + k] for buffer in buffers[i])
            np.compress(mine, ttft, out=x)
            np.compress(mine, tpot, out=y)
            np.compress(mine, e2e, out=z)
            at[i] += k
            passed[i] += int(np.count_nonzero((x <= c.ttft_cutoff_ms) & (y <= c.tpot_cutoff_ms)))
    return passed


def _ids_valid(ids) -> bool:
    """The seed's ID rule over a pyarrow binary column: non-empty, valid UTF-8 (the seed decodes
    the file), and unique as far as :func:`_surely_unique` can tell."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if ids.null_count:
        return False
    if len(ids) == 0:
        return True
    shortest, longest = pc.min_max(pc.binary_length(ids, memory_pool=_memory_pool())).values()
    if shortest.as_py() == 0:
        return False
    try:
        pc.cast(ids, pa.string())
    except pa.ArrowInvalid:
        return False
    return _surely_unique(ids, longest.as_py())


def _expected_outputs(classes: list[ClassSpec]) -> np.ndarray:
    """Each class's fixed output length, -1 where it has none (lengths are never negative)."""
    fixed = [-1 if c.expected_output_tokens is None else c.expected_output_tokens for c in classes]
    return np.array(fixed, np.int64)


def _row_hashes(ids, longest: int) -> np.ndarray:
    """A 64-bit hash of each ID of a pyarrow binary or string array (chunked or not).

    The hash of an ID of L bytes starts at L and folds in its little-endian 8-byte words w_k
    (the last one zero-padded): h = m(h XOR w_k), m(x) = y XOR (y >> 29) with
    y = x * 0x9E3779B97F4A7C15 mod 2^64, for k < ceil(L_max / 8), L_max = ``longest`` over the
    whole array (so equal IDs always get equal hashes). Little-endian machines only.
    """
    import pyarrow as pa

    chunks = ids.chunks if isinstance(ids, pa.ChunkedArray) else [ids]
    rounds = -(-longest // 8)
    hashes, at = np.empty(len(ids), np.uint64), 0
    for chunk in chunks:
        n = len(chunk)
        if n == 0:
            continue
        large = pa.types.is_large_binary(chunk.type) or pa.types.is_large_string(chunk.type)
        width = 8 if large else 4
        _, offsets_buf, data_buf = chunk.buffers()
        offsets = np.frombuffer(offsets_buf, f"<i{width}", n + 1, chunk.offset * width)
        offsets = offsets.astype(np.int64)
        length = np.diff(offsets)
        size = int(offsets[-1] - offsets[0])
        data = np.frombuffer(data_buf, np.uint8, size, int(offsets[0]))
        h = hashes[at : at + n]
        h[:] = length
        at += n
        if (length == length[0]).all():
            # One width (the usual case): the IDs are the rows of a byte matrix.
            padded = np.zeros((n, 8 * rounds), np.uint8)
            padded[:, : length[0]] = data.reshape(n, length[0])
            words = [padded.view(np.uint64)[:, k] for k in range(rounds)]
        else:
            words = _id_words(data, offsets[:-1] - offsets[0], length, rounds)
        with np.errstate(over="ignore"):
            for w in words:
                h ^= w
                h *= _MIX
                h ^= h >> np.uint64(29)
    return hashes


def _surely_unique(ids, longest: int) -> bool:
    """True when no two IDs (a pyarrow binary array; ``longest``: the longest's length) are
    equal; False on a repeated :func:`_row_hashes` value, a duplicate or (rarely) a collision, for
    the exact path to decide. Sorting the hashes finds a repeat in O(n log n) with numpy's
    vectorized sort, several times faster than a hash set of the strings."""
    import sys

    import pyarrow.compute as pc

    if sys.byteorder != "little":
        return len(pc.unique(ids)) == len(ids)
    hashes = _row_hashes(ids, longest)
    hashes.sort()
    return not (hashes[1:] == hashes[:-1]).any()


def _repeats(text: pd.Series) -> np.ndarray:
    """The rows whose value equals an earlier row's (pandas' ``duplicated(keep="first")``),
    comparing as strings only the rows whose :func:`_row_hashes` value another row shares."""
    import sys

    import pyarrow as pa
    import pyarrow.compute as pc

    if sys.byteorder != "little":
        return text.duplicated(keep="first").to_numpy()
    arr = pa.array(text)
    repeats = np.zeros(len(arr), bool)
    if len(arr) < 2:
        return repeats
    hashes = _row_hashes(arr, pc.max(pc.binary_length(arr)).as_py() or 0)
    order = np.argsort(hashes)
    shared = hashes[order[1:]] == hashes[order[:-1]]
    if shared.any():
        suspects = np.zeros(len(arr), bool)
        suspects[order[1:][shared]] = suspects[order[:-1][shared]] = True
        rows = np.flatnonzero(suspects)  # in file order
        repeats[rows] = text.iloc[rows].duplicated(keep="first").to_numpy()
    return repeats


def _id_words(data: np.ndarray, start: np.ndarray, length: np.ndarray, rounds: int):
    """Word k = 0, 1, ... ``rounds`` - 1 of IDs of varying lengths: bytes [8k, 8k + 8) of each,
    little-endian, zero past its end (the IDs lie back to back in ``data``)."""
    # Zero-padded words: a read past an ID (and past the buffer) sees bytes that are masked.
    words = np.zeros((data.size + 8 * rounds) // 8 + 2, np.uint64)
    words.view(np.uint8)[: data.size] = data
    for k in range(rounds):
        pos = start + 8 * k
        q, shift = pos >> 3, ((pos & 7) << 3).astype(np.uint64)
        # numpy defines x << 64 as 0, which the aligned case (shift 0) relies on.
        w = (words[q] >> shift) | (words[q + 1] << (np.uint64(64) - shift))
        keep = (np.clip(length - 8 * k, 0, 8) << 3).astype(np.uint64)
        w &= (np.uint64(1) << keep) - np.uint64(1)  # 1 << 64 is 0: all ones
        yield w


def _codes(values, names: list[str]) -> np.ndarray:
    """Each value's index in ``names`` (int8; -1 when absent or null), for a pyarrow array of
    text, plain or dictionary-encoded: a dictionary is looked up once per distinct value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    out = [np.empty(0, np.int8)]
    for chunk in chunks:
        if pa.types.is_dictionary(chunk.type):
            found = pc.index_in(chunk.dictionary, pa.array(names, chunk.type.value_type))
            lookup = np.append(found.fill_null(-1).to_numpy().astype(np.int8), np.int8(-1))
            # A null index reads the appended -1.
            out.append(lookup[chunk.indices.fill_null(len(chunk.dictionary)).to_numpy()])
        else:
            found = pc.index_in(chunk, pa.array(names, chunk.type))
            out.append(found.fill_null(-1).to_numpy().astype(np.int8))
    return np.concatenate(out)


def _numeric(
    text: pd.Series, rows: np.ndarray, integer: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Python's float() (int() if ``integer``) of a text column: the values as float64 (NaN
    where unparsed) and the mask of ``rows`` on which Python would raise (see
    :func:`_parse_numbers`)."""
    import pyarrow as pa

    arr = pa.array(text.astype(str))
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return _parse_numbers(arr, rows, integer)


def _parse_numbers(arr, rows: np.ndarray, integer: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_numeric` of a pyarrow string array.

    A float column pyarrow converts whole is taken as converted (its grammar is a subset of
    Python's, with the same values, except NaN payloads such as "nan(1)", which are checked).
    Otherwise, and always for integers (pyarrow also reads hexadecimal ones), ASCII text is
    matched against Python's grammar and the matches are converted by pyarrow once spaces and
    underscores are dropped; only non-ASCII text that fails the match (Unicode digits or spaces,
    which Python also accepts) goes through Python, once per distinct string.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        parsed = None if integer else pc.cast(arr, pa.float64())
    except pa.ArrowInvalid:
        parsed = None
    if parsed is not None and not parsed.null_count:
        values = np.array(parsed.to_numpy(zero_copy_only=False), dtype=float)
        bad = rows & np.isnan(values)
        if bad.any():
            where = np.flatnonzero(bad)
            nan = pc.match_substring_regex(arr.take(where), _FLOAT_RE).fill_null(False)
            bad[where] = ~nan.to_numpy(zero_copy_only=False)
        return values, bad
    fits = pc.match_substring_regex(arr, _INT_RE if integer else _FLOAT_RE).fill_null(False)
    clean = pc.replace_substring(pc.utf8_trim(arr, " \t\n\r\x0b\x0c"), "_", "")
    values = pc.cast(pc.if_else(fits, clean, "nan"), pa.float64()).to_numpy(zero_copy_only=False)
    values = np.array(values, dtype=float)  # writable
    fits = fits.to_numpy(zero_copy_only=False)
    bad = rows & ~fits
    strange = bad & ~pc.string_is_ascii(arr).fill_null(True).to_numpy(zero_copy_only=False)
    if strange.any():
        where = np.flatnonzero(strange)
        distinct, inverse = np.unique(
            np.array(arr.take(where).to_pylist(), dtype=object), return_inverse=True
        )
        parsed = [_python_number(s, integer) for s in distinct]  # per distinct string
        values[where] = np.array([v for v, _ in parsed], dtype=float)[inverse]
        bad[where] = ~np.array([good for _, good in parsed], dtype=bool)[inverse]
    return values, bad


def _python_number(text: str, integer: bool) -> tuple[float, bool]:
    try:
        return float(int(text) if integer else float(text)), True
    except (ValueError, OverflowError):
        return math.nan, False


def validate_seed_table(
    frame: pd.DataFrame, classes: list[ClassSpec], source: str
) -> dict[str, np.ndarray]:
    """Apply the seed's validation (same messages, first failing row) and return parsed columns.

    The seed checks every row, in file order, for a non-empty unseen ID, then a known class, then
    a recognized status; then every ok row, in file order, for numbers (Python float() of TTFT,
    TPOT, E2E, int() of output_tokens), finite non-negative latencies, the class's fixed output
    length and |E2E - (TTFT + TPOT (O - 1))| <= 0.5. Here each rule is a mask over all rows, and
    the first row failing any rule of a pass is reported with its first failing rule. Messages
    are the seed's, prefixed with the file and CSV line (header = line 1); a value that is not a
    number names its column instead of Python's conversion error.

    Returns ``code`` (each row's index in ``classes``), ``ok``, ttft, tpot, e2e and out (float).
    """
    import pyarrow as pa

    rid = frame["request_id"].astype(str)
    code = _codes(pa.array(frame["class"].astype(str)), [c.name for c in classes])
    status = _codes(pa.array(frame["status"].astype(str)), list(STATUSES))
    bad_id = (rid.str.len() == 0).to_numpy() | _repeats(rid)
    bad_class, bad_status = code < 0, status < 0
    first = _first(bad_id | bad_class | bad_status)
    if first is not None:
        if bad_id[first]:
            msg = "request IDs must be nonempty and unique"
        elif bad_class[first]:
            msg = "unknown workload class"
        else:
            msg = "every scheduled request needs a recognized terminal status"
        raise AnalysisError(f"{source}: line {first + 2}: {msg}")
    ok = status == 0
    ttft, bad_ttft = _numeric(frame["ttft_ms"], ok)
    tpot, bad_tpot = _numeric(frame["tpot_ms"], ok)
    e2e, bad_e2e = _numeric(frame["e2e_ms"], ok)
    out, bad_out = _numeric(frame["output_tokens"], ok, integer=True)
    parsed = ok & ~(bad_ttft | bad_tpot | bad_e2e | bad_out)
    expected = _expected_outputs(classes)[code]
    with np.errstate(invalid="ignore"):
        bad_lat = parsed & ~(
            np.isfinite(ttft) & np.isfinite(tpot) & np.isfinite(e2e)
            & (ttft >= 0) & (tpot >= 0) & (e2e >= 0)
        )  # fmt: skip
        bad_len = parsed & (expected >= 0) & (out != expected)
        bad_sum = parsed & (np.abs(e2e - (ttft + tpot * (out - 1))) > 0.5)
    checks = [
        (bad_ttft, "ttft_ms", "not a number"),
        (bad_tpot, "tpot_ms", "not a number"),
        (bad_e2e, "e2e_ms", "not a number"),
        (bad_out, "output_tokens", "not a whole number"),
        (bad_lat, None, "latencies must be finite and nonnegative"),
        (bad_len, None, "successful output length differs from the fixed workload"),
        (bad_sum, None, "TTFT/TPOT/E2E disagree under this fixture's metric convention"),
    ]
    first = _first(np.logical_or.reduce([mask for mask, _, _ in checks]))
    if first is not None:
        mask, column, msg = next(check for check in checks if check[0][first])
        if column is None:
            raise AnalysisError(f"{source}: line {first + 2}: {msg}")
        value = frame[column].iloc[first]
        raise AnalysisError(f"{source}: line {first + 2}, column {column}: {value!r} is {msg}")
    return {"code": code, "ok": ok, "ttft": ttft, "tpot": tpot, "e2e": e2e, "out": out}


def _first(mask: np.ndarray) -> int | None:
    return int(np.argmax(mask)) if mask.any() else None


def nearest_rank(sorted_values: np.ndarray, p: float) -> float | None:
    """The seed's nearest-rank percentile of an already sorted array."""
    n = sorted_values.size
    if n == 0:
        return None
    return float(sorted_values[max(0, math.ceil(p * n) - 1)])


def _nearest_ranks(values: np.ndarray, ps: tuple[float, ...]) -> list[float | None]:
    """:func:`nearest_rank` at each p of an unsorted array, by one partition instead of a sort
    (O(n)); ``values`` is reordered in place."""
    n = values.size
    if n == 0:
        return [None] * len(ps)
    ranks = [max(0, math.ceil(p * n) - 1) for p in ps]
    values.partition(sorted(set(ranks)))
    return [float(values[k]) for k in ranks]


# ---------------------------------------------------------------------------------------------
# The seed's report
# ---------------------------------------------------------------------------------------------


def seed_report(
    cols: dict[str, np.ndarray],
    duration_s: float,
    queue_trend: str,
    classes: list[ClassSpec],
    gates: Gates,
) -> dict[str, Any]:
    """Every key of the seed's report, with the seed's values.

    ``cols`` holds ttft, tpot, e2e and out per row, and either ``code`` (the row's index in
    ``classes``, -1 for none) and ``ok`` (a boolean mask), or the text columns class and status.
    """
    _check_arguments(duration_s, queue_trend)
    if "code" in cols:
        code, ok = cols["code"], cols["ok"]
    else:
        names = [c.name for c in classes]
        code = pd.Categorical(np.asarray(cols["class"], dtype=object), categories=names).codes
        ok = np.asarray(cols["status"], dtype=object) == "ok"
    samples = []
    for i, c in enumerate(classes):
        mine = ok & (code == i)
        ttft, tpot = cols["ttft"][mine], cols["tpot"][mine]
        passed = int(np.count_nonzero((ttft <= c.ttft_cutoff_ms) & (tpot <= c.tpot_cutoff_ms)))
        tokens = int(cols["out"][mine].sum())
        samples.append(_ClassSample(ttft, tpot, cols["e2e"][mine], passed, tokens))
    summary = _SeedSummary(int(code.size), int(np.count_nonzero(ok)), samples)
    return _seed_report(summary, duration_s, queue_trend, classes, gates)


def _check_arguments(duration_s: float, queue_trend: str) -> None:
    if not math.isfinite(duration_s) or duration_s <= 0:
        raise AnalysisError("duration must be positive")
    if queue_trend not in {"flat", "growing"}:
        raise AnalysisError("queue trend must be flat or growing")


def _seed_report(
    summary: _SeedSummary,
    duration_s: float,
    queue_trend: str,
    classes: list[ClassSpec],
    gates: Gates,
) -> dict[str, Any]:
    """The seed's report from a summary (its latency arrays are reordered in place)."""
    from concurrent.futures import ThreadPoolExecutor

    attempted, successful = summary.attempted, summary.successful
    # Per class, (p50, p95, p99) of TTFT and TPOT and p95 of E2E; on two threads, as numpy's
    # partition releases the GIL.
    ps = [(0.50, 0.95, 0.99), (0.50, 0.95, 0.99), (0.95,)] * len(classes)
    arrays = [a for s in summary.samples for a in (s.ttft, s.tpot, s.e2e)]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(_nearest_ranks, arrays, ps))
    ranks = [done[3 * i : 3 * i + 3] for i in range(len(classes))]
    failed = attempted - successful
    passed_total = 0
    out_tokens_total = 0
    report_classes: dict[str, Any] = {}
    for i in sorted(range(len(classes)), key=lambda i: classes[i].name):
        c, s = classes[i], summary.samples[i]
        count, passed = int(s.ttft.size), s.passed
        passed_total += passed
        out_tokens_total += s.tokens
        attainment = passed / count if count else None
        adequate = count >= gates.min_successful_samples_per_class
        p99_ok = count >= gates.p99_min_samples
        (t50, t95, t99), (s50, s95, s99), (e95,) = ranks[i]
        report_classes[c.name] = {
            "successful_count": count,
            "passing_count": passed,
            "request_ttft_cutoff_ms": c.ttft_cutoff_ms,
            "request_tpot_cutoff_ms": c.tpot_cutoff_ms,
            "attainment": attainment,
            "sample_adequate": adequate,
            "p99_sample_adequate": p99_ok,
            "class_slo_pass": bool(adequate and attainment >= gates.class_slo_attainment_min),
            "p50_ttft_ms": t50,
            "p95_ttft_ms": t95,
            "p99_ttft_ms": t99 if p99_ok else None,
            "p50_tpot_ms": s50,
            "p95_tpot_ms": s95,
            "p99_tpot_ms": s99 if p99_ok else None,
            "p95_e2e_ms": e95,
            "output_tokens": s.tokens,
        }
    error_rate = failed / attempted if attempted else None
    all_pass = all(v["class_slo_pass"] for v in report_classes.values())
    return {
        "attempted": attempted,
        "successful": successful,
        "failed": failed,
        "error_rate": error_rate,
        "overall_attainment": passed_total / successful if successful else None,
        "observed_goodput_rps": passed_total / duration_s,
        "request_throughput_rps": successful / duration_s,
        "output_throughput_tps": out_tokens_total / duration_s,
        "queue_trend": queue_trend,
        "all_class_slos_pass": all_pass,
        "capacity_gate_pass": bool(
            all_pass
            and error_rate is not None
            and error_rate <= gates.error_rate_max
            and queue_trend == "flat"
        ),
        "classes": report_classes,
    }


def analyze_csv(
    path: str | Path,
    duration_s: float,
    queue_trend: str,
    classes: list[ClassSpec] | None = None,
    gates: Gates | None = None,
) -> dict[str, Any]:
    """``capacity-pack analyze``: the seed's analyzer on a requests.csv.

    The fast path parses the file typed and checks every rule at once; a file it cannot clear
    (a rule fails, or a value pyarrow does not read as a number) is read again as text and
    checked by the exact path, which reports the first failing row with the seed's message.
    """
    classes = classes or seed_classes()
    gates = gates or Gates()
    _check_arguments(duration_s, queue_trend)
    summary = _fast_seed_summary(Path(path), classes)
    if summary is None:
        cols = validate_seed_table(read_requests_csv(path), classes, str(path))
        report = seed_report(cols, duration_s, queue_trend, classes, gates)
    else:
        report = _seed_report(summary, duration_s, queue_trend, classes, gates)
    report["percentile_method"] = "nearest_rank"
    return report


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def wilson_interval(passed: int, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval of a binomial proportion."""
    if n <= 0:
        return None
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = passed / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, round(centre + half, 12))


def early_stopping_min_samples(
    overlatency: int, percentile: float = 0.99, confidence: float = 0.99, limit: int = 10**9
) -> int | None:
    """MLPerf LoadGen early stopping: the smallest n proving the percentile with ``overlatency``
    requests over the cutoff, i.e. the least n with BinomCDF(h; n, 1 - percentile) <= 1 - c."""
    from scipy.stats import binom

    q = 1.0 - percentile
    alpha = 1.0 - confidence

    def proven(n: int) -> bool:
        return binom.cdf(overlatency, n, q) <= alpha

    lo = max(1, overlatency + 1)
    if proven(lo):
        return lo
    hi = lo
    while not proven(hi):
        hi *= 2
        if hi > limit:
            return None
    while lo + 1 < hi:  # proven(hi), not proven(lo): CDF falls as n grows
        mid = (lo + hi) // 2
        if proven(mid):
            hi = mid
        else:
            lo = mid
    return hi


def mann_kendall(values: np.ndarray) -> dict[str, float | int | None]:
    """Mann-Kendall trend test: S, Z (tie-corrected variance), one-sided p of an increase."""
    x = np.asarray(values, dtype=float)
    n = x.size
    if n < 3:
        return {"n": int(n), "s": None, "z": None, "p_increasing": None, "sen_slope": None}
    diff = x[None, :] - x[:, None]
    s = float(np.sign(diff[np.triu_indices(n, 1)]).sum())
    _, counts = np.unique(x, return_counts=True)
    var = (n * (n - 1) * (2 * n + 5) - float((counts * (counts - 1) * (2 * counts + 5)).sum())) / 18
    z = 0.0 if s == 0 or var <= 0 else (s - math.copysign(1, s)) / math.sqrt(var)
    i, j = np.triu_indices(n, 1)
    slopes = (x[j] - x[i]) / (j - i)
    return {
        "n": int(n),
        "s": s,
        "z": float(z),
        "p_increasing": float(1 - NormalDist().cdf(z)),
        "sen_slope": float(np.median(slopes)),
    }


def trend_of(
    series: pd.DataFrame, t_start_ns: int, t_end_ns: int, *, min_samples: int = 8
) -> dict[str, Any]:
    """Queue trend over [t_start, t_end] from a series with columns t_offset_ns and value."""
    window = series[(series["t_offset_ns"] >= t_start_ns) & (series["t_offset_ns"] <= t_end_ns)]
    window = window.sort_values("t_offset_ns")
    values = window["value"].to_numpy(dtype=float)
    mk = mann_kendall(values)
    result: dict[str, Any] = {
        "samples": int(values.size),
        **mk,
        # The evidence itself, so a reader can redo the test.
        "series": {
            "t_offset_s": (window["t_offset_ns"].to_numpy() / 1e9).round(3).tolist(),
            "value": values.tolist(),
        },
    }
    if values.size < min_samples:
        result["trend"] = "inconclusive"
        return result
    span_samples = values.size - 1
    growth = (mk["sen_slope"] or 0.0) * span_samples
    result["growth_over_window"] = growth
    significant = mk["z"] is not None and mk["z"] > NormalDist().inv_cdf(0.95)
    result["trend"] = "growing" if significant and growth >= 1.0 else "flat"
    return result


def littles_law(
    sent_ns: np.ndarray, end_ns: np.ndarray, t_start_ns: int, t_end_ns: int, tolerance: float = 0.1
) -> dict[str, Any]:
    """Little's Law check over all terminal requests in the window (see the module docstring)."""
    span = t_end_ns - t_start_ns
    if span <= 0 or sent_ns.size == 0:
        return {"checked": False}
    overlap = np.clip(np.minimum(end_ns, t_end_ns) - np.maximum(sent_ns, t_start_ns), 0, None)
    l_obs = float(overlap.sum() / span)
    done = (end_ns >= t_start_ns) & (end_ns <= t_end_ns)
    lam = float(done.sum() / (span / 1e9))
    w = float(((end_ns - sent_ns)[done]).mean() / 1e9) if done.any() else 0.0
    l_est = lam * w
    gap = abs(l_obs - l_est) / l_obs if l_obs > 0 else None
    return {
        "checked": True,
        "average_in_flight": l_obs,
        "completion_rate_rps": lam,
        "mean_time_to_terminal_s": w,
        "little_estimate": l_est,
        "relative_gap": gap,
        "flagged": bool(gap is not None and gap > tolerance),
    }


def little_estimate(rate: float, mean_seconds: float) -> float:
    """L = lambda W (the seed's 23.9/s x 1.8 s = 43.02)."""
    if rate < 0 or mean_seconds < 0:
        raise ValueError("rate and mean time must be non-negative")
    return rate * mean_seconds


# ---------------------------------------------------------------------------------------------
# The pipeline's per-point analysis
# ---------------------------------------------------------------------------------------------

MEASURED_PHASES = ("measure", "extension")


def _pcts(values: np.ndarray, withhold_p99: bool) -> dict[str, float | None]:
    s = np.sort(values[np.isfinite(values)])
    return {
        "p50": nearest_rank(s, 0.50),
        "p95": nearest_rank(s, 0.95),
        "p99": None if withhold_p99 else nearest_rank(s, 0.99),
        "max": float(s[-1]) if s.size else None,
    }


def measured_window(requests: pd.DataFrame) -> tuple[int, int]:
    """[first measured send, last measured terminal event] in ns offsets from the run start."""
    m = requests[requests["phase"].isin(MEASURED_PHASES)]
    # Per row: a sharded point's shards each keep their own t0 (offsets share one axis).
    t0 = m["sent_ns"] - m["sent_offset_ns"]
    return int(m["sent_offset_ns"].min()), int((m["end_ns"] - t0).max())


def analyze_point(
    requests: pd.DataFrame,
    chunks: pd.DataFrame,
    metrics: pd.DataFrame,
    sweep_summary: dict[str, Any],
    classes: list[ClassSpec],
    gates: Gates,
    *,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """The seed's report for the point's measured requests, plus the extensions above."""
    m = requests[requests["phase"].isin(MEASURED_PHASES)].reset_index(drop=True)
    if m.empty:
        raise AnalysisError("the point has no measured requests")
    start_ns, end_ns = measured_window(requests)
    duration_s = (end_ns - start_ns) / 1e9

    # Queue trend over the steady-state window: from the first to the last measured arrival.
    steady_start = int(m["due_offset_ns"].where(m["due_offset_ns"] > 0, m["sent_offset_ns"]).min())
    steady_end = int(m["due_offset_ns"].where(m["due_offset_ns"] > 0, m["sent_offset_ns"]).max())
    server_q = metrics[(metrics["source"] == "server") & (metrics["metric"] == "queue_depth")]
    backlog = metrics[(metrics["source"] == "client") & (metrics["metric"] == "due_unsent")]
    trends = {
        "server_queue_depth": trend_of(server_q, steady_start, steady_end),
        "client_backlog": trend_of(backlog, steady_start, steady_end),
    }
    decided = [t["trend"] for t in trends.values() if t["samples"] > 0]
    if "growing" in decided:
        queue_trend = "growing"
    elif decided and all(d == "flat" for d in decided):
        queue_trend = "flat"
    else:
        queue_trend = "inconclusive"

    cols = {
        "class": m["class"].to_numpy(dtype=object),
        "status": m["status"].to_numpy(dtype=object),
        "ttft": m["ttft_ms"].to_numpy(dtype=float),
        "tpot": m["tpot_ms"].to_numpy(dtype=float),
        "e2e": m["e2e_ms"].to_numpy(dtype=float),
        "out": m["output_tokens"].to_numpy(dtype=float),
    }
    # The seed's gate takes flat/growing; an undecided trend cannot pass, so it reads as growing
    # there, and the label below says inconclusive.
    report = seed_report(
        cols, duration_s, "flat" if queue_trend == "flat" else "growing", classes, gates
    )
    report["queue_trend"] = queue_trend
    report["queue_trend_evidence"] = trends

    ok = m["status"] == "ok"
    ck = chunks.merge(m[["request_id", "class"]], on="request_id")
    multi_token = bool((ck["tokens"] > 1).any())
    labels: list[str] = []
    marginal: list[str] = []
    for c in classes:
        entry = report["classes"][c.name]
        in_class = m["class"] == c.name
        okc = m[ok & in_class]
        n_ok, passed = entry["successful_count"], entry["passing_count"]
        ci = wilson_interval(passed, n_ok, confidence)
        entry["attainment_ci"] = list(ci) if ci else None
        entry["attainment_ci_confidence"] = confidence
        attempted_c = int(in_class.sum())
        entry["attempted"] = attempted_c
        entry["error_rate"] = (attempted_c - n_ok) / attempted_c if attempted_c else None
        entry["all_attempt_attainment"] = passed / attempted_c if attempted_c else None
        withhold = n_ok < gates.p99_min_samples
        entry["itl_ms"] = _pcts(ck.loc[ck["class"] == c.name, "gap_ms"].to_numpy(float), withhold)
        entry["ttft_from_scheduled_ms"] = _pcts(
            okc["ttft_from_scheduled_ms"].to_numpy(float), withhold
        )
        entry["e2e_from_scheduled_ms"] = _pcts(
            okc["e2e_from_scheduled_ms"].to_numpy(float), withhold
        )
        entry["p50_e2e_ms"] = nearest_rank(np.sort(okc["e2e_ms"].to_numpy(float)), 0.5)
        for metric, cutoff in (("ttft", c.ttft_cutoff_ms), ("tpot", c.tpot_cutoff_ms)):
            over = int((okc[f"{metric}_ms"] > cutoff).sum())
            need = early_stopping_min_samples(over) if n_ok else None
            entry[f"p99_{metric}_early_stopping"] = {
                "over_cutoff": over,
                "min_samples_to_prove": need,
                "proven": bool(need is not None and n_ok >= need),
            }
        if entry["class_slo_pass"]:
            lo = ci[0] if ci else 0.0
            if lo < gates.class_slo_attainment_min:
                marginal.append(
                    f"{c.name}: attainment CI lower bound {lo:.4f} < "
                    f"{gates.class_slo_attainment_min}"
                )
        if gates.per_class_error_rate_max is not None:
            entry["per_class_error_gate_pass"] = bool(
                entry["error_rate"] is not None
                and entry["error_rate"] <= gates.per_class_error_rate_max
            )
        if gates.all_attempt_attainment_min is not None:
            entry["all_attempt_attainment_gate_pass"] = bool(
                entry["all_attempt_attainment"] is not None
                and entry["all_attempt_attainment"] >= gates.all_attempt_attainment_min
            )
    status_counts = m["status"].value_counts().to_dict()
    delay = m["client_delay_ms"].to_numpy(float)
    report.update(
        measured_window_s=duration_s,
        window_start_offset_ns=start_ns,
        window_end_offset_ns=end_ns,
        errors_by_status={s: int(status_counts.get(s, 0)) for s in STATUSES},
        client_scheduling_delay_ms=_pcts(delay, False),
        chunks_carry_several_tokens=multi_token,
        itl_note=(
            "ITL are gaps between observed chunks; some chunks carried several tokens, so chunk "
            "gaps and per-token TPOT use different denominators"
            if multi_token
            else "one token per chunk: ITL gaps are per-token gaps"
        ),
        littles_law=littles_law(
            requests["sent_offset_ns"].to_numpy(np.int64),
            (requests["end_ns"] - requests["sent_ns"] + requests["sent_offset_ns"]).to_numpy(
                np.int64
            ),
            steady_start,
            steady_end,
        ),
        prefix_cache_hit_rate=sweep_summary.get("server_prefix_hit_rate"),
        client_cached_token_fraction=sweep_summary.get("client_cached_token_fraction"),
        client_bound=bool(sweep_summary.get("client_bound", False)),
        # None: one client process, or shards on hosts whose skew could not be measured.
        shard_clock_valid=sweep_summary.get("shard_clock_valid"),
        dispatch_lateness_ms=sweep_summary.get("dispatch_lateness_ms"),
        under_sampled_classes=[
            c.name for c in classes if not report["classes"][c.name]["sample_adequate"]
        ],
        percentile_method="nearest_rank",
    )
    optional = []
    if gates.per_class_error_rate_max is not None:
        optional.append(
            all(report["classes"][c.name]["per_class_error_gate_pass"] for c in classes)
        )
    if gates.all_attempt_attainment_min is not None:
        optional.append(
            all(report["classes"][c.name]["all_attempt_attainment_gate_pass"] for c in classes)
        )
    report["optional_gates_pass"] = all(optional) if optional else None
    gate = report["capacity_gate_pass"] and (report["optional_gates_pass"] is not False)
    report["gate_pass"] = bool(gate)
    unproven = [
        f"{c.name}: P99 {metric.upper()} not proven by early stopping"
        for c in classes
        for metric in ("ttft", "tpot")
        if report["classes"][c.name]["sample_adequate"]
        and not report["classes"][c.name][f"p99_{metric}_early_stopping"]["proven"]
    ]
    if report["client_bound"]:
        labels.append("client-bound: dispatch lateness above its bound, not a server result")
    if report["shard_clock_valid"] is False:
        labels.append("shard clocks: skew between the client shards beyond its tolerance")
    if report["under_sampled_classes"]:
        labels.append(f"under-sampled: {report['under_sampled_classes']}")
    if queue_trend == "inconclusive":
        labels.append("queue trend inconclusive")
    if labels:
        verdict = "inconclusive"
    elif not gate:
        verdict = "fail"
    elif marginal:
        verdict = "marginal"
    else:
        verdict = "pass"
    report["verdict"] = verdict
    report["verdict_reasons"] = (
        labels + (marginal if gate else []) + (failing_gates(report, gates) if not gate else [])
    )
    # P99 is reported, not gated: say where its sample cannot prove it yet.
    report["notes"] = unproven
    if sweep_summary.get("shards") and report["shard_clock_valid"] is None:
        report["notes"].append(
            "shard clocks unverified: the shards ran on hosts whose realtime skew was not "
            "measured (no NTP state); see the sweep summary's shards.clock_check"
        )
    return report


def failing_gates(report: dict[str, Any], gates: Gates) -> list[str]:
    """Which gates a point failed, in words (used to say what limited the next rate up)."""
    out = []
    for name, c in report["classes"].items():
        if not c["sample_adequate"]:
            out.append(
                f"{name}: {c['successful_count']} successful < "
                f"{gates.min_successful_samples_per_class}"
            )
        elif not c["class_slo_pass"]:
            out.append(
                f"{name}: attainment {c['attainment']:.4f} < {gates.class_slo_attainment_min}"
            )
        if c.get("per_class_error_gate_pass") is False:
            out.append(
                f"{name}: error rate {c['error_rate']:.4f} > {gates.per_class_error_rate_max}"
            )
        if c.get("all_attempt_attainment_gate_pass") is False:
            out.append(
                f"{name}: all-attempt attainment {c['all_attempt_attainment']:.4f} < "
                f"{gates.all_attempt_attainment_min}"
            )
    if report["error_rate"] is not None and report["error_rate"] > gates.error_rate_max:
        out.append(f"error rate {report['error_rate']:.4f} > {gates.error_rate_max}")
    if report["queue_trend"] != "flat":
        out.append(f"queue trend {report['queue_trend']}")
    return out


def tracking_record(summary: dict[str, Any]) -> dict[str, Any]:
    """The MLflow child run of one analysis job (metrics per class, gates, trend, hit rate)."""
    metrics: dict[str, Any] = {
        "attempted_requests": summary["attempted"],
        "successful_requests": summary["successful"],
        "error_rate": summary["error_rate"],
        "observed_goodput_rps": summary["observed_goodput_rps"],
        "request_throughput_rps": summary["request_throughput_rps"],
        "output_throughput_tps": summary["output_throughput_tps"],
        "measured_window_s": summary["measured_window_s"],
        "gate_pass": float(summary["gate_pass"]),
        "queue_trend_flat": float(summary["queue_trend"] == "flat"),
        "prefix_cache_hit_rate": summary.get("prefix_cache_hit_rate"),
        "little_relative_gap": summary["littles_law"].get("relative_gap"),
        "client_scheduling_delay_p99_ms": summary["client_scheduling_delay_ms"]["p99"],
    }
    for name, c in summary["classes"].items():
        metrics[f"{name}.attainment"] = c["attainment"]
        if c["attainment_ci"]:
            metrics[f"{name}.attainment_ci_low"] = c["attainment_ci"][0]
            metrics[f"{name}.attainment_ci_high"] = c["attainment_ci"][1]
        metrics[f"{name}.successful_requests"] = c["successful_count"]
        for key in (
            "p50_ttft_ms",
            "p95_ttft_ms",
            "p99_ttft_ms",
            "p50_tpot_ms",
            "p95_tpot_ms",
            "p99_tpot_ms",
            "p95_e2e_ms",
        ):
            metrics[f"{name}.{key}"] = c[key]
        metrics[f"{name}.itl_p99_ms"] = c["itl_ms"]["p99"]
    return {
        "stage": "analysis",
        "job": f"analysis/{summary['key']}",
        "point": summary["point"],
        "cache_state": summary["cache_state"],
        "repeat": summary["repeat"],
        "params": {"percentile_method": summary["percentile_method"]},
        "metrics": metrics,
        "tags": {
            "capacity_pack.verdict": summary["verdict"],
            "capacity_pack.queue_trend": summary["queue_trend"],
        },
    }


class AnalysisSpec(BaseModel):
    """Exactly the manifest content the analysis reads: classes, cutoffs, fixed lengths, gates."""

    model_config = ConfigDict(extra="forbid")

    workload: list[WorkloadClass]
    acceptance: Acceptance
    pack_label: str

    @classmethod
    def of(cls, pack) -> AnalysisSpec:
        return cls(workload=pack.workload, acceptance=pack.acceptance, pack_label=pack.pack.label)

    def classes(self) -> list[ClassSpec]:
        return pack_classes(self)

    def gates(self) -> Gates:
        return pack_gates(self)

    def canonical_json(self) -> str:
        from capacity_pack.io import canonical_json

        return canonical_json(self.model_dump(mode="json"))
