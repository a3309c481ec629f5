"""Atomic outputs honour the umask: a pack is as readable as any file its owner writes."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

import pandas as pd
import pytest

import capacity_pack.io as cp_io
from capacity_pack.io import atomic_path, write_json_atomic, write_text_atomic


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_files_get_the_umask_mode(tmp_path, mask, expected):
    with umask(mask):
        write_text_atomic(tmp_path / "README.md", "# pack\n")
        write_json_atomic(tmp_path / "summary.json", {"a": 1})
        with atomic_path(tmp_path / "t.parquet") as tmp:
            pd.DataFrame({"x": [1]}).to_parquet(tmp)  # replaces the temp file with its own
        # Rewriting an existing output gives it the same mode again.
        write_text_atomic(tmp_path / "README.md", "# pack, again\n")
    for name in ("README.md", "summary.json", "t.parquet"):
        assert mode(tmp_path / name) == expected, name
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_umask_read_leaves_it_unchanged():
    with umask(0o027):
        for _ in range(3):
            assert cp_io.current_umask() == 0o027
        assert os.umask(0o027) == 0o027
