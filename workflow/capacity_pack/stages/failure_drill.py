"""Stage ``failure_drill``: run one failure drill at the capacity point (inject, scrape, record
every request).

A runnable live drill holds its target's lock (:mod:`capacity_pack.measure.lock`) while it runs,
as a sweep point does; a skipped one sends nothing and takes no lock, nor does a drill in virtual
time (the engine model, no target). The plan drill of a real target also reads the pack's
calibrated twin (``twin_profile``, ``twin_validation``) where it has one: with a trusted twin a
plan too large to run live is predicted in virtual time on it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from capacity_pack.drills.plan import DrillInputs, plan_drill
from capacity_pack.drills.run import run_drill
from capacity_pack.measure.lock import LockSettings, hold_target
from capacity_pack.twin.trust import ValidatedTwin


def run(
    *,
    inputs: str | DrillInputs,
    capacity: str | Path | None,
    reports: Sequence[str | Path],
    drill: str | Path,
    log: logging.Logger,
    lock: LockSettings | Mapping[str, Any] | None = None,
    plan: str | Path | None = None,
    twin_profile: str | Path | None = None,
    twin_validation: str | Path | None = None,
) -> dict[str, Any]:
    """Plan the drill from ``capacity`` (None: the pack's failure.rate_rps), the capacity
    point's SLO ``reports`` and, for the plan drill, the ``plan`` (plan.json) and the
    calibrated twin (``twin_profile``: profile.yaml, ``twin_validation``: validation.json;
    both or neither); run it, and write its files beside ``drill``; return its facts.
    ``lock``: whether to wait for a busy target (as for stage ``sweep``)."""
    if isinstance(inputs, str):
        inputs = DrillInputs.model_validate_json(inputs)
    cap = json.loads(Path(capacity).read_text()) if capacity is not None else None
    docs = {str(p): json.loads(Path(p).read_text()) for p in reports}
    plan_doc = json.loads(Path(plan).read_text()) if plan is not None else None
    twin = (
        ValidatedTwin.from_files(twin_profile, twin_validation)
        if twin_profile is not None and twin_validation is not None
        else None
    )
    planned = plan_drill(inputs, cap, docs, plan_doc, twin)
    log.info(
        "drill %s (%s, %s): %.1f RPS (%s), %d replicas, admission %s (%s)",
        planned.drill.name,
        planned.scope,
        planned.execution,
        planned.rate_rps,
        planned.rate_source,
        planned.replicas,
        planned.admission_max_outstanding,
        planned.admission_source,
    )
    held = (
        hold_target(
            inputs.sweep.target,
            pack=inputs.sweep.schedule.pack.name,
            stage="failure_drill",
            what=planned.drill.name,
            settings=lock,
        )
        if planned.runnable and planned.execution == "live"
        else contextlib.nullcontext()
    )
    with held:
        facts = run_drill(inputs, planned, Path(drill).parent)
    if facts.get("skipped"):
        log.warning("drill %s skipped: %s", planned.drill.name, facts["skipped"])
    else:
        log.info("drill %s: actions %s", planned.drill.name, facts["actions"])
    return facts
