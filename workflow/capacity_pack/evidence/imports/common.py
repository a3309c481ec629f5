"""What every importer shares: the error type, the imported point and its provenance, and the
strict JSON reading that names the file, record and field of a bad input.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capacity_pack.errors import StatedError

Tool = Literal["aiperf", "vllm-bench"]
IMPORTER_VERSION = 1


class ExportFormatError(StatedError, ValueError):
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


class External(BaseModel):
    """Base of the models of other tools' exports."""

    # Other tools' exports gain fields between versions (AIPerf: "do not assume the field set is
    # closed"), so unknown fields are ignored here and listed as unmapped, never refused.
    model_config = ConfigDict(extra="ignore")


def status_of(text: str) -> str:
    """The status of a failed request from its error text: timeout when it names one."""
    return "timeout" if "timeout" in text.lower() else "error"


def field_path(loc: tuple) -> str:
    """A pydantic error location as a field path: ``metrics.ttft[3].value``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<record>"


def jsonable(value: Any) -> Any:
    """``value`` with a non-finite float as its text."""
    # Python's json reads NaN/Infinity (vLLM writes them for inf rates); our JSON refuses them.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def first_error(err: ValidationError) -> tuple[tuple, str]:
    """Location and message of a validation error's first entry."""
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


def loads(text: str, source: str, where: str) -> Any:
    """Parse one JSON document, refusing duplicate keys; errors name ``source`` and ``where``."""
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
