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
        lines = [f"{source}: {len(cases)} validation failure(s) against {schema.name}:"]
        for row in cases.head(max_lines).itertuples(index=False):
            where = f"row {row.index}" if pd.notna(row.index) else "table"
            column = row.column if pd.notna(row.column) else "<dataframe>"
            lines.append(
                f"  - {where}, column {column}: check {row.check} failed "
                f"(value {row.failure_case!r})"
            )
        if len(cases) > max_lines:
            lines.append(f"  ... and {len(cases) - max_lines} more")
        raise TableValidationError("\n".join(lines), cases) from None
