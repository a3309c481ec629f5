"""Failure drills, planned: which drills exist, what each reads, its rate, limit and schedule.

A drill is one named experiment of a kind registered in :mod:`capacity_pack.drills.kinds`. Rate:
``failure.rate_rps``, else the selected capacity per replica x the drill's replicas (a simulated
target's capped at ``failure.plan_drill.live_max_rps``), x ``rate_multiplier`` from the
injection; admission limit ceil(``admission_headroom`` x L / replicas under test), L from
Little's law. The plan drill (``plan_replica_kill``) runs ``required_replicas`` at
``plan.peak_rps``, live, virtual (:mod:`capacity_pack.drills.virtual`), or on a trusted
calibrated twin (:class:`capacity_pack.twin.trust.ValidatedTwin`).

Method: docs/failure-drills.md, "How a drill is planned", "Drill rate and admission limit" and
"The plan drill".
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.drills.kinds import NS, kind, kinds
from capacity_pack.io import canonical_json
from capacity_pack.measure.inputs import SweepInputs
from capacity_pack.plan.manifest import (
    PLAN_DRILL,
    Drill,
    Experiment,
    Failure,
    OpenAITarget,
    Pack,
    PlanDrill,
    Segment,
    SimTarget,
)
from capacity_pack.plan.schedule import Point, ScheduleInputs, build_schedule
from capacity_pack.twin.trust import ValidatedTwin

# Kind -> the alert mechanism it must fire, and what else it may set off, as the registered
# kinds say (the drills' own code asks the registry; tests read these).
MECHANISM = {k.name: k.mechanism for k in kinds()}
CONSEQUENCES = {k.name: set(k.consequences) for k in kinds()}
SYMPTOMS = {"errors", "slo"}


class DrillError(RuntimeError):
    """A drill could not be planned or run (bad configuration, target missing)."""


class DrillInputs(BaseModel):
    """Exactly the manifest content one drill measurement reads (the rule's params)."""

    model_config = ConfigDict(extra="forbid")

    failure: Failure = Field(description="Drill settings, with only this drill in `drills`.")
    drill: Drill = Field(description="The drill.")
    sweep: SweepInputs = Field(description="Target, model, client, request and prompt shape.")
    replicas_under_test: int = Field(description="Replicas the sweep measured (per-replica rate).")
    scope: Literal["capacity_point", "plan"] = Field(
        default="capacity_point",
        description="capacity_point: a mechanism test at the selected capacity per replica; "
        "plan: the recommended fleet at the planned peak (the N+1 check).",
    )
    peak_rps: float | None = Field(default=None, description="plan scope: plan.peak_rps.")
    plan_drill: PlanDrill | None = Field(
        default=None, description="The plan drill's settings (its live limits bound every drill)."
    )
    twin_absent: str | None = Field(
        default=None,
        description="plan scope, real target: why the pack has no validated twin to predict a "
        "plan too large to run live (None: it has one, or the target is simulated).",
    )

    @classmethod
    def for_drill(cls, pack: Pack, name: str, twin_absent: str | None = None) -> DrillInputs:
        """The inputs of drill ``name`` of ``pack``; ``twin_absent``: why the pack has no
        validated twin (:func:`capacity_pack.twin.calibrate.twin_absent_reason`), kept for a
        real target's plan drill, whose skip reason states it."""
        if pack.failure is None:
            raise DrillError("the pack has no `failure` section")
        drills = {d.name: d for d in pack.failure.all_drills}
        if name not in drills:
            raise DrillError(f"no drill named {name!r} (drills: {sorted(drills)})")
        drill = drills[name]
        schedule = ScheduleInputs.of_pack(pack)
        sweep = SweepInputs(
            schedule=schedule,
            target=pack.target,
            model=pack.model,
            client=pack.client,
            request=pack.request,
            prompts=pack.prompts,
            min_successful_samples_per_class=pack.acceptance.min_successful_samples_per_class,
        )
        # Alert thresholds and the analysis window only change how a drill is read: they are
        # left out, so changing them re-analyzes the drills without running them again.
        defaults = Failure.model_fields
        measured = pack.failure.model_copy(
            update={
                "drills": [drill],
                "alert_thresholds": {},
                "window_s": defaults["window_s"].default,
            }
        )
        plan_scope = name == PLAN_DRILL
        real = isinstance(pack.target, OpenAITarget)
        return cls(
            failure=measured,
            drill=drill,
            sweep=sweep,
            replicas_under_test=pack.plan.replicas_under_test,
            scope="plan" if plan_scope else "capacity_point",
            peak_rps=pack.plan.peak_rps if plan_scope else None,
            # Its live limits bound every live drill of a simulated target.
            plan_drill=pack.failure.plan_drill,
            twin_absent=twin_absent if plan_scope and real else None,
        )

    def canonical_json(self) -> str:
        # Left out when None: a drill without it keeps the params it had before it existed.
        exclude = {"twin_absent"} if self.twin_absent is None else set()
        return canonical_json(self.model_dump(mode="json", exclude=exclude))


class DrillPlan(BaseModel):
    """What a drill does, with every derived number and where it came from."""

    model_config = ConfigDict(extra="forbid")

    drill: Drill
    replicas: int = Field(description="Replicas behind the router.")
    rate_rps: float = Field(description="Offered rate before the injection.")
    rate_after_rps: float = Field(description="Offered rate from the injection on.")
    rate_source: str = Field(description="Where the rate came from.")
    admission_max_outstanding: int | None = Field(description="Router admission limit/replica.")
    admission_source: str
    inject_at_s: float = Field(description="Injection, seconds after the rate profile starts.")
    restore_at_s: float | None = Field(description="When a reversible fault is lifted.")
    duration_s: float
    runnable: bool = Field(description="False: skipped (see skip_reason).")
    skip_reason: str | None = None
    scope: Literal["capacity_point", "plan"] = Field(
        default="capacity_point", description="Mechanism test, or the plan's N+1 check."
    )
    execution: Literal["live", "virtual"] = Field(
        default="live",
        description="live: processes on this host; virtual: the engine model in virtual time.",
    )
    execution_reason: str = Field(default="", description="Why this execution.")
    planned: dict[str, Any] | None = Field(
        default=None, description="plan scope: the plan's numbers (plan.json) the drill checks."
    )
    twin: dict[str, Any] | None = Field(
        default=None,
        description="plan scope, real target: the calibrated twin consulted (profile path, "
        "trusted, capacity error, tolerance, label); virtual execution runs on its profile.",
    )


class DrillNumbers(BaseModel):
    """The numbers a drill takes from the pack's decision, and only those: the selected capacity
    per replica, the in-flight averages measured at it, and (plan drill) plan.json's figures.

    They are the drill rule's params (rules/failure.smk), read once the capacity decision has
    run: a drill reruns when one of these numbers changes, never because the analysis code that
    produced them did (an analysis edit that leaves capacity as it was re-measures nothing)."""

    model_config = ConfigDict(extra="forbid")

    per_replica_rps: float | None = Field(
        description="Selected capacity per replica, else the configured fallback, else the "
        "lowest tested rate / replicas under test (None: nothing to take a rate from)."
    )
    rate_source: str = Field(description="Where per_replica_rps came from.")
    inflight_at_rate: list[float] = Field(
        default_factory=list,
        description="Little's-law average requests in flight of each SLO report at "
        "per_replica_rps x replicas under test (the admission limit's basis).",
    )
    planned: dict[str, Any] | None = Field(
        default=None, description="plan scope: the plan's numbers (plan.json) the drill checks."
    )

    @classmethod
    def of(
        cls,
        inputs: DrillInputs,
        capacity: dict[str, Any] | None,
        reports: dict[str, dict[str, Any]] | None = None,
        plan_doc: dict[str, Any] | None = None,
    ) -> DrillNumbers:
        """From ``capacity`` (capacity.json; None: none decided), the open-loop SLO
        ``reports`` by path and, for the plan drill, ``plan_doc`` (plan.json)."""
        f = inputs.failure
        n_test = inputs.replicas_under_test
        reports = reports or {}
        open_loop = (capacity or {}).get("open_loop") or {}
        primary = (capacity or {}).get("primary_cache_state")
        per = None
        source = ""
        for state in [primary, "warm", "cold"]:
            sel = open_loop.get(state) if state else None
            if sel and sel.get("capacity_per_replica_rps"):
                per = float(sel["capacity_per_replica_rps"])
                source = (
                    f"selected capacity ({state} cache): {per:g} RPS per replica "
                    f"(capacity.json open_loop.{state})"
                )
                break
        rates = sorted(
            {float(r["offered_rps"]) for r in reports.values() if r.get("offered_rps") is not None}
        )
        if per is None:
            if f.fallback_rate_per_replica_rps is not None:
                per = f.fallback_rate_per_replica_rps
                source = f"no capacity point selected: configured fallback {per:g} RPS per replica"
            elif rates:
                per = rates[0] / n_test
                source = (
                    f"no capacity point selected: the lowest tested rate, {rates[0]:g} RPS on "
                    f"{n_test} replica(s)"
                )
        inflight = [
            float(r["littles_law"]["average_in_flight"])
            for _, r in sorted(reports.items())
            if per is not None
            and r.get("offered_rps") is not None
            and abs(float(r["offered_rps"]) - per * n_test) < 1e-9
            and (r.get("littles_law") or {}).get("average_in_flight")
        ]
        return cls(
            per_replica_rps=per,
            rate_source=source,
            inflight_at_rate=inflight,
            planned=_planned(plan_doc) if inputs.scope == "plan" else None,
        )

    @classmethod
    def from_files(
        cls,
        inputs: DrillInputs,
        capacity: str | Path | None,
        reports: Iterable[str | Path] = (),
        plan: str | Path | None = None,
    ) -> DrillNumbers:
        """:meth:`of` on the decision's files (``plan`` is read for the plan drill only)."""

        def read(path: str | Path) -> dict[str, Any]:
            try:
                doc = json.loads(Path(path).read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
                raise DrillError(f"{path}: expected a JSON document ({err})") from None
            if not isinstance(doc, dict):
                raise DrillError(f"{path}: expected a JSON object, got {type(doc).__name__}")
            return doc

        return cls.of(
            inputs,
            read(capacity) if capacity is not None else None,
            {str(p): read(p) for p in reports},
            read(plan) if plan is not None and inputs.scope == "plan" else None,
        )

    def canonical_json(self) -> str:
        return canonical_json(self.model_dump(mode="json"))


def plan_drill(
    inputs: DrillInputs, numbers: DrillNumbers, twin: ValidatedTwin | None = None
) -> DrillPlan:
    """The drill's rate, admission limit and timeline from the decision's ``numbers`` (and, for
    a real target's plan drill, ``twin``: the pack's calibrated twin and its validation, when it
    has one)."""
    f, d = inputs.failure, inputs.drill
    n, rate, source, planned = _size(inputs, numbers)
    k, k_source = _admission(inputs, numbers)
    spec = kind(d.kind)
    mult = d.rate_multiplier or ((n + 1) / n if spec.rate_step else 1.0)
    inject = d.inject_at_s or f.baseline_s
    restore = inject + d.fault_s if spec.reversible else None
    if restore is not None and restore >= f.duration_s:
        raise DrillError(
            f"drill {d.name!r}: the fault ends at {restore:g} s, after the schedule "
            f"({f.duration_s:g} s)"
        )
    runnable, why = True, None
    execution, execution_reason = "live", "processes on this host"
    twin_used: dict[str, Any] | None = None
    live = True
    if inputs.scope == "plan":
        assert planned is not None
        runnable, why, execution, execution_reason, twin_used = _plan_execution(
            inputs, n, rate, planned, twin
        )
        # In virtual time nothing on the target is touched, and a plan drill that cannot run
        # says its own reason: only a live one needs a way to inject.
        live = runnable and execution == "live"
    if live and (no_way := _no_injector(inputs)):
        runnable, why = False, no_way
    return DrillPlan(
        drill=d,
        replicas=n,
        rate_rps=rate,
        rate_after_rps=rate * mult,
        rate_source=source,
        admission_max_outstanding=k,
        admission_source=k_source,
        inject_at_s=inject,
        restore_at_s=restore,
        duration_s=f.duration_s,
        runnable=runnable,
        skip_reason=why,
        scope=inputs.scope,
        execution=execution,
        execution_reason=execution_reason,
        planned=planned,
        twin=twin_used,
    )


def _size(
    inputs: DrillInputs, numbers: DrillNumbers
) -> tuple[int, float, str, dict[str, Any] | None]:
    """(replicas, rate before the injection, where the rate came from, the plan's numbers)."""
    f, target = inputs.failure, inputs.sweep.target
    per, source = numbers.per_replica_rps, numbers.rate_source
    if inputs.scope == "plan":
        planned = numbers.planned or _planned(None)
        n = int(planned.get("required_replicas") or 1)
        assert inputs.peak_rps is not None
        rate = inputs.peak_rps
        source = (
            f"the plan's peak, {rate:g} RPS, on the plan's {n} replicas "
            f"({planned.get('replicas_for_load')} for the load at "
            f"{planned.get('target_utilization')} target utilization + "
            f"{planned.get('redundancy_replicas')} redundancy + "
            f"{planned.get('warm_pool_replicas')} warm pool; plan.json)"
        )
        return n, rate, source, planned
    real = isinstance(target, OpenAITarget)
    n = f.replicas or (inputs.replicas_under_test if real else max(2, inputs.replicas_under_test))
    cap = (inputs.plan_drill or PlanDrill()).live_max_rps
    if f.rate_rps is not None:
        return n, f.rate_rps, f"configured failure.rate_rps ({f.rate_rps:g} RPS)", None
    if per is not None and isinstance(target, SimTarget) and per * n > cap:
        # The project's router relays every simulated replica's stream: past this host's
        # live limit the drill would measure the router, not the mechanism.
        source = (
            f"{source} x {n} replicas = {per * n:g} RPS, capped at this host's live limit "
            f"of {cap:g} RPS (failure.plan_drill.live_max_rps: the router, one process, "
            "relays every stream)"
        )
        return n, cap, source, None
    if per is not None:
        return n, per * n, f"{source} x {n} replicas", None
    raise DrillError(
        "no drill rate: the sweep selected no capacity point and tested no open-loop "
        "rate; set failure.rate_rps"
    )


def _admission(inputs: DrillInputs, numbers: DrillNumbers) -> tuple[int | None, str]:
    """The router's admission limit per replica, and where it came from."""
    f = inputs.failure
    if f.admission_max_outstanding is not None:
        return f.admission_max_outstanding, "configured failure.admission_max_outstanding"
    inflight = numbers.inflight_at_rate
    if not inflight:
        return None, "no in-flight measurement at the capacity point: admission control off"
    per_replica = max(inflight) / inputs.replicas_under_test
    source = (
        f"{f.admission_headroom:g} x {per_replica:.1f} requests in flight per replica "
        f"measured at the capacity point (max over {len(inflight)} report(s))"
    )
    return max(1, math.ceil(f.admission_headroom * per_replica)), source


def _no_injector(inputs: DrillInputs) -> str | None:
    """Why a live drill has nothing to inject its fault with on its target (None: it has)."""
    d, target = inputs.drill, inputs.sweep.target
    spec = kind(d.kind)
    if d.commands is not None or not isinstance(target, OpenAITarget):
        return None
    if target.managed is not None and spec.needs_engine:
        return (
            f"drill {d.name!r} ({d.kind}) needs failure.drills[].commands for a managed "
            "target: the router can kill, add and slow replicas, but only the engine can "
            f"{spec.needs_engine}"
        )
    if target.managed is None and spec.router is not None:
        where = "failure.plan_drill" if inputs.scope == "plan" else "failure.drills[]"
        return (
            f"drill {d.name!r} ({d.kind}) needs {where}.commands for a real "
            "target (an argv that injects the fault, e.g. a kubectl line); none configured"
        )
    return None


def _planned(plan_doc: dict[str, Any] | None) -> dict[str, Any]:
    """The plan's numbers the plan drill checks (an empty plan when there is none)."""
    keys = (
        "required_replicas",
        "replicas_for_load",
        "redundancy_replicas",
        "warm_pool_replicas",
        "target_utilization",
        "planned_utilization",
        "capacity_per_replica_rps",
        "capacity_cache_state",
        "reason",
    )
    doc = plan_doc or {}
    # The throughput plan's figures sit under "throughput"; the combined count at the top.
    merged = {**(doc.get("throughput") or {}), **doc}
    return {k: merged.get(k) for k in keys}


def _plan_execution(
    inputs: DrillInputs,
    n: int,
    rate: float,
    planned: dict[str, Any],
    twin: ValidatedTwin | None = None,
) -> tuple[bool, str | None, str, str, dict[str, Any] | None]:
    """(runnable, why not, live or virtual, why, the twin consulted) for the plan drill."""
    settings = inputs.plan_drill or PlanDrill()
    if planned.get("required_replicas") is None:
        why = planned.get("reason") or "the plan has no replica count"
        return False, f"no plan to drill: {why}", "live", "", None
    sim = isinstance(inputs.sweep.target, SimTarget)
    fits = n <= settings.live_max_replicas and rate <= settings.live_max_rps
    size = (
        f"{n} replica{'s' if n != 1 else ''} at {rate:g} RPS against this host's live limit of "
        f"{settings.live_max_replicas} replicas and {settings.live_max_rps:g} RPS "
        "(failure.plan_drill.live_max_replicas, live_max_rps)"
    )
    if settings.mode == "live" or (settings.mode == "auto" and fits):
        how = "configured: mode live" if settings.mode == "live" else f"auto: {size}"
        return True, None, "live", how, None
    how = "configured: mode virtual" if settings.mode == "virtual" else f"auto: {size}"
    if sim:
        return True, None, "virtual", how, None
    # A real target: virtual time on the calibrated twin, when its validation trusts it.
    if twin is not None and twin.trusted:
        return True, None, "virtual", f"{how}; {twin.label()}", twin.summary()
    if twin is not None:
        why = (
            f"{how}, and the calibrated twin that could predict it is untrusted: "
            f"{twin.error_words()}"
        )
        return False, why, "live", "", twin.summary()
    none = "there is no calibrated twin" + (f": {inputs.twin_absent}" if inputs.twin_absent else "")
    why = (
        "the plan drill of a real target runs live, or in virtual time on its calibrated twin: "
        f"{size}, and {none}"
        if settings.mode == "auto"
        else f"configured: mode virtual, which for a real target runs on its calibrated twin, "
        f"and {none}"
    )
    return False, why, "live", "", None


def drill_point(plan: DrillPlan) -> Point:
    return Point(mode="exp", experiment=plan.drill.name, cache_state="warm", repeat=0)


def drill_schedule(inputs: DrillInputs, plan: DrillPlan) -> tuple[pd.DataFrame, int]:
    """The drill's arrivals and the offset (ns) at which its rate profile starts."""
    segs = [Segment(duration_s=plan.inject_at_s, rate_rps=plan.rate_rps)]
    segs.append(
        Segment(duration_s=plan.duration_s - plan.inject_at_s, rate_rps=plan.rate_after_rps)
    )
    exp = Experiment(
        name=plan.drill.name,
        test_type="stress" if plan.rate_after_rps > plan.rate_rps else "average-load",
        segments=segs,
        cache_states=["warm"],
    )
    sched_inputs = inputs.sweep.schedule.model_copy(update={"experiments": [exp]})
    frame = build_schedule(sched_inputs, drill_point(plan))
    warm = frame.loc[frame["phase"] == "warmup", "scheduled_offset_ns"]
    start_ns = int(warm.max()) if len(warm) else 0
    client_part = kind(plan.drill.kind).schedule
    if client_part is not None:
        lo = start_ns + int(plan.inject_at_s * NS)
        hi = start_ns + int((plan.restore_at_s or plan.duration_s) * NS)
        seed = inputs.sweep.schedule.client.request_schedule_seed
        client_part(frame, plan.drill, (lo, hi), seed)
    return frame, start_ns
