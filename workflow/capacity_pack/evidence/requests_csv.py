"""The request-log analyzer behind ``capacity-pack analyze requests.csv DURATION flat``.

It reads a flat requests.csv (columns request_id, class, ttft_ms, tpot_ms, e2e_ms, output_tokens,
status, and optionally output_tokens_expected: each row's scheduled output length, as a pack's own
requests.csv carries it), validates it (the rules: :func:`validate_requests_table`; without
output_tokens_expected the lengths of a distribution class are not checked), and writes the
per-class SLO report of :mod:`.slo_report` for a window of DURATION seconds and the stated queue
trend. The header must be UTF-8 and name every column at most once (a repeated name is refused
with the column named); a file that is not UTF-8 is refused with the offset of its first bad
byte ("FILE is not UTF-8 text (byte N)").

Two paths give the same report: a fast one that parses the file typed with pyarrow on two
threads and checks every rule at once (:func:`_fast_summary`), and at its first doubt the exact
one, which reads the file again as text and words the first failure. Why and the timings:
docs/performance.md, the requests.csv analyzer.
"""

from __future__ import annotations

import codecs
import csv
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from capacity_pack.evidence.gates import Gates
from capacity_pack.evidence.slo_report import (
    STATUSES,
    AnalysisError,
    ClassSample,
    ClassSpec,
    Summary,
    check_arguments,
    class_report,
    summary_report,
    tutorial_classes,
)
from capacity_pack.vocab.slo import meets_slo

if TYPE_CHECKING:
    import pandas as pd  # annotations only: the analyzer's import path stays free of pandas

CSV_COLUMNS = ["request_id", "class", "ttft_ms", "tpot_ms", "e2e_ms", "output_tokens", "status"]
# Optional: each row's scheduled output length (a pack's own requests.csv has it).
SCHEDULED_COLUMN = "output_tokens_expected"


def read_requests_csv(path: str | Path) -> pd.DataFrame:
    """A requests.csv with every column as text (pyarrow): the exact path's input (with
    output_tokens_expected where the file has it)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    path = Path(path)
    source: Any = path
    if path.is_file() and path.stat().st_size < _HEADER_BYTES:
        raw = path.read_bytes()
        if raw and not raw.endswith((b"\n", b"\r")):
            # pyarrow reads no column names from a lone header without a line end.
            source = pa.BufferReader(raw + b"\n")
    try:
        table = pacsv.read_csv(
            source,
            read_options=pacsv.ReadOptions(block_size=_BLOCK_BYTES),
            convert_options=pacsv.ConvertOptions(
                column_types={c: "string" for c in [*CSV_COLUMNS, SCHEDULED_COLUMN]},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
            memory_pool=_memory_pool(),
        )
    except FileNotFoundError:
        raise AnalysisError(f"{path}: no such file") from None
    except Exception as err:  # pyarrow's parse errors quote the row; name its line if we can
        if (offset := first_non_utf8_byte(path)) is not None:
            raise AnalysisError(f"{path} is not UTF-8 text (byte {offset})") from None
        if (ragged := _first_ragged_line(path)) is not None:
            line, got, want = ragged
            raise AnalysisError(
                f"{path}: line {line}: {got} field(s) where the header has {want}"
            ) from None
        raise AnalysisError(f"{path}: not a readable CSV: {' '.join(str(err).split())}") from None
    _check_columns(path, table.column_names)
    scheduled = [SCHEDULED_COLUMN] if SCHEDULED_COLUMN in table.column_names else []
    return table.select([*CSV_COLUMNS, *scheduled]).to_pandas()


def _check_columns(path: Path, names: list[str]) -> None:
    missing = [c for c in CSV_COLUMNS if c not in names]
    if missing:
        raise AnalysisError(
            f"{path}: missing column(s) {missing}; expected the header {','.join(CSV_COLUMNS)}"
        )


# The header is read by itself, up to its first newline: no real header is longer.
_HEADER_BYTES = 1 << 20


def check_header(path: Path) -> list[str]:
    """Refuse a header (line 1) that is not UTF-8 text or that names a column twice; return
    its column names."""
    try:
        with path.open("rb") as fh:
            head = fh.readline(_HEADER_BYTES)
    except FileNotFoundError:
        raise AnalysisError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise AnalysisError(f"{path}: a directory, not a CSV file") from None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.end < len(head) or len(head) < _HEADER_BYTES:
            raise AnalysisError(f"{path} is not UTF-8 text (byte {err.start})") from None
        text = head[: err.start].decode("utf-8")  # a character cut by the read limit
    text = text.removeprefix("\ufeff")  # pyarrow skips a UTF-8 byte-order mark
    # pyarrow ends a line at \n, \r\n or a lone \r.
    first = text.replace("\r\n", "\n").replace("\r", "\n").split("\n", 1)[0]
    try:
        names = next(csv.reader([first]), [])
    except csv.Error as err:
        raise AnalysisError(f"{path}: line 1: not a CSV header ({err})") from None
    if not any(names):
        raise AnalysisError(f"{path}: line 1: no header; expected {','.join(CSV_COLUMNS)}")
    _check_columns(path, names)
    repeated = [name for name, n in Counter(names).items() if n > 1]
    if repeated:
        listed = ", ".join(f"{name!r} ({names.count(name)} times)" for name in repeated)
        raise AnalysisError(
            f"{path}: line 1: the header names column {listed}; each column must be named once"
        )
    return names


def _first_ragged_line(path: Path) -> tuple[int, int, int] | None:
    """(line, fields, header fields) of the first record whose field count differs from the
    header's, as Python's csv module splits them (blank lines skipped, as pyarrow does)."""
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        try:
            width = len(next(reader, []))
            for row in reader:
                if row and len(row) != width:
                    return reader.line_num, len(row), width
        except csv.Error:  # a field over csv's size limit: pyarrow's own message then
            return None
    return None


def first_non_utf8_byte(path: Path) -> int | None:
    """The offset of the first byte of ``path`` that is not UTF-8 text, or None."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    done = 0  # bytes handed to the decoder before the current chunk
    with path.open("rb") as fh:
        while chunk := fh.read(_BLOCK_BYTES):
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as err:
                # err.start counts from the bytes the decoder still held from the last chunk.
                return done - pending + err.start
            done += len(chunk)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as err:
            return done - len(err.object) + err.start
    return None


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
# Read as null in the typed columns. A null on an ok row sends the file to the exact path (no
# number there, so the exact path fails the row); on failed rows, whose latencies are never
# parsed, it keeps common blanks and NA spellings on the fast path.
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


def _fast_summary(path: Path, classes: list[ClassSpec], scheduled: bool = False) -> Summary | None:
    """The summary of a requests.csv on which every validation rule holds, or None.

    pyarrow parses the file typed (request_id as bytes, class, status and output_tokens
    dictionary-encoded, latencies float64; multi-threaded). None at the first doubt: a file
    pyarrow cannot read this way (a latency outside its number grammar, a missing column), any
    rule failing on any row, a null on an ok row, or two equal ID hashes; the caller then runs
    the exact path (:func:`validate_requests_table`), which words the error. pyarrow's floats are a
    subset of Python's float() with the same (correctly rounded) values, except NaN payloads
    ("nan(1)"), which read as NaN here and fail the finite-latency rule; output_tokens go through
    :func:`_parse_numbers` once per distinct value. So whatever passes here passes the exact
    path, with the same values.

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
    columns = [*CSV_COLUMNS, SCHEDULED_COLUMN] if scheduled else CSV_COLUMNS
    if scheduled:
        types[SCHEDULED_COLUMN] = text
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(block_size=_BLOCK_BYTES),
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                include_columns=columns,
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
        ids_ok = pool.submit(ids_valid, table.column("request_id"))
        try:
            checked = [f.result() for f in [pool.submit(_check_batches, t, classes) for t in tasks]]
        except (UnicodeDecodeError, pa.ArrowInvalid):
            # Bytes that are not UTF-8 in a text column, read unchecked here for speed: the
            # exact path names the first one.
            return None
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
    samples = [ClassSample(*b, int(p), t) for b, p, t in zip(buffers, passed, tokens, strict=True)]
    return Summary(table.num_rows, int(counts.sum()), samples)


def _check_batches(
    batches: list, classes: list[ClassSpec]
) -> tuple[list[np.ndarray], list[int], list[int]] | None:
    """The rules other than the IDs' over ``batches`` (record batches, one per parsed block,
    ~150k rows, so temporaries stay in the CPU cache). Returns each batch's row classes (index
    in ``classes``, -1 for a failed row), and per class the successful rows and their output
    tokens; None when a rule fails."""
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
                import pyarrow.compute as pc

                if (ok & pc.is_null(array).to_numpy(zero_copy_only=False)).any():
                    return None
            values.append(_numbers(array))
        ttft, tpot, e2e = values
        out = _tokens(batch.column("output_tokens"), ok)
        if out is None:
            return None
        sched = None
        if SCHEDULED_COLUMN in batch.schema.names:
            sched = _tokens(batch.column(SCHEDULED_COLUMN), ok)
            if sched is None:
                return None
        with np.errstate(invalid="ignore"):
            # NaN propagates through minimum and maximum and fails both comparisons.
            low, high = np.minimum(ttft, tpot), np.maximum(ttft, tpot)
            good = (np.minimum(low, e2e, out=low) >= 0) & (np.maximum(high, e2e, out=high) < np.inf)
            expected = fixed[code]
            good &= (out == expected) | (expected < 0)
            if sched is not None:
                good &= out == sched
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


def _numbers(array) -> np.ndarray:
    """A read-only numpy view of a pyarrow array of numbers, nulls read as 0 (by DLPack:
    pyarrow's own ``to_numpy`` loads pandas, which costs more than the rest of the analysis of a
    million rows)."""
    if array.null_count:
        array = array.fill_null(0)
    return np.from_dlpack(array)


def _tokens(column, ok: np.ndarray) -> np.ndarray | None:
    """A dictionary-encoded text column of token counts as float64 (exact for any plausible
    length, < 2^53), Python's int() on each distinct value (a block holds few); None when an ok
    row's is not one."""
    if column.null_count:
        return None  # no nulls in practice: text is read as text (strings_can_be_null=False)
    parsed = [_python_number(text, True) for text in column.dictionary.to_pylist()]
    entries = np.array([value for value, _ in parsed], dtype=float)
    unparsed = np.array([not good for _, good in parsed], dtype=bool)
    which = _numbers(column.indices)
    if (ok & unparsed[which]).any():
        return None
    return entries[which]


def _gather_batches(
    batches: list,
    codes: list[np.ndarray],
    starts: np.ndarray,
    buffers: list[list[np.ndarray]],
    classes: list[ClassSpec],
) -> list[int]:
    """Copy each class's successful TTFT, TPOT and E2E of ``batches`` (rows classed by
    ``codes``) into ``buffers`` from row ``starts[class]`` on; returns per class how many meet
    the class SLO."""
    at, passed = starts.copy(), [0] * len(classes)
    for batch, code in zip(batches, codes, strict=True):
        ttft, tpot, e2e = (_numbers(batch.column(c)) for c in ("ttft_ms", "tpot_ms", "e2e_ms"))
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
            passed[i] += int(np.count_nonzero(meets_slo(x, y, c.ttft_cutoff_ms, c.tpot_cutoff_ms)))
    return passed


def ids_valid(ids) -> bool:
    """The ID rule over a pyarrow binary column: non-empty, valid UTF-8 (the exact path decodes
    the file), and unique as far as :func:`_surely_unique` can tell."""
    if ids.null_count:
        return False
    if len(ids) == 0:
        return True
    # Lengths from the offsets and an ASCII check of the bytes: numpy, without loading
    # pyarrow.compute (a tenth of the analysis of a million rows) unless an ID is not ASCII.
    shortest, longest, ascii_only = None, 0, True
    for chunk in ids.chunks:
        if len(chunk) == 0:
            continue
        offsets, data = _offsets_and_data(chunk)
        length = np.diff(offsets)
        low = int(length.min())
        shortest = low if shortest is None else min(shortest, low)
        longest = max(longest, int(length.max()))
        ascii_only = ascii_only and (data.size == 0 or int(data.max()) < 0x80)
    if shortest == 0:
        return False
    if not ascii_only:
        import pyarrow as pa
        import pyarrow.compute as pc

        try:
            pc.cast(ids, pa.string())
        except pa.ArrowInvalid:
            return False
    return _surely_unique(ids, longest)


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
        offsets, data = _offsets_and_data(chunk)
        length = np.diff(offsets)
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


def _offsets_and_data(chunk) -> tuple[np.ndarray, np.ndarray]:
    """The offsets (int64, n + 1) and the bytes (uint8, from the first ID on) of a non-empty pyarrow
    binary or string array, as numpy views of its buffers (little-endian machines)."""
    import pyarrow as pa

    large = pa.types.is_large_binary(chunk.type) or pa.types.is_large_string(chunk.type)
    width = 8 if large else 4
    _, offsets_buf, data_buf = chunk.buffers()
    offsets = np.frombuffer(offsets_buf, f"<i{width}", len(chunk) + 1, chunk.offset * width)
    offsets = offsets.astype(np.int64)
    size = int(offsets[-1] - offsets[0])
    data = np.frombuffer(data_buf, np.uint8, size, int(offsets[0]))
    return offsets, data


def _surely_unique(ids, longest: int) -> bool:
    """True when no two IDs (a pyarrow binary array; ``longest``: the longest's length) are
    equal; False on a repeated :func:`_row_hashes` value, a duplicate or (rarely) a collision, for
    the exact path to decide. Sorting the hashes finds a repeat in O(n log n) with numpy's
    vectorized sort, several times faster than a hash set of the strings."""
    import sys

    if sys.byteorder != "little":
        import pyarrow.compute as pc

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

    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    out = [np.empty(0, np.int8)]
    index = {name: i for i, name in enumerate(names)}
    for chunk in chunks:
        if pa.types.is_dictionary(chunk.type):
            # A null index reads the appended -1.
            found = [index.get(v, -1) for v in chunk.dictionary.to_pylist()]
            lookup = np.array([*found, -1], np.int8)
            indices = chunk.indices
            if indices.null_count:
                indices = indices.fill_null(len(chunk.dictionary))
            out.append(lookup[_numbers(indices)])
        else:
            import pyarrow.compute as pc

            found = pc.index_in(chunk, pa.array(names, chunk.type))
            out.append(found.fill_null(-1).to_numpy().astype(np.int8))
    return np.concatenate(out)


def numeric_column(
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
    """:func:`numeric_column` of a pyarrow string array.

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


def validate_requests_table(
    frame: pd.DataFrame, classes: list[ClassSpec], source: str
) -> dict[str, np.ndarray]:
    """Apply the validation rules (first failing row) and return the parsed columns.

    The rules check every row, in file order, for a non-empty unseen ID, then a known class, then
    a recognized status; then every ok row, in file order, for numbers (Python float() of TTFT,
    TPOT, E2E, int() of output_tokens and of output_tokens_expected where the frame has it),
    finite non-negative latencies, the class's fixed output length, the row's scheduled output
    length and |E2E - (TTFT + TPOT (O - 1))| <= 0.5. Here each rule is a mask over all rows, and
    the first row failing any rule of a pass is reported with its first failing rule. Messages
    are prefixed with the file and CSV line (header = line 1); a value that is not a
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
            known = ", ".join(c.name for c in classes)
            msg = f"unknown workload class {frame['class'].iloc[first]!r} (known: {known})"
        else:
            msg = "every scheduled request needs a recognized terminal status"
        raise AnalysisError(f"{source}: line {first + 2}: {msg}")
    ok = status == 0
    ttft, bad_ttft = numeric_column(frame["ttft_ms"], ok)
    tpot, bad_tpot = numeric_column(frame["tpot_ms"], ok)
    e2e, bad_e2e = numeric_column(frame["e2e_ms"], ok)
    out, bad_out = numeric_column(frame["output_tokens"], ok, integer=True)
    if SCHEDULED_COLUMN in frame.columns:
        sched, bad_sched = numeric_column(frame[SCHEDULED_COLUMN], ok, integer=True)
    else:
        sched, bad_sched = out, np.zeros(len(frame), bool)  # nothing scheduled to compare with
    parsed = ok & ~(bad_ttft | bad_tpot | bad_e2e | bad_out | bad_sched)
    expected = _expected_outputs(classes)[code]
    with np.errstate(invalid="ignore"):
        bad_lat = parsed & ~(
            np.isfinite(ttft) & np.isfinite(tpot) & np.isfinite(e2e)
            & (ttft >= 0) & (tpot >= 0) & (e2e >= 0)
        )  # fmt: skip
        bad_len = parsed & (expected >= 0) & (out != expected)
        bad_sched_len = parsed & ~bad_len & (out != sched)
        bad_sum = parsed & (np.abs(e2e - (ttft + tpot * (out - 1))) > 0.5)
    checks = [
        (bad_ttft, "ttft_ms", "not a number"),
        (bad_tpot, "tpot_ms", "not a number"),
        (bad_e2e, "e2e_ms", "not a number"),
        (bad_out, "output_tokens", "not a whole number"),
        (bad_sched, SCHEDULED_COLUMN, "not a whole number"),
        (bad_lat, None, "latencies must be finite and nonnegative"),
        (bad_len, None, "successful output length differs from the fixed workload"),
        (bad_sched_len, None, "successful output length differs from its scheduled length"),
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


def analyze_csv(
    path: str | Path,
    duration_s: float,
    queue_trend: str,
    classes: list[ClassSpec] | None = None,
    gates: Gates | None = None,
) -> dict[str, Any]:
    """``capacity-pack analyze``: the SLO report of a requests.csv (see the module docstring)."""
    classes = classes or tutorial_classes()
    gates = gates or Gates()
    check_arguments(duration_s, queue_trend)
    scheduled = SCHEDULED_COLUMN in check_header(Path(path))
    summary = _fast_summary(Path(path), classes, scheduled)
    if summary is None:
        cols = validate_requests_table(read_requests_csv(path), classes, str(path))
        report = class_report(cols, duration_s, queue_trend, classes, gates)
    else:
        report = summary_report(summary, duration_s, queue_trend, classes, gates)
    report["percentile_method"] = "nearest_rank"
    return report
