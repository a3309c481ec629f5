"""The load generator's records: what the client observed about each request, one JSON line each.

Per request, on one monotonic clock (``time.perf_counter_ns``) plus a realtime stamp at send
and end: scheduled offset, due time, send time, every chunk's arrival (the kernel's receive
time, :mod:`capacity_pack.measure.connection`) and tokens, HTTP and terminal status, error
text, usage, and a session request's ``session`` and ``turn``. The latencies derived from it
(:mod:`capacity_pack.evidence.normalize`): TTFT = f - s, E2E = e - s,
TPOT = (E2E - TTFT) / (O - 1) for O > 1, ITL_j = t_j - t_(j-1), lateness = s - due.
Method: docs/metrics.md, 'Per-request timestamps' and 'Per-request metrics'.

Records are appended and flushed as each request ends (:class:`RecordWriter`), so a killed run
keeps every finished request; a torn last line is ignored on reading (:func:`read_records` as
dicts, :func:`records_frame` as a frame for normalization).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow

STATUSES = ("ok", "error", "timeout", "rejected", "cancelled")


class RecordsError(ValueError):
    """A file that is not a records file of the load generator."""


@dataclass
class Attempt:
    """What the client observed about one request (raw nanoseconds, monotonic unless noted)."""

    request_id: str
    seq: int
    klass: str
    phase: str
    block: int
    input_tokens: int
    output_tokens_expected: int
    scheduled_offset_ns: int
    due_ns: int = 0
    sent_ns: int = 0
    sent_realtime_ns: int = 0
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    end_ns: int = 0
    end_realtime_ns: int = 0
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    http_status: int | None = None
    status: str = "error"
    error: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    # Session classes: the session and turn index (capacity_pack.measure.sessions), and the
    # streamed text's chunks when a later turn must carry this answer (never written out).
    session: int | None = None
    turn: int | None = None
    text: list[str] | None = None

    def to_json(self, t0_ns: int, t0_realtime_ns: int) -> str:
        out_tokens = sum(self.chunk_tokens)
        rec = {
            "request_id": self.request_id,
            "seq": self.seq,
            "class": self.klass,
            "phase": self.phase,
            "block": self.block,
            "status": self.status,
            "http_status": self.http_status,
            "error": self.error,
            "finish_reason": self.finish_reason,
            "input_tokens": self.input_tokens,
            "output_tokens_expected": self.output_tokens_expected,
            "output_tokens": out_tokens,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "prompt_tokens_mismatch": (
                self.prompt_tokens is not None and self.prompt_tokens != self.input_tokens
            ),
            "scheduled_offset_ns": self.scheduled_offset_ns,
            "t0_ns": t0_ns,
            "t0_realtime_ns": t0_realtime_ns,
            "due_ns": self.due_ns,
            "sent_ns": self.sent_ns,
            "sent_realtime_ns": self.sent_realtime_ns,
            "first_token_ns": self.first_token_ns,
            "last_token_ns": self.last_token_ns,
            "end_ns": self.end_ns,
            "end_realtime_ns": self.end_realtime_ns,
            "chunk_ns": self.chunk_ns,
            "chunk_tokens": self.chunk_tokens,
        }
        if self.session is not None:
            rec["session"], rec["turn"] = self.session, self.turn
        return json.dumps(rec, separators=(",", ":"))


class RecordWriter:
    """Append-only JSONL; every record is flushed when its request ends."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")
        self.count = 0
        self.secrets: list[str] = []
        # Appended inside every record's JSON object (a shard's index), e.g. ',"shard":1'.
        self.suffix = ""

    def write(self, line: str) -> None:
        for secret in self.secrets:
            if secret in line:
                line = line.replace(secret, "[redacted]")
        if self.suffix:
            line = line[:-1] + self.suffix + "}"
        self._fh.write(line + "\n")
        self._fh.flush()
        self.count += 1

    def close(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a (possibly killed) run; a torn last line is ignored."""
    out = []
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break  # the writer died mid-line: that request never finished recording
            out.append(json.loads(line))
    return out


# The load generator's record (Attempt.to_json; ``shard`` on a sharded point's records).
RECORD_SCHEMA = pyarrow.schema(
    [
        ("request_id", pyarrow.string()),
        ("seq", pyarrow.int64()),
        ("class", pyarrow.string()),
        ("phase", pyarrow.string()),
        ("block", pyarrow.int64()),
        ("status", pyarrow.string()),
        ("http_status", pyarrow.int64()),
        ("error", pyarrow.string()),
        ("finish_reason", pyarrow.string()),
        ("input_tokens", pyarrow.int64()),
        ("output_tokens_expected", pyarrow.int64()),
        ("output_tokens", pyarrow.int64()),
        ("prompt_tokens", pyarrow.int64()),
        ("completion_tokens", pyarrow.int64()),
        ("cached_tokens", pyarrow.int64()),
        ("prompt_tokens_mismatch", pyarrow.bool_()),
        ("scheduled_offset_ns", pyarrow.int64()),
        ("t0_ns", pyarrow.int64()),
        ("t0_realtime_ns", pyarrow.int64()),
        ("due_ns", pyarrow.int64()),
        ("sent_ns", pyarrow.int64()),
        ("sent_realtime_ns", pyarrow.int64()),
        ("first_token_ns", pyarrow.int64()),
        ("last_token_ns", pyarrow.int64()),
        ("end_ns", pyarrow.int64()),
        ("end_realtime_ns", pyarrow.int64()),
        ("chunk_ns", pyarrow.list_(pyarrow.int64())),
        ("chunk_tokens", pyarrow.list_(pyarrow.int64())),
        ("shard", pyarrow.int64()),
        ("session", pyarrow.int64()),
        ("turn", pyarrow.int64()),
    ]
)
_INT64 = {pyarrow.int64(): pd.Int64Dtype()}.get
# One record must fit in a block: 32 MB holds a stream of ~2 million chunks.
RECORD_BLOCK_BYTES = 32 << 20


def records_frame(
    path: str | Path, columns: Sequence[str] | None = None, exact_ints: bool = False
) -> pd.DataFrame:
    """Every complete record of a records.jsonl as a frame (a torn last line is ignored).

    ``columns`` keeps only those fields; ``exact_ints`` reads integer fields as nullable
    ``Int64`` (else a column with a missing value becomes float64, which rounds epoch
    nanoseconds: they exceed float64's 53 bits).

    Parsed by pyarrow's JSON reader against :data:`RECORD_SCHEMA`, not into Python dicts: the
    chunk lists become numpy arrays (8 bytes a stamp instead of a Python int and a pointer),
    which keeps a long point's normalization within memory (docs/scaling.md).
    """
    import pyarrow.json as pj  # here: a process that only writes records never loads it

    data = Path(path).read_bytes()
    end = data.rfind(b"\n") + 1  # the writer died mid-line: that request never finished recording
    if end == 0:
        if columns is None:
            return pd.DataFrame(columns=["request_id"])
        empty = RECORD_SCHEMA.empty_table().select(list(columns))
        return empty.to_pandas(types_mapper=_INT64 if exact_ints else None)
    try:
        table = pj.read_json(
            pyarrow.BufferReader(memoryview(data)[:end]),
            read_options=pj.ReadOptions(block_size=RECORD_BLOCK_BYTES),
            parse_options=pj.ParseOptions(
                explicit_schema=RECORD_SCHEMA, unexpected_field_behavior="ignore"
            ),
        )
    except (pyarrow.ArrowInvalid, pyarrow.ArrowTypeError) as err:
        raise RecordsError(f"{path}: not a records file of the load generator: {err}") from None
    del data
    if columns is not None:
        table = table.select(list(columns))
    mapper = _INT64 if exact_ints else None
    return table.to_pandas(split_blocks=True, self_destruct=True, types_mapper=mapper)
