"""Drills as the tests run them: a drill planned from the decision's documents, as the workflow
plans it (:class:`capacity_pack.drills.plan.DrillNumbers`, the rule's params, then the plan);
the default pack edited into a validated one; every drill of a pack run for real and analysed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capacity_pack.drills.alerts import write_alert_rules
from capacity_pack.drills.analyze import DrillAnalysisSpec, analyze_drill
from capacity_pack.drills.plan import DrillInputs, DrillNumbers, DrillPlan, plan_drill
from capacity_pack.drills.run import run_drill
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.twin.trust import ValidatedTwin
from tests.conftest import pack_data


def plan_at(
    inputs: DrillInputs,
    capacity: dict[str, Any] | None = None,
    reports: dict[str, dict[str, Any]] | None = None,
    plan_doc: dict[str, Any] | None = None,
    twin: ValidatedTwin | None = None,
) -> DrillPlan:
    """The plan of drill ``inputs`` from capacity.json, the SLO reports and plan.json."""
    return plan_drill(inputs, DrillNumbers.of(inputs, capacity, reports, plan_doc), twin)


def make_pack(mutate=None):
    """The default pack, edited by ``mutate`` (a function of its plain data), validated."""
    data = pack_data()
    if mutate:
        mutate(data)
    return validate_pack(data, "test pack")


def run_all(pack, out_dir: Path) -> dict[str, dict]:
    """Every drill of the pack run for real, then analysed with the pack's own rule file."""
    rules = out_dir / "rules.yaml"
    write_alert_rules(pack, rules)
    spec = DrillAnalysisSpec.of(pack)
    out = {}
    for d in pack.failure.drills:
        inputs = DrillInputs.for_drill(pack, d.name)
        plan = plan_at(inputs, None, {}, None, None)
        run_drill(inputs, plan, out_dir / d.name)
        out[d.name] = analyze_drill(out_dir / d.name, rules, spec)
    return out
