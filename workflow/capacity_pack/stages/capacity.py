"""Stage ``capacity``: select capacity per cache state across repeats and plan replicas."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from capacity_pack.artifacts import Capacity, Plan, SloReport
from capacity_pack.decide.capacity import build_capacity, build_plan
from capacity_pack.io import sha256_hex
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.plan.words import target_words


def run(
    *,
    pack: str,
    reports: Sequence[str | Path],
    capacity: str | Path,
    plan: str | Path,
    log: logging.Logger,
    tables: Sequence[str | Path] = (),
) -> tuple[Capacity, Plan]:
    """Write ``capacity.json`` and ``plan.json`` from the points' SLO reports; return both.
    ``pack``: the validated pack but its failure section, as canonical JSON (its sha256 is
    capacity.json's ``inputs_sha256``); ``tables``: the points' requests tables, the contexts
    sent at the capacity point (without them the plan sizes from the manifest)."""
    validated = validate_pack(json.loads(pack), "capacity params")
    docs = [SloReport.read(p) for p in reports]
    decided = build_capacity(docs, validated)
    # The settings it was decided on: a dry run judges the drills on this decision only if the
    # pack's settings are still these (rules/common.smk, capacity_decided).
    decided.inputs_sha256 = sha256_hex(pack)
    replicas = Plan.parse(build_plan(decided, docs, validated, [str(t) for t in tables]), plan)
    decided.write(capacity)
    replicas.write(plan)
    for sel in decided.open_loop.values():
        log.info("%s", sel.decision)
    units = target_words(validated).units
    log.info("plan: %s replicas, %s %s", replicas.required_replicas, replicas.required_gpus, units)
    return decided, replicas
