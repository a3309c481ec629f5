"""What a drill kind is: :class:`DrillKind`, the facts the drill's plan, run and analysis read
about one fault mechanism, and :class:`RouterEvent`, a router event that marks one of its
moments. A kind module builds one and registers it (:mod:`capacity_pack.drills.kinds`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from capacity_pack.plan.failure import Drill

# Nanoseconds per second: the unit of the drill clock's offsets.
NS = 1_000_000_000
# (method, path, JSON body): one call on the project's router's control plane.
Request = tuple[str, str, dict[str, Any]]
# (schedule, drill, [from, to) in schedule offsets (ns), the schedule's seed): marks in place
# the requests the client faults during the fault.
ScheduleFault = Callable[[pd.DataFrame, Drill, tuple[int, int], int], None]


@dataclass(frozen=True)
class RouterEvent:
    """A router event (``GET /cluster/events``) that marks a moment of the drill."""

    event: str  # the event's name: killed, added, ready, ...
    own_replica: bool  # only the drill's replica's event counts (else any replica's)
    what: str  # words for the report: what the event means

    def matching(self, events: list[dict[str, Any]], drill: Drill) -> list[dict[str, Any]]:
        own = drill.replica if self.own_replica else None
        return [
            e for e in events
            if e["event"] == self.event and (own is None or e.get("replica") == own)
        ]  # fmt: skip


@dataclass(frozen=True)
class DrillKind:
    """One failure mechanism: how it is injected and how the analysis reads its moments."""

    name: str  # failure.drills[].kind
    mechanism: str  # the alert mechanism the drill must fire (drills/alerts.py)
    # Other mechanisms it may legitimately set off (symptoms aside).
    consequences: frozenset[str] = frozenset()
    # The router control-plane call that injects it (restore=True: lifts it); None: the client
    # injects it, on any target, with no command.
    router: Callable[[Drill, bool], Request] | None = None
    client_fault: str = ""  # a client-side fault, in words, for the injector's record
    # What only the engine can do to inject it (a managed target then needs commands; the
    # simulated engine answers the router's call); "": the router or the client injects it.
    needs_engine: str = ""
    reversible: bool = False  # lifted fault_s after the injection
    rate_step: bool = False  # the offered rate steps up by (N + 1) / N at the injection
    # The drill's replica dies: the router's removal time and the supervisor's restarts are
    # reported, and the drill runs in virtual time too (the fleet model kills replicas only).
    kills_replica: bool = False
    injected: RouterEvent | None = None  # the event that marks the injection (else the action)
    cleared: RouterEvent | None = None  # the event that marks the fault cleared (else the lift)
    schedule: ScheduleFault | None = None  # the client's part of the fault

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"drill kind name: {self.name!r} is not a lower_snake_case word")
        if (self.router is None) != bool(self.client_fault):
            raise ValueError(
                f"drill kind {self.name!r}: client_fault: give it exactly when router is None"
            )
        if self.needs_engine and self.router is None:
            raise ValueError(f"drill kind {self.name!r}: needs_engine needs a router call")
