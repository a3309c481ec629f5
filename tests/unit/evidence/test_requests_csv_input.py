"""A requests.csv that is not what the analyzer expects gets one line naming the file and the
line, column or byte: a header naming a column twice, text that is not UTF-8, ragged rows; and
property tests: any mutation of a valid file (columns dropped, duplicated or renamed, cells
corrupted, lines cut, bytes that are not UTF-8) either gives a report or such an error, never
another exception."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capacity_pack.evidence import requests_csv
from capacity_pack.evidence.requests_csv import CSV_COLUMNS, analyze_csv
from capacity_pack.evidence.slo_report import AnalysisError

HEADER = ",".join(CSV_COLUMNS)
# The analyzer's default classes: fixed output lengths 128, 256 and 1024.
OUTPUTS = {"interactive": 128, "long_context": 256, "generation_heavy": 1024}


def valid_rows(n: int = 24) -> list[list[str]]:
    rng = np.random.default_rng(7)
    rows = []
    for i in range(n):
        name = list(OUTPUTS)[i % 3]
        if i % 5 == 4:
            rows.append(
                [f"r-{i}", name, "0", "0", "0", "0", ["error", "timeout", "cancelled"][i % 3]]
            )
            continue
        ttft, tpot = round(float(rng.uniform(50, 900)), 1), round(float(rng.uniform(5, 60)), 2)
        out = OUTPUTS[name]
        e2e = round(ttft + tpot * (out - 1), 3)
        rows.append([f"r-{i}", name, str(ttft), str(tpot), str(e2e), str(out), "ok"])
    return rows


ROWS = valid_rows()


def render(header: list[str], rows: list[list[str]]) -> bytes:
    return ("\n".join(",".join(r) for r in [header, *rows]) + "\n").encode()


def test_a_header_naming_a_column_twice_is_refused(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_bytes(render([*CSV_COLUMNS, "status"], [[*r, "ok"] for r in ROWS]))
    with pytest.raises(AnalysisError) as err:
        analyze_csv(path, 300, "flat")
    assert str(err.value) == (
        f"{path}: line 1: the header names column 'status' (2 times); each column must be named "
        "once"
    )
    res = subprocess.run(
        [sys.executable, "-m", "capacity_pack", "analyze", str(path), "300", "flat"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip() == f"Error: {err.value}"


def test_a_file_that_is_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "requests.csv"
    body = render(CSV_COLUMNS, ROWS)
    offset = body.index(b"long_context")
    path.write_bytes(body[:offset] + b"\xff" + body[offset:])
    with pytest.raises(AnalysisError) as err:
        analyze_csv(path, 300, "flat")
    assert str(err.value) == f"{path} is not UTF-8 text (byte {offset})"
    path.write_bytes(b"request_id,cl\xc3ass\n")
    with pytest.raises(AnalysisError, match=r"is not UTF-8 text \(byte 13\)"):
        analyze_csv(path, 300, "flat")


def test_first_non_utf8_byte_across_chunk_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(requests_csv, "_BLOCK_BYTES", 4)
    path = tmp_path / "x.csv"
    for body, offset in [
        ("aé€😀".encode(), None),  # multi-byte characters split across chunks
        (b"abc\xe2\x82", 3),  # cut inside a character at the end
        (b"abcdefg\xe2\x28", 7),
        (b"\x80", 0),
    ]:
        path.write_bytes(body)
        assert requests_csv.first_non_utf8_byte(path) == offset


def test_a_ragged_row_names_its_line(tmp_path):
    path = tmp_path / "requests.csv"
    rows = [list(r) for r in ROWS]
    rows[3] = rows[3][:5]
    path.write_bytes(render(CSV_COLUMNS, rows))
    with pytest.raises(AnalysisError) as err:
        analyze_csv(path, 300, "flat")
    assert str(err.value) == f"{path}: line 5: 5 field(s) where the header has 7"


def test_an_empty_file_names_the_header(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_bytes(b"")
    with pytest.raises(AnalysisError, match=r"line 1: no header; expected request_id,class,"):
        analyze_csv(path, 300, "flat")


# -- property tests --------------------------------------------------------------------------

CELL = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "nan", "inf", "-1", "1e308", "0x10", "1_000", " 5 ", '"', "a,b", "ok"]),
)
STRUCTURAL = st.one_of(
    st.tuples(st.just("drop"), st.integers(0, 6)),
    st.tuples(st.just("duplicate"), st.integers(0, 6)),
    st.tuples(st.just("rename"), st.integers(0, 6), st.text(max_size=10)),
    st.tuples(st.just("cell"), st.integers(0, len(ROWS) - 1), st.integers(0, 6), CELL),
    st.tuples(st.just("cut"), st.integers(0, len(ROWS) - 1), st.integers(0, 60)),
    st.tuples(st.just("delete_row"), st.integers(0, len(ROWS) - 1)),
    st.tuples(st.just("repeat_row"), st.integers(0, len(ROWS) - 1)),
)
BYTES = st.one_of(
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=3)),
    st.tuples(
        st.just("non_utf8"), st.floats(0, 1), st.sampled_from([b"\xff", b"\xc3", b"\xe2\x28"])
    ),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
)


def apply(edits: list, raw: list) -> bytes:
    header, rows = list(CSV_COLUMNS), [list(r) for r in ROWS]
    for op, *args in edits:
        if op == "drop" and args[0] < len(header):
            i = args[0]
            header.pop(i)
            rows = [r[:i] + r[i + 1 :] for r in rows]
        elif op == "duplicate" and args[0] < len(header):
            i = args[0]
            header.append(header[i])
            rows = [[*r, r[i] if i < len(r) else ""] for r in rows]
        elif op == "rename" and args[0] < len(header):
            header[args[0]] = args[1]
        elif op == "cell" and args[0] < len(rows) and args[1] < len(rows[args[0]]):
            rows[args[0]][args[1]] = args[2]
        elif op == "cut" and args[0] < len(rows):
            rows[args[0]] = ",".join(rows[args[0]])[: args[1]].split(",")
        elif op == "delete_row" and args[0] < len(rows):
            rows.pop(args[0])
        elif op == "repeat_row" and args[0] < len(rows):
            rows.insert(args[0], list(rows[args[0]]))
    data = render(header, rows)
    for op, where, *blob in raw:
        i = int(where * len(data))
        data = data[:i] if op == "truncate" else data[:i] + blob[0] + data[i:]
    return data


def assert_analyzer_error(message: str, path: str) -> None:
    assert "\n" not in message, message
    assert message.startswith(path), message
    rest = message[len(path) :]
    assert re.match(
        r"( is not UTF-8 text \(byte \d+\)$|: line \d+(, column \w+)?: |: missing column\(s\) )",
        rest,
    ), message


@settings(
    max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@pytest.mark.slow
@given(st.lists(STRUCTURAL, max_size=3), st.lists(BYTES, max_size=2))
def test_mutated_requests_csv_reports_or_names_line_or_column(tmp_path, edits, raw):
    path = tmp_path / "requests.csv"
    path.write_bytes(apply(edits, raw))
    try:
        report = analyze_csv(path, 300, "flat")
    except AnalysisError as err:
        assert_analyzer_error(str(err), str(path))
    else:
        assert report["attempted"] == report["successful"] + report["failed"]
