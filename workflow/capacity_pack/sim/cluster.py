"""N simulated replicas behind a router: the target of replica-failure drills.

``capacity-pack sim cluster --replicas N`` starts N ``sim serve`` processes (or, with
``--replica-command``, any engine's) on free loopback ports and serves the same OpenAI API in
front of them: routing (``round_robin``, ``least_outstanding``), admission control, retries
before any response header, health checks, supervision and cold starts, link emulation, the
merged ``/metrics`` with the router's ``router:*`` series, the ``/cluster/*`` control routes and
the event log. Replica processes die with the router (``PR_SET_PDEATHSIG``).

Module map: :mod:`capacity_pack.sim.replicas` (what the router knows of each replica, its link,
and the ``/metrics`` made of it), :mod:`capacity_pack.sim.supervisor` (spawn, health checks,
restarts, the event log), :mod:`capacity_pack.sim.routing` (picking, forwarding, retrying,
shedding) and :mod:`capacity_pack.sim.relay` (a response across the link); this module
assembles them into :class:`Cluster` and serves it (:func:`cluster_app`).

Behaviour, route by route: docs/reference.md, 'The simulated cluster'.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from capacity_pack.sim import metrics as m
from capacity_pack.sim.control import control_headers
from capacity_pack.sim.replicas import (
    Replica,
    router_exposition,
)
from capacity_pack.sim.routing import ReplicaRouting
from capacity_pack.sim.supervisor import ReplicaSupervisor
from capacity_pack.sim.wire import error_response

log = logging.getLogger("capacity_pack.sim.cluster")

Policy = Literal["round_robin", "least_outstanding"]


class Cluster(ReplicaSupervisor, ReplicaRouting):
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

    # -- control ----------------------------------------------------------------------------

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


class _Routes:
    """The router's own routes around a :class:`Cluster` (the relayed ones are its ``proxy``)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def health(self, request: Request) -> Response:
        if any(r.healthy for r in self.cluster.replicas):
            return Response(status_code=200)
        return error_response(503, "ServiceUnavailableError", "no healthy replica")

    async def metrics(self, request: Request) -> Response:
        return Response(await self.cluster.metrics_text(), media_type=m.CONTENT_TYPE)

    async def replicas(self, request: Request) -> Response:
        cluster = self.cluster
        return JSONResponse(
            {
                "policy": cluster.policy,
                "admission_max_outstanding": cluster.admission_max_outstanding,
                "retries": cluster.retries,
                "restart_after_s": cluster.restart_after_s,
                "replicas": [r.describe() for r in cluster.replicas],
            }
        )

    async def events(self, request: Request) -> Response:
        try:
            since_ns = int(request.query_params.get("since_ns", "0"))
        except ValueError:
            return error_response(400, "BadRequestError", "since_ns must be an integer")
        return JSONResponse({"events": self.cluster.events_since(since_ns)})

    async def control(self, request: Request) -> Response:
        try:
            index = int(request.path_params["index"])
            action = request.path_params["action"]
            data = _json_object(await request.body())
            when = self.cluster.schedule(action, index, _delay_s(data))
        except (ValueError, TypeError) as err:
            return error_response(400, "BadRequestError", str(err))
        return JSONResponse(
            {"replica": index, "action": action, "at_unix_s": when}, status_code=202
        )

    async def add(self, request: Request) -> Response:
        try:
            data = _json_object(await request.body())
            index, when = self.cluster.schedule_add(_delay_s(data))
        except (ValueError, TypeError) as err:
            return error_response(400, "BadRequestError", str(err))
        return JSONResponse({"replica": index, "action": "add", "at_unix_s": when}, status_code=202)

    async def link(self, request: Request) -> Response:
        keys = {"latency_ms", "bandwidth_bytes_per_s", "delay_s", "at_unix_ns"}
        try:
            index = int(request.path_params["index"])
            data = _json_object(await request.body())
            unknown = sorted(set(data) - keys)
            if unknown:
                raise ValueError(f"unknown keys {unknown} (allowed: {sorted(keys)})")
            latency_ms = _non_negative(data, "latency_ms")
            bandwidth = _non_negative(data, "bandwidth_bytes_per_s")
            when = self.cluster.schedule_link(index, latency_ms, bandwidth, _delay_s(data))
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

    async def fan_out(self, request: Request) -> Response:
        """A control call (or ``/reset_prefix_cache``) forwarded to one replica or to all."""
        cluster = self.cluster
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


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, "NotFoundError", str(exc.detail))


def cluster_app(cluster: Cluster) -> Starlette:
    """The router's HTTP API around a :class:`Cluster`."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette):
        await cluster.start()
        try:
            yield
        finally:
            await cluster.stop()

    h = _Routes(cluster)
    routes = [
        Route("/v1/completions", cluster.proxy, methods=["POST"]),
        Route("/v1/chat/completions", cluster.proxy, methods=["POST"]),
        Route("/v1/models", cluster.proxy, methods=["GET"]),
        Route("/version", cluster.proxy, methods=["GET"]),
        # Engine routes a load generator may need from a command replica (llama.cpp's).
        Route("/tokenize", cluster.proxy, methods=["POST"]),
        Route("/detokenize", cluster.proxy, methods=["POST"]),
        Route("/props", cluster.proxy, methods=["GET"]),
        Route("/health", h.health, methods=["GET"]),
        Route("/ping", h.health, methods=["GET", "POST"]),
        Route("/metrics", h.metrics, methods=["GET"]),
        Route("/reset_prefix_cache", h.fan_out, methods=["POST"]),
        Route("/sim/faults", h.fan_out, methods=["GET", "POST"]),
        Route("/sim/stall", h.fan_out, methods=["POST"]),
        Route("/cluster/replicas", h.replicas, methods=["GET"]),
        Route("/cluster/events", h.events, methods=["GET"]),
        Route("/cluster/replicas/add", h.add, methods=["POST"]),
        Route("/cluster/replicas/{index:int}/link", h.link, methods=["POST"]),
        Route("/cluster/replicas/{index:int}/{action}", h.control, methods=["POST"]),
    ]
    return Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error}
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
