"""The tool-neutral half of an import: one row per request (an :class:`ExportFrame`, what each
tool's parser produces) -> the pack's classes, the point's requests and chunks tables, its
provenance and summary; and writing them out.

Per request, with s = send, f = first content chunk, e = last content chunk and O the output
tokens: TTFT = f - s and E2E = e - s as the tool measured them, TPOT = (E2E - TTFT) / (O - 1)
for O > 1 (0 otherwise), ITL = the per-chunk gaps (the chunks table, chunk 0 at TTFT). Failed
rows carry zero latencies. The scheduled offset is the tool's intended arrival where it exports
one (client delay = send - arrival), else the send itself. Neither tool exports tokens per
chunk, so O is spread evenly over the chunks (floor steps, at least one token each).

Class assignment, per request: the export's class field when present; else the one pack class
whose input length spec fits (a fixed length exactly, a distribution within [min, max]),
narrowed by the output length when several fit; else ``class_name``. An ok request whose output
length differs from its class's fixed length becomes an error row saying so, as the load
generator records it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from capacity_pack.evidence.imports.common import (
    ExportFormatError,
    ImportedPoint,
    Provenance,
    Tool,
)
from capacity_pack.evidence.normalize import (
    NS_PER_MS,
    ChunksTable,
    ServerMetricsTable,
    requests_schema,
    seed_csv_frame,
)
from capacity_pack.io import atomic_path, file_sha256, write_json_atomic
from capacity_pack.plan.lengths import LognormalLength
from capacity_pack.plan.workload import WorkloadClass
from capacity_pack.tables import validate_table
from capacity_pack.vocab.phases import MEASURED_PHASES


class ExportFrame(BaseModel):
    """What a tool parser hands to :func:`build_point`: one row per request plus run facts."""

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


# ---------------------------------------------------------------------------------------------
# Classes
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Rows -> columns
# ---------------------------------------------------------------------------------------------


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


def _checked_rows(rows: pd.DataFrame, source: str) -> pd.DataFrame:
    """The rows in send order, refusing an empty export and repeated request ids."""
    if rows.empty:
        raise ExportFormatError(f"{source}: the export holds no requests")
    dup = rows["request_id"][rows["request_id"].duplicated()]
    if len(dup):
        raise ExportFormatError(
            f"{source}: request id {dup.iloc[0]!r} appears more than once "
            f"({', '.join(rows.loc[rows['request_id'] == dup.iloc[0], 'where'])})"
        )
    return rows.sort_values("sent_ns", kind="stable").reset_index(drop=True)


def _input_tokens(
    r: pd.DataFrame,
    klass: np.ndarray,
    classes: list[WorkloadClass],
    frame: ExportFrame,
    source: str,
    estimated: list[str],
) -> pd.Series:
    """Input tokens, a missing count filled by the class's fixed input length (noted)."""
    fixed_in = pd.Series(klass).map(
        {c.name: c.input_tokens for c in classes if isinstance(c.input_tokens, int)}
    )
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
    return inp


def _length_contract(
    r: pd.DataFrame, klass: np.ndarray, classes: list[WorkloadClass]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(status, error, mismatch, expected output tokens) once the class lengths are applied."""
    fixed_out = pd.Series(klass).map(
        {c.name: c.output_tokens for c in classes if isinstance(c.output_tokens, int)}
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
    expected = np.where(np.isnan(want), np.maximum(out, 1), np.nan_to_num(want)).astype(np.int64)
    return status, error, mismatch, expected


def _latencies(r: pd.DataFrame, ok: np.ndarray, frame: ExportFrame, source: str):
    """(TTFT, TPOT, E2E) in ms, zero on failed rows, and the chunks table with chunks per row."""
    out = r["output_tokens"].to_numpy(dtype=np.int64)
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
    return (ttft, tpot, e2e), chunks, per_request


def _requests_table(
    r: pd.DataFrame,
    frame: ExportFrame,
    *,
    klass: np.ndarray,
    status: np.ndarray,
    error: np.ndarray,
    inp: pd.Series,
    expected: np.ndarray,
    latencies: tuple[np.ndarray, np.ndarray, np.ndarray],
    per_request: np.ndarray,
    point: str,
    cache_state: str,
    repeat: int,
) -> pd.DataFrame:
    """The point's requests table (unvalidated), with offsets from the earliest send or arrival."""
    ok = status == "ok"
    ttft, tpot, e2e = latencies
    sent = r["sent_ns"].to_numpy(dtype=np.int64)
    due = r["due_ns"].to_numpy(dtype=np.int64)
    has_due = due >= 0
    due_i = np.where(has_due, due, sent)
    t0 = int(min(sent.min(), due_i.min()))
    end_raw = r["end_ns"].to_numpy(dtype=np.int64)
    e2e_ns = np.rint(np.nan_to_num(r["e2e_ms"].to_numpy(dtype=float)) * NS_PER_MS)
    end = np.maximum(np.where(end_raw >= 0, end_raw, sent + e2e_ns.astype(np.int64)), sent)
    delay_ms = np.where(has_due, (sent - due_i) / NS_PER_MS, np.nan)
    phase = r["phase"].to_numpy(dtype=object)
    seq = pd.Series(np.arange(len(r))).groupby(pd.Series(phase)).cumcount().to_numpy(dtype=np.int64)
    return pd.DataFrame(
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
            "output_tokens": r["output_tokens"].to_numpy(dtype=np.int64),
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


def _validated(
    requests: pd.DataFrame, chunks: pd.DataFrame, classes: list[WorkloadClass], source: str
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The requests and chunks tables checked by the point schemas, and an empty metrics table."""
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
    return requests, chunks, metrics


# ---------------------------------------------------------------------------------------------
# Provenance and summary
# ---------------------------------------------------------------------------------------------


def _cross_checks(
    frame: ExportFrame, requests: pd.DataFrame, chunks: pd.DataFrame
) -> dict[str, float | int | None]:
    checks = dict(frame.cross_checks)
    if len(chunks):
        last = chunks.groupby("request_id")["arrival_offset_ns"].max() / NS_PER_MS
        e2e_by_id = requests.set_index("request_id")["e2e_ms"].reindex(last.index)
        checks["last_chunk_vs_e2e_max_abs_ms"] = float((last - e2e_by_id).abs().max())
    return checks


def _summary(
    requests: pd.DataFrame,
    tool: Tool,
    status_counts: dict[str, int],
    *,
    point: str,
    cache_state: str,
    repeat: int,
) -> dict[str, Any]:
    """The minimal sweep summary :func:`~capacity_pack.evidence.analysis.analyze_point` reads."""
    measured = requests[requests["phase"].isin(MEASURED_PHASES)]
    window_s = (
        (int(measured["end_ns"].max()) - int(measured["sent_ns"].min())) / 1e9
        if len(measured)
        else None
    )
    okm = measured[measured["status"] == "ok"].dropna(subset=["prompt_tokens", "cached_tokens"])
    prompt, cached = okm["prompt_tokens"], okm["cached_tokens"]
    return {
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


def build_point(
    tool: Tool,
    frame: ExportFrame,
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
    """One tool's parsed rows -> a validated :class:`ImportedPoint` (see the module docstring)."""
    source = str(path)
    r = _checked_rows(frame.rows, source)
    classes = _workload(workload)
    klass, how = _assign_classes(r, classes, class_name, source, frame.class_field)
    estimated = list(frame.estimated)
    inp = _input_tokens(r, klass, classes, frame, source, estimated)
    status, error, mismatch, expected = _length_contract(r, klass, classes)
    ok = status == "ok"
    latencies, chunks, per_request = _latencies(r, ok, frame, source)
    requests = _requests_table(
        r,
        frame,
        klass=klass,
        status=status,
        error=error,
        inp=inp,
        expected=expected,
        latencies=latencies,
        per_request=per_request,
        point=point,
        cache_state=cache_state,
        repeat=repeat,
    )
    requests, chunks, metrics = _validated(requests, chunks, classes, source)
    status_counts = {k: int(v) for k, v in requests["status"].value_counts().items()}
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
        cross_checks=_cross_checks(frame, requests, chunks),
        run=frame.run,
    )
    summary = _summary(
        requests, tool, status_counts, point=point, cache_state=cache_state, repeat=repeat
    )
    return ImportedPoint(
        requests=requests, chunks=chunks, metrics=metrics, provenance=provenance, summary=summary
    )


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


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
