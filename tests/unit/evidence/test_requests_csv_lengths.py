"""``capacity-pack analyze`` and output lengths: a fixed-length class's rows against its length, a
distribution class's rows against their own scheduled length (output_tokens_expected), on the
fast and the exact path alike."""

from __future__ import annotations

import numpy as np
import pytest

from capacity_pack.evidence import requests_csv
from capacity_pack.evidence.requests_csv import CSV_COLUMNS, SCHEDULED_COLUMN, analyze_csv
from capacity_pack.evidence.slo_report import AnalysisError, ClassSpec

# "chat" draws its lengths from a distribution (no fixed length); "batch" is fixed at 64.
CLASSES = [ClassSpec("chat", 500, 50, None), ClassSpec("batch", 800, 50, 64)]


def rows(n: int = 30) -> list[list[str]]:
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        name = "chat" if i % 3 else "batch"
        length = int(rng.integers(2, 300)) if name == "chat" else 64
        ttft, tpot = 100.0, 10.0
        e2e = ttft + tpot * (length - 1)
        out.append([f"r-{i}", name, str(ttft), str(tpot), str(e2e), str(length), "ok", str(length)])
    return out


def write(tmp_path, table: list[list[str]], scheduled: bool = True):
    header = [*CSV_COLUMNS, SCHEDULED_COLUMN] if scheduled else CSV_COLUMNS
    body = [r if scheduled else r[:-1] for r in table]
    path = tmp_path / "requests.csv"
    path.write_text("\n".join(",".join(r) for r in [header, *body]) + "\n")
    return path


@pytest.fixture(params=["fast", "exact"])
def path_kind(request, monkeypatch):
    if request.param == "exact":
        monkeypatch.setattr(requests_csv, "_fast_summary", lambda *a, **k: None)
    return request.param


def test_each_distribution_row_matches_its_scheduled_length(tmp_path, path_kind):
    report = analyze_csv(write(tmp_path, rows()), 10, "flat", CLASSES)
    assert report["successful"] == 30
    assert report["classes"]["batch"]["output_tokens"] == 10 * 64


def test_a_distribution_row_off_its_scheduled_length_is_refused(tmp_path, path_kind):
    table = rows()
    table[4][7] = str(int(table[4][5]) + 1)  # scheduled one more token than it returned
    path = write(tmp_path, table)
    with pytest.raises(AnalysisError) as err:
        analyze_csv(path, 10, "flat", CLASSES)
    assert str(err.value) == (
        f"{path}: line 6: successful output length differs from its scheduled length"
    )


def test_a_fixed_class_still_answers_to_its_fixed_length(tmp_path, path_kind):
    table = rows()
    table[3][5] = table[3][7] = "63"  # scheduled 63, returned 63, but the class is fixed at 64
    table[3][4] = str(100.0 + 10.0 * 62)
    path = write(tmp_path, table)
    with pytest.raises(AnalysisError) as err:
        analyze_csv(path, 10, "flat", CLASSES)
    assert str(err.value) == (
        f"{path}: line 5: successful output length differs from the fixed workload"
    )


def test_a_scheduled_length_that_is_not_a_number_names_its_column(tmp_path, path_kind):
    table = rows()
    table[1][7] = "many"
    path = write(tmp_path, table)
    with pytest.raises(AnalysisError) as err:
        analyze_csv(path, 10, "flat", CLASSES)
    assert str(err.value) == (
        f"{path}: line 3, column output_tokens_expected: 'many' is not a whole number"
    )


def test_without_the_column_distribution_rows_are_not_length_checked(tmp_path, path_kind):
    table = rows()
    table[4][7] = "1"  # ignored: the file has no scheduled lengths
    report = analyze_csv(write(tmp_path, table, scheduled=False), 10, "flat", CLASSES)
    assert report["successful"] == 30


def test_failed_rows_are_not_length_checked(tmp_path, path_kind):
    table = rows()
    table[2][2:7] = ["0", "0", "0", "0", "timeout"]
    report = analyze_csv(write(tmp_path, table), 10, "flat", CLASSES)
    assert (report["attempted"], report["failed"]) == (30, 1)
