"""The suite's exclusive tests run alone on the parallel workers (tests/exclusive.py): a real
pytest-xdist run of a small suite whose tests record when they ran."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.exclusive import lock_folder
from tests.paths import ROOT

CONFTEST = (
    "from tests.exclusive import order_modules as pytest_collection_modifyitems\n"
    "from tests.exclusive import pytest_configure, pytest_runtest_protocol, pytest_unconfigure\n"
)
INI = """[pytest]
markers =
    exclusive: runs alone
    real_engine: a real engine
"""
RECORD = """
import time, pathlib, pytest

def record(name):
    start = time.monotonic()
    time.sleep(0.8)
    with open(pathlib.Path(__file__).parent / "times.txt", "a") as f:
        f.write(f"{{name}} {{start}} {{time.monotonic()}}\\n")
"""


def module(tests: list[tuple[str, str]]) -> str:
    body = RECORD
    for name, mark in tests:
        body += f"\n{mark}\ndef test_{name}():\n    record('{name}')\n"
    return body.replace("{{", "{").replace("}}", "}")


@pytest.mark.slow
def test_an_exclusive_test_overlaps_no_other_while_the_rest_run_in_parallel(tmp_path: Path):
    """Exclusive tests run alone; the others run side by side."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "test_a.py").write_text(module([("a1", ""), ("a2", ""), ("a3", "")]))
    (tmp_path / "test_b.py").write_text(module([("b1", ""), ("b2", ""), ("b3", "")]))
    (tmp_path / "test_x.py").write_text(module([("x_alone", "@pytest.mark.exclusive")]))
    (tmp_path / "test_y.py").write_text(module([("x_engine", "@pytest.mark.real_engine")]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = str(ROOT)
    run = f"test-exclusive-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadscope", "--no-loadscope-reorder", "--testrunuid", run, str(tmp_path)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    runs = {}
    for line in (tmp_path / "times.txt").read_text().splitlines():
        name, start, end = line.split()
        runs[name] = (float(start), float(end))
    assert len(runs) == 8

    def overlap(a: str, b: str) -> bool:
        return runs[a][0] < runs[b][1] and runs[b][0] < runs[a][1]

    for alone in ("x_alone", "x_engine"):
        assert not [other for other in runs if other != alone and overlap(alone, other)], runs
    # The others did run side by side (two workers, a module on each).
    assert any(overlap(a, b) for a in ("a1", "a2", "a3") for b in ("b1", "b2", "b3")), runs
    # The workers' shared lock folder went with the run.
    assert not lock_folder(run).exists()


def test_modules_are_ordered_slow_first_and_exclusive_last_the_real_engine_first(tmp_path: Path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text(INI + "    slow: slow\n")
    (tmp_path / "test_a.py").write_text(module([("a1", "")]))
    (tmp_path / "test_b.py").write_text(module([("b1", ""), ("b2", "@pytest.mark.slow")]))
    (tmp_path / "test_w.py").write_text(module([("w1", ""), ("w2", "@pytest.mark.exclusive")]))
    (tmp_path / "test_x.py").write_text(module([("x1", "@pytest.mark.real_engine")]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
         str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    order = [line.split("::")[1] for line in res.stdout.splitlines() if "::" in line]
    assert order == ["test_b1", "test_b2", "test_a1", "test_x1", "test_w1", "test_w2"]
