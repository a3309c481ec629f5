"""A pytest plugin that records each test phase's CPU time, for tests/bench/suite_timeline.py.

    CI=true pytest -p tests.bench.cpu_per_test --report-log=suite.jsonl
    python tests/bench/suite_timeline.py suite.jsonl

Each phase (setup, call, teardown) gets a user property ``cpu_s``: the worker's own CPU time
plus that of the child processes it waited for during the phase (``getrusage`` of ``SELF`` and
``CHILDREN``, user and system). A Snakemake run, a server a fixture stopped, a browser: each is
counted by the phase that waited for it; a grandchild counts once its parent has waited for it
(Snakemake's jobs do; a daemon left running to the end of a module counts in the teardown that
stops it). Processes nobody waits for are missed.
"""

from __future__ import annotations

import resource

import pytest


def _cpu_s() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    start = item.stash.get(_START, None)
    if start is not None:
        report.user_properties.append(("cpu_s", round(_cpu_s() - start, 3)))
    item.stash[_START] = _cpu_s()  # the next phase starts here


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_START] = _cpu_s()


_START = pytest.StashKey[float]()
