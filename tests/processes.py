"""Start worker processes so that they begin their real work at the same moment, and stop a
server's process group.

Each worker writes its ready file once it has imported what it needs, then waits for the start
file; races (a database created twice, two parent runs) only show when the contenders really
overlap, so the start is released only after every worker is ready.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


def start_together(
    argvs: list[list[str]], ready_dir: Path, start: Path, env: dict[str, str]
) -> list[subprocess.Popen]:
    """Start one process per argv; touch ``start`` once ``ready_dir/ready-<i>`` all exist."""
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for argv in argvs
    ]
    deadline = time.monotonic() + 60
    while not all((ready_dir / f"ready-{w}").exists() for w in range(len(procs))):
        assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs]
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.01)
    start.touch()
    return procs


def stop_group(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM ``proc``'s process group (it was started with ``start_new_session``), then SIGKILL
    it if it has not exited within ``timeout_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)
