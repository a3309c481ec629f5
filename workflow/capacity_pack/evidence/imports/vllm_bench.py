"""``vllm bench serve --save-result --save-detailed`` result JSON -> this project's point tables.

The result holds run fields (``date``, ``backend``, ``model_id``, ``num_prompts``,
``request_rate``, ``max_concurrency``, ``duration``...) and one list per field with one entry
per request (``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``errors``; ``latencies``,
``start_times``, ``queue_times`` in recent versions); ``--metadata KEY=VALUE`` pairs are
top-level keys (``vllm_version`` or ``version``: the tool version; ``class``: the class).
E2E = ``ttfts[i] + sum(itls[i])`` (checked against ``latencies``); per-chunk tokens are not
exported, so O is spread evenly over the chunks; the wall clock is ``date`` (UTC) -
``duration``; without ``start_times`` the sends are estimated from ``request_rate`` and a
``max_concurrency`` slot simulation. Field by field: docs/metrics.md, 'Mapping to other tools'.
"""

from __future__ import annotations

import heapq
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from capacity_pack.evidence.imports.common import (
    ExportFormatError,
    External,
    ImportedPoint,
    field_path,
    first_error,
    jsonable,
    loads,
    status_of,
)
from capacity_pack.evidence.imports.point import ExportFrame, build_point

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


class _VllmResult(External):
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


def _read_result(path: Path) -> tuple[dict[str, Any], _VllmResult]:
    """The document and its typed fields, every per-request list as long as ``ttfts``."""
    source = str(path)
    doc = loads(path.read_text(encoding="utf-8"), source, "document")
    if not isinstance(doc, dict):
        raise ExportFormatError(f"{source}: expected a JSON object (a vllm bench result)")
    try:
        result = _VllmResult.model_validate(doc)
    except ValidationError as err:
        loc, msg = first_error(err)
        where = f"request {loc[1]}: " if len(loc) > 1 and isinstance(loc[1], int) else ""
        hint = (
            " (per-request lists are written by --save-result --save-detailed)"
            if msg == "Field required" and loc[0] in _VLLM_LISTS
            else ""
        )
        raise ExportFormatError(f"{source}: {where}field {field_path(loc)}: {msg}{hint}") from None
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
    return doc, result


def _outcomes(result: _VllmResult, source: str):
    """(TTFT s, gap lists s, ok, E2E s, status, error) per request."""
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
    status = np.where(ok, "ok", errors.map(status_of).to_numpy(dtype=object))
    error = np.where(
        ok,
        None,
        np.where(
            errors == "",
            "failed without an error text (vllm bench keeps only the HTTP reason)",
            errors,
        ),
    )
    return ttft_s, gaps_s, ok, e2e_s, status, error


def _rate(result: _VllmResult, source: str) -> float:
    try:
        return math.inf if result.request_rate is None else float(result.request_rate)
    except ValueError:
        raise ExportFormatError(
            f"{source}: field request_rate: {result.request_rate!r} is neither a number nor inf"
        ) from None


def _send_times(
    result: _VllmResult,
    e2e_s: np.ndarray,
    rate: float,
    *,
    timestamps: dict[str, str],
    estimated: list[str],
    source: str,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Send and arrival ns from the earliest of either (arrival -1 when not exported), and
    whether arrivals were exported; how each was obtained goes to ``timestamps``/``estimated``."""
    n = len(e2e_s)
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
    return sent_ns, due_ns, due_s is not None


def _cross_checks(
    result: _VllmResult, ok: np.ndarray, e2e_s: np.ndarray
) -> dict[str, float | int | None]:
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
    return checks


def _unmapped_and_run(doc: dict[str, Any], has_due: bool) -> tuple[list[str], dict[str, Any]]:
    """Fields with no counterpart of ours, and the run-level fields kept in provenance.run."""
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
    if not has_due:
        unmapped.append("scheduled arrival (no queue_times): client_delay_ms empty")
    run = {k: jsonable(doc[k]) for k in _VLLM_RUN_FIELDS if k in doc}
    run.update(
        {
            k: jsonable(doc[k])
            for k in (*stats, *extra)
            if isinstance(doc[k], str | int | float | bool)
        }
    )
    return unmapped, run


def _rows(result, doc, ok, status, error, sent_ns, due_ns, ttft_s, e2e_s, gaps_s, source):
    """One row a request, in the common import frame's columns (times in ns and ms)."""
    n = len(result.ttfts)
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
    return frame


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
    doc, result = _read_result(path)
    ttft_s, gaps_s, ok, e2e_s, status, error = _outcomes(result, source)
    estimated: list[str] = ["chunk token counts (O spread evenly over the chunks)"]
    timestamps: dict[str, str] = {}
    anchor, anchor_how = _anchor_ns(result)
    if anchor_how.startswith("estimated"):
        estimated.append("wall-clock anchor of the run (date - duration)")
    timestamps["realtime"] = anchor_how
    rate = _rate(result, source)
    sent_ns, due_ns, has_due = _send_times(
        result, e2e_s, rate, timestamps=timestamps, estimated=estimated, source=source
    )
    checks = _cross_checks(result, ok, e2e_s)
    frame = _rows(result, doc, ok, status, error, sent_ns, due_ns, ttft_s, e2e_s, gaps_s, source)
    unmapped, run = _unmapped_and_run(doc, has_due)
    version_key = _vllm_version(doc)
    parsed = ExportFrame(
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
    imported = build_point(
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
