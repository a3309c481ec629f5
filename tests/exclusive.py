"""Exclusive tests on the suite's parallel workers, and the lock that runs them alone.

The suite runs on three parallel workers on CI's two cores (pytest-xdist, `addopts` in
pyproject.toml): a point's load and a drill's timeline run in real time, so fewer workers leave
the cores idle. Each worker's measurements take turns through a target lock of their own
(:func:`_own_target_locks`): through the project's host-wide lock the shared part kept the
cores 73 % busy and took 809 s; with a lock per worker, 89 % and 737 s (2026-12-08,
docs/performance.md, "A target lock per worker, again"). A test marked `exclusive` (and every
`real_engine` test) runs alone: it measures something the other workers' CPU would move (a
real engine's capacity on two cores, a point beside a CPU hog, a twin fitted to measured
latencies, a drill's alert timing).

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
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


def lock_folder(run: str) -> Path:
    return Path(tempfile.gettempdir()) / f"capacity-pack-tests-{run}"


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        _own_target_locks(workerinput["testrunuid"], workerinput["workerid"])
        return
    # On the controller of a parallel run: the run's id is ours (xdist takes --testrunuid when
    # given), so that the lock folder its workers share can be removed when the run ends.
    if not config.getoption("numprocesses", None):
        return
    if config.getoption("testrunuid", None) is None:
        config.option.testrunuid = uuid.uuid4().hex
    config.stash[_RUN_KEY] = config.option.testrunuid


def pytest_unconfigure(config: pytest.Config) -> None:
    # Every worker has ended by now: nobody holds the locks any more.
    run = config.stash.get(_RUN_KEY, None)
    if run is not None:
        shutil.rmtree(lock_folder(run), ignore_errors=True)


_RUN_KEY = pytest.StashKey[str]()


def _own_target_locks(run: str, worker: str) -> None:
    """Each worker's measurements take turns through a target lock of their own.

    The project's target lock (capacity_pack.measure.lock, under ``$XDG_RUNTIME_DIR``) is
    host-wide: every simulated measurement of the suite would wait for the other workers' (on
    2026-12-07 the lock was held about half the suite's shared part and the cores idled a
    third of it). The pipeline tests already share the host with the other workers' jobs and
    measure without the host checks (``UNCHECKED_HOST`` in tests/conftest.py); a test that
    measures what other work would move runs ``exclusive``. Within a worker (one test at a
    time) the lock still holds, and tests/integration/test_target_lock.py checks it between
    two invocations of one test."""
    lock_folder(run).mkdir(mode=0o700, exist_ok=True)
    runtime = lock_folder(run) / f"runtime-{worker}"
    runtime.mkdir(mode=0o700, exist_ok=True)
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)


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
    folder = lock_folder(run)
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


def order_modules(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order the workers take modules in (`--no-loadscope-reorder` keeps it): modules with
    slow tests first, so that a long pipeline module does not run alone at the end while the
    other workers idle; then the rest; the exclusive modules last, the real engine's first (the
    longest of them). Collection order within each rank. (A pipeline module and another slow
    module in turn, so that the third worker computes while two measure, was tried on
    2026-12-07 and was slower: docs/performance.md, "Three workers, one measurement at a
    time".)"""

    marks: dict[str, set[str]] = {}
    for item in items:
        names = {m.name for m in item.iter_markers()}
        if _exclusive(item):
            names.add("exclusive")
        marks.setdefault(item.nodeid.split("::")[0], set()).update(names)

    def rank(module: str) -> int:
        m = marks[module]
        if "real_engine" in m:
            return 2
        if "exclusive" in m:
            return 3
        return 0 if "slow" in m else 1

    items.sort(key=lambda item: rank(item.nodeid.split("::")[0]))  # stable
