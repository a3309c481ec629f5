"""``kv_pressure``: one replica's usable KV blocks drop to ``kv_capacity_fraction`` for
``fault_s`` (the simulated engine's ``POST /sim/faults``, through the router; a managed or
other real target needs commands: only the engine can do it)."""

from __future__ import annotations

from capacity_pack.drills.kinds.base import DrillKind, Request
from capacity_pack.drills.kinds.registry import register
from capacity_pack.plan.failure import Drill


def _shrink_kv(drill: Drill, restore: bool) -> Request:
    frac = 1.0 if restore else drill.kv_capacity_fraction
    return "POST", f"/sim/faults?replica={drill.replica}", {"kv_capacity_fraction": frac}


KIND = register(
    DrillKind(
        name="kv_pressure",
        mechanism="kv_pressure",
        # A replica that cannot hold its batch queues what it cannot admit.
        consequences=frozenset({"queue_saturation"}),
        router=_shrink_kv,
        needs_engine="shrink its KV cache",
        reversible=True,
    )
)
