"""N simulated replicas behind a router: the target of replica-failure drills.

``capacity-pack sim cluster --replicas N`` starts N ``sim serve`` processes on free loopback
ports (replica ``i`` labels its metrics ``engine="i"`` and its ground-truth lines
``"replica": i``; all share one ground-truth file, each line written by a single append) and
serves the same OpenAI API in front of them:

- routing: ``round_robin`` (the next healthy replica in turn) or ``least_outstanding`` (the
  healthy replica with the fewest requests in flight through the router; ties go round robin);
  no retries, so a client sees what a replica failure does to its requests;
- health: every ``health_interval_s`` each replica's process is polled and ``GET /health`` asked
  (1 s timeout); a dead process, a failed check or a refused connection takes the replica out of
  rotation at once, and a passing check puts it back;
- ``GET /metrics``: the router's own ``router:*`` series per replica, then every live replica's
  metric families merged (one ``# HELP``/``# TYPE`` per family, the replicas told apart by the
  ``engine`` label, as vLLM labels its data-parallel engines);
- control: ``GET /cluster/replicas``; ``POST /cluster/replicas/{i}/kill`` and ``.../restart``
  with ``{"delay_s": s}`` or ``{"at_unix_ns": t}`` (kill is SIGKILL; restart starts a fresh
  process on the same port); ``POST /sim/faults?replica=i`` forwards fault settings to one
  replica or, without ``replica``, to all; ``POST /reset_prefix_cache`` resets every replica.

Replica processes die with the router (``PR_SET_PDEATHSIG`` on Linux) so that a killed router
leaves no orphans behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from capacity_pack.sim import metrics as m
from capacity_pack.sim.process import die_with_parent
from capacity_pack.sim.server import InjectedDisconnect, error_response

log = logging.getLogger("capacity_pack.sim.cluster")

Policy = Literal["round_robin", "least_outstanding"]
_FORWARD_HEADERS = ("content-type", "x-request-id", "authorization")


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


class Replica:
    """One replica process and what the router knows about it."""

    def __init__(self, index: int, port_file: Path) -> None:
        self.index = index
        self.port_file = port_file
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.healthy = False
        self.state = "starting"
        self.outstanding = 0
        self.requests_total = 0
        self.upstream_errors_total = 0
        self.starts = 0
        self.last_change_ns = time.time_ns()

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
            "starts": self.starts,
            "last_change_unix_ns": self.last_change_ns,
        }


class Cluster:
    """Spawns, health-checks, routes to, kills and restarts the replicas."""

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
    ) -> None:
        if replicas < 1:
            raise ValueError("a cluster needs at least one replica")
        self.serve_args = serve_args
        self.policy = policy
        self.health_interval_s = health_interval_s
        self.startup_timeout_s = startup_timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="capacity-pack-cluster-")
        base = workdir or Path(self._tmp.name)
        self.replicas = [Replica(i, base / f"replica-{i}.port") for i in range(replicas)]
        self._rr = 0
        self.no_replica_total = 0
        self._client: httpx.AsyncClient | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._initial_actions = actions or []
        self.seed = seed

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=2.0, read=None, write=10.0, pool=None),
            limits=httpx.Limits(max_connections=4096, max_keepalive_connections=512),
            trust_env=False,
        )
        try:
            for r in self.replicas:
                self._spawn(r)
            await asyncio.gather(*(self._await_up(r) for r in self.replicas))
        except BaseException:
            await self.stop()
            raise
        self._health_task = asyncio.get_running_loop().create_task(self._health_loop())
        for action, index, at_s in self._initial_actions:
            self.schedule(action, index, at_s)

    async def stop(self) -> None:
        for t in self._timers:
            t.cancel()
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
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
        r.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
        )
        r.starts += 1
        self._set(r, "starting", False)

    async def _await_up(self, r: Replica) -> None:
        assert r.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if r.proc.poll() is not None:
                raise RuntimeError(f"replica {r.index} exited with status {r.proc.returncode}")
            if r.port_file.is_file():
                text = r.port_file.read_text().strip()
                if text:
                    r.port = int(text)
                    if await self._check(r):
                        self._set(r, "up", True)
                        return
            await asyncio.sleep(0.05)
        raise RuntimeError(
            f"replica {r.index} did not become healthy in {self.startup_timeout_s} s"
        )

    def _terminate(self, r: Replica, sig: int) -> None:
        if r.proc is not None and r.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                r.proc.send_signal(sig)

    def _set(self, r: Replica, state: str, healthy: bool) -> None:
        if r.state != state or r.healthy != healthy:
            log.info("replica %d: %s -> %s", r.index, r.state, state)
            r.last_change_ns = time.time_ns()
        r.state, r.healthy = state, healthy

    async def _check(self, r: Replica) -> bool:
        assert self._client is not None
        try:
            resp = await self._client.get(f"{r.url}/health", timeout=1.0)
            return resp.status_code == 200
        except httpx.HTTPError:
            return False

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await asyncio.gather(*(self._health_once(r) for r in self.replicas))

    async def _health_once(self, r: Replica) -> None:
        if r.proc is None:
            return
        if r.proc.poll() is not None:
            self._set(r, "killed" if r.state == "killed" else "down", False)
            return
        if r.port is None:
            text = r.port_file.read_text().strip() if r.port_file.is_file() else ""
            if not text:
                return
            r.port = int(text)
        ok = await self._check(r)
        self._set(r, "up" if ok else "unhealthy", ok)

    # -- control ----------------------------------------------------------------------------

    def kill(self, index: int) -> None:
        r = self.replicas[index]
        self._terminate(r, signal.SIGKILL)
        r.state = "killed"
        log.info("replica %d killed", index)

    def restart(self, index: int) -> None:
        r = self.replicas[index]
        if r.proc is not None and r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()
        self._spawn(r)

    def schedule(self, action: str, index: int, delay_s: float) -> float:
        """Run ``action`` on replica ``index`` after ``delay_s``; returns the Unix time."""
        if not 0 <= index < len(self.replicas):
            raise ValueError(f"no replica {index} (replicas: 0..{len(self.replicas) - 1})")
        fn = {"kill": self.kill, "restart": self.restart}.get(action)
        if fn is None:
            raise ValueError(f"unknown action {action!r} (kill, restart)")
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(max(0.0, delay_s), fn, index))
        return time.time() + max(0.0, delay_s)

    # -- routing ----------------------------------------------------------------------------

    def pick(self) -> Replica | None:
        live = [r for r in self.replicas if r.healthy]
        if not live:
            return None
        self._rr += 1
        if self.policy == "round_robin":
            return live[self._rr % len(live)]
        low = min(r.outstanding for r in live)
        tied = [r for r in live if r.outstanding == low]
        return tied[self._rr % len(tied)]

    def mark_failed(self, r: Replica) -> None:
        r.upstream_errors_total += 1
        self._set(r, "killed" if r.state == "killed" else "unhealthy", False)

    async def proxy(self, request: Request) -> Response:
        r = self.pick()
        if r is None:
            self.no_replica_total += 1
            return error_response(503, "ServiceUnavailableError", "no healthy replica")
        assert self._client is not None
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARD_HEADERS}
        r.outstanding += 1
        r.requests_total += 1
        try:
            upstream = await self._client.send(
                self._client.build_request(
                    request.method, f"{r.url}{request.url.path}", content=body, headers=headers
                ),
                stream=True,
            )
        except httpx.TransportError as err:
            r.outstanding -= 1
            self.mark_failed(r)
            return error_response(
                502, "BadGatewayError", f"replica {r.index} unreachable: {type(err).__name__}"
            )

        async def relay():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            except httpx.TransportError:
                self.mark_failed(r)
                # The replica died mid-response: drop the client's connection the same way.
                raise InjectedDisconnect(f"replica {r.index} failed mid-response") from None

        async def release() -> None:
            r.outstanding -= 1
            await upstream.aclose()

        out_headers = {
            k: v for k, v in upstream.headers.items() if k in ("content-type", "x-request-id")
        }
        out_headers["x-sim-replica"] = str(r.index)
        return _Relay(relay(), release, status_code=upstream.status_code, headers=out_headers)

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

        texts = await asyncio.gather(*(scrape(r) for r in self.replicas))
        x = m.Exposition()
        lab = [(r, [("replica", str(r.index))]) for r in self.replicas]
        x.gauge(
            "router:replica_up",
            "1 while the replica is in rotation.",
            [(labels, 1.0 if r.healthy else 0.0) for r, labels in lab],
        )
        x.gauge(
            "router:replica_outstanding_requests",
            "Requests in flight through the router.",
            [(labels, r.outstanding) for r, labels in lab],
        )
        x.counter(
            "router:requests_total",
            "Requests routed to each replica.",
            [(labels, r.requests_total) for r, labels in lab],
        )
        x.counter(
            "router:upstream_errors_total",
            "Connection failures to each replica.",
            [(labels, r.upstream_errors_total) for r, labels in lab],
        )
        x.counter(
            "router:replica_starts_total",
            "Processes started for each replica.",
            [(labels, r.starts) for r, labels in lab],
        )
        x.counter(
            "router:no_replica_total",
            "Requests refused because no replica was healthy.",
            [([], self.no_replica_total)],
        )
        merged: dict[str, m.MetricFamily] = {}
        for text in texts:
            if text is None:
                continue
            try:
                families = m.parse(text)
            except m.ExpositionError:
                continue
            for name, fam in families.items():
                if name in merged:
                    merged[name].samples.extend(fam.samples)
                else:
                    merged[name] = fam
        for fam in merged.values():
            x.raw_family(fam)
        return x.text()


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
            {"policy": cluster.policy, "replicas": [r.describe() for r in cluster.replicas]}
        )

    async def control(request: Request) -> Response:
        try:
            index = int(request.path_params["index"])
            action = request.path_params["action"]
            raw = await request.body()
            data = json.loads(raw) if raw.strip() else {}
            if not isinstance(data, dict):
                raise ValueError("the body must be a JSON object")
            if "at_unix_ns" in data:
                delay_s = (int(data["at_unix_ns"]) - time.time_ns()) / 1e9
            else:
                delay_s = float(data.get("delay_s", 0.0))
            when = cluster.schedule(action, index, delay_s)
        except (ValueError, TypeError) as err:
            return error_response(400, "BadRequestError", str(err))
        return JSONResponse(
            {"replica": index, "action": action, "at_unix_s": when}, status_code=202
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
                    headers={"content-type": "application/json"},
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
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/reset_prefix_cache", fan_out, methods=["POST"]),
        Route("/sim/faults", fan_out, methods=["GET", "POST"]),
        Route("/sim/stall", fan_out, methods=["POST"]),
        Route("/cluster/replicas", replicas, methods=["GET"]),
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
