"""Stage ``failure_drill``: run one failure drill at the capacity point (inject, scrape, record
every request).

The decision's numbers arrive as params (:class:`capacity_pack.drills.plan.DrillNumbers`), never
as the decision's files: a drill measures again when its rate, admission basis or plan changes,
not when the analysis code that decided them does. A runnable live drill holds its target's lock
(:mod:`capacity_pack.measure.lock`) as a sweep point does; a skipped or virtual-time one takes
none. The plan drill of a real target reads the pack's calibrated twin where it has one: with a
trusted twin a plan too large to run live is predicted in virtual time on it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capacity_pack.drills.plan import DrillInputs, DrillNumbers, plan_drill
from capacity_pack.drills.run import run_drill
from capacity_pack.measure.lock import LockSettings, hold_target
from capacity_pack.twin.trust import ValidatedTwin


def run(
    *,
    inputs: str | DrillInputs,
    numbers: str | DrillNumbers,
    drill: str | Path,
    log: logging.Logger,
    lock: LockSettings | Mapping[str, Any] | None = None,
    twin_profile: str | Path | None = None,
    twin_validation: str | Path | None = None,
) -> dict[str, Any]:
    """Plan the drill from the decision's ``numbers`` and, for a real target's plan drill, the
    calibrated twin (``twin_profile``: profile.yaml, ``twin_validation``: validation.json; both
    or neither); run it, and write its files beside ``drill``; return its facts. ``lock``:
    whether to wait for a busy target (as for stage ``sweep``)."""
    if isinstance(inputs, str):
        inputs = DrillInputs.model_validate_json(inputs)
    if isinstance(numbers, str):
        numbers = DrillNumbers.model_validate_json(numbers)
    twin = (
        ValidatedTwin.from_files(twin_profile, twin_validation)
        if twin_profile is not None and twin_validation is not None
        else None
    )
    planned = plan_drill(inputs, numbers, twin)
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
