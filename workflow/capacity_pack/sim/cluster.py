"""N simulated replicas behind a router: the target of replica-failure drills.

``capacity-pack sim cluster --replicas N`` starts N ``sim serve`` processes on free loopback
ports (replica ``i`` labels its metrics ``engine="i"`` and its ground-truth lines
``"replica": i``; all share one ground-truth file, each line written by a single append) and
serves the same OpenAI API in front of them:

- routing: ``round_robin`` (the next healthy replica in turn) or ``least_outstanding`` (the
  healthy replica with the fewest requests in flight through the router; ties go round robin);
- admission control (``admission_max_outstanding`` K > 0): while every healthy replica has K or
  more requests outstanding, a completion is refused at once with 429 ``RateLimitError`` and
  ``Retry-After: 1``, no replica contacted;
- retries: a forward that fails before any response header arrived (connection refused or reset:
  the replica died and the health loop has not noticed yet) takes that replica out of rotation
  and is retried, up to ``retries`` times, on healthy replicas this request has not tried; a
  response is never retried once its headers arrived, so a stream cut mid-way reaches the client
  as a dropped connection;
- health: every ``health_interval_s`` each replica's process is polled and ``GET /health`` asked
  (1 s timeout, emulated link latency included, at most one check in flight per replica); a dead
  process, a refused connection or an error answer takes the replica out of rotation at once, a
  check left unanswered only the second time running (Envoy's ``unhealthy_threshold``,
  Kubernetes' ``failureThreshold``: one late answer of a loaded replica is not a death), and a
  passing check puts it back;
- supervision (``restart_after_s`` S): a replica whose process the health loop finds dead is
  started again (same index and port, cold cache) S seconds later, like a restarted pod;
- cold start (``cold_start_s`` C): a replica spawned after the cluster is up (restart or
  scale-out) listens only C seconds after it starts, as a real engine loads its weights first;
  ``router:replica_starting`` is 1 meanwhile;
- link emulation between the router and one replica: a forwarded request leaves ``latency_ms``
  late, and the response head and each response chunk are released ``latency_ms`` after they
  arrived (a pipeline delay, order kept); a bandwidth limit on responses is one token bucket per
  replica (16 KiB burst) shared by all its streams; health checks cross the latency both ways;
- ``GET /metrics``: the router's own ``router:*`` series, then every live replica's metric
  families merged (one ``# HELP``/``# TYPE`` per family, the replicas told apart by the
  ``engine`` label, as vLLM labels its data-parallel engines). Router series:
  ``replica_up``, ``replica_starting`` (spawned, not yet healthy: loading),
  ``replica_outstanding_requests``, ``replica_health_rtt_seconds`` (gauges,
  per ``replica``; the RTT is measured, the configured link is not exported, and a replica out of
  rotation, or whose last check went unanswered, has none);
  ``requests_total``, ``upstream_errors_total``, ``retries_total`` (per failed replica),
  ``relay_failures_total`` (streams cut mid-response), ``relayed_bytes_total``,
  ``replica_starts_total`` (per ``replica``); ``responses_total`` (per ``code``, every response
  of the completion routes, router-made or relayed); ``admission_rejected_total`` and
  ``no_replica_total``;
- control: ``GET /cluster/replicas``; ``POST /cluster/replicas/{i}/kill`` and ``.../restart``
  with ``{"delay_s": s}`` or ``{"at_unix_ns": t}`` (kill is SIGKILL; restart starts a fresh
  process on the same port); ``POST /cluster/replicas/add`` (same timing keys; a new replica,
  the next index, joins rotation once healthy; answers its index);
  ``POST /cluster/replicas/{i}/link`` with ``{"latency_ms", "bandwidth_bytes_per_s"}`` (0: no
  limit; both 0: a clean link) and the timing keys; ``POST /sim/faults?replica=i`` forwards
  fault settings to one replica or, without ``replica``, to all (``POST /sim/stall`` likewise);
  ``POST /reset_prefix_cache`` resets every replica;
- ``GET /cluster/events?since_ns=N``: the router's event log, ``{"unix_ns", "replica", "event",
  "detail"}`` with strictly increasing ``unix_ns`` (those after N): ``spawned``, ``ready``,
  ``removed`` (the detail starts with the reason: ``process dead``, ``health check failed``,
  ``upstream connect failure``, ``mid-stream failure``, ``restart``), ``killed``,
  ``restart_scheduled``, ``restarted``, ``added``, ``link_changed``,
  ``admission_shedding_started`` and ``admission_shedding_stopped`` (after 1 s with nothing
  shed).

Control plane: every ``/sim/*`` and ``/cluster/*`` route (reads included) needs the router's
``X-Sim-Control-Token``, bodies are JSON only, and every route needs a ``Host`` naming the bound
address (:mod:`capacity_pack.sim.control`); ``/reset_prefix_cache`` needs no token, as vLLM's. Each
replica has a token of its own, drawn by the router and given to its process through
``CAPACITY_PACK_SIM_CONTROL_TOKEN``: the router sends it with every control call it forwards,
and a page that finds a replica's port gets 401 there too.

Replica processes die with the router (``PR_SET_PDEATHSIG`` on Linux) so that a killed router
leaves no orphans behind.

**Other engines as replicas** (``--replica-command``): the replicas need not be simulated. Given
an argv with ``{port}`` (and optionally ``{host}``, ``{tmpdir}``) placeholders, each replica is
that command on a free loopback port the router picks (kept across restarts) and its own
temporary directory, ready when ``GET`` of ``ready_path`` answers 200 (llama.cpp's
``llama-server``, vLLM, SGLang: ``/health``); its output goes to ``replica-<i>.log`` in the
cluster's directory. Routing, admission control, retries, health checks, supervision, link
emulation, kills, restarts and scale-out are the same; a restarted replica's load time is its
own (``cold_start_s`` delays only simulated replicas), ``/sim/*`` has nothing to reach, and
``/tokenize``, ``/detokenize`` and ``/props`` are relayed as the completions are (uncounted).
``upstream_keep_alive`` False opens a connection per forwarded request, for a server that drops
reused connections (llama-server does after a few streamed responses).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import json
import logging
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from capacity_pack.sim import metrics as m
from capacity_pack.sim.control import TOKEN_ENV, control_headers
from capacity_pack.sim.process import die_with_parent
from capacity_pack.sim.server import InjectedDisconnect, error_response

log = logging.getLogger("capacity_pack.sim.cluster")

Policy = Literal["round_robin", "least_outstanding"]
_FORWARD_HEADERS = ("content-type", "x-request-id", "authorization")
# The routes whose responses are counted and which admission control guards: the ones that cost
# an engine work.
_GENERATE_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
_HEALTH_TIMEOUT_S = 1.0
# Unanswered checks in a row that take a healthy replica out of rotation.
_UNANSWERED_THRESHOLD = 2
# How long a refused or reset probe waits for a dying replica's exit status to show.
_EXIT_GRACE_S = 0.05
_NO_ANSWER = f"health check failed (no answer in {_HEALTH_TIMEOUT_S:g} s)"
# A shedding episode ends once nothing was shed for as long as shed clients are told to wait, so
# a router at its limit logs one start and one stop rather than a pair per request.
_SHED_QUIET_S = 1.0
LINK_BURST_BYTES = 16 * 1024


class Link:
    """The emulated network path between the router and one replica."""

    def __init__(self) -> None:
        self.latency_s = 0.0
        self.rate = 0.0
        self._tokens = float(LINK_BURST_BYTES)
        self._stamp: float | None = None

    @property
    def clean(self) -> bool:
        return self.latency_s == 0.0 and self.rate == 0.0

    def set(self, latency_s: float, rate: float) -> None:
        self.latency_s, self.rate = latency_s, rate
        self._tokens, self._stamp = float(LINK_BURST_BYTES), None

    def release_at(self, arrived: float, size: int) -> float:
        """When a chunk of ``size`` bytes that reached the router at ``arrived`` (loop clock)
        goes on to the client: once the shared bucket has earned its bytes, plus the latency.
        Reserving in arrival order keeps every stream of the link within ``rate``."""
        wait = 0.0
        if self.rate > 0:
            if self._stamp is not None:
                earned = max(0.0, arrived - self._stamp) * self.rate
                self._tokens = min(float(LINK_BURST_BYTES), self._tokens + earned)
            self._stamp = arrived
            self._tokens -= size
            if self._tokens < 0:
                wait = -self._tokens / self.rate
        return arrived + wait + self.latency_s

    def describe(self) -> dict[str, float]:
        return {"latency_ms": self.latency_s * 1e3, "bandwidth_bytes_per_s": self.rate}


class _Relay(StreamingResponse):
    """A proxied response whose upstream is released however the relay ends: completed, cut
    by the replica, or abandoned by a client that left before the first byte."""

    def __init__(self, content: Any, release: Any, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()


class RouterView:
    """What the router knows of one replica: its rotation state and counters, the fields
    :func:`router_families` exports (the live :class:`Replica` and the virtual-time fleet's)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.healthy = False
        self.state = "starting"
        self.outstanding = 0
        self.requests_total = 0
        self.upstream_errors_total = 0
        self.retries_total = 0
        self.relay_failures_total = 0
        self.relayed_bytes_total = 0
        self.health_rtt_s: float | None = None
        self.starts = 0


class Replica(RouterView):
    """One replica process and what the router knows about it."""

    def __init__(self, index: int, port_file: Path) -> None:
        super().__init__(index)
        self.port_file = port_file
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.last_change_ns = time.time_ns()
        self.link = Link()
        # The replica's control token, handed to each of its processes through the environment
        # (kept across restarts), so the router can forward control calls to it.
        self.token = secrets.token_urlsafe(32)
        # Taken away on purpose (the cluster is stopping): the supervisor leaves it dead.
        self.removed = False
        self.restart_timer: asyncio.Handle | None = None
        self.restart_at_s: float | None = None
        self.check_task: asyncio.Task[None] | None = None
        self.unanswered = 0  # health checks in a row that timed out

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def describe(self) -> dict[str, Any]:
        return {
            "replica": self.index,
            "port": self.port,
            "pid": self.proc.pid if self.proc else None,
            "state": self.state,
            "healthy": self.healthy,
            "outstanding": self.outstanding,
            "requests_total": self.requests_total,
            "upstream_errors_total": self.upstream_errors_total,
            "retries_total": self.retries_total,
            "relay_failures_total": self.relay_failures_total,
            "relayed_bytes_total": self.relayed_bytes_total,
            "health_rtt_s": self.health_rtt_s,
            "starts": self.starts,
            "last_change_unix_ns": self.last_change_ns,
            "restart_at_unix_s": self.restart_at_s,
            "link": self.link.describe(),
        }


class _Pipe:
    """Carries one upstream response to the client across the replica's emulated link."""

    def __init__(self, cluster: Cluster, r: Replica, upstream: httpx.Response) -> None:
        self.cluster = cluster
        self.r = r
        self.upstream = upstream
        self._raw = upstream.aiter_raw()
        self._queue: asyncio.Queue[tuple[float, Any]] | None = None
        self._reader: asyncio.Task[None] | None = None

    def pipeline(self) -> None:
        """From now on a reader drains the replica as it sends, so each chunk's delay runs
        from its own arrival, not from the release of the chunk before it."""
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._reader = asyncio.get_running_loop().create_task(self._read(self._queue))

    async def chunks(self) -> AsyncIterator[bytes]:
        r = self.r
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self._queue is None and not r.link.clean:
                    self.pipeline()
                if self._queue is None:
                    try:
                        chunk = await anext(self._raw)
                    except StopAsyncIteration:
                        return
                else:
                    release_at, item = await self._queue.get()
                    wait = release_at - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    if item is None:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    chunk = item
                r.relayed_bytes_total += len(chunk)
                yield chunk
        except httpx.TransportError as err:
            r.relay_failures_total += 1
            self.cluster.mark_failed(r, f"mid-stream failure ({type(err).__name__})")
            # The replica died mid-response: drop the client's connection the same way.
            raise InjectedDisconnect(f"replica {r.index} failed mid-response") from None

    async def _read(self, queue: asyncio.Queue[tuple[float, Any]]) -> None:
        link = self.r.link
        loop = asyncio.get_running_loop()
        end: Exception | None = None
        try:
            async for chunk in self._raw:
                queue.put_nowait((link.release_at(loop.time(), len(chunk)), chunk))
        except Exception as err:
            end = err
        # The end of the response, or the replica's failure, crosses the link like the data.
        queue.put_nowait((loop.time() + link.latency_s, end))

    async def close(self) -> None:
        self.r.outstanding -= 1
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self.upstream.aclose()


class Cluster:
    """Spawns, health-checks, routes to, kills, restarts and adds the replicas."""

    def __init__(
        self,
        replicas: int,
        serve_args: list[str],
        *,
        policy: Policy = "least_outstanding",
        health_interval_s: float = 0.5,
        startup_timeout_s: float = 60.0,
        workdir: Path | None = None,
        actions: list[tuple[str, int, float]] | None = None,
        seed: int = 0,
        admission_max_outstanding: int = 0,
        retries: int = 1,
        restart_after_s: float | None = None,
        add_at_s: Sequence[float] = (),
        cold_start_s: float = 0.0,
        replica_command: Sequence[str] | None = None,
        ready_path: str = "/health",
        upstream_keep_alive: bool = True,
    ) -> None:
        if replicas < 1:
            raise ValueError("a cluster needs at least one replica")
        if admission_max_outstanding < 0:
            raise ValueError("admission_max_outstanding must be >= 0 (0: off)")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        if restart_after_s is not None and restart_after_s < 0:
            raise ValueError("restart_after_s must be >= 0")
        self.serve_args = serve_args
        self.policy = policy
        self.health_interval_s = health_interval_s
        self.startup_timeout_s = startup_timeout_s
        self.admission_max_outstanding = admission_max_outstanding
        self.retries = retries
        self.restart_after_s = restart_after_s
        self.cold_start_s = cold_start_s
        self.replica_command = list(replica_command) if replica_command else None
        if self.replica_command is not None and not any(
            "{port}" in a for a in self.replica_command
        ):
            raise ValueError("a replica command needs a {port} placeholder")
        self.ready_path = ready_path
        self.upstream_keep_alive = upstream_keep_alive
        self._up = False  # set once the initial replicas serve: later spawns start cold
        self._tmp = tempfile.TemporaryDirectory(prefix="capacity-pack-cluster-")
        self._base = workdir or Path(self._tmp.name)
        self.replicas = [self._new_replica(i) for i in range(replicas)]
        # Indices handed out, scheduled additions included, so an add answers its index at once.
        self._reserved = replicas
        self._rr = 0
        self.no_replica_total = 0
        self.admission_rejected_total = 0
        self.responses_total: collections.Counter[int] = collections.Counter()
        self.events: list[dict[str, Any]] = []
        self._last_event_ns = 0
        self._shedding = False
        self._shed_count = 0
        self._shed_last = 0.0
        self._shed_last_ns = 0
        self._stopping = False
        self._client: httpx.AsyncClient | None = None
        self._health_task: asyncio.Task[None] | None = None
        # (loop time due, handle): uvloop returns a plain Handle, without when(), for a zero
        # delay, so the due time is kept beside it.
        self._timers: list[tuple[float, asyncio.Handle]] = []
        self._initial_actions = actions or []
        self._initial_adds = list(add_at_s)
        self.seed = seed

    def _new_replica(self, index: int) -> Replica:
        return Replica(index, self._base / f"replica-{index}.port")

    def replica(self, index: int) -> Replica | None:
        return next((r for r in self.replicas if r.index == index), None)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=2.0, read=None, write=10.0, pool=None),
            limits=httpx.Limits(
                max_connections=4096,
                max_keepalive_connections=512 if self.upstream_keep_alive else 0,
            ),
            trust_env=False,
        )
        try:
            for r in self.replicas:
                self._spawn(r)
            await asyncio.gather(*(self._await_up(r) for r in self.replicas))
        except BaseException:
            await self.stop()
            raise
        self._up = True
        self._health_task = asyncio.get_running_loop().create_task(self._health_loop())
        for action, index, at_s in self._initial_actions:
            self.schedule(action, index, at_s)
        for at_s in self._initial_adds:
            self.schedule_add(at_s)

    async def stop(self) -> None:
        self._stopping = True
        for _, t in self._timers:
            t.cancel()
        for r in self.replicas:
            r.removed = True
            self._cancel_restart(r)
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        checks = [r.check_task for r in self.replicas if r.check_task is not None]
        for task in checks:
            task.cancel()
        await asyncio.gather(*checks, return_exceptions=True)
        for r in self.replicas:
            self._terminate(r, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for r in self.replicas:
            if r.proc is not None:
                try:
                    r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    r.proc.kill()
                    r.proc.wait()
        if self._client is not None:
            await self._client.aclose()
        self._tmp.cleanup()

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

    # -- control ----------------------------------------------------------------------------

    def _later(self, delay_s: float, fn: Callable[..., None], *args: Any) -> asyncio.Handle:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._timers = [(w, t) for w, t in self._timers if not t.cancelled() and w > now]
        handle = loop.call_later(max(0.0, delay_s), fn, *args)
        self._timers.append((now + max(0.0, delay_s), handle))
        return handle

    def _live(self, index: int, action: str) -> Replica | None:
        r = self.replica(index)
        if r is None:
            log.warning("%s: replica %d was not added yet", action, index)
        return r

    def kill(self, index: int) -> None:
        r = self._live(index, "kill")
        if r is None:
            return
        pid = r.proc.pid if r.proc else None
        self._terminate(r, signal.SIGKILL)
        r.state = "killed"
        self._event(index, "killed", f"SIGKILL to pid {pid}")

    def restart(self, index: int) -> None:
        r = self._live(index, "restart")
        if r is None:
            return
        self._cancel_restart(r)
        self._set(r, "starting", False, "restart on request")
        if r.proc is not None and r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()
        self._event(index, "restarted", "on request")
        self._spawn(r)

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self._reserved:
            raise ValueError(f"no replica {index} (replicas: 0..{self._reserved - 1})")

    def schedule(self, action: str, index: int, delay_s: float) -> float:
        """Run ``action`` on replica ``index`` after ``delay_s``; returns the Unix time."""
        self._check_index(index)
        fn = {"kill": self.kill, "restart": self.restart}.get(action)
        if fn is None:
            raise ValueError(f"unknown action {action!r} (kill, restart, link)")
        self._later(delay_s, fn, index)
        return time.time() + max(0.0, delay_s)

    def schedule_add(self, delay_s: float) -> tuple[int, float]:
        """Add a replica after ``delay_s``; returns its index and the Unix time."""
        index = self._reserved
        self._reserved += 1
        self._later(delay_s, self.add, index)
        return index, time.time() + max(0.0, delay_s)

    def add(self, index: int) -> None:
        if self._stopping:
            return
        r = self._new_replica(index)
        self.replicas.append(r)
        self.replicas.sort(key=lambda x: x.index)
        self._event(index, "added", "scale-out")
        # The health loop picks up its port file and puts it in rotation once a probe passes.
        self._spawn(r)

    def schedule_link(
        self, index: int, latency_ms: float, bandwidth_bytes_per_s: float, delay_s: float
    ) -> float:
        """Set the link to replica ``index`` after ``delay_s``; returns the Unix time."""
        self._check_index(index)
        for name, value in (
            ("latency_ms", latency_ms),
            ("bandwidth_bytes_per_s", bandwidth_bytes_per_s),
        ):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0")
        self._later(delay_s, self.set_link, index, latency_ms / 1e3, bandwidth_bytes_per_s)
        return time.time() + max(0.0, delay_s)

    def set_link(self, index: int, latency_s: float, bandwidth_bytes_per_s: float) -> None:
        r = self._live(index, "link")
        if r is None:
            return
        r.link.set(latency_s, bandwidth_bytes_per_s)
        if r.link.clean:
            detail = "clean"
        else:
            rate = f"{bandwidth_bytes_per_s:g} B/s" if bandwidth_bytes_per_s else "unlimited"
            detail = f"latency {latency_s * 1e3:g} ms, bandwidth {rate}"
        self._event(index, "link_changed", detail)

    # -- routing ----------------------------------------------------------------------------

    def pick(self, exclude: Collection[int] = ()) -> Replica | None:
        live = [r for r in self.replicas if r.healthy and r.index not in exclude]
        if not live:
            return None
        self._rr += 1
        if self.policy == "round_robin":
            return live[self._rr % len(live)]
        low = min(r.outstanding for r in live)
        tied = [r for r in live if r.outstanding == low]
        return tied[self._rr % len(tied)]

    def mark_failed(self, r: Replica, reason: str = "upstream connect failure") -> None:
        r.upstream_errors_total += 1
        self._set(r, "killed" if r.state == "killed" else "unhealthy", False, reason)

    async def proxy(self, request: Request) -> Response:
        response = await self._route(request)
        if request.url.path in _GENERATE_PATHS:
            self.responses_total[response.status_code] += 1
        return response

    async def _route(self, request: Request) -> Response:
        assert self._client is not None
        body = await request.body()
        live = [r for r in self.replicas if r.healthy]
        if not live:
            self.no_replica_total += 1
            return error_response(503, "ServiceUnavailableError", "no healthy replica")
        limit = self.admission_max_outstanding
        if (
            limit
            and request.url.path in _GENERATE_PATHS
            and all(r.outstanding >= limit for r in live)
        ):
            return self._shed()
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARD_HEADERS}
        tried: set[int] = set()
        while True:
            r = self.pick(exclude=tried)
            if r is None:
                self.no_replica_total += 1
                return error_response(503, "ServiceUnavailableError", "no healthy replica")
            r.outstanding += 1
            r.requests_total += 1
            try:
                if r.link.latency_s:
                    await asyncio.sleep(r.link.latency_s)
                upstream = await self._client.send(
                    self._client.build_request(
                        request.method, f"{r.url}{request.url.path}", content=body, headers=headers
                    ),
                    stream=True,
                )
            except httpx.TransportError as err:
                r.outstanding -= 1
                self.mark_failed(r, f"upstream connect failure ({type(err).__name__})")
                tried.add(r.index)
                # No response header came, so the client has seen nothing yet and another
                # replica can still serve the request whole.
                others = any(x.healthy and x.index not in tried for x in self.replicas)
                if len(tried) <= self.retries and others:
                    r.retries_total += 1
                    continue
                tried_text = ", ".join(str(i) for i in sorted(tried))
                return error_response(
                    502,
                    "BadGatewayError",
                    f"replica {r.index} unreachable: {type(err).__name__} "
                    f"(replicas tried: {tried_text})",
                )
            except BaseException:
                r.outstanding -= 1
                raise
            arrived = asyncio.get_running_loop().time()
            pipe = _Pipe(self, r, upstream)
            if r.link.latency_s:
                # The response head crosses the link too; the body is read meanwhile, so its
                # chunks keep their own arrival times.
                pipe.pipeline()
                try:
                    await asyncio.sleep(
                        arrived + r.link.latency_s - asyncio.get_running_loop().time()
                    )
                except BaseException:
                    await pipe.close()
                    raise
            out_headers = {
                k: v for k, v in upstream.headers.items() if k in ("content-type", "x-request-id")
            }
            out_headers["x-sim-replica"] = str(r.index)
            return _Relay(
                pipe.chunks(), pipe.close, status_code=upstream.status_code, headers=out_headers
            )

    def _shed(self) -> Response:
        limit = self.admission_max_outstanding
        self.admission_rejected_total += 1
        self._shed_last = time.monotonic()
        self._shed_last_ns = time.time_ns()
        self._shed_count += 1
        if not self._shedding:
            self._shedding = True
            self._shed_count = 1
            self._event(
                None,
                "admission_shedding_started",
                f"every healthy replica has {limit} or more requests outstanding",
            )
            self._later(_SHED_QUIET_S, self._shed_check)
        response = error_response(
            429,
            "RateLimitError",
            f"admission control shed the request: every healthy replica has {limit} or more "
            "requests outstanding",
        )
        response.headers["Retry-After"] = "1"
        return response

    def _shed_check(self) -> None:
        quiet = time.monotonic() - self._shed_last
        if quiet < _SHED_QUIET_S:
            self._later(_SHED_QUIET_S - quiet, self._shed_check)
            return
        self._shedding = False
        self._event(
            None,
            "admission_shedding_stopped",
            f"nothing shed for {_SHED_QUIET_S:g} s; {self._shed_count} shed in this episode, the "
            f"last at unix_ns {self._shed_last_ns}",
        )

    # -- observability ----------------------------------------------------------------------

    async def metrics_text(self) -> str:
        assert self._client is not None

        async def scrape(r: Replica) -> str | None:
            if not r.healthy:
                return None
            try:
                resp = await self._client.get(f"{r.url}/metrics", timeout=2.0)
                return resp.text if resp.status_code == 200 else None
            except httpx.HTTPError:
                return None

        scraped = list(self.replicas)  # a replica added meanwhile is in the next scrape
        texts = await asyncio.gather(*(scrape(r) for r in scraped))
        return router_exposition(
            self.replicas,
            self.responses_total,
            self.admission_rejected_total,
            self.no_replica_total,
            [(r.index, text) for r, text in zip(scraped, texts, strict=True)],
            label_engines=self.replica_command is not None,
        )


def router_exposition(
    replicas: Sequence[RouterView],
    responses_total: collections.Counter[int],
    admission_rejected_total: int,
    no_replica_total: int,
    replica_texts: Sequence[tuple[int, str | None]],
    *,
    label_engines: bool = False,
) -> str:
    """The router's ``/metrics``: its own ``router:*`` families (:func:`router_families`),
    then every replica's exposition merged. ``label_engines``: add ``engine="i"`` to replica
    series that lack it (another engine's)."""
    x = router_families(replicas, responses_total, admission_rejected_total, no_replica_total)
    merged: dict[str, m.MetricFamily] = {}
    for index, text in replica_texts:
        if text is None:
            continue
        try:
            families = m.parse(text)
        except m.ExpositionError as err:
            log.warning("replica %d: /metrics not merged: %s", index, err)
            continue
        if label_engines:
            # A simulated replica labels its series engine="i" itself (vLLM's data-parallel
            # label); another engine's are labelled here, so replicas stay apart.
            for fam in families.values():
                for sample in fam.samples:
                    if sample.label("engine") is None:
                        sample.labels.append(("engine", str(index)))
        for name, fam in families.items():
            if name in merged:
                merged[name].samples.extend(fam.samples)
            else:
                merged[name] = fam
    for fam in merged.values():
        x.raw_family(fam)
    return x.text()


def router_families(
    replicas: Sequence[RouterView],
    responses_total: collections.Counter[int],
    admission_rejected_total: int,
    no_replica_total: int,
) -> m.Exposition:
    """The router's own ``router:*`` families from ``replicas``. One home for the live router
    and the virtual-time fleet (:mod:`capacity_pack.sim.fleet`)."""
    x = m.Exposition()
    lab = [(r, [("replica", str(r.index))]) for r in replicas]
    x.gauge(
        "router:replica_up",
        "1 while the replica is in rotation.",
        [(labels, 1.0 if r.healthy else 0.0) for r, labels in lab],
    )
    x.gauge(
        "router:replica_starting",
        "1 while a spawned replica has not yet passed its first health check (loading).",
        [(labels, 1.0 if r.state == "starting" else 0.0) for r, labels in lab],
    )
    x.gauge(
        "router:replica_outstanding_requests",
        "Requests in flight through the router.",
        [(labels, r.outstanding) for r, labels in lab],
    )
    x.gauge(
        "router:replica_health_rtt_seconds",
        "Round-trip time of the last answered health check.",
        [(labels, r.health_rtt_s) for r, labels in lab if r.health_rtt_s is not None],
    )
    x.counter(
        "router:requests_total",
        "Requests routed to each replica (each retry attempt counts).",
        [(labels, r.requests_total) for r, labels in lab],
    )
    x.counter(
        "router:upstream_errors_total",
        "Connection failures to each replica, before or during a response.",
        [(labels, r.upstream_errors_total) for r, labels in lab],
    )
    x.counter(
        "router:retries_total",
        "Requests retried elsewhere after failing to reach this replica.",
        [(labels, r.retries_total) for r, labels in lab],
    )
    x.counter(
        "router:relay_failures_total",
        "Responses cut mid-way because the replica failed.",
        [(labels, r.relay_failures_total) for r, labels in lab],
    )
    x.counter(
        "router:relayed_bytes_total",
        "Response bytes relayed from each replica.",
        [(labels, r.relayed_bytes_total) for r, labels in lab],
    )
    x.counter(
        "router:replica_starts_total",
        "Processes started for each replica.",
        [(labels, r.starts) for r, labels in lab],
    )
    x.counter(
        "router:responses_total",
        "Responses to completion requests by HTTP status, router-made or relayed.",
        [([("code", str(code))], n) for code, n in sorted(responses_total.items())],
    )
    x.counter(
        "router:admission_rejected_total",
        "Requests shed by admission control.",
        [([], admission_rejected_total)],
    )
    x.counter(
        "router:no_replica_total",
        "Requests refused because no replica was healthy.",
        [([], no_replica_total)],
    )
    return x


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _json_object(raw: bytes) -> dict[str, Any]:
    data = json.loads(raw) if raw.strip() else {}
    if not isinstance(data, dict):
        raise ValueError("the body must be a JSON object")
    return data


def _delay_s(data: dict[str, Any]) -> float:
    """Seconds from now to the action's time: ``at_unix_ns`` or ``delay_s`` (default now)."""
    if "at_unix_ns" in data:
        delay = (int(data["at_unix_ns"]) - time.time_ns()) / 1e9
    else:
        delay = float(data.get("delay_s", 0.0))
    if not math.isfinite(delay):
        raise ValueError("delay_s must be finite")
    return delay


def _non_negative(data: dict[str, Any], key: str) -> float:
    value = data.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{key} must be a finite number >= 0")
    return float(value)


def cluster_app(cluster: Cluster) -> Starlette:
    """The router's HTTP API around a :class:`Cluster`."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette):
        await cluster.start()
        try:
            yield
        finally:
            await cluster.stop()

    async def health(request: Request) -> Response:
        if any(r.healthy for r in cluster.replicas):
            return Response(status_code=200)
        return error_response(503, "ServiceUnavailableError", "no healthy replica")

    async def metrics(request: Request) -> Response:
        return Response(await cluster.metrics_text(), media_type=m.CONTENT_TYPE)

    async def replicas(request: Request) -> Response:
        return JSONResponse(
            {
                "policy": cluster.policy,
                "admission_max_outstanding": cluster.admission_max_outstanding,
                "retries": cluster.retries,
                "restart_after_s": cluster.restart_after_s,
                "replicas": [r.describe() for r in cluster.replicas],
            }
        )

    async def events(request: Request) -> Response:
        try:
            since_ns = int(request.query_params.get("since_ns", "0"))
        except ValueError:
            return error_response(400, "BadRequestError", "since_ns must be an integer")
        return JSONResponse({"events": cluster.events_since(since_ns)})

    async def control(request: Request) -> Response:
        try:
            index = int(request.path_params["index"])
            action = request.path_params["action"]
            data = _json_object(await request.body())
            when = cluster.schedule(action, index, _delay_s(data))
        except (ValueError, TypeError) as err:
            return error_response(400, "BadRequestError", str(err))
        return JSONResponse(
            {"replica": index, "action": action, "at_unix_s": when}, status_code=202
        )

    async def add(request: Request) -> Response:
        try:
            data = _json_object(await request.body())
            index, when = cluster.schedule_add(_delay_s(data))
        except (ValueError, TypeError) as err:
            return error_response(400, "BadRequestError", str(err))
        return JSONResponse({"replica": index, "action": "add", "at_unix_s": when}, status_code=202)

    async def link(request: Request) -> Response:
        keys = {"latency_ms", "bandwidth_bytes_per_s", "delay_s", "at_unix_ns"}
        try:
            index = int(request.path_params["index"])
            data = _json_object(await request.body())
            unknown = sorted(set(data) - keys)
            if unknown:
                raise ValueError(f"unknown keys {unknown} (allowed: {sorted(keys)})")
            latency_ms = _non_negative(data, "latency_ms")
            bandwidth = _non_negative(data, "bandwidth_bytes_per_s")
            when = cluster.schedule_link(index, latency_ms, bandwidth, _delay_s(data))
        except (ValueError, TypeError) as err:
            return error_response(400, "BadRequestError", str(err))
        return JSONResponse(
            {
                "replica": index,
                "action": "link",
                "at_unix_s": when,
                "latency_ms": latency_ms,
                "bandwidth_bytes_per_s": bandwidth,
            },
            status_code=202,
        )

    async def fan_out(request: Request) -> Response:
        assert cluster._client is not None
        body = await request.body()
        which = request.query_params.get("replica")
        targets = [r for r in cluster.replicas if which is None or str(r.index) == which]
        if not targets:
            return error_response(404, "NotFoundError", f"no replica {which}")
        results = []
        for r in targets:
            try:
                resp = await cluster._client.request(
                    request.method,
                    f"{r.url}{request.url.path}",
                    content=body,
                    headers={"content-type": "application/json", **control_headers(r.token)},
                    timeout=5.0,
                )
                results.append(
                    {
                        "replica": r.index,
                        "status": resp.status_code,
                        "body": resp.json() if resp.content else None,
                    }
                )
            except (httpx.HTTPError, ValueError) as err:
                results.append({"replica": r.index, "status": None, "error": str(err)})
        if request.url.path == "/reset_prefix_cache":
            ok = all((x.get("body") or {}).get("reset") for x in results)
            return JSONResponse({"reset": ok, "replicas": results})
        status = 200 if all(x["status"] == 200 for x in results) else 502
        return JSONResponse({"replicas": results}, status_code=status)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(exc.status_code, "NotFoundError", str(exc.detail))

    routes = [
        Route("/v1/completions", cluster.proxy, methods=["POST"]),
        Route("/v1/chat/completions", cluster.proxy, methods=["POST"]),
        Route("/v1/models", cluster.proxy, methods=["GET"]),
        Route("/version", cluster.proxy, methods=["GET"]),
        # Engine routes a load generator may need from a command replica (llama.cpp's).
        Route("/tokenize", cluster.proxy, methods=["POST"]),
        Route("/detokenize", cluster.proxy, methods=["POST"]),
        Route("/props", cluster.proxy, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/reset_prefix_cache", fan_out, methods=["POST"]),
        Route("/sim/faults", fan_out, methods=["GET", "POST"]),
        Route("/sim/stall", fan_out, methods=["POST"]),
        Route("/cluster/replicas", replicas, methods=["GET"]),
        Route("/cluster/events", events, methods=["GET"]),
        Route("/cluster/replicas/add", add, methods=["POST"]),
        Route("/cluster/replicas/{index:int}/link", link, methods=["POST"]),
        Route("/cluster/replicas/{index:int}/{action}", control, methods=["POST"]),
    ]
    return Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error}
    )


def parse_schedule(items: tuple[str, ...], action: str, replicas: int) -> list[tuple[int, float]]:
    """``REPLICA@SECONDS`` items of ``--kill`` / ``--restart`` as (replica, seconds)."""
    out = []
    for item in items:
        try:
            index_text, at_text = item.split("@", 1)
            index, at_s = int(index_text), float(at_text)
        except ValueError:
            raise ValueError(f"--{action} {item!r}: expected REPLICA@SECONDS, e.g. 1@30") from None
        if not 0 <= index < replicas:
            raise ValueError(f"--{action} {item!r}: no replica {index} (0..{replicas - 1})")
        out.append((index, at_s))
    return out
