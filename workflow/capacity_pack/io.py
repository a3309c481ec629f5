"""Atomic file output and canonical JSON.

Every file the project writes goes through these helpers: content is written to a temporary
file in the destination folder and renamed over the target, so a crash or a validation error
never leaves a half-written output behind (rename is atomic on POSIX within one filesystem).
The temporary file is made with ``mkstemp`` (mode 0600 whatever the umask), so before the rename
it gets the mode an ordinary ``open`` would have given it, ``0o666 & ~umask`` (0644 under the
usual umask 022): a pack on a shared volume is as readable as any other file its owner writes.

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
import threading
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


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc/self/status``,
    Linux 4.7+); elsewhere set and restored at once, under a lock (a file another thread of this
    process creates in between would get umask 0)."""
    with (
        contextlib.suppress(OSError, ValueError),
        open("/proc/self/status", encoding="ascii", errors="replace") as fh,
    ):
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def output_mode() -> int:
    """The mode a new output file gets: what ``open(path, "w")`` would give it."""
    return 0o666 & ~current_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``path``; rename it onto ``path`` only if the block succeeds.

    The file renamed is given the umask's mode (see the module docstring), also when the block
    replaced the temp file by another one of its own (``to_parquet``, a copy)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, output_mode())
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


def user_cache_dir() -> Path:
    """This account's cache folder for the project: ``$XDG_CACHE_HOME/capacity-pack``
    (``~/.cache/capacity-pack`` without the variable), for caches keyed by content."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "capacity-pack"
