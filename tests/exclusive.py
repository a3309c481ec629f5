"""Exclusive tests on the suite's parallel workers, and the lock that runs them alone.

The suite runs on parallel workers (pytest-xdist, `addopts` in pyproject.toml): most of its
time is waiting (a point's load runs in real time; a drill's timeline is seconds long), and
the pipelines' measurements already take turns through the project's own host-wide target
lock (capacity_pack.measure.lock). A test marked `exclusive` (and every `real_engine` test)
runs alone: it measures something the other workers' CPU would move (a real engine's
capacity on two cores, the default pack's boundary, a twin fitted to measured latencies).

A readers-writer lock over flock(2) on two files shared by the run's workers: every test
holds `run.lock` shared from its setup to its teardown (module fixtures included: they are set
up inside their first test's protocol); an exclusive test holds it exclusively. `gate.lock`
gives the writer priority: a reader passes the gate before taking its shared lock, and a
waiting writer holds the gate, so new tests wait behind it instead of starving it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _exclusive(item: pytest.Item) -> bool:
    return any(item.iter_markers("exclusive")) or any(item.iter_markers("real_engine"))


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def _suite_turn(item: pytest.Item) -> Iterator[None]:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:  # one process: every test already runs alone
        yield
        return
    folder = Path(tempfile.gettempdir()) / f"capacity-pack-tests-{run}"
    folder.mkdir(mode=0o700, exist_ok=True)
    gate, lock = folder / "gate.lock", folder / "run.lock"
    if _exclusive(item):
        with _flock(gate, fcntl.LOCK_EX), _flock(lock, fcntl.LOCK_EX):
            yield
        return
    with contextlib.ExitStack() as stack:
        with _flock(gate, fcntl.LOCK_EX):
            stack.enter_context(_flock(lock, fcntl.LOCK_SH))
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    with _suite_turn(item):
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules with exclusive tests first, then those with slow tests, then the rest, each in
    collection order: with a module per worker (`--dist loadscope`), a long pipeline module
    collected last would otherwise run alone at the end while the other worker idles."""
    rank: dict[str, int] = {}
    for item in items:
        r = 0 if _exclusive(item) else 1 if any(item.iter_markers("slow")) else 2
        rank[item.module.__name__] = min(rank.get(item.module.__name__, 2), r)
    items.sort(key=lambda item: rank[item.module.__name__])  # stable: collection order within
