"""Atomic file output and canonical JSON.

Every file the project writes goes through these helpers: content is written to a temporary
file in the destination folder and renamed over the target, so a crash or a validation error
never leaves a half-written output behind (rename is atomic on POSIX within one filesystem).

Canonical JSON (sorted keys, no insignificant whitespace, UTF-8, no NaN) is what hashes are
computed over, so the same content always gives the same sha256. :func:`finite_or_none` turns
the non-finite floats JSON cannot hold into nulls.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def canonical_json(obj: Any) -> str:
    """Serialize ``obj`` deterministically: sorted keys, compact separators, no NaN/Inf."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def sha256_hex(data: str | bytes) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def sha256_of_obj(obj: Any) -> str:
    """sha256 of the canonical JSON of ``obj``."""
    return sha256_hex(canonical_json(obj))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """Write human-readable JSON (sorted keys) atomically, with a trailing newline."""
    text = json.dumps(obj, sort_keys=True, indent=indent, ensure_ascii=False, allow_nan=False)
    write_text_atomic(path, text + "\n")


def file_sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def finite_or_none(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, +-inf) replaced by None, through dicts and
    lists: JSON has no such numbers, and a summary must stay readable everywhere."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite_or_none(v) for v in obj]
    return obj
