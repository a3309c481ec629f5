"""Normalization: derived metrics, the seed's table rules, and reconciliation with the schedule."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from capacity_pack.evidence.normalize import (
    NormalizeError,
    normalize,
    normalize_point,
    reconcile,
    seed_csv_frame,
)
from capacity_pack.plan import schedule as S
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.tables import TableValidationError
from tests.conftest import with_fixed_lengths
from tests.paths import DEFAULT

T0 = 10**12
FIXED = {"interactive": 32, "long_context": 48, "generation_heavy": 128}


def pack():
    data = with_fixed_lengths(yaml.safe_load(DEFAULT.read_text()))
    data["client"].update(
        initial_scheduled_requests=30, warmup_seconds=0.2, minimum_duration_seconds=1
    )
    data["client"].pop("class_schedule_counts")
    return validate_pack(data)


def fake_records(schedule: pd.DataFrame, *, ttft_ms=20.0, itl_ms=10.0) -> list[dict]:
    """Records a perfect client would write for this schedule (one token per chunk)."""
    out = []
    for row in schedule.to_dict("records"):
        due = T0 + int(row["scheduled_offset_ns"])
        sent = due + 100_000
        n = int(row["output_tokens"])
        chunks = [sent + int(ttft_ms * 1e6) + int(k * itl_ms * 1e6) for k in range(n)]
        out.append({
            "request_id": row["request_id"], "seq": int(row["seq"]), "class": row["class"],
            "phase": row["phase"], "block": int(row["block"]), "status": "ok",
            "http_status": 200, "error": None, "finish_reason": "length",
            "input_tokens": int(row["input_tokens"]), "output_tokens_expected": n,
            "output_tokens": n, "prompt_tokens": int(row["input_tokens"]),
            "completion_tokens": n, "cached_tokens": 0, "prompt_tokens_mismatch": False,
            "scheduled_offset_ns": int(row["scheduled_offset_ns"]), "t0_ns": T0,
            "t0_realtime_ns": 5 * T0, "due_ns": due, "sent_ns": sent,
            "sent_realtime_ns": 5 * T0 + sent - T0, "first_token_ns": chunks[0],
            "last_token_ns": chunks[-1], "end_ns": chunks[-1] + 50_000,
            "end_realtime_ns": 5 * T0 + chunks[-1] - T0, "chunk_ns": chunks,
            "chunk_tokens": [1] * n,
        })  # fmt: skip
    return out


def run(records: list[dict], p=None):
    p = p or pack()
    return normalize(
        pd.DataFrame.from_records(records), point="open-r20", cache_state="cold", repeat=0,
        class_names=p.class_names, fixed_output=FIXED, source="records.jsonl",
    )  # fmt: skip


@pytest.fixture
def schedule():
    p = pack()
    return S.build_schedule(p, S.Point(mode="open", rate_rps=20, cache_state="cold", repeat=0))


def test_derived_metrics_follow_the_seed_formulas(schedule):
    requests, chunks = run(fake_records(schedule))
    row = requests.iloc[0]
    assert row["ttft_ms"] == pytest.approx(20.0)
    assert row["tpot_ms"] == pytest.approx(10.0)  # (E2E - TTFT) / (O - 1)
    assert row["e2e_ms"] == pytest.approx(20.0 + 10.0 * (row["output_tokens"] - 1))
    assert row["client_delay_ms"] == pytest.approx(0.1)
    assert row["ttft_from_scheduled_ms"] == pytest.approx(20.1)
    first = chunks[chunks["request_id"] == row["request_id"]]
    assert np.isnan(first["gap_ms"].iloc[0]) and first["gap_ms"].iloc[1:].eq(10.0).all()
    assert len(chunks) == requests["output_tokens"].sum()


def test_seed_csv_layout_zeros_failed_rows(schedule):
    recs = fake_records(schedule)
    recs[-1].update(
        status="error",
        error="HTTP 500: boom",
        http_status=500,
        chunk_ns=[],
        chunk_tokens=[],
        output_tokens=0,
        first_token_ns=None,
        last_token_ns=None,
    )
    requests, _ = run(recs)
    csv = seed_csv_frame(requests)
    assert list(csv.columns) == [
        "request_id",
        "class",
        "ttft_ms",
        "tpot_ms",
        "e2e_ms",
        "output_tokens",
        "status",
        "output_tokens_expected",
    ]
    last = csv.iloc[-1]
    assert (last["ttft_ms"], last["tpot_ms"], last["e2e_ms"], last["output_tokens"]) == (0, 0, 0, 0)
    assert set(requests[requests["phase"] == "warmup"]["request_id"]).isdisjoint(csv["request_id"])


@pytest.mark.parametrize(
    ("mutate", "column", "check"),
    [
        (lambda r: r.update(request_id=""), "request_id", "str_length"),
        (lambda r: r.update(status="finished"), "status", "isin"),
        (lambda r: r.update({"class": "chatbot"}), "class", "isin"),
        (lambda r: r.update(output_tokens=31, chunk_ns=r["chunk_ns"][:31],
                            chunk_tokens=[1] * 31), "<dataframe>", "fixed output length"),
        (lambda r: r.update(first_token_ns=r["sent_ns"] - 5_000_000), "<dataframe>",
         "finite, non-negative"),
        (lambda r: r.update(end_ns=r["sent_ns"] - 1), "<dataframe>", "cannot precede"),
    ],
)  # fmt: skip
def test_every_table_rule_reports_row_column_check(schedule, mutate, column, check):
    recs = fake_records(schedule)
    target = next(i for i, r in enumerate(recs) if r["class"] == "interactive")
    mutate(recs[target])
    with pytest.raises(TableValidationError) as err:
        run(recs)
    text = str(err.value)
    assert text.startswith("records.jsonl (requests):")
    line = next(x for x in text.splitlines() if check in x)
    assert f"column {column}" in line and (f"row {target}" in line or "table" in line)


def test_metric_convention_rule_on_an_imported_table(schedule):
    """TPOT derived here always satisfies E2E = TTFT + TPOT x (O - 1); a table from another
    tool may not, and the schema says which row."""
    from capacity_pack.evidence.normalize import requests_schema
    from capacity_pack.tables import validate_table

    requests, _ = run(fake_records(schedule))
    requests.loc[4, "tpot_ms"] += 0.1
    with pytest.raises(TableValidationError) as err:
        validate_table(requests, requests_schema(pack().class_names, FIXED), "imported.parquet")
    assert "row 4, column <dataframe>: check ok rows: E2E must equal TTFT" in str(err.value)


def test_duplicate_ids_are_reported(schedule):
    recs = fake_records(schedule)
    recs[3]["request_id"] = recs[2]["request_id"]
    with pytest.raises(TableValidationError, match="request_id"):
        run(recs)


def test_reconciliation_refuses_missing_and_extra_ids(schedule):
    recs = pd.DataFrame.from_records(fake_records(schedule))
    assert reconcile(recs, schedule, "r.jsonl")["recorded"] == len(schedule)
    with pytest.raises(NormalizeError, match=r"r.jsonl: 1 scheduled request\(s\) have no record"):
        reconcile(recs.iloc[1:], schedule, "r.jsonl")
    extra = pd.concat([recs, recs.iloc[[0]].assign(request_id="ghost")])
    with pytest.raises(NormalizeError, match="not in the schedule, e.g. \\['ghost'\\]"):
        reconcile(extra, schedule, "r.jsonl")
    dup = pd.concat([recs, recs.iloc[[0]]])
    with pytest.raises(NormalizeError, match="recorded more than once"):
        reconcile(dup, schedule, "r.jsonl")


def test_normalize_point_with_extension_cut_at_max_duration(tmp_path):
    p = pack()
    point = S.Point(mode="open", rate_rps=20, cache_state="cold", repeat=0)
    schedule = S.build_schedule(p, point)
    full = S.build_schedule(p, point, extension_blocks=2)
    sent = full.iloc[:-2]  # the last two rows of block 3 were cut at the time limit
    (tmp_path / "records.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in fake_records(sent))
    )
    schedule.to_parquet(tmp_path / "schedule.parquet")
    pd.DataFrame({"t_offset_ns": [0, 10**9], "realtime_ns": [1, 2], "source": "server",
                  "metric": "queue_depth", "value": [0.0, 0.0]}).to_parquet(
        tmp_path / "metrics.parquet")  # fmt: skip
    out = normalize_point(tmp_path / "records.jsonl", tmp_path / "schedule.parquet",
                          tmp_path / "metrics.parquet", {"extension_blocks": 2},
                          S.ScheduleInputs.for_point(p, point), point)  # fmt: skip
    assert out["reconciliation"] == {"expected": len(full), "recorded": len(sent),
                                     "cut_at_max_duration": 2,
                                     "unsent_after_early_stop": 0}  # fmt: skip
    # Missing rows elsewhere than the cut tail are an error.
    (tmp_path / "records.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in fake_records(full.drop(index=5)))
    )
    with pytest.raises(NormalizeError, match="have no record"):
        normalize_point(tmp_path / "records.jsonl", tmp_path / "schedule.parquet",
                        tmp_path / "metrics.parquet", {"extension_blocks": 2},
                        S.ScheduleInputs.for_point(p, point), point)  # fmt: skip


def test_normalize_point_after_an_early_stop(tmp_path):
    """An early stop leaves exactly the summary's unsent rows, the schedule's tail, without a
    record (here from inside block 2 to the end of block 3); anything else missing, or a
    record for a row called unsent, is an error."""
    p = pack()
    point = S.Point(mode="open", rate_rps=20, cache_state="cold", repeat=0)
    schedule = S.build_schedule(p, point)
    full = S.build_schedule(p, point, extension_blocks=2)
    unsent = int((full["block"] == 3).sum()) + 2
    schedule.to_parquet(tmp_path / "schedule.parquet")
    pd.DataFrame({"t_offset_ns": [0, 10**9], "realtime_ns": [1, 2], "source": "server",
                  "metric": "queue_depth", "value": [0.0, 0.0]}).to_parquet(
        tmp_path / "metrics.parquet")  # fmt: skip
    summary = {"extension_blocks": 2, "stopped_early": True, "unsent_requests": unsent}

    def run(rows: pd.DataFrame, doc: dict) -> dict:
        (tmp_path / "records.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in fake_records(rows))
        )
        return normalize_point(tmp_path / "records.jsonl", tmp_path / "schedule.parquet",
                               tmp_path / "metrics.parquet", doc,
                               S.ScheduleInputs.for_point(p, point), point)  # fmt: skip

    sent = full.iloc[: len(full) - unsent]
    out = run(sent, summary)
    assert out["reconciliation"] == {"expected": len(full), "recorded": len(sent),
                                     "cut_at_max_duration": 0,
                                     "unsent_after_early_stop": unsent}  # fmt: skip
    assert len(out["requests"]) == len(sent)
    with pytest.raises(NormalizeError, match="have no record"):
        run(sent.drop(index=5), summary)
    with pytest.raises(NormalizeError, match="never sent .* have a record"):
        run(full.iloc[: len(full) - unsent + 1], summary)
    # Without the stop in the summary the same gap (inside block 2) is an error.
    with pytest.raises(NormalizeError, match="have no record"):
        run(sent, {"extension_blocks": 2, "stopped_early": False, "unsent_requests": 0})
