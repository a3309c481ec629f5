"""Two Snakemake invocations against one target, and killed ones: real pipelines, real processes.

Both invocations measure the embedded simulator (one target: this host's CPU,
``capacity_pack.measure.lock``) from two output folders. The tests point ``XDG_RUNTIME_DIR`` at
their own folder, so they never meet another measurement's lock on this host. Processes are
found by walking ``/proc`` from the Snakemake process: the job (the rule script), its simulator
(``capacity_pack.sim``) and its shards (``capacity_pack shard``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capacity_pack import stages
from tests.conftest import SNAKEMAKE, small_pack_data, write_pack
from tests.paths import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

POINT = {"point": "open-r10", "cache": "cold", "repeat": 0}


def pack(name: str, requests: int, **client) -> dict:
    return small_pack_data(
        name,
        requests=requests,
        min_samples=4,
        sweep={"open_loop_rps": [10], "closed_loop_concurrency": [], "cache_states": ["cold"]},
        maximum_duration_seconds=60,
        **client,
    )


def output(name: str, stage: str, key: str) -> str:
    return stages.STAGES[stage].output(key, f"results/{name}", **POINT)


@pytest.fixture
def env(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    out = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    out["XDG_RUNTIME_DIR"] = str(run)
    return out


def snakemake(workdir: Path, target: str, env: dict[str, str]) -> subprocess.Popen:
    argv = [*SNAKEMAKE, "-s", str(ROOT / "Snakefile"), "--directory", str(workdir)]
    argv += ["--configfile", str(workdir / "pack.yaml"), "--cores", "2", target]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def finish(proc: subprocess.Popen, timeout_s: float = 120) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out
    return out


# -- /proc ------------------------------------------------------------------------------------


def stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: state first, then the parent PID."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def alive(pid: int, start: str | None = None) -> bool:
    fields = stat(pid)
    return fields is not None and fields[0] != "Z" and (start is None or fields[19] == start)


def cmdline(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    return []


def descendants(root: int) -> dict[int, tuple[list[str], str]]:
    """Every live process below ``root``: PID -> (command line, start time)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := stat(int(entry.name))) and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        fields = stat(pid)
        if fields is not None:
            out[pid] = (cmdline(pid), fields[19])
            todo += children.get(pid, [])
    return out


def roles(procs: dict[int, tuple[list[str], str]]) -> dict[str, list[int]]:
    """The Python processes among ``procs`` by role (the job's shell is not one)."""
    found: dict[str, list[int]] = {"job": [], "sim": [], "shard": []}
    for pid, (argv, _) in procs.items():
        if not argv or not Path(argv[0]).name.startswith("python"):
            continue
        if argv[1:3] == ["-m", "capacity_pack.sim"]:
            found["sim"].append(pid)
        elif argv[1:4] == ["-m", "capacity_pack", "shard"]:
            found["shard"].append(pid)
        elif any(".snakemake/scripts/" in a and a.endswith("sweep.py") for a in argv[1:]):
            found["job"].append(pid)
    return found


def wait_for(root: int, ready, timeout_s: float = 90) -> dict[int, tuple[list[str], str]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs = descendants(root)
        if ready(roles(procs)):
            return procs
        time.sleep(0.05)
    raise AssertionError(f"no such processes below {root} in {timeout_s} s: {descendants(root)}")


def window(workdir: Path, name: str) -> tuple[int, int]:
    """First send and last end of a point's records, on CLOCK_MONOTONIC (one clock for every
    process of the host)."""
    path = workdir / output(name, "sweep", "records")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records
    return min(r["sent_ns"] for r in records), max(r["end_ns"] for r in records)


# -- the tests --------------------------------------------------------------------------------


def test_a_second_invocation_waits_for_the_first_and_never_overlaps_it(tmp_path, env):
    a, b = tmp_path / "a", tmp_path / "b"
    for workdir, name in ((a, "lock-a"), (b, "lock-b")):
        workdir.mkdir()
        write_pack(workdir, pack(name, requests=30))
    # The schedules first (both at once), so that the measurements are what meets.
    for proc in [snakemake(a, output("lock-a", "schedule", "schedule"), env),
                 snakemake(b, output("lock-b", "schedule", "schedule"), env)]:  # fmt: skip
        finish(proc)
    first = snakemake(a, output("lock-a", "sweep", "summary"), env)
    second = None
    try:
        # The first holds the target once its simulator starts; keep it there (stopped) until
        # the second has reached the lock, so the meeting does not depend on this host's speed.
        procs = wait_for(first.pid, lambda r: r["sim"] and r["job"])
        holder = roles(procs)["job"][0]
        os.kill(holder, signal.SIGSTOP)
        try:
            second = snakemake(b, output("lock-b", "sweep", "summary"), env)
            log = b / "results/lock-b/logs/sweep/open-r10/cold/rep0.log"
            deadline = time.monotonic() + 60
            while "waiting for target" not in (log.read_text() if log.exists() else ""):
                assert not roles(descendants(second.pid))["sim"], "the second measured at once"
                assert second.poll() is None and time.monotonic() < deadline, second.stdout
                time.sleep(0.05)
        finally:
            os.kill(holder, signal.SIGCONT)
        finish(first)
        out = finish(second)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    text = log.read_text()
    assert "sweep open-r10/cold/rep0 of pack 'lock-b': waiting for target local@localhost" in text
    assert f"being measured by PID {holder} (pack 'lock-a', sweep open-r10/cold/rep0" in text
    assert "target local@localhost is free after" in text
    assert f"PID {holder} (pack 'lock-a'" in out  # on the console too
    start_a, end_a = window(a, "lock-a")
    start_b, end_b = window(b, "lock-b")
    assert start_a < end_a < start_b < end_b


@pytest.mark.parametrize("victim", ["job", "snakemake"])
def test_a_killed_measurement_leaves_no_process_loading_the_target(tmp_path, env, victim):
    """SIGKILL the sweep job: its simulator and shards die with it. SIGKILL Snakemake: the job
    (whose parent, a shell, survives) stops, and its children with it."""
    write_pack(tmp_path, pack("lock-kill", requests=300, shards=2))
    proc = snakemake(tmp_path, output("lock-kill", "sweep", "summary"), env)
    watched: dict[int, str] = {}
    try:
        procs = wait_for(proc.pid, lambda r: r["sim"] and len(r["shard"]) == 2 and r["job"])
        found = roles(procs)
        watched = {pid: procs[pid][1] for pid in [*found["job"], *found["sim"], *found["shard"]]}
        os.kill(proc.pid if victim == "snakemake" else found["job"][0], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (left := [p for p, start in watched.items() if alive(p, start)]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert not left, {p: procs[p][0] for p in left}
    finally:
        for pid in [proc.pid, *(p for p, start in watched.items() if alive(p, start))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=30)
