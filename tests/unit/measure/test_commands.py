"""The commands a pack config names: each has a timeout from the config, is killed with what it
started when the timeout passes, fails with a one-line error, and its output is redacted."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from capacity_pack.measure.commands import CommandError, copy_redacted, run_command
from capacity_pack.measure.managed import ManagedError, prepare
from capacity_pack.measure.target import TargetError, reset_prefix_cache
from capacity_pack.plan.failure import DrillCommands
from capacity_pack.plan.system import ManagedProcess, OpenAITarget

SECRET = "sk-cmd-secret-8086"


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CP_TEST_API_TOKEN", SECRET)
    return SECRET


def restarting(argv: list[str], timeout_s: float) -> OpenAITarget:
    # Nothing listens on port 9: the restart fails before any request would be sent.
    return OpenAITarget(
        kind="openai",
        base_url="http://127.0.0.1:9",
        cache_reset="restart",
        restart_command=argv,
        restart_timeout_s=timeout_s,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has ended too; only its parent (init here) has not reaped it yet.
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


def test_a_hanging_restart_command_is_killed_and_reported_in_one_line(
    tmp_path: Path, secret: str
) -> None:
    pidfile = tmp_path / "child.pid"
    # A shell that prints the secret, then waits on a child: the whole group must go.
    script = f'echo "restarting with $CP_TEST_API_TOKEN"; sleep 60 & echo $! > {pidfile}; wait'
    target = restarting(["sh", "-c", script], timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(TargetError) as err:
        reset_prefix_cache(target, target.base_url)
    assert time.monotonic() - t0 < 15
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("target.restart_command ['sh', '-c', ")
    assert "did not finish within 1 s (killed)" in message
    assert "restarting with [redacted]" in message and secret not in message
    deadline = time.monotonic() + 5
    while alive(int(pidfile.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(int(pidfile.read_text())), "the command's child outlived the timeout"


def test_a_failing_restart_command_quotes_its_output_redacted(secret: str) -> None:
    target = restarting(["sh", "-c", 'echo "no auth: $CP_TEST_API_TOKEN" >&2; exit 3'], 30)
    with pytest.raises(TargetError) as err:
        reset_prefix_cache(target, target.base_url)
    assert "exited with 3: no auth: [redacted]" in str(err.value)
    assert secret not in str(err.value)


def test_every_command_has_a_finite_positive_timeout_with_a_default() -> None:
    assert restarting(["true"], 600).restart_timeout_s == 600
    base = {"kind": "openai", "base_url": "http://h:1", "cache_reset": "none"}
    assert OpenAITarget(**base).restart_timeout_s == 600
    assert ManagedProcess(command=["srv"]).prepare_timeout_s == 1800
    assert DrillCommands(inject=["kill"]).timeout_s == 60
    for bad in (0, -1, math.inf, math.nan, 1e9):
        with pytest.raises(ValidationError, match="restart_timeout_s"):
            OpenAITarget(**base, restart_timeout_s=bad)
        with pytest.raises(ValidationError, match="prepare_timeout_s"):
            ManagedProcess(command=["srv"], prepare_timeout_s=bad)
        with pytest.raises(ValidationError, match="timeout_s"):
            DrillCommands(inject=["kill"], timeout_s=bad)


def test_managed_prepare_is_killed_at_its_timeout() -> None:
    with pytest.raises(ManagedError, match=r"did not finish within 0.5 s \(killed\)"):
        prepare([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=0.5)


def test_run_command_redacts_both_streams_and_reports_a_missing_program(secret: str) -> None:
    done = run_command(
        ["sh", "-c", 'echo "out $CP_TEST_API_TOKEN"; echo "err $CP_TEST_API_TOKEN" >&2'],
        timeout_s=30,
    )
    assert done.returncode == 0
    assert (done.stdout, done.stderr) == ("out [redacted]\n", "err [redacted]\n")
    late = run_command(["sleep", "60"], timeout_s=0.3, what="drill command")
    assert late.timed_out and late.returncode is None
    assert late.summary() == "['sleep', '60'] did not finish within 0.3 s (killed)"
    with pytest.raises(CommandError, match="drill command .* could not start"):
        run_command(["/nonexistent/inject"], timeout_s=1, what="drill command")


def test_a_childs_private_log_reaches_the_results_redacted(tmp_path: Path, secret: str) -> None:
    private = tmp_path / "private.log"
    private.write_text(f"loaded with key {secret}\nready\n")
    kept = tmp_path / "results" / "server.log"
    copy_redacted(private, kept)
    assert kept.read_text() == "loaded with key [redacted]\nready\n"
