"""The schedule table's schema (pandera) and the schedule stage's writer.

Kept apart from :mod:`capacity_pack.plan.schedule`, which builds schedules: the sweep and the
search import that module (points, extension blocks) and never validate or write a schedule,
so they do not pay pandera's import (about 0.2 s) in every measurement job, while the target
is reserved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from capacity_pack.io import atomic_path, file_sha256, write_json_atomic
from capacity_pack.plan.manifest import Pack
from capacity_pack.plan.schedule import Point, ScheduleInputs, as_inputs, summarize
from capacity_pack.tables import validate_table
from capacity_pack.vocab.phases import SCHEDULE_PHASES


class ScheduleTable(pa.DataFrameModel):
    """One row per scheduled request of one point."""

    request_id: Series[str] = pa.Field(unique=True, str_length={"min_value": 1})
    seq: Series[np.int64] = pa.Field(ge=0, unique=True)
    block: Series[np.int64] = pa.Field(ge=0)
    phase: Series[str] = pa.Field(isin=list(SCHEDULE_PHASES))
    class_: Series[str] = pa.Field(alias="class")
    input_tokens: Series[np.int64] = pa.Field(gt=0)
    output_tokens: Series[np.int64] = pa.Field(gt=0)
    scheduled_offset_ns: Series[np.int64] = pa.Field(ge=0)
    prefix_id: Series[np.int32] = pa.Field(ge=-1)
    prefix_tokens: Series[np.int32] = pa.Field(ge=0)
    # A block-hash trace's hash ids, space-separated ("" otherwise): plan.traces.
    prefix_blocks: Series[str] = pa.Field(str_matches=r"^(\d+( \d+)*)?$")
    prompt_seed: Series[np.int64] = pa.Field(ge=0)
    cancel_after_ns: Series[np.int64] = pa.Field(ge=-1)
    # Session classes only (capacity_pack.plan.sessions); absent from other packs' schedules.
    session: Series[np.int64] | None = pa.Field(ge=-1)
    turn: Series[np.int32] | None = pa.Field(ge=-1)
    think_ns: Series[np.int64] | None = pa.Field(ge=0)
    user_tokens: Series[np.int64] | None = pa.Field(ge=0)

    class Config:
        strict = True
        coerce = True

    @pa.dataframe_check(error="scheduled_offset_ns must be non-decreasing in schedule order")
    def offsets_non_decreasing(cls, df: pd.DataFrame) -> pd.Series:
        return df["scheduled_offset_ns"].diff().fillna(0) >= 0

    @pa.dataframe_check(error="a shared prefix must be shorter than its prompt")
    def prefix_shorter_than_prompt(cls, df: pd.DataFrame) -> pd.Series:
        return df["prefix_tokens"] < df["input_tokens"]


def validate_schedule(frame: pd.DataFrame, class_names: list[str], source: str) -> pd.DataFrame:
    """Validate lazily against :class:`ScheduleTable` plus the pack's class names."""
    schema = ScheduleTable.to_schema().update_column("class", checks=[pa.Check.isin(class_names)])
    return validate_table(frame, schema, source)


def write_schedule(
    frame: pd.DataFrame,
    source: Pack | ScheduleInputs,
    point: Point,
    parquet_path: str | Path,
    summary_path: str | Path,
) -> dict[str, Any]:
    """Validate, then write the parquet (deterministic bytes) and the JSON summary atomically."""
    import pyarrow
    import pyarrow.parquet as pq

    inputs = as_inputs(source, point)
    frame = validate_schedule(frame, inputs.class_names, f"schedule {point.key}")
    table = pyarrow.Table.from_pandas(frame, preserve_index=False)
    with atomic_path(parquet_path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    summary = summarize(frame, inputs, point)
    summary["schedule_sha256"] = file_sha256(parquet_path)
    write_json_atomic(summary_path, summary)
    return summary
