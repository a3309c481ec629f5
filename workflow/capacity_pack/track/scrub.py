"""What may reach MLflow, and in what form: keys and values cleaned to MLflow's limits, nested
settings flattened to dotted keys, metrics checked, secrets dropped or redacted.

``None`` metrics are withheld (``capacity_pack.metrics_withheld``), non-finite ones raise
:class:`ValueError`; secret keys and values are dropped (``capacity_pack.redacted``) and
artifacts redacted (:func:`~capacity_pack.redact.redact_text` for any text).

Policy: docs/tracking-server.md, "How the pack writes to a store" (Scrubbing).
"""

from __future__ import annotations

import json
import math
import numbers
import posixpath
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capacity_pack.io import sha256_hex
from capacity_pack.redact import MIN_CONTAINED_SECRET, holds_secret, looks_secret, redact_text

# MLflow's limits (mlflow.utils.validation), copied so that importing this module stays cheap.
MAX_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000


# --- Keys and values ---


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ending in a marker with its length and hash."""
    if len(text) <= limit:
        return text
    marker = f"...[truncated: {len(text)} chars, sha256 {sha256_hex(text)[:16]}]"
    return text[: limit - len(marker)] + marker


def _clean_key(key: object) -> str:
    """A key MLflow accepts: allowed characters only, no path tricks, at most 250 characters."""
    text = re.sub(r"[^\w.\- :/]", "_", str(key)).strip()
    if posixpath.normpath(text) != text or text.startswith("/"):
        text = text.replace("/", "_")
    text = re.sub(r"^\.+", lambda m: "_" * len(m.group()), text)  # "..x" reads as a parent dir
    if not text:
        raise ValueError(f"{key!r} cannot be used as an MLflow key")
    if len(text) > MAX_KEY_LENGTH:
        # A hash suffix keeps apart two long keys that share a prefix.
        text = text[: MAX_KEY_LENGTH - 17] + "-" + sha256_hex(text)[:16]
    return text


def _format_value(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def flatten(obj: object, prefix: str = "") -> dict[str, object]:
    """Nested settings as dotted keys.

    Lists of mappings that each have a unique ``name`` are keyed by it
    (``workload.interactive.mix``), other lists of mappings by index, and lists of scalars stay
    one value (``sweep.open_loop_rps`` = ``[10.0, 20.0, 30.0]``).
    """

    def join(key: object) -> str:
        return f"{prefix}.{key}" if prefix else str(key)

    def merge(out: dict[str, object], more: dict[str, object]) -> None:
        # {"a.b": 1, "a": {"b": 2}} would otherwise lose one value without a word.
        clash = sorted(set(out) & set(more))
        if clash:
            raise ValueError(f"settings {clash} appear twice once flattened to dotted keys")
        out.update(more)

    if isinstance(obj, Mapping):
        if not obj:
            return {prefix: {}} if prefix else {}
        out: dict[str, object] = {}
        for key, value in obj.items():
            merge(out, flatten(value, join(key)))
        return out
    if isinstance(obj, list | tuple) and obj and all(isinstance(x, Mapping) for x in obj):
        names = [x.get("name") for x in obj]
        named = all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names)
        out = {}
        for i, item in enumerate(obj):
            if named:
                rest = {k: v for k, v in item.items() if k != "name"}
                merge(out, flatten(rest, join(names[i])) if rest else {join(names[i]): {}})
            else:
                merge(out, flatten(item, join(i)))
        return out
    return {prefix: obj}


# --- Secrets and metrics ---


def _artifact_holds(path: Path, secrets: list[str]) -> bool:
    data = path.read_bytes()
    return any(len(s) >= MIN_CONTAINED_SECRET and s.encode() in data for s in secrets)


def redacted_artifacts(
    files: list[Path], secrets: list[str], redacted: list[str]
) -> tuple[list[Path], tempfile.TemporaryDirectory[str] | None]:
    """``files`` (files or directories), with a secret-free copy in place of any that holds a
    secret (a binary file that holds one is left out), and the temporary directory that holds
    the copies (removed when it is garbage-collected). Names go to ``redacted``."""
    out = []
    scratch: tempfile.TemporaryDirectory[str] | None = None
    for path in files:
        members = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        leaking = [p for p in members if _artifact_holds(p, secrets)]
        if not leaking:
            out.append(path)
            continue
        if scratch is None:
            scratch = tempfile.TemporaryDirectory(prefix="capacity-pack-mlflow-")
        copy = Path(scratch.name) / path.name
        if path.is_dir():
            shutil.copytree(path, copy)
        else:
            shutil.copy2(path, copy)
        for member in leaking:
            target = copy / member.relative_to(path) if path.is_dir() else copy
            redacted.append(f"artifact:{member.relative_to(path.parent)}")
            try:
                text = member.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                target.unlink()  # a binary file cannot be rewritten safely: withheld
                continue
            target.write_text(redact_text(text, secrets), encoding="utf-8")
        if copy.exists():
            out.append(copy)
    return out, scratch


def scrub(items: Mapping[str, str], secrets: list[str], redacted: list[str]) -> dict[str, str]:
    """``items`` without secret-looking keys or secret values; dropped keys go to ``redacted``."""
    out = {}
    for key, value in items.items():
        key_leaks = holds_secret(key, secrets)
        if key_leaks or looks_secret(key) or holds_secret(value, secrets):
            if not key_leaks:  # a key holding a secret value is not even listed
                redacted.append(key)
            continue
        out[key] = value
    return out


def clean_items(items: Mapping[Any, object], what: str, limit: int) -> dict[str, str]:
    """Clean keys and formatted, truncated values; two keys cleaning to one is an error."""
    out: dict[str, str] = {}
    for key, value in items.items():
        clean = _clean_key(key)
        if clean in out:
            raise ValueError(f"two {what} map to the same MLflow key {clean!r} (one is {key!r})")
        out[clean] = truncate(_format_value(value), limit)
    return out


def prepare_metrics(metrics: Mapping[str, Any]) -> tuple[dict[str, float], list[str]]:
    """Finite floats by clean key, and the names withheld because their value is ``None``."""
    values: dict[str, float] = {}
    withheld: list[str] = []
    bad: list[str] = []
    for key, value in metrics.items():
        if value is None:
            withheld.append(str(key))
            continue
        if not isinstance(value, numbers.Real):
            raise TypeError(f"metric {key!r} must be a number, got {type(value).__name__}")
        number = float(value)
        if not math.isfinite(number):
            bad.append(f"{key}={number}")
            continue
        clean = _clean_key(key)
        if clean in values:
            raise ValueError(f"two metrics map to the same MLflow key {clean!r} (one is {key!r})")
        values[clean] = number
    if bad:
        raise ValueError(
            f"metrics must be finite; refusing to log {', '.join(bad)} (pass None to withhold a "
            "value that could not be computed)"
        )
    return values, withheld
