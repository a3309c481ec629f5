"""``degraded_link``: ``latency_ms`` (and optionally a bandwidth cap) on the link between the
router and one replica for ``fault_s`` (the router's link emulation, ``POST
/cluster/replicas/i/link``)."""

from __future__ import annotations

from capacity_pack.drills.kinds.base import DrillKind, Request
from capacity_pack.drills.kinds.registry import register
from capacity_pack.plan.failure import Drill


def _slow_link(drill: Drill, restore: bool) -> Request:
    body = {"latency_ms": 0.0, "bandwidth_bytes_per_s": 0.0}
    if not restore:
        body = {
            "latency_ms": drill.latency_ms,
            "bandwidth_bytes_per_s": drill.bandwidth_bytes_per_s,
        }
    return "POST", f"/cluster/replicas/{drill.replica}/link", body


KIND = register(
    DrillKind(
        name="degraded_link",
        mechanism="transfer_degradation",
        router=_slow_link,
        reversible=True,
    )
)
