"""The router's replicas as processes: spawned, health-checked, restarted when they die.

A mixin of :class:`capacity_pack.sim.cluster.Cluster`, whose state it reads and changes
(``replicas``, ``events``, the HTTP client, the timers and the settings ``__init__`` sets):

- spawning: a simulated replica is ``sim serve`` on its own port (its port file tells which),
  started cold (``--startup-delay-s``) once the cluster is up; another engine is the replica
  command on a free loopback port kept across restarts, its output in ``replica-<i>.log``;
  every process dies with the router (``PR_SET_PDEATHSIG`` on Linux);
- health: every ``health_interval_s`` each replica's process is polled and its ready path asked
  (1 s timeout, emulated link latency included, at most one check in flight per replica); a dead
  process, a refused connection or an error answer takes the replica out of rotation at once, a
  check left unanswered only the second time running, and a passing check puts it back;
- supervision: a replica whose process the health loop finds dead is started again
  ``restart_after_s`` later;
- the event log (:meth:`ReplicaSupervisor.events_since`) with strictly increasing stamps.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from capacity_pack.sim.control import TOKEN_ENV
from capacity_pack.sim.process import die_with_parent
from capacity_pack.sim.replicas import Replica

log = logging.getLogger("capacity_pack.sim.cluster")

_HEALTH_TIMEOUT_S = 1.0
# Unanswered checks in a row that take a healthy replica out of rotation.
_UNANSWERED_THRESHOLD = 2
# How long a refused or reset probe waits for a dying replica's exit status to show.
_EXIT_GRACE_S = 0.05
_NO_ANSWER = f"health check failed (no answer in {_HEALTH_TIMEOUT_S:g} s)"


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ReplicaSupervisor:
    """Spawns, health-checks and restarts the replicas of a
    :class:`~capacity_pack.sim.cluster.Cluster` (a mixin: the cluster holds the state)."""

    def _spawn(self, r: Replica) -> None:
        if self.replica_command is not None:
            self._spawn_command(r)
            return
        with contextlib.suppress(FileNotFoundError):
            r.port_file.unlink()
        argv = [
            sys.executable,
            "-m",
            "capacity_pack.sim",
            "serve",
            *self.serve_args,
            "--port",
            str(r.port or 0),
            "--port-file",
            str(r.port_file),
            "--engine-index",
            str(r.index),
            "--replica-id",
            str(r.index),
            "--seed",
            str(self.seed + r.index),
        ]
        if self._up and self.cold_start_s > 0:
            argv += ["--startup-delay-s", str(self.cold_start_s)]
        r.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env={**os.environ, TOKEN_ENV: r.token},
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
        )
        r.starts += 1
        self._set(r, "starting", False, "restart")
        port = r.port if r.port else "a free port"
        self._event(r.index, "spawned", f"pid {r.proc.pid} on {port}, start {r.starts}")

    def _spawn_command(self, r: Replica) -> None:
        """Replica ``r`` as the configured command on its own port and directory."""
        if r.port is None:
            r.port = _free_port()
        workdir = self._base / f"replica-{r.index}"
        workdir.mkdir(parents=True, exist_ok=True)
        values = {"{port}": str(r.port), "{host}": "127.0.0.1", "{tmpdir}": str(workdir)}
        argv = []
        for a in self.replica_command or []:
            for key, value in values.items():
                a = a.replace(key, value)
            argv.append(a)
        with open(self.replica_log(r.index), "ab") as out:
            r.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, TOKEN_ENV: r.token},
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
            )
        r.starts += 1
        self._set(r, "starting", False, "restart")
        self._event(r.index, "spawned", f"pid {r.proc.pid} on {r.port}, start {r.starts}")

    def replica_log(self, index: int) -> Path:
        """Where a command replica's output goes (appended across its restarts)."""
        return self._base / f"replica-{index}.log"

    def _log_tail(self, index: int, chars: int = 1500) -> str:
        with contextlib.suppress(FileNotFoundError):
            return self.replica_log(index).read_text(errors="replace")[-chars:]
        return ""

    async def _await_up(self, r: Replica) -> None:
        assert r.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if r.proc.poll() is not None:
                tail = self._log_tail(r.index) if self.replica_command is not None else ""
                raise RuntimeError(
                    f"replica {r.index} exited with status {r.proc.returncode}"
                    + (f":\n{tail}" if tail else "")
                )
            if r.port is None and r.port_file.is_file():
                text = r.port_file.read_text().strip()
                if text:
                    r.port = int(text)
            if r.port is not None:
                ok, why = await self._check(r)
                if ok:
                    self._set(r, "up", True, why)
                    return
            await asyncio.sleep(0.05)
        raise RuntimeError(
            f"replica {r.index} did not become healthy in {self.startup_timeout_s} s"
        )

    def _terminate(self, r: Replica, sig: int) -> None:
        if r.proc is not None and r.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                r.proc.send_signal(sig)

    def _set(self, r: Replica, state: str, healthy: bool, reason: str = "") -> None:
        if r.state != state or r.healthy != healthy:
            log.info("replica %d: %s -> %s", r.index, r.state, state)
            r.last_change_ns = time.time_ns()
        if healthy and not r.healthy:
            self._event(r.index, "ready", reason)
        elif r.healthy and not healthy:
            self._event(r.index, "removed", reason)
            # The last round trip of a replica out of rotation says nothing of its link now; a
            # stale slow probe (one answered as it died) would read as a degraded link.
            r.health_rtt_s = None
        r.state, r.healthy = state, healthy

    def _event(self, replica: int | None, event: str, detail: str = "") -> None:
        # Strictly increasing stamps make ``since_ns`` an exact cursor.
        ns = max(time.time_ns(), self._last_event_ns + 1)
        self._last_event_ns = ns
        self.events.append({"unix_ns": ns, "replica": replica, "event": event, "detail": detail})
        log.info("event %s (replica %s): %s", event, replica, detail)

    def events_since(self, since_ns: int) -> list[dict[str, Any]]:
        start = bisect.bisect_right(self.events, since_ns, key=lambda e: e["unix_ns"])
        return self.events[start:]

    async def _check(self, r: Replica) -> tuple[bool, str]:
        """One health probe: (passed, why), and ``r.health_rtt_s`` when an answer came."""
        assert self._client is not None
        start = time.perf_counter()
        try:
            async with asyncio.timeout(_HEALTH_TIMEOUT_S):
                # The probe crosses the emulated link both ways, as a completion does.
                if r.link.latency_s:
                    await asyncio.sleep(r.link.latency_s)
                resp = await self._client.get(f"{r.url}{self.ready_path}")
                if r.link.latency_s:
                    await asyncio.sleep(r.link.latency_s)
        except TimeoutError:
            return False, _NO_ANSWER
        except httpx.HTTPError as err:
            return False, f"health check failed ({type(err).__name__})"
        r.health_rtt_s = time.perf_counter() - start
        if resp.status_code != 200:
            return False, f"health check failed (status {resp.status_code})"
        return True, f"health check passed in {r.health_rtt_s * 1e3:.1f} ms"

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            for r in list(self.replicas):
                self._health_once(r)

    def _health_once(self, r: Replica) -> None:
        if r.proc is None or r.removed:
            return
        code = r.proc.poll()
        if code is not None:
            state = "killed" if r.state == "killed" else "down"
            self._set(r, state, False, f"process dead (exit status {code})")
            self._supervise(r, code)
            return
        if r.port is None:
            text = r.port_file.read_text().strip() if r.port_file.is_file() else ""
            if not text:
                return
            r.port = int(text)
        # One probe in flight per replica: a slow link delays its own replica's verdicts only,
        # never another replica's death detection.
        if r.check_task is None or r.check_task.done():
            r.check_task = asyncio.get_running_loop().create_task(self._probe(r, r.proc))

    async def _probe(self, r: Replica, proc: subprocess.Popen[bytes]) -> None:
        ok, why = await self._check(r)
        if not ok and why != _NO_ANSWER and proc.poll() is None:
            # The kernel closes a killed process's sockets before the process can be reaped,
            # so a reset or refused probe can beat its exit status: give the exit a moment to
            # show, so the verdict names the death (next check) rather than its symptom.
            await asyncio.sleep(_EXIT_GRACE_S)
        # A verdict on a process that has since died or been replaced is stale.
        if r.proc is not proc or proc.poll() is not None or r.removed:
            return
        r.unanswered = r.unanswered + 1 if why == _NO_ANSWER else 0
        if r.unanswered:
            # Its round trip is unknown now: the last answer's would read as the link's.
            r.health_rtt_s = None
        if ok:
            self._set(r, "up", True, why)
        elif r.healthy and 0 < r.unanswered < _UNANSWERED_THRESHOLD:
            log.info("replica %s: %s (%d in a row; still in rotation)", r.index, why, r.unanswered)
        else:
            self._set(r, r.state if r.state in ("starting", "killed") else "unhealthy", False, why)

    def _supervise(self, r: Replica, code: int) -> None:
        if self.restart_after_s is None or r.removed or r.restart_timer is not None:
            return
        delay = self.restart_after_s
        self._event(
            r.index,
            "restart_scheduled",
            f"process exited with status {code}; restart in {delay:g} s",
        )
        r.restart_at_s = time.time() + delay
        r.restart_timer = self._later(delay, self._supervised_restart, r)

    def _supervised_restart(self, r: Replica) -> None:
        early_s = (r.restart_at_s or 0.0) - time.time()
        if early_s > 0:
            # uvloop counts timers from the loop's clock as cached at the start of its
            # iteration, so one can fire a little early: the restart waits the full delay.
            r.restart_timer = self._later(early_s, self._supervised_restart, r)
            return
        r.restart_timer, r.restart_at_s = None, None
        if r.removed or (r.proc is not None and r.proc.poll() is None):
            return
        self._event(r.index, "restarted", "by the supervisor")
        self._spawn(r)

    def _cancel_restart(self, r: Replica) -> None:
        if r.restart_timer is not None:
            r.restart_timer.cancel()
        r.restart_timer, r.restart_at_s = None, None

    def _later(self, delay_s: float, fn: Callable[..., None], *args: Any) -> asyncio.Handle:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._timers = [(w, t) for w, t in self._timers if not t.cancelled() and w > now]
        handle = loop.call_later(max(0.0, delay_s), fn, *args)
        self._timers.append((now + max(0.0, delay_s), handle))
        return handle
