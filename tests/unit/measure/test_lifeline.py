"""Measurement processes die with what started them: PR_SET_PDEATHSIG children, and a job that
follows its Snakemake process through the shell between them (real processes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from capacity_pack.measure import lifeline

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's prctl, /proc")


def alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's zombie may wait long for its reaper)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rfind(")") + 2] != "Z"


def wait_dead(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


PARENT = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    from capacity_pack.measure.lifeline import dies_with_parent
    child = subprocess.Popen(["sleep", "120"], preexec_fn=dies_with_parent(signal.SIGTERM))
    print(child.pid, flush=True)
    time.sleep(120)
    """
)

# A stand-in for Snakemake: exports its token and runs the job under a shell, as Snakemake does.
INVOKER = textwrap.dedent(
    """
    import os, shlex, subprocess, sys, time
    from capacity_pack.measure import lifeline
    os.environ[lifeline.INVOKER_ENV] = lifeline.invoker_token()
    job = shlex.join([sys.executable, "-c", sys.argv[1]])
    subprocess.Popen(["bash", "-c", "set -euo pipefail; " + job])
    time.sleep(120)
    """
)
JOB = textwrap.dedent(
    """
    import os, time
    from capacity_pack.measure.lifeline import follow_invoker
    print(os.getpid(), follow_invoker(), flush=True)
    time.sleep(120)
    """
)


def test_a_child_dies_with_its_sigkilled_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert alive(child)
    parent.kill()
    parent.wait()
    assert wait_dead(child, 5.0), "the child outlived its SIGKILLed parent"


def test_a_job_under_a_shell_stops_when_its_invoker_is_sigkilled():
    invoker = subprocess.Popen(
        [sys.executable, "-c", INVOKER, JOB], stdout=subprocess.PIPE, text=True
    )
    assert invoker.stdout is not None
    job, followed = invoker.stdout.readline().split()
    try:
        assert int(followed) == invoker.pid
        # Whether or not the shell execs the job (bash may, for a last command).
        assert invoker.pid in lifeline.ancestors(int(job))[:2]
        invoker.kill()
        invoker.wait()
        assert wait_dead(int(job), 5.0), "the job outlived the process that started it"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(job), signal.SIGKILL)


def test_nothing_is_followed_without_an_invoker_among_the_ancestors():
    parent = os.getppid()
    assert lifeline.follow_invoker({}) is None
    assert lifeline.follow_invoker({lifeline.INVOKER_ENV: "garbage"}) is None
    # Not an ancestor (this very process), or an ancestor whose start time is not the token's
    # (its PID was reused).
    assert lifeline.follow_invoker({lifeline.INVOKER_ENV: lifeline.invoker_token()}) is None
    stale = f"{parent}:{(lifeline.start_ticks(parent) or 0) + 1}"
    assert lifeline.follow_invoker({lifeline.INVOKER_ENV: stale}) is None
