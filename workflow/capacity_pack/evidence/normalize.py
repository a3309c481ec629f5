"""Normalization: raw load-generator records -> validated, reconciled request tables.

Tables (pandera ``RequestsTable``, ``ChunksTable``, ``ServerMetricsTable``; strict, coercing,
validated lazily); dataframe checks (those ``capacity-pack analyze`` applies to a
requests.csv, with E2E = TTFT + TPOT x (O - 1) within 0.5 ms); reconciliation of every
scheduled request exactly once, with the three kinds of rows allowed absent, and a sharded
point's merge (:func:`capacity_pack.measure.shards.check_merge`).
Method: docs/metrics.md, 'Per-request metrics' and 'Normalization'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from capacity_pack.errors import StatedError
from capacity_pack.measure.records import STATUSES, RecordsError, records_frame
from capacity_pack.tables import validate_table
from capacity_pack.vocab import latency
from capacity_pack.vocab.phases import MEASURED_PHASES, REQUEST_PHASES

NS_PER_MS = 1e6


class NormalizeError(StatedError, ValueError):
    """Records that cannot be normalized (reconciliation or parsing); names file and IDs."""


class RequestsTable(pa.DataFrameModel):
    """One row per attempted request of one point."""

    request_id: Series[str] = pa.Field(unique=True, str_length={"min_value": 1})
    class_: Series[str] = pa.Field(alias="class")
    point: Series[str]
    cache_state: Series[str] = pa.Field(isin=["cold", "warm"])
    repeat: Series[np.int64] = pa.Field(ge=0)
    phase: Series[str] = pa.Field(isin=list(REQUEST_PHASES))
    block: Series[np.int64] = pa.Field(ge=0)
    seq: Series[np.int64]
    status: Series[str] = pa.Field(isin=list(STATUSES))
    http_status: Series[pd.Int64Dtype] = pa.Field(nullable=True)
    error: Series[str] = pa.Field(nullable=True)
    input_tokens: Series[np.int64] = pa.Field(gt=0)
    output_tokens_expected: Series[np.int64] = pa.Field(gt=0)
    output_tokens: Series[np.int64] = pa.Field(ge=0)
    prompt_tokens: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    cached_tokens: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    scheduled_offset_ns: Series[np.int64] = pa.Field(ge=0)
    due_offset_ns: Series[np.int64]
    sent_offset_ns: Series[np.int64]
    client_delay_ms: Series[float] = pa.Field(nullable=True)
    ttft_ms: Series[float]
    tpot_ms: Series[float]
    e2e_ms: Series[float]
    ttft_from_scheduled_ms: Series[float] = pa.Field(nullable=True)
    e2e_from_scheduled_ms: Series[float] = pa.Field(nullable=True)
    chunks: Series[np.int64] = pa.Field(ge=0)
    sent_ns: Series[np.int64]
    end_ns: Series[np.int64]
    sent_realtime_ns: Series[np.int64]
    end_realtime_ns: Series[np.int64]
    warmup: Series[bool]
    # Session classes only (capacity_pack.plan.sessions): absent from other packs' tables,
    # null on rows outside a session.
    session: Series[pd.Int64Dtype] | None = pa.Field(nullable=True, ge=0)
    turn: Series[pd.Int64Dtype] | None = pa.Field(nullable=True, ge=0)

    class Config:
        strict = True
        coerce = True

    @pa.dataframe_check(error="ok rows need finite, non-negative TTFT, TPOT and E2E")
    def ok_latencies_finite(cls, df: pd.DataFrame) -> pd.Series:
        ok = df["status"] == "ok"
        lat = df[["ttft_ms", "tpot_ms", "e2e_ms"]]
        good = np.isfinite(lat).all(axis=1) & (lat >= 0).all(axis=1)
        return ~ok | good

    @pa.dataframe_check(error="ok rows: E2E must equal TTFT + TPOT x (O - 1) within 0.5 ms")
    def ok_metric_convention(cls, df: pd.DataFrame) -> pd.Series:
        ok = (df["status"] == "ok") & (df["output_tokens"] > 1)
        gap = (df["e2e_ms"] - (df["ttft_ms"] + df["tpot_ms"] * (df["output_tokens"] - 1))).abs()
        return ~ok | (gap <= 0.5)

    @pa.dataframe_check(
        error="ok rows must have their scheduled output length (a fixed-length class's: its "
        "fixed output length)"
    )
    def ok_fixed_length(cls, df: pd.DataFrame) -> pd.Series:
        ok = df["status"] == "ok"
        return ~ok | (df["output_tokens"] == df["output_tokens_expected"])

    @pa.dataframe_check(error="a terminal end cannot precede the send")
    def end_after_send(cls, df: pd.DataFrame) -> pd.Series:
        return df["end_ns"] >= df["sent_ns"]


class ChunksTable(pa.DataFrameModel):
    """One row per streamed chunk (long format)."""

    request_id: Series[str] = pa.Field(str_length={"min_value": 1})
    chunk_index: Series[np.int64] = pa.Field(ge=0)
    arrival_offset_ns: Series[np.int64] = pa.Field(ge=0)
    tokens: Series[np.int64] = pa.Field(ge=1)
    gap_ms: Series[float] = pa.Field(nullable=True, ge=0)

    class Config:
        strict = True
        coerce = True

    @pa.dataframe_check(error="chunk indices must be unique per request")
    def unique_chunks(cls, df: pd.DataFrame) -> pd.Series:
        return ~df.duplicated(["request_id", "chunk_index"])


class ServerMetricsTable(pa.DataFrameModel):
    """The scraped time series of a point (long format)."""

    t_offset_ns: Series[np.int64]
    realtime_ns: Series[np.int64]
    source: Series[str] = pa.Field(isin=["server", "client"])
    metric: Series[str] = pa.Field(str_length={"min_value": 1})
    value: Series[float]

    class Config:
        strict = True
        coerce = True


def requests_schema(class_names: list[str], fixed: dict[str, int | None]):
    """RequestsTable with the pack's classes (fixed lengths are enforced per row)."""
    return RequestsTable.to_schema().update_column("class", checks=[pa.Check.isin(class_names)])


def expected_ids(
    schedule: pd.DataFrame, extension: pd.DataFrame | None, prewarm: pd.DataFrame | None
) -> pd.DataFrame:
    parts = [schedule]
    if extension is not None and len(extension):
        parts.append(extension)
    if prewarm is not None and len(prewarm):
        parts.append(prewarm)
    return pd.concat(parts, ignore_index=True)


def reconcile(
    records: pd.DataFrame,
    expected: pd.DataFrame,
    source: str,
    unsent: int = 0,
    not_sent: list[str] | None = None,
) -> dict[str, Any]:
    """Every expected request exactly once; only the last ``unsent`` rows (an early stop's),
    the cut tail of the last extension block and the session turns the run lists as never
    sent (``not_sent``) may be absent."""
    dup = records["request_id"][records["request_id"].duplicated()]
    if len(dup):
        raise NormalizeError(
            f"{source}: {len(dup)} request ID(s) recorded more than once, e.g. {dup.iloc[0]!r}"
        )
    got = set(records["request_id"])
    want = set(expected["request_id"])
    extra = sorted(got - want)
    if extra:
        raise NormalizeError(
            f"{source}: {len(extra)} recorded request ID(s) are not in the schedule, "
            f"e.g. {extra[:3]}"
        )
    skipped = 0
    if not_sent:
        held = set(not_sent)
        sent_anyway = sorted(held & got)
        if sent_anyway:
            raise NormalizeError(
                f"{source}: the sweep summary lists {len(sent_anyway)} session turn(s) as never "
                f"sent, but they have a record, e.g. {sent_anyway[:3]}"
            )
        skipped = int(expected["request_id"].isin(held).sum())
        expected = expected[~expected["request_id"].isin(held)]
    missing = expected[~expected["request_id"].isin(got)]
    if unsent:
        # The run stopped its arrivals: the rows after the last one started were never sent.
        tail = expected[expected["phase"] != "prewarm"].sort_values("seq").tail(unsent)
        sent_anyway = tail[tail["request_id"].isin(got)]
        if len(sent_anyway) or len(tail) < unsent:
            raise NormalizeError(
                f"{source}: the sweep summary says the last {unsent} scheduled request(s) were "
                f"never sent (an early stop), but {len(sent_anyway)} of them have a record, e.g. "
                f"{sent_anyway['request_id'].head(3).tolist()}"
            )
        missing = missing[~missing["request_id"].isin(set(tail["request_id"]))]
        expected = expected[~expected["request_id"].isin(set(tail["request_id"]))]
    cut = 0
    if len(missing):
        last_block = int(expected["block"].max())
        tail = expected[expected["block"] == last_block].sort_values("seq")
        allowed = (
            set(tail["request_id"].iloc[len(tail) - len(missing) :]) if last_block >= 2 else set()
        )
        if last_block < 2 or not set(missing["request_id"]) <= allowed:
            sample = missing["request_id"].head(3).tolist()
            raise NormalizeError(
                f"{source}: {len(missing)} scheduled request(s) have no record (no terminal "
                f"status), e.g. {sample}"
            )
        cut = len(missing)
    facts = {
        "expected": int(len(expected)) + unsent + skipped,
        "recorded": int(len(records)),
        "cut_at_max_duration": cut,
        "unsent_after_early_stop": unsent,
    }
    if not_sent is not None:
        facts["session_turns_not_sent"] = skipped
    return facts


def _latencies(r: pd.DataFrame) -> dict[str, np.ndarray]:
    """Latency columns (ms) of the records: TTFT, TPOT and E2E from the send stamp (zeros on a
    failed row, never a partial latency), client delay and the two from the scheduled instant."""
    sent = r["sent_ns"].to_numpy(dtype=np.int64)
    due = r["due_ns"].to_numpy(dtype=np.int64)
    first = pd.to_numeric(r["first_token_ns"], errors="coerce").to_numpy(dtype=float)
    last = pd.to_numeric(r["last_token_ns"], errors="coerce").to_numpy(dtype=float)
    ok = (r["status"] == "ok").to_numpy()
    ttft = latency.ttft_ms(sent, first)
    e2e = latency.e2e_ms(sent, last)
    tpot = latency.tpot_ms(e2e, ttft, r["output_tokens"].to_numpy(dtype=np.int64))
    has_due = due > 0
    return {
        "client_delay_ms": np.where(has_due, (sent - due) / NS_PER_MS, np.nan),
        "ttft_ms": np.where(ok, ttft, 0.0),
        "tpot_ms": np.where(ok, tpot, 0.0),
        "e2e_ms": np.where(ok, e2e, 0.0),
        "ttft_from_scheduled_ms": np.where(ok & has_due, (first - due) / NS_PER_MS, np.nan),
        "e2e_from_scheduled_ms": np.where(ok & has_due, (last - due) / NS_PER_MS, np.nan),
    }


def normalize(
    records: pd.DataFrame,
    *,
    point: str,
    cache_state: str,
    repeat: int,
    class_names: list[str],
    fixed_output: dict[str, int | None],
    source: str,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Requests and chunks tables of one point (validated)."""
    r = records
    n = len(r)
    sent = r["sent_ns"].to_numpy(dtype=np.int64)
    t0 = r["t0_ns"].to_numpy(dtype=np.int64)
    due = r["due_ns"].to_numpy(dtype=np.int64)
    has_due = due > 0
    klass = r["class"].astype(str)
    # The class's fixed length is the contract; prewarm rows ask for one token on purpose.
    fixed_len = klass.map(lambda c: fixed_output.get(c)).astype("Float64").to_numpy(na_value=np.nan)
    use_fixed = ~np.isnan(fixed_len) & (r["phase"] != "prewarm").to_numpy()
    expected_col = np.where(
        use_fixed, np.nan_to_num(fixed_len), r["output_tokens_expected"].to_numpy()
    ).astype(np.int64)
    requests = pd.DataFrame(
        {
            "request_id": r["request_id"].astype(str),
            "class": klass,
            "point": point,
            "cache_state": cache_state,
            "repeat": np.int64(repeat),
            "phase": r["phase"].astype(str),
            "block": r["block"].astype(np.int64),
            "seq": r["seq"].astype(np.int64),
            "status": r["status"].astype(str),
            "http_status": pd.array(r["http_status"], dtype="Int64"),
            "error": r["error"].astype(object),
            "input_tokens": r["input_tokens"].astype(np.int64),
            "output_tokens_expected": expected_col,
            "output_tokens": r["output_tokens"].to_numpy(dtype=np.int64),
            "prompt_tokens": pd.array(r["prompt_tokens"], dtype="Int64"),
            "cached_tokens": pd.array(r["cached_tokens"], dtype="Int64"),
            "scheduled_offset_ns": r["scheduled_offset_ns"].astype(np.int64),
            "due_offset_ns": np.where(has_due, due - t0, 0),
            "sent_offset_ns": sent - t0,
            **_latencies(r),
            "chunks": r["chunk_ns"].map(len).astype(np.int64) if n else np.zeros(0, np.int64),
            "sent_ns": sent,
            "end_ns": r["end_ns"].to_numpy(dtype=np.int64),
            "sent_realtime_ns": r["sent_realtime_ns"].astype(np.int64),
            "end_realtime_ns": r["end_realtime_ns"].astype(np.int64),
            "warmup": r["phase"].isin(["warmup", "prewarm"]).to_numpy(),
        }
    )
    if "turn" in r.columns and r["turn"].notna().any():
        requests["session"] = pd.array(r["session"], dtype="Int64")
        requests["turn"] = pd.array(r["turn"], dtype="Int64")
    requests = validate_table(
        requests, requests_schema(class_names, fixed_output), f"{source} (requests)"
    )
    chunks = chunks_frame(r)
    chunks = validate_table(chunks, ChunksTable.to_schema(), f"{source} (chunks)")
    return requests, chunks


def chunks_frame(records: pd.DataFrame) -> pd.DataFrame:
    """Explode per-request chunk lists into the long chunks table (vectorized).

    Built with one row-index array and in-place arithmetic: at millions of chunks every
    temporary array costs 8 bytes a chunk (docs/scaling.md).
    """
    if not len(records):
        return pd.DataFrame(
            {"request_id": [], "chunk_index": [], "arrival_offset_ns": [], "tokens": [],
             "gap_ms": []}
        )  # fmt: skip
    counts = records["chunk_ns"].map(len).to_numpy(dtype=np.int64)
    times = np.concatenate([np.asarray(x, dtype=np.int64) for x in records["chunk_ns"]])
    tokens = np.concatenate([np.asarray(x, dtype=np.int64) for x in records["chunk_tokens"]])
    row = np.repeat(np.arange(len(records), dtype=np.int64), counts)
    times -= records["sent_ns"].to_numpy(dtype=np.int64)[row]  # now arrival offsets
    index = np.arange(times.size, dtype=np.int64)
    index -= (np.cumsum(counts) - counts)[row]
    rid = records["request_id"].to_numpy(dtype=object)[row]
    del row
    # Within a request the offsets share one send time, so their differences are the gaps.
    gaps = np.empty(times.size, dtype=float)
    if times.size:
        np.subtract(times[1:], times[:-1], out=gaps[1:])
        gaps /= NS_PER_MS
    gaps[index == 0] = np.nan
    return pd.DataFrame(
        {
            "request_id": rid,
            "chunk_index": index,
            "arrival_offset_ns": times,
            "tokens": tokens,
            "gap_ms": gaps,
        },
        copy=False,
    )


def seed_csv_frame(requests: pd.DataFrame) -> pd.DataFrame:
    """The flat requests.csv that ``capacity-pack analyze`` reads: measured rows only, columns
    request_id, class, ttft_ms, tpot_ms, e2e_ms, output_tokens, status (zeros on failed rows),
    and output_tokens_expected, each row's scheduled output length (what the analyzer checks a
    successful row of a distribution class against)."""
    m = requests[requests["phase"].isin(MEASURED_PHASES)]
    return pd.DataFrame(
        {
            "request_id": m["request_id"],
            "class": m["class"],
            # Full precision: rounding TPOT would break E2E = TTFT + TPOT x (O - 1) at O ~ 1000.
            "ttft_ms": m["ttft_ms"],
            "tpot_ms": m["tpot_ms"],
            "e2e_ms": m["e2e_ms"],
            "output_tokens": np.where(m["status"] == "ok", m["output_tokens"], 0),
            "status": m["status"],
            "output_tokens_expected": m["output_tokens_expected"],
        }
    )


def normalize_point(
    records_path: str | Path,
    schedule_path: str | Path,
    metrics_path: str | Path,
    sweep_summary: dict[str, Any],
    inputs,
    point,
) -> dict[str, Any]:
    """Normalize one measured point; returns the tables and the reconciliation facts.

    ``inputs`` is the point's :class:`capacity_pack.plan.schedule.ScheduleInputs` (to rebuild the
    extension blocks and prewarm rows the run used), ``point`` its
    :class:`capacity_pack.plan.schedule.Point`.
    """
    from capacity_pack.plan.schedule import build_schedule, prewarm_rows

    source = str(records_path)
    stopped = sweep_summary.get("interrupted")
    if stopped:
        raise NormalizeError(
            f"{source}: the measurement was interrupted by {stopped.get('signal')} "
            f"({stopped.get('never_sent')} of {stopped.get('scheduled')} requests never sent): "
            "its records are partial; measure the point again"
        )
    try:
        records = records_frame(records_path)
    except RecordsError as err:
        raise NormalizeError(str(err)) from None
    schedule = pd.read_parquet(schedule_path)
    k = int(sweep_summary.get("extension_blocks", 0))
    extension = None
    if k:
        full = build_schedule(inputs, point, extension_blocks=k)
        extension = full[full["block"] >= 2]
    prewarm = prewarm_rows(inputs, point)
    expected = expected_ids(schedule, extension, prewarm)
    if not len(records):
        raise NormalizeError(f"{source}: no records at all for {len(expected)} scheduled requests")
    unsent = int(sweep_summary.get("unsent_requests") or 0)
    if not sweep_summary.get("stopped_early"):
        unsent = 0
    not_sent = sweep_summary.get("session_turns_not_sent")
    facts = reconcile(
        records,
        expected,
        source,
        unsent,
        [t["request_id"] for t in not_sent] if not_sent is not None else None,
    )
    shards = sweep_summary.get("shards")
    if shards and int(shards.get("count", 1)) > 1:
        # Imported here: the shard runner brings the load generator (httpx, the engines), which
        # the normalize job of every unsharded point would otherwise import for nothing.
        from capacity_pack.measure.shards import ShardError, check_merge

        try:
            facts["shards"] = check_merge(records, schedule, prewarm, shards, source)
        except ShardError as err:
            raise NormalizeError(str(err)) from None
        facts["shards"]["clock_valid"] = sweep_summary.get("shard_clock_valid")
    fixed = {
        c.name: (c.output_tokens if isinstance(c.output_tokens, int) else None)
        for c in inputs.workload
    }
    requests, chunks = normalize(
        records,
        point=point.point_id,
        cache_state=point.cache_state,
        repeat=point.repeat,
        class_names=inputs.class_names,
        fixed_output=fixed,
        source=source,
    )
    metrics = validate_table(
        pd.read_parquet(metrics_path), ServerMetricsTable.to_schema(), f"{metrics_path}"
    )
    return {"requests": requests, "chunks": chunks, "metrics": metrics, "reconciliation": facts}
