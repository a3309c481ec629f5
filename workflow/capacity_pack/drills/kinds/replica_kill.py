"""``replica_kill``: SIGKILL one replica (simulated cluster and managed target: the router's
``POST /cluster/replicas/i/kill``; another real target: the configured command). The router
must detect it, stop routing to it, shed what the survivors cannot carry (admission control
answers 429), and the supervisor restarts it (``restart_after_s``), cold. The plan drill
(``plan_replica_kill``) is this kind on the recommended fleet."""

from __future__ import annotations

from capacity_pack.drills.kinds.base import DrillKind, Request, RouterEvent
from capacity_pack.drills.kinds.registry import register
from capacity_pack.plan.failure import Drill


def _kill(drill: Drill, restore: bool) -> Request:
    return "POST", f"/cluster/replicas/{drill.replica}/kill", {}


KIND = register(
    DrillKind(
        name="replica_kill",
        mechanism="replica_failure",
        # The survivors cannot carry the rate: shedding is the honest answer, and the
        # supervisor's replacement comes back with an empty cache.
        consequences=frozenset({"queue_saturation", "cold_start"}),
        router=_kill,
        kills_replica=True,
        injected=RouterEvent("killed", own_replica=True, what="SIGKILL sent"),
        cleared=RouterEvent("ready", own_replica=True, what="restarted replica"),
    )
)
