"""Stage ``capacity``: select capacity per cache state across repeats and plan replicas."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from capacity_pack.decide.capacity import build_capacity, build_plan
from capacity_pack.decide.report import load_reports
from capacity_pack.io import sha256_hex, write_json_atomic
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
) -> tuple[dict, dict]:
    """Write ``capacity.json`` and ``plan.json`` from the points' SLO reports; return both.
    ``pack``: the validated pack but its failure section, as canonical JSON (its sha256 is
    capacity.json's ``inputs_sha256``).
    ``tables``: the points' requests tables, which the plan reads the contexts sent at the
    capacity point from (without them it sizes from the manifest's distributions)."""
    validated = validate_pack(json.loads(pack), "capacity params")
    docs = load_reports(list(reports))
    cap = build_capacity(docs, validated)
    # The settings it was decided on: a dry run judges the drills on this decision only if the
    # pack's settings are still these (rules/common.smk, capacity_decided).
    cap["inputs_sha256"] = sha256_hex(pack)
    replicas = build_plan(cap, docs, validated, [str(t) for t in tables])
    write_json_atomic(capacity, cap)
    write_json_atomic(plan, replicas)
    for sel in cap["open_loop"].values():
        log.info("%s", sel["decision"])
    log.info(
        "plan: %s replicas, %s %s",
        replicas.get("required_replicas"),
        replicas.get("required_gpus"),
        target_words(validated).units,
    )
    return cap, replicas
