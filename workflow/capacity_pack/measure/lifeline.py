"""A measurement's processes die with the process that started them (Linux; elsewhere no-ops).

:func:`dies_with_parent`: a child's ``PR_SET_PDEATHSIG`` (the parent is the forking *thread*,
so children start from the job's main thread; a parent dead before the ``prctl`` is caught by
checking the parent PID). :func:`follow_invoker`: a measurement job watches the Snakemake
process the Snakefile exports (``CAPACITY_PACK_INVOKER``, :func:`invoker_token`) and
terminates itself when it is gone. The simulator keeps its own copy
(``capacity_pack.sim.process.die_with_parent``): it imports nothing of the rest.
Method: docs/cluster.md, 'A measurement's processes die with it'.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("capacity_pack.measure.lifeline")

PR_SET_PDEATHSIG = 1
INVOKER_ENV = "CAPACITY_PACK_INVOKER"
# After SIGTERM, how long a job may take to stop (cancel, flush its records) before SIGKILL.
GRACE_S = 30.0
POLL_S = 0.5

_followed: int | None = None
_follow_lock = threading.Lock()


@functools.cache
def _prctl() -> Callable[..., int] | None:
    # Resolved in the parent, so the child between fork and exec only calls it (no dlopen).
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def dies_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get ``sig`` when this process dies (Linux; None
    elsewhere, which ``subprocess.Popen`` takes as no ``preexec_fn``)."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()
    number = int(sig)

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, number, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: no signal would come
            os.kill(os.getpid(), number)

    return preexec


def _stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the command name (field 3, the state, is first)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (``/proc/PID/stat`` field 22): with the
    PID, it names one process even after the PID is reused."""
    fields = _stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def ancestors(pid: int | None = None) -> list[int]:
    """The PIDs above ``pid`` (default: this process), nearest first, up to PID 1."""
    out: list[int] = []
    current = os.getpid() if pid is None else pid
    while current > 1 and len(out) < 4096:
        fields = _stat(current)
        if not fields:
            break
        current = int(fields[1])
        out.append(current)
    return out


def invoker_token(pid: int | None = None) -> str:
    """``PID:START`` of ``pid`` (default: this process), for ``CAPACITY_PACK_INVOKER``."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_ticks(pid) or 0}"


def _wait_gone(pid: int, start: int) -> None:
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(pid)  # type: ignore[attr-defined]
    # Opened, then checked: the pidfd names the process that still has this start time.
    if pidfd is not None and start_ticks(pid) == start:
        try:
            select.select([pidfd], [], [])
        finally:
            os.close(pidfd)
        return
    if pidfd is not None:
        os.close(pidfd)
    while (fields := _stat(pid)) and fields[0] != "Z" and start_ticks(pid) == start:
        time.sleep(POLL_S)


def _watch(pid: int, start: int, grace_s: float) -> None:
    _wait_gone(pid, start)
    log.warning(
        "the process that started this job (PID %d, Snakemake) is gone: stopping this "
        "measurement (SIGTERM, SIGKILL after %g s)",
        pid,
        grace_s,
    )
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os.kill(os.getpid(), signal.SIGKILL)


def follow_invoker(environ: Mapping[str, str] | None = None, *, grace_s: float = GRACE_S) -> Any:
    """Stop this process when the process named by ``CAPACITY_PACK_INVOKER`` ends, if that
    process is one of this one's ancestors; the followed PID, or None (nothing to follow).

    Once per process: a second call returns the PID already followed.
    """
    global _followed
    env = os.environ if environ is None else environ
    with _follow_lock:
        if _followed is not None:
            return _followed
        pid_text, _, start_text = env.get(INVOKER_ENV, "").partition(":")
        try:
            pid, start = int(pid_text), int(start_text)
        except ValueError:
            return None
        if pid not in ancestors() or start_ticks(pid) != start:
            return None
        threading.Thread(
            target=_watch, args=(pid, start, grace_s), name="follow-invoker", daemon=True
        ).start()
        _followed = pid
        return pid
