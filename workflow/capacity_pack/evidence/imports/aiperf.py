"""AIPerf ``profile_export.jsonl`` -> this project's point tables.

One JSON record per line, ``{"metadata", "metrics": {name: {"value", "unit"}}, "error"}``; the
tool version is read from ``aiperf_version`` of a ``profile_export_aiperf.json`` beside it.
Send time <- ``metadata.request_start_ns`` (exact); TPOT is ours over our O, AIPerf's
``inter_token_latency`` kept as a cross-check; chunk gaps <- ``inter_chunk_latency`` with O
spread evenly; phase <- ``benchmark_phase``; class <- ``metadata.class`` when present.
Field by field: docs/metrics.md, 'Mapping to other tools'.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import Field, ValidationError

from capacity_pack.evidence.imports.common import (
    ExportFormatError,
    External,
    ImportedPoint,
    field_path,
    first_error,
    loads,
    status_of,
)
from capacity_pack.evidence.imports.point import ExportFrame, build_point

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


class _MetricValue(External):
    value: float | list[float] | None = None
    unit: str | None = None


class _AIPerfMetadata(External):
    x_request_id: str | None = None
    session_num: int | None = None
    turn_index: int = 0
    request_start_ns: int
    request_end_ns: int | None = None
    benchmark_phase: str = "profiling"
    was_cancelled: bool = False
    cancellation_time_ns: int | None = None
    class_: str | None = Field(default=None, alias="class")


class _AIPerfError(External):
    code: int | None = None
    type: str | None = None
    message: str | None = None


class _AIPerfRecord(External):
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
                loc, msg = first_error(err)
                raise self._fail(field_path((name, *loc)), msg) from None
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
        status, text = status_of(text), text or "error without a type or message"
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
    doc = loads(summary.read_text(encoding="utf-8"), str(summary), "document")
    version = doc.get("aiperf_version") if isinstance(doc, dict) else None
    return (str(version), f"{summary.name}: aiperf_version") if version else (None, None)


def _read_records(path: Path) -> tuple[list[dict[str, Any]], set[str], set[str]]:
    """One row per record, and the metric and metadata names seen across the records."""
    source = str(path)
    rows: list[dict[str, Any]] = []
    metric_names: set[str] = set()
    metadata_names: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for lineno, text in enumerate(fh, 1):
            if not text.strip():
                continue
            where = f"line {lineno}"
            obj = loads(text, source, where)
            try:
                record = _AIPerfRecord.model_validate(obj)
            except ValidationError as err:
                loc, msg = first_error(err)
                raise ExportFormatError(
                    f"{source}: {where}: field {field_path(loc)}: {msg}"
                ) from None
            if record.metadata.x_request_id:
                where += f" (x_request_id {record.metadata.x_request_id})"
            line = _AIPerfLine(record, source, where)
            metric_names.update(line.raw)
            metadata_names.update(obj["metadata"])
            rows.append(_aiperf_row(record, line, lineno))
    return rows, metric_names, metadata_names


def _cross_checks(frame: pd.DataFrame) -> dict[str, float | int | None]:
    """Our TPOT and AIPerf's definition of its ITL recomputed, against AIPerf's ITL."""
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
    return {
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


def _unmapped(metadata_names: set[str], metric_names: set[str]) -> list[str]:
    unmapped = sorted(f"metadata.{m}" for m in metadata_names - _AIPERF_METADATA_USED)
    unmapped += sorted(f"metrics.{m}" for m in metric_names - _AIPERF_USED)
    unmapped += [
        "scheduled arrival (AIPerf records no intended send time): due_offset_ns 0, "
        "client_delay_ms and *_from_scheduled_ms empty",
        "http_status of ok records (not exported)",
    ]
    return unmapped


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
    rows, metric_names, metadata_names = _read_records(path)
    frame = pd.DataFrame.from_records(rows)
    if frame.empty:
        raise ExportFormatError(f"{source}: the export holds no records")
    for col in ("input_tokens", "prompt_tokens", "cached_tokens"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
    if "osl" not in frame:
        frame["osl"] = np.nan
    parsed = ExportFrame(
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
        unmapped=_unmapped(metadata_names, metric_names),
        cross_checks=_cross_checks(frame),
        run={},
    )
    return build_point(
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
