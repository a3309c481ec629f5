"""Validation of tables at stage boundaries, with reports a person can act on.

Every table that crosses a stage boundary has one pandera ``DataFrameModel`` (in the module of
the stage that writes it). :func:`validate_table` validates lazily, so every failing row and
check is reported at once, and raises :class:`TableValidationError` whose message names the
source file, and for each failure the column, check, row index and offending value.
"""

from __future__ import annotations

import pandas as pd


class TableValidationError(ValueError):
    """A table failed its schema; ``failure_cases`` holds pandera's table of failures."""

    def __init__(self, message: str, failure_cases: pd.DataFrame):
        super().__init__(message)
        self.failure_cases = failure_cases


def validate_table(
    frame: pd.DataFrame, schema, source: str, *, max_lines: int = 50
) -> pd.DataFrame:
    """Validate ``frame`` with ``schema`` (lazy); return the coerced frame or raise."""
    import pandera.errors

    try:
        return schema.validate(frame, lazy=True)
    except pandera.errors.SchemaErrors as err:
        cases = err.failure_cases
        lines = [f"{source}: {len(_distinct(cases))} validation failure(s) against {schema.name}:"]
        for where, column, check, value in _distinct(cases)[:max_lines]:
            lines.append(f"  - {where}, column {column}: check {check} failed (value {value!r})")
        extra = len(_distinct(cases)) - max_lines
        if extra > 0:
            lines.append(f"  ... and {extra} more")
        raise TableValidationError("\n".join(lines), cases) from None


def _distinct(cases: pd.DataFrame) -> list[tuple[str, str, str, object]]:
    """One line per failure; a dataframe-level check fails once per row, not once per column."""
    out: list[tuple[str, str, str, object]] = []
    seen: set[tuple] = set()
    for row in cases.itertuples(index=False):
        frame_level = row.schema_context == "DataFrameSchema"
        where = f"row {row.index}" if pd.notna(row.index) else "table"
        column = "<dataframe>" if frame_level or pd.isna(row.column) else row.column
        key = (where, column, row.check) if frame_level else (where, column, row.check, id(row))
        if key in seen:
            continue
        seen.add(key)
        # For a row-level check the first column's value (the row's id) identifies the row.
        out.append((where, column, row.check, row.failure_case))
    return out
