"""The suite's tiers: what `pytest -m "not slow"`, the edit-test loop, leaves out.

Folders by role, as GuideLLM splits its tests: ``tests/unit`` holds one package's behaviour,
``tests/integration`` the real pipeline, several processes, drills, a tracking server;
``tests/e2e`` a real model. Every test under ``integration`` and ``e2e`` is ``slow`` by where it
lives (no module has to remember the mark); a unit test that takes more than a few seconds
(a real load of several seconds, a search in virtual time) carries the mark itself. The full
suite, `pytest`, runs every tier; CI runs it (``.ci/run``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SLOW_FOLDERS = frozenset({"integration", "e2e"})


def mark_tiers(items: list[pytest.Item]) -> None:
    """Mark every test of a slow folder ``slow``."""
    for item in items:
        try:
            folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        if folder in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
