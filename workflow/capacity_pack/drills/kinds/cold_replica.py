"""``cold_replica``: at the injection the offered rate steps up by (N + 1) / N and a new replica
is added (an autoscaler's reaction: the router's ``POST /cluster/replicas/add``); it joins
cold."""

from __future__ import annotations

from capacity_pack.drills.kinds.base import DrillKind, Request, RouterEvent
from capacity_pack.drills.kinds.registry import register
from capacity_pack.plan.failure import Drill


def _add(drill: Drill, restore: bool) -> Request:
    return "POST", "/cluster/replicas/add", {}


KIND = register(
    DrillKind(
        name="cold_replica",
        mechanism="cold_start",
        # The step up in load is what made the autoscaler act: until the new replica is ready
        # the old ones shed the excess.
        consequences=frozenset({"queue_saturation"}),
        router=_add,
        rate_step=True,
        injected=RouterEvent("added", own_replica=False, what="replica spawned"),
        cleared=RouterEvent("ready", own_replica=False, what="added replica"),
    )
)
