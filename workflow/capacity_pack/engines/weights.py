"""The digest of the weights a server serves, where the server names a file on this host.

llama.cpp's ``/props`` and SGLang's ``/get_model_info`` give the ``model_path`` the server
loaded. For a target on 127.0.0.1 that path is a file (or a directory) on this machine, and its
SHA-256 says which weights were measured, whatever the server calls the model (llama.cpp's
``--alias`` sets the served name to anything). A manifest whose ``model.revision`` is
``sha256:<64 hex digits>`` pins the file, and a different file is an identity mismatch
(:func:`capacity_pack.engines.probe.check_identity`).

Hashing reads the whole file (a 98 MB GGUF: about 0.2 s; a 140 GB checkpoint: minutes), so a
digest is computed once per file and kept in a small JSON cache keyed by the resolved path,
size and modification time (``$XDG_CACHE_HOME/capacity-pack/weights-sha256.json``, default
``~/.cache``); a rewritten file changes its size or time and is hashed again. A directory
(a Hugging Face checkpoint) is not hashed: its revision is the hub commit the manifest names.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from capacity_pack.io import file_sha256 as sha256_of_file
from capacity_pack.io import user_cache_dir, write_json_atomic


def cache_path() -> Path:
    """The digest cache file, in :func:`capacity_pack.io.user_cache_dir`."""
    return user_cache_dir() / "weights-sha256.json"


def file_sha256(path: str | Path) -> str | None:
    """SHA-256 (hex) of the regular file at ``path``, from the cache when its size and
    modification time are unchanged; None when ``path`` is not a readable regular file."""
    p = Path(path)
    try:
        resolved = p.resolve()
        st = resolved.stat()
    except OSError:
        return None
    if not resolved.is_file():
        return None
    key = f"{resolved}|{st.st_size}|{st.st_mtime_ns}"
    cache = _read_cache()
    if key in cache:
        return cache[key]
    try:
        value = sha256_of_file(resolved)
    except OSError:
        return None
    # Entries of other versions of the same file are dropped: they can never match again.
    cache = {k: v for k, v in cache.items() if not k.startswith(f"{resolved}|")}
    cache[key] = value
    _write_cache(cache)
    return value


def pinned_sha256(revision: str | None) -> str | None:
    """The digest a ``model.revision`` of the form ``sha256:<64 hex>`` pins, else None."""
    text = (revision or "").strip().lower()
    if not text.startswith("sha256:"):
        return None
    hexes = text.removeprefix("sha256:")
    return hexes if len(hexes) == 64 and all(c in "0123456789abcdef" for c in hexes) else None


def _read_cache() -> dict[str, str]:
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_cache(cache: dict[str, str]) -> None:
    """Best effort: a cache that cannot be written only costs a second hashing."""
    path = cache_path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, cache)
