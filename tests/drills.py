"""A drill planned from the decision's documents, as the workflow plans it: the numbers first
(:class:`capacity_pack.drills.plan.DrillNumbers`, the rule's params), then the plan."""

from __future__ import annotations

from typing import Any

from capacity_pack.drills.plan import DrillInputs, DrillNumbers, DrillPlan, plan_drill
from capacity_pack.twin.trust import ValidatedTwin


def plan_at(
    inputs: DrillInputs,
    capacity: dict[str, Any] | None = None,
    reports: dict[str, dict[str, Any]] | None = None,
    plan_doc: dict[str, Any] | None = None,
    twin: ValidatedTwin | None = None,
) -> DrillPlan:
    """The plan of drill ``inputs`` from capacity.json, the SLO reports and plan.json."""
    return plan_drill(inputs, DrillNumbers.of(inputs, capacity, reports, plan_doc), twin)
