"""Routing a request to one of the router's replicas, or refusing it.

A mixin of :class:`capacity_pack.sim.cluster.Cluster`, whose replicas and counters it uses:

- routing: ``round_robin`` (the next healthy replica in turn) or ``least_outstanding`` (the
  healthy replica with the fewest requests in flight through the router; ties go round robin);
- admission control (``admission_max_outstanding`` K > 0): a completion goes only to a replica
  with fewer than K requests outstanding; while every healthy replica has K or more it is
  refused at once with 429 ``RateLimitError`` and ``Retry-After: 1``, no replica contacted; a
  shedding episode is logged as one start and one stop event;
- retries: a forward that fails before any response header arrived takes that replica out of
  rotation and is retried, up to ``retries`` times, on healthy replicas this request has not
  tried, under the same cap (a retry that finds every other replica at K is shed: the
  requests in flight to a replica killed before the router noticed would otherwise all land
  on the survivor at once, over its cap); a response is never retried once its headers
  arrived (:mod:`capacity_pack.sim.relay` carries it to the client).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection

import httpx
from starlette.requests import Request
from starlette.responses import Response

from capacity_pack.sim.relay import Pipe, Relay
from capacity_pack.sim.replicas import Replica
from capacity_pack.sim.wire import error_response

_FORWARD_HEADERS = ("content-type", "x-request-id", "authorization")
# The routes whose responses are counted and which admission control guards: the ones that cost
# an engine work.
_GENERATE_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
# A shedding episode ends once nothing was shed for as long as shed clients are told to wait, so
# a router at its limit logs one start and one stop rather than a pair per request.
_SHED_QUIET_S = 1.0


class ReplicaRouting:
    """Picks a replica for each request of a :class:`~capacity_pack.sim.cluster.Cluster` and
    forwards it, or sheds it (a mixin: the cluster holds the state)."""

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
        guarded = bool(limit) and request.url.path in _GENERATE_PATHS
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARD_HEADERS}
        tried: set[int] = set()
        while True:
            full = {
                x.index for x in self.replicas if guarded and x.healthy and x.outstanding >= limit
            }
            r = self.pick(exclude=tried | full)
            if r is None and full - tried:  # every healthy replica not yet tried is at the cap
                return self._shed()
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
            pipe = Pipe(self.mark_failed, r, upstream)
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
            return Relay(
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
