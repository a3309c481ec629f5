"""Failure drills in virtual time: the same drill on the engine model's fleet, in seconds of CPU.

The drill's schedule is replayed against :class:`capacity_pack.sim.fleet.Fleet` (prompts:
:func:`capacity_pack.twin.requests.fleet_requests`) and writes the files a live drill writes,
each saying it is virtual; the realtime anchor is ``VIRTUAL_EPOCH_NS`` plus the offset. A real
target runs its calibrated twin behind :data:`REAL_TARGET_POLICY`, labelled a prediction.

Docs: docs/failure-drills.md, "How a drill runs"; docs/twin.md, "The plan drill of a real
target".
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.drills.kinds import kind, kinds
from capacity_pack.drills.plan import NS, DrillError, DrillInputs, DrillPlan, drill_schedule
from capacity_pack.plan.manifest import SimTarget
from capacity_pack.twin.requests import fleet_requests

# Virtual stamps: monotonic and realtime origins of a virtual run (arbitrary, fixed, so that the
# same drill writes the same files).
VIRTUAL_T0_NS = 1_000 * NS
VIRTUAL_EPOCH_NS = 1_800_000_000 * NS
CLOCK = (
    "virtual: the engine model's simulated clock (capacity_pack.sim.fleet), seconds from the "
    "fleet's start; no network, no client lateness"
)
TWIN_CLOCK = (
    "virtual: the calibrated twin's engine model clock (capacity_pack.sim.fleet), seconds from "
    "the fleet's start; no network, no client lateness"
)
# The project's router's policy when given none (`capacity-pack sim cluster --router`): a managed
# target's drill fleet runs behind it (tests/unit/drills/test_plan_twin.py checks they agree).
REAL_TARGET_POLICY = "least_outstanding"


def scrape_frames(scrapes: list[Any], rt0: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The fleet's scrapes as the live drill's two tables (:func:`capacity_pack.drills.run.
    parse_scrapes`): samples (t_ns, metric, labels, value), labels written as the exposition
    reader writes them; scrapes (t_ns, realtime_ns, ok, client_in_flight)."""
    from capacity_pack.engines.exposition import format_labels

    label_text: dict[tuple, str] = {}
    rows = []
    for t, _, samples in scrapes:
        for name, labels, value in samples:
            key = tuple(labels)
            text = label_text.get(key)
            if text is None:
                text = label_text[key] = format_labels(dict(labels))
            rows.append((t, name, text, value))
    frame = pd.DataFrame(rows, columns=["t_ns", "metric", "labels", "value"])
    frame["t_ns"] = frame["t_ns"].astype(np.int64)
    index = pd.DataFrame(
        [(t, rt0 + t, True, fl) for t, fl, _ in scrapes],
        columns=["t_ns", "realtime_ns", "ok", "client_in_flight"],
    ).astype({"t_ns": np.int64, "realtime_ns": np.int64})
    return frame, index


def _records(schedule: pd.DataFrame, results: list[Any], t0: int, rt0: int) -> list[str]:
    """The fleet's results as the load generator's ``records.jsonl`` lines, one per scheduled
    request, stamped from the virtual origins ``t0`` (monotonic) and ``rt0`` (realtime)."""
    from capacity_pack.measure.records import Attempt

    lines = []
    for row, res in zip(schedule.to_dict("records"), results, strict=True):
        offset = int(row["scheduled_offset_ns"])
        a = Attempt(
            request_id=str(row["request_id"]),
            seq=int(row["seq"]),
            klass=str(row["class"]),
            phase=str(row["phase"]),
            block=int(row["block"]),
            input_tokens=int(row["input_tokens"]),
            output_tokens_expected=int(row["output_tokens"]),
            scheduled_offset_ns=offset,
            due_ns=t0 + offset,
            sent_ns=t0 + res.sent_ns,
            sent_realtime_ns=rt0 + res.sent_ns,
            first_token_ns=t0 + res.token_ns[0] if res.token_ns else None,
            last_token_ns=t0 + res.token_ns[-1] if res.token_ns else None,
            end_ns=t0 + res.end_ns,
            end_realtime_ns=rt0 + res.end_ns,
            chunk_ns=[t0 + t for t in res.token_ns],
            chunk_tokens=[1] * len(res.token_ns),
            http_status=res.http_status,
            status=res.status,
            error=res.error,
            finish_reason="length" if res.status == "ok" else None,
            prompt_tokens=res.prompt_tokens if res.status == "ok" else None,
            completion_tokens=len(res.token_ns) if res.status == "ok" else None,
            cached_tokens=res.cached_tokens if res.status == "ok" else None,
        )
        lines.append(a.to_json(t0, rt0))
    return lines


def _virtual_twin(inputs: DrillInputs, plan: DrillPlan) -> dict[str, Any] | None:
    """The calibrated twin a real target's drill runs on (None: a simulated target's own
    profile); a drill virtual time cannot run is refused, saying why."""
    target = inputs.sweep.target
    twin = plan.twin if not isinstance(target, SimTarget) else None
    if not isinstance(target, SimTarget) and not (twin and twin.get("trusted")):
        raise DrillError(
            "a virtual drill needs the target's engine model: a simulated target's own, or a "
            "real target's trusted calibrated twin"
        )
    if not kind(plan.drill.kind).kills_replica:
        # The fleet model's only fault is a killed replica.
        killers = ", ".join(k.name for k in kinds() if k.kills_replica)
        raise DrillError(f"virtual time runs {killers} drills only, not {plan.drill.kind}")
    return twin


def _engine_model(
    inputs: DrillInputs, plan: DrillPlan, twin: dict[str, Any] | None
) -> tuple[Any, str, str]:
    """(the engine profile every replica runs, the router's policy, who "started" them)."""
    from capacity_pack.sim.profile import load_profile

    if twin is not None:
        policy = REAL_TARGET_POLICY
        started_by = (
            f"virtual time: {plan.replicas} copies of the calibrated twin's engine model "
            f"({twin['profile']}) behind the project's router policy ({policy}); "
            f"{twin['label']}"
        )
        return load_profile(twin["profile"]), policy, started_by
    target = inputs.sweep.target
    assert isinstance(target, SimTarget)
    started_by = (
        f"virtual time: {plan.replicas} engine models of profile {target.profile!r} behind "
        "the router's policy (capacity_pack.sim.fleet)"
    )
    return load_profile(target.profile), target.router, started_by


def run_virtual_drill(inputs: DrillInputs, plan: DrillPlan, out_dir: str | Path) -> dict[str, Any]:
    """Run the drill in virtual time; write the live drill's files; return its facts."""
    from capacity_pack.drills.files import write_outputs
    from capacity_pack.sim.fleet import Fleet, FleetSettings

    target = inputs.sweep.target
    twin = _virtual_twin(inputs, plan)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cpu0 = time.process_time()
    schedule, start_ns = drill_schedule(inputs, plan)
    seed = inputs.sweep.schedule.client.request_schedule_seed
    f = inputs.failure
    client = inputs.sweep.client
    model = inputs.sweep.model.served_name or inputs.sweep.model.id
    inject_s = start_ns / NS + plan.inject_at_s
    profile, policy, started_by = _engine_model(inputs, plan, twin)
    settings = FleetSettings(
        replicas=plan.replicas,
        policy=policy,
        admission_max_outstanding=plan.admission_max_outstanding or 0,
        retries=1,
        health_interval_s=f.health_interval_s,
        restart_after_s=f.restart_after_s,
        cold_start_s=f.cold_start_s,
        request_timeout_s=client.request_timeout_seconds,
        scrape_interval_s=f.scrape_interval_s,
        model_name=model,
        kills=((plan.drill.replica, inject_s),),
    )
    requests = fleet_requests(schedule, seed)
    run = Fleet(profile, settings, seed=seed).run(requests)
    t0, rt0 = VIRTUAL_T0_NS, VIRTUAL_EPOCH_NS
    lines = _records(schedule, run.results, t0, rt0)
    (out / "records.jsonl").write_text("\n".join(lines) + "\n" if lines else "")
    samples, scrape_index = scrape_frames(run.scrapes, rt0)
    events = [
        {"unix_ns": rt0 + int(e["t_ns"]), **{k: v for k, v in e.items() if k != "t_ns"}}
        for e in run.events
    ]
    statuses = pd.Series([r.status for r in run.results]).value_counts().to_dict()
    facts: dict[str, Any] = {
        "plan": plan.model_dump(mode="json"),
        "drill": plan.drill.name,
        "execution": "virtual",
        "t0_ns": t0,
        "t0_realtime_ns": rt0,
        "profile_start_s": start_ns / NS,
        "actions": [
            {
                "action": "inject",
                "t_s": inject_s,
                "done_t_s": inject_s,
                "request": f"virtual SIGKILL of replica {plan.drill.replica}",
            }
        ],
        "load": {
            "requests": len(requests),
            "statuses": statuses,
            "virtual_s": run.end_ns / NS,
            "engine_steps": run.steps,
            "cpu_s": time.process_time() - cpu0,
        },
        "base_url": "(virtual)",
        "target_kind": target.kind,
        "replicas_started_by": started_by,
        "scheduled_requests": int(len(schedule)),
        "clock": TWIN_CLOCK if twin is not None else CLOCK,
    }
    if twin is not None:
        facts["prediction"] = twin["label"]
    write_outputs(out, facts, events, samples, scrape_index, schedule)
    return facts
