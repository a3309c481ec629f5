"""Import per-request exports of other load generators as this project's point tables.

Two formats, each read as its tool documents it:

- AIPerf ``profile_export.jsonl``: one JSON record per line, ``{"metadata": {...}, "metrics":
  {name: {"value", "unit"}}, "error": null | {"code", "type", "message"}}``
  (:func:`import_aiperf`). The tool version is not in the records; it is read from the
  ``aiperf_version`` of a ``profile_export_aiperf.json`` beside the file when there is one.
- ``vllm bench serve --save-result --save-detailed`` result JSON: run fields (``date``,
  ``backend``, ``model_id``, ``num_prompts``, ``request_rate``, ``max_concurrency``,
  ``duration``...) and one list per field with one entry per request (``input_lens``,
  ``output_lens``, ``ttfts``, ``itls``, ``errors``; ``latencies``, ``start_times``,
  ``queue_times`` in recent versions) (:func:`import_vllm_bench`). ``--metadata KEY=VALUE``
  pairs are top-level keys; ``vllm_version`` (or ``version``) is read as the tool version.

Both give an :class:`ImportedPoint`: the requests and chunks tables validated by the same
pandera schemas as a measured point (``RequestsTable`` with the pack's classes, ``ChunksTable``),
a :class:`Provenance` (tool, version, file sha256, the definitions applied, what was estimated
and what could not be mapped) and the minimal sweep summary :func:`analysis.analyze_point` reads.

Our definitions (``capacity_pack.measure.loadgen``): s = request sent, f = first non-empty content
chunk,
e = last content chunk, O = output tokens (``usage.completion_tokens`` when given):
TTFT = f - s, E2E = e - s, TPOT = (E2E - TTFT) / (O - 1) for O > 1 (0 otherwise),
ITL = gaps between consecutive chunks (the chunks table). Failed rows carry zero latencies.

Metric-definition mapping, AIPerf record -> ours:

- TTFT <- ``metrics.time_to_first_token`` (first non-empty content response - request start).
- E2E <- ``metrics.request_latency`` (last content response - request start).
- TPOT <- derived as above with our O. AIPerf's ``inter_token_latency`` is the same per-request
  average ((request_latency - TTFT) / (output_sequence_length - 1)) but over *its* token count;
  it is kept only as a cross-check (they differ when usage and AIPerf's tokenizer disagree).
- ITL (chunks) <- ``metrics.inter_chunk_latency`` (per-chunk gaps); the first chunk arrives at
  TTFT. AIPerf exports no per-chunk token counts, so O is spread evenly over the chunks
  (estimated).
- O <- ``metrics.usage_completion_tokens`` (server usage) when present, else
  ``output_sequence_length`` (AIPerf's client tokenization of the text plus reasoning tokens, or
  the server count under ``--use-server-token-count``).
- input tokens <- ``input_sequence_length`` (``error_isl`` on failed records); prompt and
  cached tokens <- ``usage_prompt_tokens``, ``usage_prompt_cache_read_tokens``.
- send time <- ``metadata.request_start_ns`` (epoch ns: exact, no estimate); terminal time <-
  ``request_end_ns`` (``cancellation_time_ns`` for a cancelled request).
- status: ``was_cancelled`` -> cancelled; an ``error`` naming a timeout -> timeout; any other
  ``error`` -> error (``error.code`` as the HTTP status); none -> ok.
- phase: ``benchmark_phase`` profiling -> measure (block 1), warmup -> warmup (block 0).

Metric-definition mapping, vLLM bench result -> ours:

- TTFT <- ``ttfts[i]`` (s): the first SSE event carrying ``choices`` - ``start_time``, even when
  its text is empty (ours waits for non-empty content), with the start taken before the HTTP
  call (ours after the request is written).
- E2E <- ``ttfts[i] + sum(itls[i])``: the last ``choices`` event, equal to ``latencies[i]``
  where exported (checked).
- ITL (chunks) <- ``itls[i]`` (s): per-chunk gaps, exactly our chunk gaps; vLLM's "ITL"
  statistics are over these gaps, so they are *not* a per-token average when chunks carry
  several tokens. Per-chunk token counts are not exported: O is spread evenly (estimated).
- TPOT <- derived as above (vLLM's own per-request TPOT uses the same formula over
  ``output_lens``; per-request values are not exported).
- O <- ``output_lens[i]``: ``usage.completion_tokens`` when the server sent usage, else the
  benchmark tokenizer's re-tokenization of the generated text (always, in older versions); the
  file does not say which.
- input tokens <- ``input_lens[i]`` (the dataset's prompt length, or the server's
  ``prompt_tokens`` in versions that read usage).
- status: ok when ``errors[i]`` is empty and ``ttfts[i] > 0``; an error text naming a timeout
  -> timeout; otherwise error (a non-200 response may leave an empty error text).
- send time <- ``start_times[i]`` (``time.perf_counter`` s: exact offsets, no absolute origin);
  the wall clock is estimated as ``date`` (written after the run, no zone: read as UTC, 1 s
  resolution) - ``duration``. Scheduled arrival <- ``start_times - queue_times`` (the client's
  concurrency-semaphore wait). Without ``start_times`` (older versions) the send times are
  estimated: arrival i / ``request_rate`` (0 for ``inf``), delayed by a ``max_concurrency``
  slot simulation over each request's E2E.

Class assignment, per request: a ``class`` field in the export (AIPerf ``metadata.class``,
vLLM top-level ``class`` from ``--metadata class=NAME``) when present; else the one pack class
whose input length spec fits (a fixed length exactly, a distribution within [min, max]),
narrowed by the output length when several fit; else ``class_name``. An ok request whose output
length differs from its class's fixed length becomes an error row saying so, as the load
generator records it.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capacity_pack.evidence.normalize import (
    MEASURED,
    NS_PER_MS,
    ChunksTable,
    ServerMetricsTable,
    requests_schema,
    seed_csv_frame,
)
from capacity_pack.io import atomic_path, file_sha256, write_json_atomic
from capacity_pack.plan.manifest import LognormalLength, WorkloadClass
from capacity_pack.tables import validate_table

Tool = Literal["aiperf", "vllm-bench"]
IMPORTER_VERSION = 1
# Time units AIPerf writes in a metric's "unit", as factors to milliseconds.
_TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3, "sec": 1e3}
# AIPerf metadata fields this importer reads (``class`` is not AIPerf's: a post-processing hook).
_AIPERF_METADATA_FIELDS = (
    "x_request_id",
    "session_num",
    "turn_index",
    "request_start_ns",
    "request_end_ns",
    "benchmark_phase",
    "was_cancelled",
    "cancellation_time_ns",
    "class",
)
# AIPerf metrics this importer reads; any other metric of a record is listed as unmapped.
_AIPERF_USED = {
    "time_to_first_token",
    "request_latency",
    "inter_token_latency",
    "inter_chunk_latency",
    "input_sequence_length",
    "error_isl",
    "output_sequence_length",
    "output_token_count",
    "usage_completion_tokens",
    "usage_prompt_tokens",
    "usage_prompt_cache_read_tokens",
}

_AIPERF_METADATA_USED = set(_AIPERF_METADATA_FIELDS)

AIPERF_DEFINITIONS = {
    "ttft_ms": "metrics.time_to_first_token: first non-empty content response - request start",
    "e2e_ms": "metrics.request_latency: last content response - request start",
    "tpot_ms": (
        "derived (E2E - TTFT) / (O - 1) with our O; AIPerf's metrics.inter_token_latency is the "
        "same per-request average over output_sequence_length, kept as a cross-check only"
    ),
    "itl (chunks.gap_ms)": "metrics.inter_chunk_latency: per-chunk gaps; chunk 0 at TTFT",
    "output_tokens": (
        "metrics.usage_completion_tokens (server usage) when present, else "
        "metrics.output_sequence_length (AIPerf's tokenization of the text plus reasoning "
        "tokens, or the server count under --use-server-token-count)"
    ),
    "input_tokens": "metrics.input_sequence_length (metrics.error_isl on failed records)",
    "prompt_tokens": "metrics.usage_prompt_tokens",
    "cached_tokens": "metrics.usage_prompt_cache_read_tokens",
    "sent_ns": "metadata.request_start_ns (epoch ns, also the realtime stamp)",
    "end_ns": "metadata.request_end_ns (cancellation_time_ns when cancelled)",
    "status": (
        "was_cancelled -> cancelled; error naming a timeout -> timeout; other error -> error "
        "(error.code as http_status); no error -> ok"
    ),
    "phase": "metadata.benchmark_phase: profiling -> measure (block 1), warmup -> warmup",
    "request_id": "metadata.x_request_id (else aiperf-<session_num>-<turn_index>)",
}

VLLM_DEFINITIONS = {
    "ttft_ms": (
        "ttfts x 1000: first SSE event with choices (even empty text) - start_time, the start "
        "taken before the HTTP call"
    ),
    "e2e_ms": "(ttfts + sum(itls)) x 1000: the last choices event (= latencies where exported)",
    "tpot_ms": "derived (E2E - TTFT) / (O - 1) with O = output_lens",
    "itl (chunks.gap_ms)": "itls x 1000: per-chunk gaps (not per token); chunk 0 at TTFT",
    "output_tokens": (
        "output_lens: usage.completion_tokens when the server sent usage, else the re-tokenized "
        "generated text (always, in older versions); the file does not say which"
    ),
    "input_tokens": "input_lens (dataset prompt length, or the server's prompt_tokens)",
    "sent_ns": "start_times (perf_counter s) relative to the earliest; else estimated",
    "due (scheduled arrival)": "start_times - queue_times (client semaphore wait)",
    "status": (
        "ok when errors[i] is empty and ttfts[i] > 0; error text naming a timeout -> timeout; "
        "otherwise error"
    ),
    "phase": "every request measure (block 1): warm-up requests are not in the result",
    "request_id": "vllm-<index in the per-request lists>",
}


class ExportFormatError(ValueError):
    """An export that cannot be imported; the message names the file, the record and the field."""


class Provenance(BaseModel):
    """Where an imported point came from and how its numbers were mapped onto ours."""

    model_config = ConfigDict(extra="forbid")

    tool: Tool
    tool_version: str | None = Field(description="As written by the tool; null when absent.")
    tool_version_source: str | None = Field(description="File and field the version came from.")
    source_file: str
    source_sha256: str
    importer_version: int = IMPORTER_VERSION
    point: str
    cache_state: str
    repeat: int
    records: int = Field(description="Requests in the export (every record, none dropped).")
    status_counts: dict[str, int]
    definitions: dict[str, str] = Field(description="Our column <- their field and meaning.")
    output_tokens_source: dict[str, int] = Field(description="Rows per output-count source.")
    class_assignment: dict[str, int] = Field(description="Rows per assignment method.")
    class_counts: dict[str, int]
    length_mismatch_errors: int = Field(
        description="ok requests turned into error rows: output differs from the class length."
    )
    timestamps: dict[str, str] = Field(description="How each time base was obtained.")
    estimated: list[str] = Field(description="Quantities synthesized, not read.")
    unmapped: list[str] = Field(description="Export fields or our columns with no counterpart.")
    cross_checks: dict[str, float | int | None]
    run: dict[str, Any] = Field(description="Run-level fields of the export, as written.")


class ImportedPoint(BaseModel):
    """One imported point: validated tables, provenance and a minimal sweep summary."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    requests: pd.DataFrame
    chunks: pd.DataFrame
    metrics: pd.DataFrame = Field(description="Empty ServerMetricsTable: nothing was scraped.")
    provenance: Provenance
    summary: dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Shared: the tool-neutral frame -> our tables
# ---------------------------------------------------------------------------------------------


class _Frame(BaseModel):
    """What a tool parser hands to :func:`_build`: one row per request plus run facts."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    # Columns: request_id, where, phase, status, http_status, error, input_tokens (float, NaN
    # unknown), output_tokens (int), output_source, prompt_tokens, cached_tokens (float),
    # sent_ns, end_ns, due_ns (int64 ns, -1 unknown: epoch ns do not survive float64),
    # ttft_ms, e2e_ms (float), class_hint (object), gaps_ms (list or None), gap_field (its name,
    # for errors).
    rows: pd.DataFrame
    realtime_shift_ns: int
    input_field: str
    class_field: str
    latency_fields: str
    timestamps: dict[str, str]
    estimated: list[str]
    unmapped: list[str]
    cross_checks: dict[str, float | int | None]
    run: dict[str, Any]


def _workload(workload) -> list[WorkloadClass]:
    if hasattr(workload, "workload"):
        return list(workload.workload)
    if isinstance(workload, Mapping):
        return list(workload.values())
    return list(workload)


def _fits(spec, values: np.ndarray) -> np.ndarray:
    """Which lengths a class's length spec admits (NaN admits nothing)."""
    if isinstance(spec, int):
        return values == spec
    if isinstance(spec, LognormalLength):
        lo, hi = spec.min, spec.max
    else:
        lo, hi = int(spec.values.min()), int(spec.values.max())
    return (values >= lo) & (values <= hi)


def _assign_classes(
    rows: pd.DataFrame,
    classes: list[WorkloadClass],
    class_name: str | None,
    source: str,
    class_field: str,
) -> tuple[np.ndarray, np.ndarray]:
    names = [c.name for c in classes]
    if class_name is not None and class_name not in names:
        raise ExportFormatError(
            f"{source}: --class-name {class_name!r} is not a workload class of the pack "
            f"(classes: {', '.join(names)}); its cutoffs come from the pack"
        )
    n = len(rows)
    klass = np.full(n, None, dtype=object)
    how = np.full(n, "", dtype=object)
    hint = rows["class_hint"]
    has_hint = hint.notna().to_numpy()
    unknown = has_hint & ~hint.isin(names).to_numpy()
    if unknown.any():
        i = int(np.argmax(unknown))
        raise ExportFormatError(
            f"{source}: {rows['where'].iloc[i]}: field {class_field}: class "
            f"{hint.iloc[i]!r} is not a workload class of the pack ({', '.join(names)})"
        )
    klass[has_hint] = hint.to_numpy(dtype=object)[has_hint]
    how[has_hint] = "export field"
    inp = rows["input_tokens"].to_numpy(dtype=float)
    out = rows["output_tokens"].to_numpy(dtype=float)
    out = np.where(out > 0, out, np.nan)
    fit_in = np.column_stack([_fits(c.input_tokens, inp) for c in classes])
    both = fit_in & np.column_stack([_fits(c.output_tokens, out) for c in classes])
    # Input lengths decide when they single out a class: a wrong output length must then show
    # as a length-contract error, not move the request to another class.
    choice = np.where(
        fit_in.sum(axis=1) == 1,
        fit_in.argmax(axis=1),
        np.where(both.sum(axis=1) == 1, both.argmax(axis=1), -1),
    )
    matched = ~has_hint & (choice >= 0)
    klass[matched] = np.asarray(names, dtype=object)[choice[matched]]
    how[matched] = "input/output lengths"
    rest = ~has_hint & (choice < 0)
    if rest.any():
        if class_name is None:
            i = int(np.argmax(rest))
            raise ExportFormatError(
                f"{source}: {int(rest.sum())} request(s) match no single workload class by "
                f"their lengths, e.g. {rows['where'].iloc[i]} (input "
                f"{_num(inp[i])}, output {_num(out[i])}); name one with --class-name"
            )
        klass[rest] = class_name
        how[rest] = "--class-name"
    return klass, how


def _num(x: float) -> str:
    return "unknown" if not np.isfinite(x) else str(int(x))


def _chunks(rows: pd.DataFrame, ok: np.ndarray, out_tokens: np.ndarray, source: str):
    """Long chunks table from per-request gap lists; arrivals in integer ns, so exact sums."""
    has = ok & rows["gaps_ms"].notna().to_numpy()
    gaps = rows["gaps_ms"][has]
    counts = gaps.map(len).to_numpy(dtype=np.int64) + 1
    per_request = np.zeros(len(rows), dtype=np.int64)
    per_request[has] = counts
    flat = (
        np.concatenate([np.asarray(g, dtype=float) for g in gaps])
        if len(gaps)
        else np.zeros(0, dtype=float)
    )
    bad = ~np.isfinite(flat) | (flat < 0)
    if bad.any():
        j = int(np.argmax(bad))
        owner = int(np.searchsorted(np.cumsum(counts - 1), j, side="right"))
        k = j - int((counts - 1)[:owner].sum())
        raise ExportFormatError(
            f"{source}: {rows['where'][has].iloc[owner]}: field "
            f"{rows['gap_field'][has].iloc[owner]}[{k}]: "
            f"{float(flat[j])!r} is not a finite non-negative gap"
        )
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    first = np.zeros(total, dtype=bool)
    first[starts] = True
    gap_ms = np.full(total, np.nan)
    gap_ms[~first] = flat
    step_ns = np.where(first, 0, np.rint(np.nan_to_num(gap_ms) * NS_PER_MS)).astype(np.int64)
    cum = np.cumsum(step_ns)
    within = cum - np.repeat(cum[starts], counts)
    ttft_ns = np.rint(rows["ttft_ms"].to_numpy(dtype=float)[has] * NS_PER_MS).astype(np.int64)
    index = np.arange(total) - np.repeat(starts, counts)
    # Neither tool exports tokens per chunk: spread O evenly (floor steps), at least one each.
    o = np.repeat(out_tokens[has], counts)
    n = np.repeat(counts, counts)
    tokens = np.maximum((index + 1) * o // n - index * o // n, 1)
    frame = pd.DataFrame(
        {
            "request_id": np.repeat(rows["request_id"].to_numpy(dtype=object)[has], counts),
            "chunk_index": index.astype(np.int64),
            "arrival_offset_ns": np.repeat(ttft_ns, counts) + within,
            "tokens": tokens.astype(np.int64),
            "gap_ms": gap_ms,
        }
    )
    return frame, per_request


def _build(
    tool: Tool,
    frame: _Frame,
    path: Path,
    *,
    workload,
    point: str,
    cache_state: str,
    repeat: int,
    class_name: str | None,
    definitions: dict[str, str],
    version: tuple[str | None, str | None],
) -> ImportedPoint:
    source = str(path)
    r = frame.rows
    if r.empty:
        raise ExportFormatError(f"{source}: the export holds no requests")
    dup = r["request_id"][r["request_id"].duplicated()]
    if len(dup):
        raise ExportFormatError(
            f"{source}: request id {dup.iloc[0]!r} appears more than once "
            f"({', '.join(r.loc[r['request_id'] == dup.iloc[0], 'where'])})"
        )
    r = r.sort_values("sent_ns", kind="stable").reset_index(drop=True)
    classes = _workload(workload)
    klass, how = _assign_classes(r, classes, class_name, source, frame.class_field)
    fixed_in = pd.Series(klass).map(
        {c.name: c.input_tokens for c in classes if isinstance(c.input_tokens, int)}
    )
    fixed_out = pd.Series(klass).map(
        {c.name: c.output_tokens for c in classes if isinstance(c.output_tokens, int)}
    )
    estimated = list(frame.estimated)
    inp = r["input_tokens"].where(r["input_tokens"] > 0)
    missing_in = inp.isna().to_numpy()
    if missing_in.any():
        unfilled = missing_in & fixed_in.isna().to_numpy()
        if unfilled.any():
            i = int(np.argmax(unfilled))
            raise ExportFormatError(
                f"{source}: {r['where'].iloc[i]}: field {frame.input_field} is missing and "
                f"class {klass[i]!r} has no fixed input length to stand in for it"
            )
        inp = inp.fillna(fixed_in)
        estimated.append(
            f"input_tokens of {int(missing_in.sum())} request(s): the class's fixed input length"
        )
    out = r["output_tokens"].to_numpy(dtype=np.int64)
    status = r["status"].to_numpy(dtype=object).copy()
    error = r["error"].to_numpy(dtype=object).copy()
    ok = status == "ok"
    want = fixed_out.to_numpy(dtype=float)
    mismatch = ok & ~np.isnan(want) & (out != np.nan_to_num(want))
    if mismatch.any():
        # The load generator's contract: a short or long output is an error, never a success.
        status[mismatch] = "error"
        error[mismatch] = (
            "output_tokens "
            + pd.Series(out[mismatch]).astype(str)
            + " differ from class "
            + pd.Series(klass[mismatch]).astype(str)
            + "'s fixed length "
            + pd.Series(want[mismatch]).astype(np.int64).astype(str)
            + " (counted from "
            + r["output_source"][mismatch].reset_index(drop=True)
            + ")"
        ).to_numpy(dtype=object)
        ok = status == "ok"
    expected = np.where(np.isnan(want), np.maximum(out, 1), np.nan_to_num(want)).astype(np.int64)

    sent = r["sent_ns"].to_numpy(dtype=np.int64)
    due = r["due_ns"].to_numpy(dtype=np.int64)
    has_due = due >= 0
    due_i = np.where(has_due, due, sent)
    t0 = int(min(sent.min(), due_i.min()))
    ttft = r["ttft_ms"].to_numpy(dtype=float)
    e2e = r["e2e_ms"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / (out - 1), 0.0)
    chunks, per_request = _chunks(r, ok, out, source)
    short = ok & ~(e2e >= ttft)
    if short.any():
        # Caught here, not by the table check, so the message names the record, not a row index.
        i = int(np.argmax(short))
        raise ExportFormatError(
            f"{source}: {r['where'].iloc[i]}: fields {frame.latency_fields}: E2E {e2e[i]:.3f} ms "
            f"is shorter than TTFT {ttft[i]:.3f} ms"
        )
    ttft, e2e, tpot = (np.where(ok, x, 0.0) for x in (ttft, e2e, tpot))
    end_raw = r["end_ns"].to_numpy(dtype=np.int64)
    e2e_ns = np.rint(np.nan_to_num(r["e2e_ms"].to_numpy(dtype=float)) * NS_PER_MS)
    end = np.maximum(np.where(end_raw >= 0, end_raw, sent + e2e_ns.astype(np.int64)), sent)
    delay_ms = np.where(has_due, (sent - due_i) / NS_PER_MS, np.nan)
    phase = r["phase"].to_numpy(dtype=object)
    seq = pd.Series(np.arange(len(r))).groupby(pd.Series(phase)).cumcount().to_numpy(dtype=np.int64)
    requests = pd.DataFrame(
        {
            "request_id": r["request_id"].astype(str),
            "class": klass,
            "point": point,
            "cache_state": cache_state,
            "repeat": np.int64(repeat),
            "phase": phase,
            "block": np.where(phase == "warmup", 0, 1).astype(np.int64),
            "seq": seq,
            "status": status,
            "http_status": pd.array(r["http_status"], dtype="Int64"),
            "error": error,
            "input_tokens": inp.to_numpy(dtype=np.int64),
            "output_tokens_expected": expected,
            "output_tokens": out,
            "prompt_tokens": pd.array(r["prompt_tokens"].round(), dtype="Int64"),
            "cached_tokens": pd.array(r["cached_tokens"].round(), dtype="Int64"),
            # No precommitted schedule: the scheduled offset is the arrival (due) where the
            # tool exports one, else the send itself.
            "scheduled_offset_ns": due_i - t0,
            "due_offset_ns": np.where(has_due, due_i - t0, 0),
            "sent_offset_ns": sent - t0,
            "client_delay_ms": delay_ms,
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2e_ms": e2e,
            "ttft_from_scheduled_ms": np.where(ok & has_due, ttft + delay_ms, np.nan),
            "e2e_from_scheduled_ms": np.where(ok & has_due, e2e + delay_ms, np.nan),
            "chunks": per_request,
            "sent_ns": sent,
            "end_ns": end,
            "sent_realtime_ns": sent + frame.realtime_shift_ns,
            "end_realtime_ns": end + frame.realtime_shift_ns,
            "warmup": phase == "warmup",
        }
    )
    names = [c.name for c in classes]
    fixed = {c.name: c.output_tokens if isinstance(c.output_tokens, int) else None for c in classes}
    requests = validate_table(requests, requests_schema(names, fixed), f"{source} (requests)")
    chunks = validate_table(chunks, ChunksTable.to_schema(), f"{source} (chunks)")
    metrics = validate_table(
        pd.DataFrame(
            {"t_offset_ns": [], "realtime_ns": [], "source": [], "metric": [], "value": []}
        ),
        ServerMetricsTable.to_schema(),
        f"{source} (metrics)",
    )

    counts = requests["status"].value_counts()
    status_counts = {k: int(v) for k, v in counts.items()}
    measured = requests[requests["phase"].isin(MEASURED)]
    window_s = (
        (int(measured["end_ns"].max()) - int(measured["sent_ns"].min())) / 1e9
        if len(measured)
        else None
    )
    okm = measured[measured["status"] == "ok"].dropna(subset=["prompt_tokens", "cached_tokens"])
    prompt, cached = okm["prompt_tokens"], okm["cached_tokens"]
    checks = dict(frame.cross_checks)
    if len(chunks):
        last = chunks.groupby("request_id")["arrival_offset_ns"].max() / NS_PER_MS
        e2e_by_id = requests.set_index("request_id")["e2e_ms"].reindex(last.index)
        checks["last_chunk_vs_e2e_max_abs_ms"] = float((last - e2e_by_id).abs().max())
    provenance = Provenance(
        tool=tool,
        tool_version=version[0],
        tool_version_source=version[1],
        source_file=source,
        source_sha256=file_sha256(path),
        point=point,
        cache_state=cache_state,
        repeat=repeat,
        records=len(requests),
        status_counts=status_counts,
        definitions=definitions,
        output_tokens_source={
            k: int(v) for k, v in r.loc[ok, "output_source"].value_counts().items()
        },
        class_assignment={k: int(v) for k, v in pd.Series(how).value_counts().items()},
        class_counts={k: int(v) for k, v in requests["class"].value_counts().items()},
        length_mismatch_errors=int(mismatch.sum()),
        timestamps=frame.timestamps,
        estimated=estimated,
        unmapped=frame.unmapped,
        cross_checks=checks,
        run=frame.run,
    )
    summary = {
        "point": point,
        "cache_state": cache_state,
        "repeat": repeat,
        "imported_from": tool,
        "requests_recorded": len(requests),
        "failed": int((requests["status"] != "ok").sum()),
        "status_counts": status_counts,
        "measured_window_s": window_s,
        "extension_blocks": 0,
        "prewarm_requests": 0,
        # Not observable from an export: the importing tool's own lateness and the server's
        # metrics were not recorded, so the analysis reports the queue trend inconclusive.
        "client_bound": False,
        "client_bound_checked": False,
        "dispatch_lateness_ms": None,
        "server_prefix_hit_rate": None,
        "client_cached_token_fraction": (
            float(cached.sum() / prompt.sum()) if len(cached) and prompt.sum() > 0 else None
        ),
    }
    return ImportedPoint(
        requests=requests, chunks=chunks, metrics=metrics, provenance=provenance, summary=summary
    )


def _status_of(text: str) -> str:
    return "timeout" if "timeout" in text.lower() else "error"


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<record>"


def _jsonable(value: Any) -> Any:
    # Python's json reads NaN/Infinity (vLLM writes them for inf rates); our JSON refuses them.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _first_error(err: ValidationError) -> tuple[tuple, str]:
    e = err.errors()[0]
    return tuple(e["loc"]), e["msg"]


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of two equal keys silently; a record saying two things is bad
    # input, not something to pick from.
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _loads(text: str, source: str, where: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as err:
        raise ExportFormatError(
            f"{source}: {where}: not valid JSON ({err.msg} at column {err.colno})"
        ) from None
    except _DuplicateKey as err:
        raise ExportFormatError(
            f"{source}: {where}: field {err.key!r} appears twice in one object"
        ) from None


# ---------------------------------------------------------------------------------------------
# AIPerf profile_export.jsonl
# ---------------------------------------------------------------------------------------------


class _External(BaseModel):
    # Other tools' exports gain fields between versions (AIPerf: "do not assume the field set is
    # closed"), so unknown fields are ignored here and listed as unmapped, never refused.
    model_config = ConfigDict(extra="ignore")


class _MetricValue(_External):
    value: float | list[float] | None = None
    unit: str | None = None


class _AIPerfMetadata(_External):
    x_request_id: str | None = None
    session_num: int | None = None
    turn_index: int = 0
    request_start_ns: int
    request_end_ns: int | None = None
    benchmark_phase: str = "profiling"
    was_cancelled: bool = False
    cancellation_time_ns: int | None = None
    class_: str | None = Field(default=None, alias="class")


class _AIPerfError(_External):
    code: int | None = None
    type: str | None = None
    message: str | None = None


class _AIPerfRecord(_External):
    metadata: _AIPerfMetadata
    # Raw: a metric is validated only when read, so a new metric of any shape is no error.
    metrics: dict[str, Any] | None = None
    error: _AIPerfError | None = None


class _AIPerfLine:
    """Typed access to one record's metrics, with errors naming the line and field."""

    def __init__(self, record: _AIPerfRecord, source: str, where: str):
        self.raw = {k: v for k, v in (record.metrics or {}).items() if v is not None}
        self.source, self.where = source, where
        self._typed: dict[str, _MetricValue] = {}

    def _fail(self, name: str, what: str) -> ExportFormatError:
        return ExportFormatError(f"{self.source}: {self.where}: field metrics.{name}: {what}")

    def get(self, name: str) -> _MetricValue | None:
        if name not in self.raw:
            return None
        if name not in self._typed:
            try:
                self._typed[name] = _MetricValue.model_validate(self.raw[name])
            except ValidationError as err:
                loc, msg = _first_error(err)
                raise self._fail(_loc((name, *loc)), msg) from None
        m = self._typed[name]
        return m if m.value is not None else None

    def has(self, name: str) -> bool:
        return self.get(name) is not None

    def ms(self, name: str, *, required: str | None = None) -> float | list[float] | None:
        m = self.get(name)
        if m is None:
            if required:
                raise self._fail(name, f"missing ({required})")
            return None
        factor = _TO_MS.get(m.unit or "ms")
        if factor is None:
            raise self._fail(name, f"unit {m.unit!r} is not a time unit ({', '.join(_TO_MS)})")
        if isinstance(m.value, list):
            return [v * factor for v in m.value]
        return m.value * factor

    def scalar_ms(self, name: str, *, required: str | None = None) -> float | None:
        v = self.ms(name, required=required)
        if isinstance(v, list):
            raise self._fail(name, "expected one number, got a list")
        if v is not None and (not math.isfinite(v) or v < 0):
            raise self._fail(name, f"expected a finite non-negative time, got {v!r}")
        return v

    def count(self, name: str) -> int | None:
        m = self.get(name)
        if m is None:
            return None
        v = m.value
        if isinstance(v, list) or not float(v).is_integer() or v < 0:
            raise self._fail(name, f"expected a whole token count, got {v!r}")
        return int(v)


def _aiperf_row(record: _AIPerfRecord, line: _AIPerfLine, lineno: int) -> dict[str, Any]:
    md = record.metadata
    rid = md.x_request_id or (
        f"aiperf-{md.session_num}-{md.turn_index}"
        if md.session_num is not None
        else f"aiperf-line{lineno}"
    )
    phase = {"profiling": "measure", "warmup": "warmup"}.get(md.benchmark_phase)
    if phase is None:
        raise ExportFormatError(
            f"{line.source}: {line.where}: field metadata.benchmark_phase: "
            f"{md.benchmark_phase!r} is neither profiling nor warmup"
        )
    err = record.error
    text = ": ".join(x for x in (err.type, err.message) if x) if err else ""
    if md.was_cancelled:
        status, text = "cancelled", text or "cancelled"
    elif err is not None:
        status, text = _status_of(text), text or "error without a type or message"
    else:
        status = "ok"
    row: dict[str, Any] = {
        "request_id": rid,
        "where": line.where,
        "phase": phase,
        "status": status,
        "http_status": (err.code if err and err.code and 100 <= err.code <= 599 else None),
        "error": text or None,
        "sent_ns": md.request_start_ns,
        "end_ns": (
            md.cancellation_time_ns
            if md.was_cancelled and md.cancellation_time_ns is not None
            else md.request_end_ns
            if md.request_end_ns is not None
            else -1
        ),
        "due_ns": -1,
        "class_hint": md.class_,
        "prompt_tokens": line.count("usage_prompt_tokens"),
        "cached_tokens": line.count("usage_prompt_cache_read_tokens"),
        "itl_tool_ms": None,
        "gaps_ms": None,
        "gap_field": "metrics.inter_chunk_latency.value",
        "ttft_ms": np.nan,
        "e2e_ms": np.nan,
        "output_tokens": 0,
        "output_source": "none (failed)",
    }
    if status != "ok":
        row["input_tokens"] = line.count("error_isl") or line.count("input_sequence_length")
        return row
    row["input_tokens"] = line.count("input_sequence_length")
    row["ttft_ms"] = line.scalar_ms(
        "time_to_first_token", required="AIPerf writes it for streaming runs only"
    )
    row["e2e_ms"] = line.scalar_ms("request_latency", required="every ok record has it")
    usage = line.count("usage_completion_tokens")
    osl = line.count("output_sequence_length")
    if osl is None:
        osl = line.count("output_token_count")
    if usage is not None:
        row["output_tokens"], row["output_source"] = usage, "usage_completion_tokens"
    elif osl is not None:
        row["output_tokens"], row["output_source"] = osl, "output_sequence_length"
    else:
        raise line._fail("output_sequence_length", "missing, and no usage_completion_tokens")
    row["itl_tool_ms"] = line.scalar_ms("inter_token_latency")
    row["osl"] = osl
    gaps = line.ms("inter_chunk_latency")
    if gaps is not None and not isinstance(gaps, list):
        gaps = [gaps]  # one gap: two chunks
    row["gaps_ms"] = gaps
    return row


def _aiperf_version(path: Path) -> tuple[str | None, str | None]:
    summary = path.with_name("profile_export_aiperf.json")
    if not summary.is_file():
        return None, None
    doc = _loads(summary.read_text(encoding="utf-8"), str(summary), "document")
    version = doc.get("aiperf_version") if isinstance(doc, dict) else None
    return (str(version), f"{summary.name}: aiperf_version") if version else (None, None)


def import_aiperf(
    path: str | Path,
    *,
    workload,
    point: str,
    cache_state: str = "cold",
    repeat: int = 0,
    class_name: str | None = None,
) -> ImportedPoint:
    """Import an AIPerf ``profile_export.jsonl`` (see the module docstring for the mapping).

    ``workload`` is a :class:`~capacity_pack.plan.manifest.Pack`, its workload classes, or a
    mapping name -> class.
    """
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise ExportFormatError(f"{source}: no such file")
    rows: list[dict[str, Any]] = []
    metric_names: set[str] = set()
    metadata_names: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for lineno, text in enumerate(fh, 1):
            if not text.strip():
                continue
            where = f"line {lineno}"
            obj = _loads(text, source, where)
            try:
                record = _AIPerfRecord.model_validate(obj)
            except ValidationError as err:
                loc, msg = _first_error(err)
                raise ExportFormatError(f"{source}: {where}: field {_loc(loc)}: {msg}") from None
            if record.metadata.x_request_id:
                where += f" (x_request_id {record.metadata.x_request_id})"
            line = _AIPerfLine(record, source, where)
            metric_names.update(line.raw)
            metadata_names.update(obj["metadata"])
            rows.append(_aiperf_row(record, line, lineno))
    frame = pd.DataFrame.from_records(rows)
    if frame.empty:
        raise ExportFormatError(f"{source}: the export holds no records")
    for col in ("input_tokens", "prompt_tokens", "cached_tokens"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
    if "osl" not in frame:
        frame["osl"] = np.nan
    ok = (frame["status"] == "ok").to_numpy()
    osl = pd.to_numeric(frame["osl"], errors="coerce").to_numpy(dtype=float)
    tool_itl = pd.to_numeric(frame["itl_tool_ms"], errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        ours = np.where(
            frame["output_tokens"] > 1,
            (frame["e2e_ms"] - frame["ttft_ms"]) / (frame["output_tokens"] - 1),
            np.nan,
        )
        # AIPerf's ITL recomputed from its own fields: checks we read its definition right.
        theirs = (frame["e2e_ms"] - frame["ttft_ms"]).to_numpy() / (osl - 1)
    both = ok & np.isfinite(tool_itl) & np.isfinite(ours)
    mapped_ok = both & np.isfinite(theirs)
    checks: dict[str, float | int | None] = {
        "aiperf_itl_vs_its_definition_max_abs_ms": (
            float(np.abs(theirs[mapped_ok] - tool_itl[mapped_ok]).max())
            if mapped_ok.any()
            else None
        ),
        "tpot_vs_aiperf_inter_token_latency_max_abs_ms": (
            float(np.abs(ours[both] - tool_itl[both]).max()) if both.any() else None
        ),
        "requests_where_usage_and_aiperf_count_differ": int(
            (ok & np.isfinite(osl) & (frame["output_tokens"].to_numpy() != osl)).sum()
        ),
        "ok_requests_without_chunk_gaps": int((ok & frame["gaps_ms"].isna().to_numpy()).sum()),
    }
    unmapped = sorted(f"metadata.{m}" for m in metadata_names - _AIPERF_METADATA_USED)
    unmapped += sorted(f"metrics.{m}" for m in metric_names - _AIPERF_USED)
    unmapped += [
        "scheduled arrival (AIPerf records no intended send time): due_offset_ns 0, "
        "client_delay_ms and *_from_scheduled_ms empty",
        "http_status of ok records (not exported)",
    ]
    parsed = _Frame(
        rows=frame,
        realtime_shift_ns=0,
        input_field="metrics.input_sequence_length / metrics.error_isl",
        class_field="metadata.class",
        latency_fields="metrics.time_to_first_token, metrics.request_latency",
        timestamps={
            "send": "exact: metadata.request_start_ns (epoch ns), used as both clocks",
            "end": "exact: metadata.request_end_ns (may follow the last token: usage/[DONE])",
            "first/last token": "send + time_to_first_token / request_latency",
        },
        estimated=["chunk token counts (O spread evenly over the chunks)"],
        unmapped=unmapped,
        cross_checks=checks,
        run={},
    )
    return _build(
        "aiperf",
        parsed,
        path,
        workload=workload,
        point=point,
        cache_state=cache_state,
        repeat=repeat,
        class_name=class_name,
        definitions=AIPERF_DEFINITIONS,
        version=_aiperf_version(path),
    )


# ---------------------------------------------------------------------------------------------
# vllm bench serve result JSON
# ---------------------------------------------------------------------------------------------


class _VllmResult(_External):
    date: str | None = None
    backend: str | None = None
    label: str | None = None
    model_id: str | None = None
    tokenizer_id: str | None = None
    num_prompts: int | None = None
    request_rate: float | str | None = None
    burstiness: float | None = None
    max_concurrency: int | None = None
    duration: float | None = None
    completed: int | None = None
    failed: int | None = None
    ramp_up_strategy: str | None = None
    input_lens: list[int]
    output_lens: list[int]
    ttfts: list[float]
    itls: list[list[float]]
    errors: list[str | None]
    latencies: list[float] | None = None
    start_times: list[float] | None = None
    queue_times: list[float] | None = None


_VLLM_LISTS = ("input_lens", "output_lens", "ttfts", "itls", "errors")
_VLLM_OPTIONAL_LISTS = ("latencies", "start_times", "queue_times")
_VLLM_RUN_FIELDS = (
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "ramp_up_strategy",
)
# Run-level statistics the result also carries: summaries of what is imported per request, which
# our analysis recomputes; kept in provenance.run for comparison.
_VLLM_STATS = re.compile(
    r"^((mean|median|std|p\d+(\.\d+)?)_\w+_ms|total_input_tokens|total_output_tokens|"
    r"request_throughput|request_goodput|output_throughput|total_token_throughput|"
    r"max_output_tokens_per_s|max_concurrent_requests|rtfx)$"
)


def _slot_schedule(arrival_s: np.ndarray, e2e_s: np.ndarray, slots: int | None) -> np.ndarray:
    """Send times under a client concurrency cap, requests taking slots in order.

    Sequential by nature (each start depends on the slots earlier requests freed), so a heap
    over ``slots`` end times rather than a vectorized expression.
    """
    if not slots:
        return arrival_s
    free = [0.0] * slots
    out = np.empty_like(arrival_s)
    for i, (a, d) in enumerate(zip(arrival_s, e2e_s, strict=True)):
        start = max(a, heapq.heappop(free))
        out[i] = start
        heapq.heappush(free, start + d)
    return out


def _vllm_version(doc: dict[str, Any]) -> str | None:
    """The top-level key holding the tool version (written by ``--metadata``), if any."""
    return next((k for k in ("vllm_version", "version") if doc.get(k)), None)


def _anchor_ns(result: _VllmResult) -> tuple[int, str]:
    if result.date:
        try:
            written = datetime.strptime(result.date, "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
        except ValueError:
            pass
        else:
            start = written.timestamp() - (result.duration or 0.0)
            return int(round(start * 1e9)), (
                "estimated: date (local time the result was written, no zone: read as UTC, "
                "1 s resolution) - duration"
            )
    return 0, "unknown: no parseable date; realtime stamps are offsets from 0"


def import_vllm_bench(
    path: str | Path,
    *,
    workload,
    point: str,
    cache_state: str = "cold",
    repeat: int = 0,
    class_name: str | None = None,
) -> ImportedPoint:
    """Import a ``vllm bench serve --save-result --save-detailed`` result JSON."""
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise ExportFormatError(f"{source}: no such file")
    doc = _loads(path.read_text(encoding="utf-8"), source, "document")
    if not isinstance(doc, dict):
        raise ExportFormatError(f"{source}: expected a JSON object (a vllm bench result)")
    try:
        result = _VllmResult.model_validate(doc)
    except ValidationError as err:
        loc, msg = _first_error(err)
        where = f"request {loc[1]}: " if len(loc) > 1 and isinstance(loc[1], int) else ""
        hint = (
            " (per-request lists are written by --save-result --save-detailed)"
            if msg == "Field required" and loc[0] in _VLLM_LISTS
            else ""
        )
        raise ExportFormatError(f"{source}: {where}field {_loc(loc)}: {msg}{hint}") from None
    n = len(result.ttfts)
    for name in (*_VLLM_LISTS, *_VLLM_OPTIONAL_LISTS):
        values = getattr(result, name)
        if values is not None and len(values) != n:
            raise ExportFormatError(
                f"{source}: field {name}: {len(values)} entries, but ttfts has {n} "
                "(one entry per request in every per-request list)"
            )
    if n == 0:
        raise ExportFormatError(f"{source}: the result holds no requests")
    ttft_s = np.asarray(result.ttfts, dtype=float)
    gaps_s = pd.Series(result.itls, dtype=object)
    sums = gaps_s.map(math.fsum).to_numpy(dtype=float)
    errors = pd.Series(result.errors, dtype=object).fillna("").astype(str)
    ok = (errors == "").to_numpy() & (ttft_s > 0)
    bad = ~np.isfinite(ttft_s) | (ttft_s < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ExportFormatError(
            f"{source}: request {i}: field ttfts[{i}]: {float(ttft_s[i])!r} is not a finite "
            "non-negative time"
        )
    e2e_s = np.where(ok, ttft_s + sums, 0.0)
    status = np.where(ok, "ok", errors.map(_status_of).to_numpy(dtype=object))
    error = np.where(
        ok,
        None,
        np.where(
            errors == "",
            "failed without an error text (vllm bench keeps only the HTTP reason)",
            errors,
        ),
    )
    estimated: list[str] = ["chunk token counts (O spread evenly over the chunks)"]
    timestamps: dict[str, str] = {}
    anchor, anchor_how = _anchor_ns(result)
    if anchor_how.startswith("estimated"):
        estimated.append("wall-clock anchor of the run (date - duration)")
    timestamps["realtime"] = anchor_how
    try:
        rate = math.inf if result.request_rate is None else float(result.request_rate)
    except ValueError:
        raise ExportFormatError(
            f"{source}: field request_rate: {result.request_rate!r} is neither a number nor inf"
        ) from None
    due_s: np.ndarray | None = None
    if result.start_times is not None:
        start_s = np.asarray(result.start_times, dtype=float)
        timestamps["send"] = "exact offsets: start_times (time.perf_counter), earliest = 0"
        if result.queue_times is not None:
            due_s = start_s - np.asarray(result.queue_times, dtype=float)
            timestamps["due"] = "exact offsets: start_times - queue_times"
    else:
        arrival = np.arange(n) / rate if math.isfinite(rate) and rate > 0 else np.zeros(n)
        start_s = _slot_schedule(arrival, e2e_s, result.max_concurrency)
        how = (
            "arrival i / request_rate"
            if math.isfinite(rate) and rate > 0
            else "every arrival at 0 (request_rate inf)"
        )
        if result.max_concurrency:
            how += f", delayed by a {result.max_concurrency}-slot simulation over E2E"
        timestamps["send"] = f"estimated (no start_times in this version): {how}"
        estimated.append(f"send times: {how}")
        if result.ramp_up_strategy:
            estimated.append("ramp-up arrivals are not reproduced (rates not exported per request)")
    for name, values in (("start_times", start_s), ("queue_times", due_s)):
        if values is not None and not np.isfinite(values).all():
            i = int(np.argmax(~np.isfinite(values)))
            raise ExportFormatError(f"{source}: request {i}: field {name}[{i}]: not finite")
    origin = float(np.min(start_s if due_s is None else np.minimum(start_s, due_s)))
    sent_ns = np.rint((start_s - origin) * 1e9).astype(np.int64)
    due_ns = (
        np.full(n, -1, dtype=np.int64)
        if due_s is None
        else np.rint((due_s - origin) * 1e9).astype(np.int64)
    )
    checks: dict[str, float | int | None] = {
        "result_completed": result.completed,
        "imported_ok_before_length_check": int(ok.sum()),
        "result_failed": result.failed,
    }
    if result.latencies is not None:
        lat = np.asarray(result.latencies, dtype=float)
        checks["e2e_vs_latencies_max_abs_ms"] = (
            float(np.abs(e2e_s[ok] - lat[ok]).max() * 1e3) if ok.any() else None
        )
    class_hint = doc.get("class")
    if class_hint is not None and not isinstance(class_hint, str):
        raise ExportFormatError(f"{source}: field class: expected a class name, got {class_hint!r}")
    frame = pd.DataFrame(
        {
            "request_id": [f"vllm-{i:05d}" for i in range(n)],
            "where": [f"request {i}" for i in range(n)],
            "phase": "measure",
            "status": status,
            "http_status": pd.array([None] * n, dtype="Int64"),
            "error": error,
            "input_tokens": np.asarray(result.input_lens, dtype=float),
            "output_tokens": np.where(ok, np.asarray(result.output_lens, dtype=np.int64), 0),
            "output_source": "output_lens (usage or re-tokenized text)",
            "prompt_tokens": np.nan,
            "cached_tokens": np.nan,
            "sent_ns": sent_ns,
            "end_ns": sent_ns + np.rint(e2e_s * 1e9).astype(np.int64),
            "due_ns": due_ns,
            "ttft_ms": ttft_s * 1e3,
            "e2e_ms": e2e_s * 1e3,
            "class_hint": class_hint,
            "gaps_ms": gaps_s.map(lambda g: [x * 1e3 for x in g]),
            "gap_field": [f"itls[{i}]" for i in range(n)],
        }
    )
    if (frame["output_tokens"] < 0).any():
        i = int(np.argmax(frame["output_tokens"] < 0))
        raise ExportFormatError(f"{source}: request {i}: field output_lens[{i}]: negative")
    known = {*_VLLM_LISTS, *_VLLM_OPTIONAL_LISTS, *_VLLM_RUN_FIELDS, "class", "generated_texts"}
    stats = sorted(k for k in doc if _VLLM_STATS.match(k))
    extra = sorted(k for k in doc if k not in known and k not in stats)
    version_key = _vllm_version(doc)
    unmapped = [f"{k} (kept in provenance.run)" for k in extra if k != version_key]
    unmapped += [
        "generated_texts (not needed: lengths come from output_lens)",
        "prompt_tokens, cached_tokens (not exported per request)",
        "http_status (not exported)",
        "run-level statistics (totals, throughputs, mean/median/std/pNN): recomputed by our "
        "analysis, kept in provenance.run",
    ]
    if due_s is None:
        unmapped.append("scheduled arrival (no queue_times): client_delay_ms empty")
    run = {k: _jsonable(doc[k]) for k in _VLLM_RUN_FIELDS if k in doc}
    run.update(
        {
            k: _jsonable(doc[k])
            for k in (*stats, *extra)
            if isinstance(doc[k], str | int | float | bool)
        }
    )
    parsed = _Frame(
        rows=frame,
        realtime_shift_ns=anchor,
        input_field="input_lens",
        class_field="class",
        latency_fields="ttfts, itls",
        timestamps=timestamps,
        estimated=estimated,
        unmapped=unmapped,
        cross_checks=checks,
        run=run,
    )
    imported = _build(
        "vllm-bench",
        parsed,
        path,
        workload=workload,
        point=point,
        cache_state=cache_state,
        repeat=repeat,
        class_name=class_name,
        definitions=VLLM_DEFINITIONS,
        version=(
            (str(doc[version_key]), f"top-level {version_key} (--metadata)")
            if version_key
            else (None, None)
        ),
    )
    if math.isfinite(rate):
        imported.summary["offered_rps"] = rate
    imported.summary["concurrency"] = result.max_concurrency
    return imported


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

IMPORTERS = {"aiperf": import_aiperf, "vllm-bench": import_vllm_bench}


def write_imported(imported: ImportedPoint, out_dir: str | Path) -> list[Path]:
    """requests.parquet, chunks.parquet, requests.csv (the flat layout ``capacity-pack analyze``
    reads), provenance.json and summary.json, each written atomically."""
    out = Path(out_dir)
    written = []
    for name, frame in (
        ("requests.parquet", imported.requests),
        ("chunks.parquet", imported.chunks),
    ):
        with atomic_path(out / name) as tmp:
            frame.to_parquet(tmp, index=False)
        written.append(out / name)
    with atomic_path(out / "requests.csv") as tmp:
        seed_csv_frame(imported.requests).to_csv(tmp, index=False)
    written.append(out / "requests.csv")
    write_json_atomic(out / "provenance.json", imported.provenance.model_dump(mode="json"))
    write_json_atomic(out / "summary.json", imported.summary)
    written += [out / "provenance.json", out / "summary.json"]
    return written
