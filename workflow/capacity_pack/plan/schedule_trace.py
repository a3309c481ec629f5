"""Trace replay: a point's schedule from a recorded trace (:mod:`capacity_pack.plan.traces`).

The trace's offsets are stretched so that its mean rate equals the point rate (``replay:
stretch``), or taken as recorded times the point's declared time scale (``replay: verbatim``),
with the trace's classes and lengths and, for a block-hash trace, its hash ids in
``prefix_blocks``; a trace schedule has no extension block.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.plan.manifest import ManifestError
from capacity_pack.plan.schedule_blocks import block_requests, prefix_assignment
from capacity_pack.plan.schedule_inputs import NS_PER_S, Point, ScheduleInputs, format_level
from capacity_pack.plan.traces import (
    TraceError,
    block_ids_text,
    check_classes,
    native_rate,
    verbatim_rates,
)


def load_trace(inputs: ScheduleInputs) -> pd.DataFrame:
    """The trace's requests (:func:`capacity_pack.plan.traces.read_trace`), sorted by time,
    offsets from the first arrival; a row whose class is not the pack's is an error naming it."""
    spec = inputs.client.trace
    assert spec is not None
    try:
        trace = spec.arrivals(default_class=inputs.class_names[0])
        check_classes(trace, inputs.class_names, spec.path, spec.format)
    except TraceError as err:
        raise ManifestError(str(err)) from None
    return trace


def trace_native_rate(trace: pd.DataFrame) -> float:
    return native_rate(trace)


def verbatim_time_scale(inputs: ScheduleInputs, trace: pd.DataFrame, point: Point) -> float:
    """The declared time scale whose verbatim rate is ``point``'s rate."""
    spec = inputs.client.trace
    assert spec is not None and point.rate_rps is not None
    rates = verbatim_rates(trace, spec.time_scales)
    for scale, rate in zip(spec.time_scales, rates, strict=True):
        if format_level(rate) == format_level(point.rate_rps):
            return scale
    raise ManifestError(
        f"{point.point_id}: not a rate of the verbatim trace {spec.path} (its time_scales "
        f"{spec.time_scales} give {rates} RPS)"
    )


def trace_facts(inputs: ScheduleInputs, trace: pd.DataFrame, point: Point) -> dict[str, Any]:
    """What a trace point replays: the file, its layout and sha256, how (verbatim at which time
    scale, or stretched by which factor) and its requests per class."""
    spec = inputs.client.trace
    assert spec is not None and point.rate_rps is not None
    verbatim = spec.verbatim
    return {
        "path": spec.path,
        "format": spec.format,
        "sha256": spec.sha256,
        "replay": spec.replay,
        "time_scale": verbatim_time_scale(inputs, trace, point) if verbatim else None,
        "stretch": None if verbatim else trace_native_rate(trace) / point.rate_rps,
        "rows": len(trace),
        "class_rows": {c: int((trace["class"] == c).sum()) for c in inputs.class_names},
        "block_hashes": "hash_ids" in trace.columns,
    }


def trace_schedule(inputs: ScheduleInputs, point: Point, entropy: list[int]) -> pd.DataFrame:
    # Verbatim: the recorded offsets times the point's declared time scale; else stretched so
    # the trace's mean rate is the point's. Never extended (plan.traces).
    spec = inputs.client.trace
    assert spec is not None and point.rate_rps is not None
    trace = load_trace(inputs)
    if spec.verbatim:
        factor = verbatim_time_scale(inputs, trace, point)
    else:
        factor = trace_native_rate(trace) / point.rate_rps
    offsets = trace["offset_s"].to_numpy() * factor
    n = len(trace)
    cols = block_requests(inputs, entropy, 1, n, classes=trace["class"].to_numpy(dtype=object))
    for name in ("input_tokens", "output_tokens"):
        if name in trace.columns:
            cols[name] = trace[name].to_numpy(dtype=np.int64)
    phase = np.where(offsets < inputs.client.warmup_seconds, "warmup", "measure")
    block = np.where(phase == "warmup", 0, 1)
    prefix_id, prefix_tokens = prefix_assignment(inputs, point, entropy, 1, cols["input_tokens"])
    blocks = np.full(n, "", dtype=object)
    if "hash_ids" in trace.columns:
        # The trace's own block hashes make each prompt (plan.prompts.block_prompt), shared
        # prefixes and all: no prefix set on top.
        blocks = np.array([block_ids_text(h) for h in trace["hash_ids"]], dtype=object)
        prefix_id[:], prefix_tokens[:] = -1, 0
    return pd.DataFrame(
        {
            "block": block.astype(np.int64),
            "phase": phase,
            **cols,
            "scheduled_offset_ns": np.rint(offsets * NS_PER_S).astype(np.int64),
            "prefix_id": prefix_id,
            "prefix_tokens": prefix_tokens,
            "prefix_blocks": blocks,
        }
    )
