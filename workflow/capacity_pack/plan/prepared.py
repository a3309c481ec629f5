"""Prepared prompts: every scheduled request's exact prompt text, written once per schedule and
tokenizer before the target is reserved, read by the measurement.

:class:`PromptInputs` is exactly what a prompt's text depends on beyond its schedule row: the
corpus and prefix-set revisions, the cold head's length, a block-hash trace's block length and
the tokenizer (the project tokenizer, or a ``tokenizer.json`` named by its sha256, so an edited
file at the same path re-prepares). The prompts file (parquet: ``request_id``, ``prompt``) holds
in its metadata these inputs and the digest of the schedule columns a prompt reads
(:func:`schedule_digest`: sha256 over ``request_id``, a session's ``turn`` and
``user_tokens``, ``input_tokens``, ``prompt_seed``, ``prefix_id``, ``prefix_tokens``,
``prefix_blocks``). A session's later turn holds its new user message (the conversation before
it is known only when the previous answer has come); a measurement whose schedule or inputs
differ refuses the file (:func:`read_prepared`).

A target counted only through its server's ``POST /tokenize`` is not up before its measurement:
its file holds no prompts (``tokenizer: endpoint``) and the measurement fits them itself.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict

from capacity_pack.errors import StatedError
from capacity_pack.io import canonical_json
from capacity_pack.plan.client import TraceSpec
from capacity_pack.plan.manifest import Pack
from capacity_pack.plan.prompts import FileTokenizerCounter, TokenCounter
from capacity_pack.plan.system import OpenAITarget, SimTarget
from capacity_pack.plan.workload import Prompts

PROMPT_COLUMNS = (
    "request_id",
    "turn",
    "user_tokens",
    "input_tokens",
    "prompt_seed",
    "prefix_id",
    "prefix_tokens",
    "prefix_blocks",
)
META_KEY = b"capacity_pack.prompts"


class PreparedPromptsError(StatedError, ValueError):
    """A prompts file that does not belong to the schedule or inputs it is read with."""


class PromptInputs(BaseModel):
    """What a prompt's text depends on beyond its schedule row."""

    model_config = ConfigDict(extra="forbid")

    corpus_revision: str
    cold_unique_prefix_tokens: int
    prefix_revision: str | None
    block_tokens: int
    tokenizer: Literal["project", "file", "endpoint"]
    tokenizer_path: str | None = None
    tokenizer_sha256: str | None = None

    @classmethod
    def of_pack(cls, pack: Pack) -> PromptInputs:
        return cls.of_parts(pack.target, pack.prompts, pack.client.trace)

    @classmethod
    def of_parts(
        cls, target: SimTarget | OpenAITarget, prompts: Prompts, trace: TraceSpec | None
    ) -> PromptInputs:
        """From the manifest's target, prompts section and trace (a measurement's inputs)."""
        kind: Literal["project", "file", "endpoint"] = "project"
        path = sha = None
        if isinstance(target, OpenAITarget) and target.tokenizer_path is not None:
            kind, path = "file", str(target.tokenizer_path)
            sha = _file_sha256(path)
        elif isinstance(target, OpenAITarget) and target.tokenize_endpoint:
            kind = "endpoint"
        prefix = prompts.prefix
        return cls(
            corpus_revision=prompts.corpus_revision,
            cold_unique_prefix_tokens=prompts.cold_unique_prefix_tokens,
            prefix_revision=prefix.revision if prefix else None,
            block_tokens=trace.block_tokens if trace is not None else 512,
            tokenizer=kind,
            tokenizer_path=path,
            tokenizer_sha256=sha,
        )

    def canonical_json(self) -> str:
        return canonical_json(self.model_dump(mode="json"))

    def counter(self) -> TokenCounter | None:
        """The tokenizer the prompts are fitted to (None: the project tokenizer)."""
        if self.tokenizer != "file":
            return None
        assert self.tokenizer_path is not None
        counter = FileTokenizerCounter(self.tokenizer_path)
        if self.tokenizer_sha256 is not None and _file_sha256(self.tokenizer_path) != (
            self.tokenizer_sha256
        ):
            raise PreparedPromptsError(
                f"tokenizer file {self.tokenizer_path} changed since the pipeline read it "
                "(sha256 differs): run again"
            )
        return counter

    def row(self, row: dict[str, Any]) -> dict[str, Any]:
        """A schedule row as :func:`capacity_pack.plan.prompts.build_prompt` keywords, with
        ``user_tokens`` for a session's later turn (its text is the new user message)."""
        out = {
            "input_tokens": int(row["input_tokens"]),
            "prompt_seed": int(row["prompt_seed"]),
            "prefix_id": int(row["prefix_id"]),
            "prefix_tokens": int(row["prefix_tokens"]),
            "prefix_revision": self.prefix_revision,
            "cold_unique_prefix_tokens": self.cold_unique_prefix_tokens,
            "corpus_revision": self.corpus_revision,
            "prefix_blocks": str(row.get("prefix_blocks") or ""),
            "block_tokens": self.block_tokens,
        }
        if int(row.get("turn", 0) or 0) > 0:
            out["user_tokens"] = int(row["user_tokens"])
        return out


def _file_sha256(path: str | Path) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None  # a missing file: the stage that opens it says so


def schedule_digest(frame: pd.DataFrame) -> str:
    """sha256 of the schedule columns a prompt reads, row by row."""
    h = hashlib.sha256()
    for name in PROMPT_COLUMNS:
        col = frame[name] if name in frame.columns else pd.Series([""] * len(frame))
        h.update(name.encode())
        h.update(pd.util.hash_pandas_object(col.astype(str), index=False).to_numpy().tobytes())
    return h.hexdigest()


def write_prepared(
    path: str | Path, frame: pd.DataFrame, prompts: list[str] | None, inputs: PromptInputs
) -> None:
    """Write the prompts of ``frame``'s rows (None: none prepared) with their provenance."""
    ids = frame["request_id"].astype(str).tolist() if prompts is not None else []
    table = pa.table(
        {
            "request_id": pa.array(ids, pa.string()),
            "prompt": pa.array(prompts or [], pa.large_string()),
        }
    )
    meta = {"inputs": inputs.canonical_json(), "schedule": schedule_digest(frame)}
    table = table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(out)


def read_prepared(path: str | Path, frame: pd.DataFrame, inputs: PromptInputs) -> dict[str, str]:
    """The prepared prompts by request id, after checking they were made for ``frame`` (the
    schedule measured) under ``inputs``; raises :class:`PreparedPromptsError` otherwise."""
    try:
        table = pq.read_table(path)
        meta = json.loads((table.schema.metadata or {})[META_KEY])
    except (OSError, KeyError, ValueError, pa.ArrowException) as err:
        raise PreparedPromptsError(f"{path}: not a prepared-prompts file ({err})") from None
    if meta.get("schedule") != schedule_digest(frame):
        raise PreparedPromptsError(
            f"{path}: prepared for another schedule (its schedule digest differs); "
            "prepare the prompts again"
        )
    if meta.get("inputs") != inputs.canonical_json():
        raise PreparedPromptsError(
            f"{path}: prepared under other prompt inputs (corpus, prefix set or tokenizer "
            "differ); prepare the prompts again"
        )
    return dict(
        zip(
            table.column("request_id").to_pylist(),
            table.column("prompt").to_pylist(),
            strict=True,
        )
    )
