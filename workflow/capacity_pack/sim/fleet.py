"""A fleet in virtual time: the router's policy and N engine models on one simulated clock.

What ``capacity-pack sim cluster`` does with processes and sockets
(:mod:`capacity_pack.sim.cluster`), replayed as a discrete-event simulation from the live
pieces: each replica a :class:`capacity_pack.sim.engine.Engine` stepped by ``begin_step`` /
``end_step`` as its live loop steps it, the router's routing (:meth:`Fleet.pick`), admission,
retries, kills, health checks and restarts, and the router's ``/metrics`` as samples. It leaves
out HTTP and loopback latency, the client's lateness and CPU competition. Times are ns from the
fleet's start (``t_ns``). Method: docs/twin.md, 'The fleet in virtual time'.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from capacity_pack.sim.engine import Engine, Rejected
from capacity_pack.sim.profile import Profile
from capacity_pack.sim.replicas import RouterView, router_families
from capacity_pack.sim.scheduler import SimRequest, Step

NS = 1_000_000_000
# From a replica's death to its cut streams' end at the client: the router's relay reading the
# reset and closing the client's stream (about a millisecond on loopback).
CUT_NS = 1_000_000

# Event kinds, in the order same-instant events run: a replica that dies at t dies before the
# arrival at t is routed; a step that ends at t emits before a check or scrape at t reads it.
_KILL, _STEP, _LISTEN, _RESTART, _HEALTH, _TIMEOUT, _ARRIVAL, _SCRAPE = range(8)


@dataclass(frozen=True)
class FleetSettings:
    """The router's and the supervisor's settings (the live cluster's flags)."""

    replicas: int
    policy: Literal["round_robin", "least_outstanding"] = "least_outstanding"
    admission_max_outstanding: int = 0
    retries: int = 1
    health_interval_s: float = 0.25
    restart_after_s: float | None = 3.0
    cold_start_s: float = 0.0
    request_timeout_s: float = 30.0
    scrape_interval_s: float = 0.5
    model_name: str | None = None
    kills: tuple[tuple[int, float], ...] = ()  # (replica, seconds from the fleet's start)


@dataclass(frozen=True)
class FleetRequest:
    """One client request: due time (s from the fleet's start), prompt token ids, max tokens."""

    due_s: float
    prompt_ids: tuple[int, ...]
    max_tokens: int


@dataclass
class FleetResult:
    """What the client saw of one request (ns from the fleet's start)."""

    status: str = "error"  # ok, error, timeout, rejected
    http_status: int | None = None
    error: str | None = None
    sent_ns: int = 0
    end_ns: int = 0
    token_ns: list[int] = field(default_factory=list)
    replica: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None


class _Replica(RouterView):
    """A replica in virtual time: the router's view of it, its engine and process state."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.engine: Engine | None = None
        self.alive = False  # the process runs
        self.listening = False
        self.generation = 0  # bumped by each start: stale step events are dropped
        self.step: Step | None = None
        self.restart_pending = False
        self.held: dict[int, int] = {}  # id(SimRequest) -> request index


# One sample of a scrape: (name, labels, value), as parsing the exposition text gives it.
Sample = tuple[str, Sequence[tuple[str, str]], float]


@dataclass
class FleetRun:
    results: list[FleetResult]
    events: list[dict[str, object]]
    scrapes: list[tuple[int, int, list[Sample]]]  # (t_ns, client in flight, /metrics samples)
    end_ns: int = 0
    steps: int = 0


class Fleet:
    """One virtual-time run; see the module docstring."""

    def __init__(self, profile: Profile, settings: FleetSettings, seed: int = 0) -> None:
        if settings.replicas < 1:
            raise ValueError("a fleet needs at least one replica")
        self.profile = profile
        self.s = settings
        self.seed = seed
        self.replicas = [_Replica(i) for i in range(settings.replicas)]
        self.responses_total: collections.Counter[int] = collections.Counter()
        self.admission_rejected_total = 0
        self.no_replica_total = 0
        self.events: list[dict[str, object]] = []
        self._heap: list[tuple[int, int, int, int, object]] = []
        self._seq = itertools.count()
        self._rr = 0
        self._shedding = False
        self._shed_last_ns = 0
        self._in_flight = 0
        self.steps = 0

    # -- the clock ------------------------------------------------------------------------------

    def _at(self, t_ns: int, kind: int, payload: object = None) -> None:
        heapq.heappush(self._heap, (t_ns, kind, next(self._seq), 0, payload))

    def _event(self, t_ns: int, replica: int | None, event: str, detail: str = "") -> None:
        self.events.append({"t_ns": t_ns, "replica": replica, "event": event, "detail": detail})

    # -- replicas -------------------------------------------------------------------------------

    def _start(self, r: _Replica, t_ns: int, *, cold: bool) -> None:
        r.engine = Engine(
            self.profile,
            model_name=self.s.model_name,
            seed=self.seed + r.index,
            engine_index=r.index,
            replica=r.index,
        )
        r.alive = True
        r.starts += 1
        r.generation += 1
        r.step = None
        r.held = {}
        r.state = "starting"
        self._event(t_ns, r.index, "spawned", f"start {r.starts}")
        if cold and self.s.cold_start_s > 0:
            r.listening = False
            self._at(t_ns + round(self.s.cold_start_s * NS), _LISTEN, (r.index, r.generation))
        else:
            r.listening = True

    def _set(self, r: _Replica, t_ns: int, state: str, healthy: bool, reason: str) -> None:
        if healthy and not r.healthy:
            self._event(t_ns, r.index, "ready", reason)
        elif r.healthy and not healthy:
            self._event(t_ns, r.index, "removed", reason)
            r.health_rtt_s = None
        r.state, r.healthy = state, healthy
        if healthy:
            r.health_rtt_s = 0.001

    def _kill(self, t_ns: int, index: int, results: list[FleetResult]) -> None:
        r = self.replicas[index]
        if not r.alive:
            return
        r.alive = False
        r.listening = False
        r.state = "killed"
        r.generation += 1
        self._event(t_ns, index, "killed", "SIGKILL")
        for i in r.held.values():
            res = results[i]
            if res.token_ns:
                r.relay_failures_total += 1
            # The client sees its stream cut once the router's relay has seen the reset.
            self._end(
                res, t_ns + CUT_NS, "error", None, "the stream ended early: connection dropped"
            )
        if r.held:
            # The router's relays see their streams cut and take the replica out at once.
            r.upstream_errors_total += 1
            self._set(r, t_ns, "killed", False, "mid-stream failure (RemoteProtocolError)")
        r.held = {}
        r.outstanding = 0
        r.step = None
        r.engine = None

    def _health(self, t_ns: int) -> None:
        for r in self.replicas:
            if not r.alive:
                if r.state != "killed" or r.healthy:
                    self._set(r, t_ns, "killed", False, "process dead (exit status -9)")
                if self.s.restart_after_s is not None and not r.restart_pending:
                    r.restart_pending = True
                    delay = self.s.restart_after_s
                    self._at(t_ns + round(delay * NS), _RESTART, r.index)
                    self._event(
                        t_ns,
                        r.index,
                        "restart_scheduled",
                        f"process exited with status -9; restart in {delay:g} s",
                    )
            elif r.listening:
                self._set(r, t_ns, "up", True, "health check passed in 1.0 ms")
        self._at(t_ns + round(self.s.health_interval_s * NS), _HEALTH)

    def pick(self, exclude: Sequence[int] = ()) -> _Replica | None:
        """The live router's choice (:meth:`capacity_pack.sim.cluster.Cluster.pick`)."""
        live = [r for r in self.replicas if r.healthy and r.index not in exclude]
        if not live:
            return None
        self._rr += 1
        if self.s.policy == "round_robin":
            return live[self._rr % len(live)]
        low = min(r.outstanding for r in live)
        tied = [r for r in live if r.outstanding == low]
        return tied[self._rr % len(tied)]

    # -- requests -------------------------------------------------------------------------------

    def _end(self, res: FleetResult, t_ns: int, status: str, code: int | None, err: str | None):
        """The client's view of a request's end; ``code``: a response the router made."""
        res.status, res.end_ns, res.error = status, t_ns, err
        if code is not None:
            res.http_status = code
            self.responses_total[code] += 1
        self._in_flight -= 1

    def _route(self, t_ns: int, i: int, req: FleetRequest, results: list[FleetResult]) -> None:
        res = results[i]
        res.sent_ns = t_ns
        self._in_flight += 1
        live = [r for r in self.replicas if r.healthy]
        if not live:
            self.no_replica_total += 1
            self._end(res, t_ns, "rejected", 503, "ServiceUnavailableError: no healthy replica")
            return
        k = self.s.admission_max_outstanding
        tried: list[int] = []
        while True:
            # Under the cap, a retry too (capacity_pack.sim.routing).
            full = [x.index for x in self.replicas if k and x.healthy and x.outstanding >= k]
            r = self.pick(exclude=tried + full)
            if r is None and set(full) - set(tried):
                self._shed(t_ns, res, k)
                return
            if r is None:
                self.no_replica_total += 1
                self._end(res, t_ns, "rejected", 503, "ServiceUnavailableError: no replica")
                return
            r.requests_total += 1
            if r.alive and r.listening:
                break
            # Connection refused: no response header yet, so another replica may serve it.
            r.upstream_errors_total += 1
            self._set(r, t_ns, r.state, False, "upstream connect failure (ConnectError)")
            tried.append(r.index)
            if len(tried) <= self.s.retries and any(
                x.healthy and x.index not in tried for x in self.replicas
            ):
                r.retries_total += 1
                continue
            self._end(res, t_ns, "error", 502, f"BadGatewayError: replica {r.index} unreachable")
            return
        engine = r.engine
        assert engine is not None
        try:
            engine.check_room(len(req.prompt_ids), req.max_tokens)
        except Rejected as rej:
            status = "rejected" if rej.status in (429, 503) else "error"
            self._end(res, t_ns, status, rej.status, f"{rej.err_type}: {rej.message}")
            return
        sim = SimRequest(f"v{i}", list(req.prompt_ids), req.max_tokens, arrival_ns=t_ns)
        # The router counts a relayed response when its head arrives: a stream starts at once.
        self.responses_total[200] += 1
        res.http_status = 200
        r.outstanding += 1
        r.held[id(sim)] = i
        res.replica = r.index
        res.prompt_tokens = sim.num_prompt
        engine.sched.add(sim)
        self._at(t_ns + round(self.s.request_timeout_s * NS), _TIMEOUT, (i, r.index, sim))
        if r.step is None:
            self._begin(r, t_ns, results)

    def _shed(self, t_ns: int, res: FleetResult, k: int) -> None:
        self.admission_rejected_total += 1
        self._shed_last_ns = t_ns
        if not self._shedding:
            self._shedding = True
            self._event(
                t_ns,
                None,
                "admission_shedding_started",
                f"every healthy replica has {k} or more requests outstanding",
            )
        self._end(res, t_ns, "rejected", 429, "RateLimitError: admission control shed it")

    def _begin(self, r: _Replica, t_ns: int, results: list[FleetResult]) -> None:
        engine = r.engine
        assert engine is not None
        while engine.sched.has_work():
            step = engine.begin_step(t_ns)
            for sim in step.failed:
                self._finish(r, sim, t_ns, results, "error", "the request can no longer fit")
            if step.reqs:
                r.step = step
                self._at(t_ns + round(step.duration_s * NS), _STEP, (r.index, r.generation))
                return
        r.step = None

    def _finish(self, r, sim, t_ns, results, status="ok", err=None) -> None:
        i = r.held.pop(id(sim), None)
        if i is None:
            return
        r.outstanding -= 1
        res = results[i]
        res.cached_tokens = sim.num_cached_tokens
        self._end(res, t_ns, status, None, err)

    def _step_end(self, t_ns: int, index: int, gen: int, results: list[FleetResult]) -> None:
        r = self.replicas[index]
        if gen != r.generation or r.step is None or r.engine is None:
            return
        step, r.step = r.step, None
        self.steps += 1
        for sim in r.engine.end_step(step, t_ns):
            i = r.held.get(id(sim))
            if i is None:
                continue
            results[i].token_ns.append(t_ns)
            if sim.finish_reason is not None:
                self._finish(r, sim, t_ns, results)
        self._begin(r, t_ns, results)

    def _timeout(self, t_ns: int, payload, results: list[FleetResult]) -> None:
        i, index, sim = payload
        r = self.replicas[index]
        if r.held.get(id(sim)) != i:
            return
        r.held.pop(id(sim))
        r.outstanding -= 1
        if r.engine is not None:
            r.engine.abort_at(sim, t_ns)
        self._end(results[i], t_ns, "timeout", None, "client timeout")

    def _scrape(self, t_ns: int) -> list[Sample]:
        if self._shedding and t_ns - self._shed_last_ns >= NS:
            self._shedding = False
            self._event(t_ns, None, "admission_shedding_stopped", "nothing shed for 1 s")
        out = router_families(
            self.replicas,
            self.responses_total,
            self.admission_rejected_total,
            self.no_replica_total,
        ).samples()
        for r in self.replicas:
            # The live router merges the scrapes of the replicas in rotation only.
            if r.healthy and r.engine is not None:
                out += r.engine.metrics_exposition().samples()
        return out

    # -- the run --------------------------------------------------------------------------------

    def run(
        self, requests: Sequence[FleetRequest], scrape_until_s: float | None = None
    ) -> FleetRun:
        """Every request to its end; scrapes from t = 0 until the last request ended (or
        ``scrape_until_s``)."""
        results = [FleetResult() for _ in requests]
        for r in self.replicas:
            self._start(r, 0, cold=False)
            self._set(r, 0, "up", True, "health check passed in 1.0 ms")
        for i, req in enumerate(requests):
            self._at(round(req.due_s * NS), _ARRIVAL, i)
        for index, at_s in self.s.kills:
            self._at(round(at_s * NS), _KILL, index)
        self._at(round(self.s.health_interval_s * NS), _HEALTH)
        self._at(0, _SCRAPE)
        scrapes: list[tuple[int, int, list[Sample]]] = []
        last_due = max((round(r.due_s * NS) for r in requests), default=0)
        until = round(scrape_until_s * NS) if scrape_until_s is not None else None
        t_ns = 0
        while self._heap:
            t_ns, kind, _, _, payload = heapq.heappop(self._heap)
            if kind == _ARRIVAL:
                assert isinstance(payload, int)
                self._route(t_ns, payload, requests[payload], results)
            elif kind == _STEP:
                index, gen = payload  # type: ignore[misc]
                self._step_end(t_ns, index, gen, results)
            elif kind == _KILL:
                assert isinstance(payload, int)
                self._kill(t_ns, payload, results)
            elif kind == _HEALTH:
                if self._done(t_ns, last_due, until):
                    continue
                self._health(t_ns)
            elif kind == _RESTART:
                assert isinstance(payload, int)
                r = self.replicas[payload]
                r.restart_pending = False
                if not r.alive:
                    self._event(t_ns, r.index, "restarted", "by the supervisor")
                    self._start(r, t_ns, cold=True)
            elif kind == _LISTEN:
                index, gen = payload  # type: ignore[misc]
                r = self.replicas[index]
                if r.generation == gen and r.alive:
                    r.listening = True
            elif kind == _TIMEOUT:
                self._timeout(t_ns, payload, results)
            elif kind == _SCRAPE:
                scrapes.append((t_ns, self._in_flight, self._scrape(t_ns)))
                if not self._done(t_ns, last_due, until):
                    self._at(t_ns + round(self.s.scrape_interval_s * NS), _SCRAPE)
        # The heap ends with the client's timers of requests long finished: not the run's end.
        end = max([scrapes[-1][0], *(res.end_ns for res in results)])
        return FleetRun(results, self.events, scrapes, end_ns=end, steps=self.steps)

    def _done(self, t_ns: int, last_due: int, until: int | None) -> bool:
        """Every request sent and ended, and ``until`` passed: the checks and scrapes stop."""
        return t_ns > last_due and self._in_flight == 0 and (until is None or t_ns >= until)
