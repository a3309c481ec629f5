"""Two Snakemake invocations against one target, and killed ones: real pipelines, real processes.

Both invocations measure the embedded simulator (one target: this host's CPU,
``capacity_pack.measure.lock``) from two output folders. The tests point ``XDG_RUNTIME_DIR`` at
their own folder, so they never meet another measurement's lock on this host. Processes are
found by walking ``/proc`` from the Snakemake (or ``capacity-pack load``) process: the job (the
rule script), its simulator (``capacity_pack.sim``) and its shards (``capacity_pack shard``).
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
    client.setdefault("maximum_duration_seconds", 60)
    return small_pack_data(
        name,
        requests=requests,
        min_samples=4,
        sweep={"open_loop_rps": [10], "closed_loop_concurrency": [], "cache_states": ["cold"]},
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


def sweep_log(workdir: Path, name: str) -> Path:
    return workdir / f"results/{name}/logs/sweep/open-r10/cold/rep0.log"


def test_a_second_invocation_waits_for_the_first_and_never_overlaps_it(tmp_path, env):
    names = {"lock-a": tmp_path / "a", "lock-b": tmp_path / "b"}
    procs = {}
    try:
        for name, workdir in names.items():
            workdir.mkdir()
            # 3 s of arrivals; an undecided point extends to its maximum duration: 8 s.
            write_pack(workdir, pack(name, requests=30, maximum_duration_seconds=8))
            procs[name] = snakemake(workdir, output(name, "sweep", "summary"), env)
        # Whichever reaches the target first holds it once its simulator starts; keep it there
        # (stopped) until the other has reached the lock, so that the meeting does not depend
        # on this host's speed.
        deadline = time.monotonic() + 120
        while True:
            found = {n: roles(descendants(p.pid)) for n, p in procs.items()}
            first = next((n for n, r in found.items() if r["sim"] and r["job"]), None)
            if first is not None:
                break
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs.values())
            time.sleep(0.05)
        (second,) = set(names) - {first}
        holder = found[first]["job"][0]
        os.kill(holder, signal.SIGSTOP)
        try:
            log = sweep_log(names[second], second)
            while "waiting for target" not in (log.read_text() if log.exists() else ""):
                assert not roles(descendants(procs[second].pid))["sim"], "both measured at once"
                assert procs[second].poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            os.kill(holder, signal.SIGCONT)
        outputs = {n: finish(p) for n, p in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    text = log.read_text()
    assert (
        f"sweep open-r10/cold/rep0 of pack '{second}': waiting for target local@localhost" in text
    )
    assert f"being measured by PID {holder} (pack '{first}', sweep open-r10/cold/rep0" in text
    assert "target local@localhost is free after" in text
    assert f"PID {holder} (pack '{first}'" in outputs[second]  # on the console too
    start_1, end_1 = window(names[first], first)
    start_2, end_2 = window(names[second], second)
    assert start_1 < end_1 < start_2 < end_2


def wait_gone(watched: dict[int, str], timeout_s: float = 10) -> list[int]:
    """The processes of ``watched`` (PID -> start time) still alive after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p, start in watched.items() if alive(p, start)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return left


def kill_all(watched: dict[int, str]) -> None:
    for pid, start in watched.items():
        if alive(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_sigkilled_measurement_leaves_no_simulator_or_shard_alive(tmp_path, env):
    """The sweep stage's process (here `capacity-pack load`, as a pipeline job runs it) killed
    mid-point: its simulator and its shards die with it."""
    write_pack(tmp_path, pack("lock-kill", requests=300))
    argv = [sys.executable, "-m", "capacity_pack", "load", str(tmp_path / "pack.yaml")]
    argv += ["--point", "open-r10", "--cache-state", "cold", "--shards", "2", "--no-progress"]
    proc = subprocess.Popen([*argv, "-o", str(tmp_path / "out")], env=env)
    watched: dict[int, str] = {}
    try:
        procs = wait_for(proc.pid, lambda r: r["sim"] and len(r["shard"]) == 2)
        found = roles(procs)
        watched = {pid: procs[pid][1] for pid in [*found["sim"], *found["shard"]]}
        proc.kill()
        proc.wait()
        left = wait_gone(watched)
        assert not left, {p: procs[p][0] for p in left}
    finally:
        proc.kill()
        proc.wait()
        kill_all(watched)


def test_a_sigkilled_snakemake_leaves_no_job_simulator_or_shard_alive(tmp_path, env):
    """Snakemake killed mid-point: its measurement job stops (nothing made it a child that dies
    with its parent), and the job's simulator and shards with it."""
    write_pack(tmp_path, pack("lock-kill", requests=300, shards=2))
    proc = snakemake(tmp_path, output("lock-kill", "sweep", "summary"), env)
    watched: dict[int, str] = {}
    try:
        procs = wait_for(proc.pid, lambda r: r["sim"] and len(r["shard"]) == 2 and r["job"])
        found = roles(procs)
        watched = {pid: procs[pid][1] for pid in [*found["job"], *found["sim"], *found["shard"]]}
        proc.kill()
        left = wait_gone(watched)
        assert not left, {p: procs[p][0] for p in left}
    finally:
        proc.kill()
        kill_all(watched)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=30)
