"""Start and stop a simulator (``sim serve`` or ``sim cluster``) as a child process.

For the pipeline and the tests: the child binds a free loopback port (``--port 0``), reports it
through ``--port-file``, and is waited for until that file appears (the server then accepts
requests); its control-plane token (:mod:`capacity_pack.sim.control`) is read from the
``--token-file`` it wrote before the port file, for :attr:`SimProcess.control_headers`. Stopping
sends SIGTERM, then SIGKILL after a grace period. On Linux the child also
gets SIGKILL if this process dies, so an interrupted run leaves no server behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from capacity_pack.sim.control import control_headers, read_token


def die_with_parent() -> None:
    """In a child before exec: get SIGKILL when the parent dies (Linux; no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class SimProcess:
    """``python -m capacity_pack.sim COMMAND ARGS --port 0 --port-file ...`` as a context manager.

    ``url`` is ``http://127.0.0.1:PORT`` once started, ``token`` the control-plane token (its
    file: ``token_file``) and ``control_headers`` the header that carries it; ``stderr_text()``
    returns what the child wrote to standard error (kept in a temporary file, so a chatty child
    never blocks).
    """

    def __init__(
        self,
        *args: str,
        command: str = "serve",
        startup_timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.args = list(args)
        self.command = command
        self.startup_timeout_s = startup_timeout_s
        self.env = env
        self._tmp = tempfile.TemporaryDirectory(prefix="capacity-pack-sim-")
        self.port_file = Path(self._tmp.name) / "port"
        self.token_file = Path(self._tmp.name) / "control.token"
        self.token: str | None = None
        self._stderr_path = Path(self._tmp.name) / "stderr.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the simulator is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def control_headers(self) -> dict[str, str]:
        """The header a control-plane request (``/sim/*``, ``/cluster/*``) must carry."""
        if self.token is None:
            raise RuntimeError("the simulator is not started")
        return control_headers(self.token)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stderr_text(self) -> str:
        with contextlib.suppress(FileNotFoundError):
            return self._stderr_path.read_text(errors="replace")
        return ""

    def start(self) -> SimProcess:
        argv = [
            sys.executable,
            "-m",
            "capacity_pack.sim",
            self.command,
            *self.args,
            "--port",
            "0",
            "--port-file",
            str(self.port_file),
            "--token-file",
            str(self.token_file),
        ]
        env = {**os.environ, **(self.env or {})}
        with open(self._stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.port_file.is_file():
                text = self.port_file.read_text().strip()
                if text:
                    self.token = read_token(self.token_file)
                    self.port = int(text)
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"simulator exited with status {self.proc.returncode}:\n{self.stderr_text()}"
                )
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"simulator did not start in {self.startup_timeout_s} s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def close_keeping_log(self, log_path: Path | None, transform: Callable[[str], str]) -> None:
        """Stop, write ``transform`` of what the child printed to ``log_path`` (the child wrote
        to a private temporary file: only the transformed copy, e.g. redacted, is kept), close."""
        self.stop()
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_text(transform(self.stderr_text()))
        self.close()

    def __enter__(self) -> SimProcess:
        return self.start() if self.proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
