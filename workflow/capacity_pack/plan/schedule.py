"""Seeded request schedules: which requests a measurement point sends, and when.

A point's schedule has one row per request (class, lengths, scheduled offset, prefix, prompt
seed, cancellation deadline), built per block (0 warm-up, 1 measured, 2.. extension): exact
class counts by largest remainder, then shuffled; lengths; arrivals in operational time,
t = Lambda^-1(u) with Lambda(t) = integral of rate(s) ds; warm points' prefix ids by Zipf.
Every stream is a ``numpy.random.SeedSequence`` of the pack's seed and the point identity, so
cold and warm schedules of one point pair. Method: docs/metrics.md, 'Schedules'.

Module map: :mod:`capacity_pack.plan.schedule_inputs` (points and the schedule's inputs),
:mod:`capacity_pack.plan.schedule_rates` (rate profiles), :mod:`capacity_pack.plan.schedule_blocks`
(seeded streams, block sizes, per-request columns), :mod:`capacity_pack.plan.schedule_trace`
(trace replay); this module builds the schedule (:func:`build_schedule`), its prewarm requests
and its summary, and every name of those modules that importers use is importable from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.plan import sessions
from capacity_pack.plan.manifest import Pack
from capacity_pack.plan.schedule_blocks import (
    ARRIVAL_STREAM,
    PROMPT_STREAM,
    arrival_pattern,
    block_requests,
    block_rng,
    experiment_of,
    extension_block_size,
    measure_size,
    operational_gaps,
    prefix_assignment,
    warmup_size,
)
from capacity_pack.plan.schedule_inputs import (
    NS_PER_S,
    SCHEDULE_CLIENT_FIELDS,
    Mode,
    Point,
    ScheduleClient,
    ScheduleInputs,
    SchedulePack,
    find_point,
    format_level,
    match_points,
    point_entropy,
    points,
    searchable_point,
)
from capacity_pack.plan.schedule_rates import (
    RateProfile,
    constant_profile,
    experiment_profile,
    warmup_rate,
)
from capacity_pack.plan.schedule_trace import (
    load_trace,
    trace_facts,
    trace_native_rate,
    trace_schedule,
    verbatim_time_scale,
)
from capacity_pack.vocab.phases import SCHEDULE_PHASES

COLUMNS = [
    "request_id",
    "seq",
    "block",
    "phase",
    "class",
    "input_tokens",
    "output_tokens",
    "scheduled_offset_ns",
    "prefix_id",
    "prefix_tokens",
    "prefix_blocks",
    "prompt_seed",
    "cancel_after_ns",
]


def as_inputs(source: Pack | ScheduleInputs, point: Point) -> ScheduleInputs:
    return source if isinstance(source, ScheduleInputs) else ScheduleInputs.for_point(source, point)


def build_schedule(
    source: Pack | ScheduleInputs, point: Point, *, extension_blocks: int = 0
) -> pd.DataFrame:
    """The point's schedule: warm-up block, measured block and ``extension_blocks`` more.

    Deterministic: the same inputs and point always give the same table, and the rows of a
    schedule built with k extension blocks are a prefix of the one built with k+1.
    """
    inputs = as_inputs(source, point)
    if extension_blocks < 0:
        raise ValueError("extension_blocks must be >= 0")
    entropy = point_entropy(inputs, point)
    if inputs.client.arrival_pattern == "trace" and point.mode == "open":
        frame = trace_schedule(inputs, point, entropy)
    else:
        frame = _synthetic_schedule(inputs, point, entropy, extension_blocks)
    columns = COLUMNS
    if sessions.has_sessions(inputs.workload):
        frame = sessions.expand_sessions(frame, inputs.workload, inputs.prompts, entropy)
        columns = COLUMNS + sessions.SESSION_COLUMNS
    frame.insert(0, "seq", np.arange(len(frame), dtype=np.int64))
    stem = f"{point.point_id}.{point.cache_state}.rep{point.repeat}"
    frame.insert(0, "request_id", [f"{stem}.{i:06d}" for i in range(len(frame))])
    return frame[columns]


def _synthetic_schedule(
    inputs: ScheduleInputs, point: Point, entropy: list[int], extension_blocks: int
) -> pd.DataFrame:
    pattern, cv = arrival_pattern(inputs, point)
    sizes = [
        (0, "warmup", warmup_size(inputs, point)),
        (1, "measure", measure_size(inputs, point)),
    ]
    sizes += [
        (1 + k, "extension", extension_block_size(inputs)) for k in range(1, extension_blocks + 1)
    ]
    max_offset_ns = round(
        (inputs.client.warmup_seconds + inputs.client.maximum_duration_seconds) * NS_PER_S
    )
    frames = []
    clock_s = 0.0  # real-time end of the previous block's arrivals
    for block, phase, n in sizes:
        if n == 0:
            continue
        cols = block_requests(inputs, entropy, block, n)
        gaps = operational_gaps(
            pattern,
            cv,
            block_rng(entropy, block, ARRIVAL_STREAM),
            n if point.mode != "exp" or phase != "measure" else n + 1,
        )
        if point.mode == "closed":
            offsets = np.zeros(n)
        elif point.mode == "open":
            assert point.rate_rps is not None
            offsets = clock_s + np.cumsum(gaps) / point.rate_rps
            clock_s = float(offsets[-1])
        else:
            profile = experiment_profile(experiment_of(inputs, point))
            if phase == "warmup":
                offsets = np.cumsum(gaps) / warmup_rate(profile)
            elif phase == "measure":
                u = np.cumsum(gaps)
                u = u[:-1] * (profile.total / u[-1])
                start_s = clock_s
                offsets = start_s + profile.inverse(u)
            else:
                last_rate = float(profile.r1[-1]) or float(profile.total / profile.duration_s)
                offsets = clock_s + np.cumsum(gaps) / last_rate
            clock_s = float(offsets[-1]) if phase != "measure" else start_s + profile.duration_s
        offset_ns = np.rint(offsets * NS_PER_S).astype(np.int64)
        prefix_id, prefix_tokens = prefix_assignment(
            inputs, point, entropy, block, cols["input_tokens"]
        )
        frame = pd.DataFrame(
            {
                "block": np.int64(block),
                "phase": phase,
                **cols,
                "scheduled_offset_ns": offset_ns,
                "prefix_id": prefix_id,
                "prefix_tokens": prefix_tokens,
                "prefix_blocks": "",
            }
        )
        if phase == "extension" and point.mode != "closed":
            frame = frame[frame["scheduled_offset_ns"] <= max_offset_ns]
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    # Rounding to ns can reorder nothing (gaps >= 0), but keep the invariant explicit.
    out["scheduled_offset_ns"] = np.maximum.accumulate(out["scheduled_offset_ns"].to_numpy())
    return out


def summarize(frame: pd.DataFrame, inputs: ScheduleInputs, point: Point) -> dict[str, Any]:
    """Counts per class and phase, offered and realised rate, duration, gap statistics."""
    measured = frame[frame["phase"] != "warmup"]
    offsets_s = measured["scheduled_offset_ns"].to_numpy() / NS_PER_S
    gaps = np.diff(offsets_s)
    pattern, cv = arrival_pattern(inputs, point)
    summary: dict[str, Any] = {
        "point": point.point_id,
        "key": point.key,
        "mode": point.mode,
        "cache_state": point.cache_state,
        "repeat": point.repeat,
        "pack": inputs.pack.name,
        "pack_label": inputs.pack.label,
        "arrival_pattern": "closed-loop" if point.mode == "closed" else pattern,
        "arrival_cv": cv if pattern == "gamma" else None,
        "seed_entropy": point_entropy(inputs, point),
        "requests": len(frame),
        "phase_counts": {ph: int((frame["phase"] == ph).sum()) for ph in SCHEDULE_PHASES},
        "class_counts": {
            ph: {
                c: int(((frame["phase"] == ph) & (frame["class"] == c)).sum())
                for c in inputs.class_names
            }
            for ph in SCHEDULE_PHASES
        },
        "duration_s": float(frame["scheduled_offset_ns"].max() / NS_PER_S) if len(frame) else 0.0,
        "warmup_seconds": inputs.client.warmup_seconds,
        "inputs_sha256": inputs.sha256(),
    }
    if point.mode == "open":
        summary["offered_rps"] = point.rate_rps
    if point.mode == "closed":
        summary["concurrency"] = point.concurrency
    if point.mode == "exp":
        e = experiment_of(inputs, point)
        prof = experiment_profile(e)
        summary["experiment"] = {
            "name": e.name,
            "test_type": e.test_type,
            "profile_duration_s": prof.duration_s,
            "expected_requests": prof.total,
        }
    if inputs.client.arrival_pattern == "trace" and point.mode == "open":
        trace = load_trace(inputs)
        summary["trace_native_rps"] = trace_native_rate(trace)
        summary["trace"] = trace_facts(inputs, trace, point)
    if point.mode != "closed" and gaps.size > 1:
        span = offsets_s[-1] - offsets_s[0]
        summary["realised_rps"] = float(gaps.size / span) if span > 0 else None
        summary["gap_mean_s"] = float(gaps.mean())
        summary["gap_cv"] = float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else None
    if "session" in frame.columns:
        summary.update(sessions.summary(frame, inputs.workload))
    if inputs.prompts.prefix is not None and point.cache_state == "warm":
        summary["distinct_prefixes_used"] = int(
            frame.loc[frame["prefix_id"] >= 0, "prefix_id"].nunique()
        )
    return summary


def prewarm_rows(source: Pack | ScheduleInputs, point: Point) -> pd.DataFrame:
    """Warm-cache prewarm requests: one per shared prefix of the versioned set, sent (and
    recorded, phase ``prewarm``) before the point's clock starts; empty for cold points.

    Each is the shared prefix plus one unique token, asking for one output token, so it leaves
    exactly the prefix's KV blocks in the cache and little else.
    """
    inputs = as_inputs(source, point)
    spec = inputs.prompts.prefix
    if point.cache_state != "warm" or spec is None:
        return pd.DataFrame(columns=COLUMNS)
    n = spec.shared_prefixes
    stem = f"{point.point_id}.{point.cache_state}.rep{point.repeat}.prewarm"
    seeds = block_rng(point_entropy(inputs, point), 0, PROMPT_STREAM + 10).integers(
        0, 2**63 - 1, size=n, dtype=np.int64
    )
    return pd.DataFrame(
        {
            "request_id": [f"{stem}.{k:04d}" for k in range(n)],
            "seq": np.arange(-n, 0, dtype=np.int64),
            "block": np.int64(0),
            "phase": "prewarm",
            "class": inputs.class_names[0],
            "input_tokens": np.int64(spec.prefix_tokens + 1),
            "output_tokens": np.int64(1),
            "scheduled_offset_ns": np.int64(0),
            "prefix_id": np.arange(n, dtype=np.int32),
            "prefix_tokens": np.int32(spec.prefix_tokens),
            "prefix_blocks": "",
            "prompt_seed": seeds,
            "cancel_after_ns": np.int64(-1),
        }
    )[COLUMNS]


def read_schedule(path: str | Path) -> pd.DataFrame:
    return pd.read_parquet(path)


# Moved to schedule_inputs, schedule_rates, schedule_blocks and schedule_trace; importers name
# them from here too.
__all__ = [
    "COLUMNS",
    "NS_PER_S",
    "SCHEDULE_CLIENT_FIELDS",
    "Mode",
    "Point",
    "RateProfile",
    "ScheduleClient",
    "ScheduleInputs",
    "SchedulePack",
    "as_inputs",
    "build_schedule",
    "constant_profile",
    "experiment_profile",
    "extension_block_size",
    "find_point",
    "format_level",
    "load_trace",
    "match_points",
    "point_entropy",
    "points",
    "prewarm_rows",
    "read_schedule",
    "searchable_point",
    "summarize",
    "trace_facts",
    "trace_native_rate",
    "verbatim_time_scale",
    "warmup_rate",
]
