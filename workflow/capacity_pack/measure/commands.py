"""The commands a pack config names: trusted code, run with a timeout, their output redacted.

A pack config is trusted input: its argv lists (``target.restart_command``,
``target.managed.prepare`` and ``.command``, a drill's ``commands.inject``/``restore``,
``client.shard_launcher``) run as given, no shell, as the user with the whole environment; each
is bounded by its timeout (the table: docs/security.md, 'A pack config is trusted input').
:func:`run_command` runs a short one with stdin from ``/dev/null``, output piped into memory, in a
process group of its own (SIGKILL at the timeout reaches all it started), and redacts what it
printed (:func:`capacity_pack.redact.redact_text`) before anything logs it. A long-lived child
writes to a file in a private temporary folder (a pipe nobody reads would block it), redacted
whole when read back (:func:`copy_redacted`), so a secret cut in two is still matched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from capacity_pack.redact import redact_text, secret_values

# After the group is killed: how long its pipes may take to close (a process that left the group
# with setsid keeps them open; it is then left alone).
DRAIN_S = 5.0
# Characters of output quoted in an error message.
QUOTED_CHARS = 300


class CommandError(RuntimeError):
    """A configured command could not start, did not finish in time, or failed."""


@dataclass(frozen=True)
class CommandResult:
    """One command's outcome; ``stdout`` and ``stderr`` are redacted."""

    argv: list[str]
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    timeout_s: float
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def summary(self) -> str:
        """One line: how the command ended, and the end of what it printed."""
        if self.timed_out:
            head = f"{self.argv} did not finish within {self.timeout_s:g} s (killed)"
        else:
            head = f"{self.argv} exited with {self.returncode}"
        said = one_line(self.stderr) or one_line(self.stdout)
        return f"{head}: {said}" if said else head


def one_line(text: str, limit: int = QUOTED_CHARS) -> str:
    """The end of ``text`` on one line (lines joined by " | "), at most ``limit`` characters."""
    joined = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return joined if len(joined) <= limit else "..." + joined[-limit:]


def redact_output(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` with the environment's secrets and ``secrets`` redacted."""
    return redact_text(text, [*secret_values(), *secrets])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def run_command(
    argv: Sequence[str],
    *,
    timeout_s: float,
    what: str = "command",
    env: dict[str, str] | None = None,
    secrets: Sequence[str] = (),
) -> CommandResult:
    """Run ``argv`` for at most ``timeout_s`` seconds (then SIGKILL to its process group).

    Raises :class:`CommandError` (naming ``what``) when it cannot start; a timeout or a non-zero
    exit is the result's to tell (:meth:`CommandResult.summary`, :func:`check`).
    """
    argv = [str(a) for a in argv]
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except (OSError, ValueError) as err:
        message = f"{what} {argv} could not start: {err}"
        raise CommandError(redact_output(message, secrets)) from None
    returncode: int | None
    try:
        out, err = proc.communicate(timeout=timeout_s)
        returncode = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        returncode = None
        try:
            # What it printed before the timeout is kept by communicate() across the retry.
            out, err = proc.communicate(timeout=DRAIN_S)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            proc.wait()
    except BaseException:  # an interrupt: the command goes with this process
        _kill_group(proc)
        proc.wait()
        raise
    return CommandResult(
        argv=argv,
        returncode=returncode,
        stdout=redact_output(out.decode(errors="replace"), secrets),
        stderr=redact_output(err.decode(errors="replace"), secrets),
        timeout_s=timeout_s,
        seconds=time.monotonic() - t0,
    )


def check(result: CommandResult, what: str) -> CommandResult:
    """``result`` if the command exited 0, else :class:`CommandError` with its one-line summary."""
    if result.returncode != 0:
        raise CommandError(f"{what} {result.summary()}")
    return result


def copy_redacted(src: str | Path, dst: str | Path, secrets: Sequence[str] = ()) -> None:
    """Write ``src``'s text (a child's private log) to ``dst``, redacted."""
    try:
        text = Path(src).read_text(errors="replace")
    except FileNotFoundError:
        text = ""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(redact_output(text, secrets))
