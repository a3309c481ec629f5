"""What the router knows of its replicas, and the ``/metrics`` it makes of that.

- :class:`Link`: the emulated network path between the router and one replica (latency, and a
  bandwidth limit as one token bucket per replica, 16 KiB burst, shared by all its streams);
- :class:`RouterView`: one replica's rotation state and counters, the fields
  :func:`router_families` exports; :class:`Replica` adds the live process, port, link and
  control token (:mod:`capacity_pack.sim.cluster`), and the virtual-time fleet keeps its own
  views (:mod:`capacity_pack.sim.fleet`);
- :func:`router_exposition`: the router's ``/metrics``, its own ``router:*`` families then every
  live replica's metric families merged (one ``# HELP``/``# TYPE`` per family, the replicas told
  apart by the ``engine`` label).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capacity_pack.sim import metrics as m

log = logging.getLogger("capacity_pack.sim.cluster")

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
