"""Drill kinds: one module per failure mechanism, each registering a
:class:`~capacity_pack.drills.kinds.base.DrillKind`, and the registry every drill stage asks.

Adding a kind: a new module here that calls
:func:`~capacity_pack.drills.kinds.registry.register`, one import line below, and its name in
``DRILL_KINDS`` of :mod:`capacity_pack.plan.failure` (``tests/unit/drills/test_kinds.py`` keeps
the two equal).
"""

# The kinds, in registration order (the manifest's DRILL_KINDS order).
# isort: off
from capacity_pack.drills.kinds import replica_kill
from capacity_pack.drills.kinds import cold_replica
from capacity_pack.drills.kinds import kv_pressure
from capacity_pack.drills.kinds import cancellation
from capacity_pack.drills.kinds import degraded_link

# isort: on
from capacity_pack.drills.kinds.base import NS, DrillKind, Request, RouterEvent
from capacity_pack.drills.kinds.registry import kind, kinds, register, unregister

__all__ = [
    "NS",
    "DrillKind",
    "Request",
    "RouterEvent",
    "cancellation",
    "cold_replica",
    "degraded_link",
    "kind",
    "kinds",
    "kv_pressure",
    "register",
    "replica_kill",
    "unregister",
]
