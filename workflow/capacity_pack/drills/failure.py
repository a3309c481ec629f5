"""Failure drills: inject one fault into N replicas at the capacity point and prove what happened.

A drill is one named experiment with one mechanism (never a combined chaos score):

- ``replica_kill``: SIGKILL one replica (simulated cluster: ``POST /cluster/replicas/i/kill``;
  real target: the configured command). The router must detect it, stop routing to it, shed
  what the survivors cannot carry (admission control answers 429), and the supervisor restarts
  it (``restart_after_s``), cold.
- ``cold_replica``: at the injection the offered rate steps up by (N + 1) / N and a new replica
  is added (an autoscaler's reaction); it joins cold.
- ``kv_pressure``: one replica's usable KV blocks drop to ``kv_capacity_fraction`` for
  ``fault_s``.
- ``cancellation``: the client cancels ``cancel_fraction`` of the requests it sends during
  ``fault_s``, ``cancel_after_s`` after sending them.
- ``degraded_link``: ``latency_ms`` (and optionally a bandwidth cap) on the link between the
  router and one replica for ``fault_s``.

Drill rate: the selected capacity per replica x the drill's replicas (every replica at its
capacity point), or the configured rate. Admission limit per replica: ``admission_headroom`` x
the average in-flight requests per replica measured at that point (Little's law, from the
point's SLO reports).

One clock: every time in a drill report is an offset in seconds from the load generator's t0
on its CLOCK_MONOTONIC (``perf_counter_ns``); the scraper and the injector run in the same
process on that clock. Router events carry CLOCK_REALTIME stamps (another process) and are
mapped through the run's (t0, t0_realtime) anchor; the divergence of the two clocks over the
run, measured on every request's (sent, sent_realtime) pair, is reported beside them.

Windowed metrics: requests are binned by when they ended (``window_s`` wide), so a request cut
by the fault counts in the incident, not in the healthy window it was sent in; a window's
attainment is the share of successful requests meeting both their class's TTFT and TPOT
cutoffs; its failure share counts errors, timeouts and rejections (policy cancellations are
neither). Phases: before = [warm-up end, injection), during = [injection, recovery), after =
[recovery, last request's end]. Recovery = the later of the fault being cleared (replica back in
rotation, fault lifted) and the start of the first window from which every later window passes
(attainment >= the gate, failure share <= the error-rate gate). Queue recovery = the first
scrape after the incident's peak at which the engines' waiting queue is back at or under its
baseline maximum and the client's in-flight count under 1.2 x its baseline maximum.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.io import atomic_path, canonical_json, write_text_atomic
from capacity_pack.measure.sweep import SweepInputs
from capacity_pack.plan.manifest import (
    Drill,
    Experiment,
    Failure,
    OpenAITarget,
    Pack,
    PackInfo,
    Segment,
    SimTarget,
    WorkloadClass,
)
from capacity_pack.plan.schedule import Point, ScheduleClient, ScheduleInputs, build_schedule

log = logging.getLogger("capacity_pack.drills.failure")

NS = 1_000_000_000
# The alert that names each drill's mechanism, and what else it may legitimately set off.
MECHANISM = {
    "replica_kill": "replica_failure",
    "cold_replica": "cold_start",
    "kv_pressure": "kv_pressure",
    "cancellation": "cancellation",
    "degraded_link": "transfer_degradation",
}
CONSEQUENCES = {
    # The survivors cannot carry the rate (the seed's point): shedding is the honest answer, and
    # the supervisor's replacement comes back with an empty cache.
    "replica_kill": {"queue_saturation", "cold_start"},
    # The step up in load is what made the autoscaler act: until the new replica is ready the
    # old ones shed the excess.
    "cold_replica": {"queue_saturation"},
    # A replica that cannot hold its batch queues what it cannot admit.
    "kv_pressure": {"queue_saturation"},
    "cancellation": set(),
    "degraded_link": set(),
}
SYMPTOMS = {"errors", "slo"}


class DrillError(RuntimeError):
    """A drill could not be planned or run (bad configuration, target missing)."""


# ---------------------------------------------------------------------------------------------
# Inputs and plan
# ---------------------------------------------------------------------------------------------


class DrillInputs(BaseModel):
    """Exactly the manifest content one drill measurement reads (the rule's params)."""

    model_config = ConfigDict(extra="forbid")

    failure: Failure = Field(description="Drill settings, with only this drill in `drills`.")
    drill: Drill = Field(description="The drill.")
    sweep: SweepInputs = Field(description="Target, model, client, request and prompt shape.")
    replicas_under_test: int = Field(description="Replicas the sweep measured (per-replica rate).")

    @classmethod
    def for_drill(cls, pack: Pack, name: str) -> DrillInputs:
        if pack.failure is None:
            raise DrillError("the pack has no `failure` section")
        drills = {d.name: d for d in pack.failure.drills}
        if name not in drills:
            raise DrillError(f"no drill named {name!r} (drills: {sorted(drills)})")
        drill = drills[name]
        schedule = ScheduleInputs(
            pack=pack.pack,
            client=ScheduleClient.of(pack.client),
            workload=pack.workload,
            prompts=pack.prompts,
        )
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
        return cls(
            failure=measured,
            drill=drill,
            sweep=sweep,
            replicas_under_test=pack.plan.replicas_under_test,
        )

    def canonical_json(self) -> str:
        return canonical_json(self.model_dump(mode="json"))


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


def _selected_rate(
    inputs: DrillInputs, capacity: dict[str, Any] | None, reports: dict[str, dict[str, Any]]
) -> tuple[float | None, str, list[dict[str, Any]]]:
    """Per-replica rate and the SLO reports of that rate."""
    f = inputs.failure
    n_test = inputs.replicas_under_test
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
    at_rate = [
        r
        for r in reports.values()
        if per is not None
        and r.get("offered_rps") is not None
        and abs(float(r["offered_rps"]) - per * n_test) < 1e-9
    ]
    return per, source, at_rate


def plan_drill(
    inputs: DrillInputs,
    capacity: dict[str, Any] | None = None,
    reports: dict[str, dict[str, Any]] | None = None,
) -> DrillPlan:
    """The drill's rate, admission limit and timeline from the capacity decision."""
    f, d = inputs.failure, inputs.drill
    reports = reports or {}
    n = f.replicas or max(2, inputs.replicas_under_test)
    per, source, at_rate = _selected_rate(inputs, capacity, reports)
    if f.rate_rps is not None:
        rate, source = f.rate_rps, f"configured failure.rate_rps ({f.rate_rps:g} RPS)"
    elif per is not None:
        rate = per * n
        source = f"{source} x {n} replicas"
    else:
        raise DrillError(
            "no drill rate: the sweep selected no capacity point and tested no open-loop rate; "
            "set failure.rate_rps"
        )
    k, k_source = f.admission_max_outstanding, "configured failure.admission_max_outstanding"
    if k is None:
        inflight = [
            float(r["littles_law"]["average_in_flight"])
            for r in at_rate
            if (r.get("littles_law") or {}).get("average_in_flight")
        ]
        if inflight:
            per_replica = max(inflight) / inputs.replicas_under_test
            k = max(1, math.ceil(f.admission_headroom * per_replica))
            k_source = (
                f"{f.admission_headroom:g} x {per_replica:.1f} requests in flight per replica "
                f"measured at the capacity point (max over {len(inflight)} report(s))"
            )
        else:
            k_source = "no in-flight measurement at the drill rate: admission control off"
    mult = d.rate_multiplier or ((n + 1) / n if d.kind == "cold_replica" else 1.0)
    inject = d.inject_at_s or f.baseline_s
    restore = (
        inject + d.fault_s if d.kind in ("kv_pressure", "cancellation", "degraded_link") else None
    )
    if restore is not None and restore >= f.duration_s:
        raise DrillError(
            f"drill {d.name!r}: the fault ends at {restore:g} s, after the schedule "
            f"({f.duration_s:g} s)"
        )
    runnable, why = True, None
    real = isinstance(inputs.sweep.target, OpenAITarget)
    if real and d.commands is None and d.kind != "cancellation":
        runnable = False
        why = (
            f"drill {d.name!r} ({d.kind}) needs failure.drills[].commands for a real "
            "target (an argv that injects the fault, e.g. a kubectl line); none configured"
        )
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
    )


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
    if plan.drill.kind == "cancellation":
        lo = start_ns + int(plan.inject_at_s * NS)
        hi = start_ns + int((plan.restore_at_s or plan.duration_s) * NS)
        rng = np.random.default_rng([inputs.sweep.schedule.client.request_schedule_seed, 0xCA9CE1])
        due = frame["scheduled_offset_ns"].to_numpy()
        pick = (due >= lo) & (due < hi) & (rng.random(len(frame)) < plan.drill.cancel_fraction)
        cancel = frame["cancel_after_ns"].to_numpy().copy()
        cancel[pick] = int(plan.drill.cancel_after_s * NS)
        frame["cancel_after_ns"] = cancel
    return frame, start_ns


# ---------------------------------------------------------------------------------------------
# Running a drill
# ---------------------------------------------------------------------------------------------


class _Recorder:
    """The drill's scraper and injector, on the load generator's loop and clock."""

    def __init__(self, base_url: str, plan: DrillPlan, start_ns: int, interval_s: float, sim: bool):
        self.base_url = base_url
        self.plan = plan
        self.start_ns = start_ns
        self.interval_s = interval_s
        self.sim = sim
        self.scrapes: list[tuple[int, int, int, str | None]] = []
        self.actions: list[dict[str, Any]] = []
        self.t0_ns = 0
        self.t0_realtime_ns = 0

    def tasks(self, run: Any, stop: asyncio.Event) -> list[Any]:
        self.t0_ns, self.t0_realtime_ns = run.t0_ns, run.t0_realtime_ns
        return [self._scrape(run, stop), self._inject(stop)]

    async def _scrape(self, run: Any, stop: asyncio.Event) -> None:
        import httpx

        # A monitoring agent of its own (like Prometheus), never the load generator's client.
        async with httpx.AsyncClient(timeout=httpx.Timeout(2.0), trust_env=False) as client:
            nxt = time.perf_counter()
            while True:
                t = time.perf_counter_ns()
                rt = time.time_ns()
                text = None
                with contextlib.suppress(httpx.HTTPError):
                    resp = await client.get(f"{self.base_url}/metrics")
                    if resp.status_code == 200:
                        text = resp.text
                # Raw text now, parsed after the run: parsing here would delay the sends.
                self.scrapes.append((t - self.t0_ns, rt, int(run.state.in_flight), text))
                if stop.is_set():
                    return
                nxt += self.interval_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, nxt - time.perf_counter()))

    async def _at(self, offset_s: float, stop: asyncio.Event) -> bool:
        due = self.t0_ns + self.start_ns + int(offset_s * NS)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, (due - time.perf_counter_ns()) / NS))
        return not stop.is_set()

    async def _inject(self, stop: asyncio.Event) -> None:
        p = self.plan
        if not await self._at(p.inject_at_s, stop):
            return
        await self._act("inject")
        if p.restore_at_s is not None and await self._at(p.restore_at_s, stop):
            await self._act("restore")

    async def _act(self, which: str) -> None:
        d = self.plan.drill
        t = time.perf_counter_ns()
        entry: dict[str, Any] = {"action": which, "t_s": (t - self.t0_ns) / NS}
        try:
            if d.commands is not None:
                argv = d.commands.inject if which == "inject" else d.commands.restore
                if argv is None:
                    return
                entry.update(await _run_command(argv))
            elif self.sim:
                entry.update(await self._sim_action(which))
            else:
                entry["outcome"] = "nothing to do (client-side fault)"
        except Exception as err:  # a failed injection is a drill result, not a crash
            entry["error"] = f"{type(err).__name__}: {err}"
        entry["done_t_s"] = (time.perf_counter_ns() - self.t0_ns) / NS
        self.actions.append(entry)

    async def _sim_action(self, which: str) -> dict[str, Any]:
        import httpx

        d = self.plan.drill
        restore = which == "restore"
        if d.kind == "replica_kill":
            method, path, body = "POST", f"/cluster/replicas/{d.replica}/kill", {}
        elif d.kind == "cold_replica":
            method, path, body = "POST", "/cluster/replicas/add", {}
        elif d.kind == "kv_pressure":
            frac = 1.0 if restore else d.kv_capacity_fraction
            method, path, body = (
                "POST",
                f"/sim/faults?replica={d.replica}",
                {"kv_capacity_fraction": frac},
            )
        elif d.kind == "degraded_link":
            body = {"latency_ms": 0.0, "bandwidth_bytes_per_s": 0.0}
            if not restore:
                body = {
                    "latency_ms": d.latency_ms,
                    "bandwidth_bytes_per_s": d.bandwidth_bytes_per_s,
                }
            method, path = "POST", f"/cluster/replicas/{d.replica}/link"
        else:
            return {"outcome": "client-side fault: the schedule's cancellations"}
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
            resp = await client.request(method, f"{self.base_url}{path}", json=body)
        return {"request": f"{method} {path}", "body": body, "status": resp.status_code}


async def _run_command(argv: list[str]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    return {
        "command": argv,
        "returncode": proc.returncode,
        "stdout_tail": out.decode(errors="replace")[-500:],
        "stderr_tail": err.decode(errors="replace")[-500:],
    }


def parse_scrapes(
    scrapes: list[tuple[int, int, int, str | None]],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(samples: t_ns, metric, labels, value; scrapes: t_ns, realtime_ns, ok, client_in_flight)."""
    from capacity_pack.sim import metrics as m

    rows: list[tuple[int, str, str, float]] = []
    index = []
    for t, rt, in_flight, text in scrapes:
        ok = text is not None
        if ok:
            try:
                families = m.parse(text)
            except m.ExpositionError:
                ok = False
            else:
                for fam in families.values():
                    for s in fam.samples:
                        rows.append((t, s.name, m.format_labels(sorted(s.labels)), float(s.value)))
        index.append((t, rt, ok, in_flight))
    samples = pd.DataFrame(rows, columns=["t_ns", "metric", "labels", "value"])
    samples["t_ns"] = samples["t_ns"].astype(np.int64)
    frame = pd.DataFrame(index, columns=["t_ns", "realtime_ns", "ok", "client_in_flight"])
    return samples, frame.astype({"t_ns": np.int64, "realtime_ns": np.int64})


def run_drill(
    inputs: DrillInputs,
    plan: DrillPlan,
    out_dir: str | Path,
    *,
    progress: bool = False,
) -> dict[str, Any]:
    """Measure one drill; write records.jsonl, scrapes, events.json and drill.json."""
    from capacity_pack.measure.loadgen import run_point
    from capacity_pack.measure.sweep import load_settings, token_counter
    from capacity_pack.measure.target import SimProcess, _healthy

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    facts: dict[str, Any] = {"plan": plan.model_dump(mode="json"), "drill": plan.drill.name}
    if not plan.runnable:
        facts["skipped"] = plan.skip_reason
        _write_outputs(out, facts, [], pd.DataFrame(), pd.DataFrame(), None)
        return facts
    schedule, start_ns = drill_schedule(inputs, plan)
    records_path = out / "records.jsonl"
    records_path.unlink(missing_ok=True)
    target = inputs.sweep.target
    sim = isinstance(target, SimTarget)
    model = inputs.sweep.model.served_name or inputs.sweep.model.id
    proc = None
    f = inputs.failure
    try:
        if sim:
            assert isinstance(target, SimTarget)
            extra = ["--health-interval-s", str(f.health_interval_s), "--retries", "1"]
            if plan.admission_max_outstanding:
                extra += ["--admission-max-outstanding", str(plan.admission_max_outstanding)]
            if f.restart_after_s is not None:
                extra += ["--restart-after-s", str(f.restart_after_s)]
            if f.cold_start_s:
                extra += ["--cold-start-s", str(f.cold_start_s)]
            gt = out / "ground_truth.jsonl"
            gt.unlink(missing_ok=True)
            proc = SimProcess(
                target.model_copy(update={"replicas": plan.replicas}),
                model,
                ground_truth=gt if target.ground_truth else None,
                log_path=out / "server.log",
                extra_args=extra,
            )
            base_url = proc.start()
        else:
            assert isinstance(target, OpenAITarget)
            base_url = target.base_url.rstrip("/")
            if not _healthy(base_url, timeout_s=5.0):
                raise DrillError(f"{base_url}/health does not answer 200: is the target up?")
        recorder = _Recorder(base_url, plan, start_ns, f.scrape_interval_s, sim)
        settings = load_settings(inputs.sweep, drill_point(plan), base_url, progress=progress)
        settings.token_counter = token_counter(inputs.sweep, base_url)
        settings.min_successful_per_class = None  # a drill runs its profile, never extends it
        settings.maximum_duration_s = None
        settings.side_tasks = recorder.tasks
        summary = run_point(schedule, settings, records_path)
        events: list[dict[str, Any]] | None = None
        if sim:
            import httpx

            with contextlib.suppress(httpx.HTTPError, ValueError):
                events = httpx.get(f"{base_url}/cluster/events", timeout=5.0).json()["events"]
    finally:
        if proc is not None:
            proc.stop()
    samples, scrape_index = parse_scrapes(recorder.scrapes)
    facts.update(
        t0_ns=recorder.t0_ns,
        t0_realtime_ns=recorder.t0_realtime_ns,
        profile_start_s=start_ns / NS,
        actions=recorder.actions,
        load=summary,
        base_url=base_url if sim else "(configured target)",
        target_kind=target.kind,
        scheduled_requests=int(len(schedule)),
        clock="load generator CLOCK_MONOTONIC (perf_counter_ns), seconds from its t0",
    )
    _write_outputs(out, facts, events, samples, scrape_index, schedule)
    return facts


def _write_outputs(
    out: Path,
    facts: dict[str, Any],
    events: list[dict[str, Any]] | None,
    samples: pd.DataFrame,
    scrapes: pd.DataFrame,
    schedule: pd.DataFrame | None,
) -> None:
    from capacity_pack.measure.loadgen import _finite

    if schedule is not None:
        with atomic_path(out / "schedule.parquet") as tmp:
            schedule.to_parquet(tmp, index=False)
    elif not (out / "records.jsonl").exists():
        write_text_atomic(out / "records.jsonl", "")
    for name, frame in (("samples.parquet", samples), ("scrapes.parquet", scrapes)):
        with atomic_path(out / name) as tmp:
            frame.to_parquet(tmp, index=False)
    write_text_atomic(out / "events.json", json.dumps({"events": events}, indent=1) + "\n")
    write_text_atomic(out / "drill.json", json.dumps(_finite(facts), indent=1) + "\n")


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------


class DrillAnalysisSpec(BaseModel):
    """What analysing a drill reads from the manifest (the analysis rule's params)."""

    model_config = ConfigDict(extra="forbid")

    workload: list[WorkloadClass]
    attainment_min: float = Field(description="acceptance.class_slo_attainment_min")
    error_rate_max: float = Field(description="acceptance.error_rate_max")
    window_s: float
    warmup_s: float
    pack: PackInfo
    engine_name: str = Field(description="The engine's metric-name map (queue depth).")

    @classmethod
    def of(cls, pack: Pack) -> DrillAnalysisSpec:
        from capacity_pack.drills.dashboard import metric_map_name

        f = pack.failure or Failure()
        return cls(
            workload=pack.workload,
            attainment_min=pack.acceptance.class_slo_attainment_min,
            error_rate_max=pack.acceptance.error_rate_max,
            window_s=f.window_s,
            warmup_s=f.warmup_s,
            pack=pack.pack,
            engine_name=metric_map_name(pack),
        )

    def canonical_json(self) -> str:
        return canonical_json(self.model_dump(mode="json"))


def _pct(values: np.ndarray, p: float) -> float | None:
    from capacity_pack.evidence.analysis import nearest_rank

    if not len(values):
        return None
    return nearest_rank(np.sort(values), p / 100)


def _s(t_ns: Any) -> float | None:
    """Nanoseconds on the drill clock as seconds; None for a missing time (None, NaN, NA)."""
    return None if t_ns is None or pd.isna(t_ns) else float(t_ns) / NS


def request_frame(records_path: Path, spec: DrillAnalysisSpec, name: str) -> pd.DataFrame:
    """The drill's requests table (pandera-validated like a sweep point's), with SLO columns."""
    from capacity_pack.evidence.normalize import normalize, records_frame

    recs = records_frame(records_path)
    fixed = {c.name: c.output_tokens if isinstance(c.output_tokens, int) else None
             for c in spec.workload}  # fmt: skip
    if not len(recs) or "sent_ns" not in recs:
        return pd.DataFrame()
    req, _ = normalize(
        recs,
        point=f"drill-{name}",
        cache_state="warm",
        repeat=0,
        class_names=[c.name for c in spec.workload],
        fixed_output=fixed,
        source=str(records_path),
    )
    ttft = req["class"].map({c.name: c.request_ttft_cutoff_ms for c in spec.workload})
    tpot = req["class"].map({c.name: c.request_tpot_cutoff_ms for c in spec.workload})
    ok = req["status"] == "ok"
    req["meets_slo"] = ok & (req["ttft_ms"] <= ttft) & (req["tpot_ms"] <= tpot)
    req["failed"] = req["status"].isin(["error", "timeout", "rejected"])
    # Where a request lands in time: when it ended. A request cut by the fault belongs to the
    # incident, not to the healthy window in which it happened to be sent.
    req["end_offset_ns"] = req["sent_offset_ns"] + (req["end_ns"] - req["sent_ns"])
    return req


def windows(req: pd.DataFrame, start_ns: int, end_ns: int, width_s: float) -> pd.DataFrame:
    """Per-window counts and latencies by terminal time (vectorized)."""
    width = int(width_s * NS)
    edges = np.arange(start_ns, end_ns + width, width)
    r = req[(req["end_offset_ns"] >= start_ns) & (req["end_offset_ns"] < edges[-1])].copy()
    r["w"] = ((r["end_offset_ns"] - start_ns) // width).astype(int)
    ok = r[r["status"] == "ok"]
    g = r.groupby("w")
    frame = pd.DataFrame(
        {
            "attempted": g.size(),
            "ok": g["status"].apply(lambda s: int((s == "ok").sum())),
            "failed": g["failed"].sum(),
            "rejected": g["status"].apply(lambda s: int((s == "rejected").sum())),
            "cancelled": g["status"].apply(lambda s: int((s == "cancelled").sum())),
            "meets_slo": g["meets_slo"].sum(),
        }
    ).reindex(range(len(edges) - 1), fill_value=0)
    og = ok.groupby("w")
    frame["ttft_p95_ms"] = og["ttft_ms"].quantile(0.95, interpolation="higher")
    frame["tpot_p95_ms"] = og["tpot_ms"].quantile(0.95, interpolation="higher")
    frame["start_s"] = edges[:-1] / NS
    judged = frame["attempted"] - frame["cancelled"]
    frame["attainment"] = np.where(frame["ok"] > 0, frame["meets_slo"] / frame["ok"].clip(lower=1),
                                   np.nan)  # fmt: skip
    frame["failure_share"] = np.where(judged > 0, frame["failed"] / judged.clip(lower=1), np.nan)
    return frame.reset_index(drop=True)


def phase_stats(req: pd.DataFrame, lo_ns: int, hi_ns: int, spec: DrillAnalysisSpec) -> dict:
    """TTFT/TPOT/attainment of the requests that ended in [lo, hi), per class and joint."""
    r = req[(req["end_offset_ns"] >= lo_ns) & (req["end_offset_ns"] < hi_ns)]
    out: dict[str, Any] = {
        "from_s": lo_ns / NS,
        "to_s": hi_ns / NS,
        "attempted": int(len(r)),
        "ok": int((r["status"] == "ok").sum()),
        "failed": int(r["failed"].sum()),
        "rejected": int((r["status"] == "rejected").sum()),
        "cancelled": int((r["status"] == "cancelled").sum()),
    }
    judged = out["attempted"] - out["cancelled"]
    out["error_rate"] = out["failed"] / judged if judged else None
    ok = r[r["status"] == "ok"]
    out["attainment"] = float(ok["meets_slo"].mean()) if len(ok) else None
    dur = max(1e-9, (hi_ns - lo_ns) / NS)
    out["goodput_rps"] = float(ok["meets_slo"].sum()) / dur
    classes = {}
    for c in spec.workload:
        k = ok[ok["class"] == c.name]
        classes[c.name] = {
            "ok": int(len(k)),
            "ttft_p50_ms": _pct(k["ttft_ms"].to_numpy(), 50),
            "ttft_p95_ms": _pct(k["ttft_ms"].to_numpy(), 95),
            "tpot_p50_ms": _pct(k["tpot_ms"].to_numpy(), 50),
            "tpot_p95_ms": _pct(k["tpot_ms"].to_numpy(), 95),
            "attainment": float(k["meets_slo"].mean()) if len(k) else None,
        }
    out["classes"] = classes
    return out


def clock_check(req: pd.DataFrame) -> dict[str, Any]:
    """Divergence of CLOCK_MONOTONIC from CLOCK_REALTIME over the run, on every request."""
    if not len(req):
        return {"requests": 0}
    rt0 = req["sent_realtime_ns"] - req["sent_ns"]
    drift = (rt0 - rt0.iloc[0]).abs()
    return {
        "requests": int(len(req)),
        "max_divergence_us": float(drift.max() / 1e3),
        "note": "realtime - monotonic on each request's send; router events are mapped with it",
    }


def _series(samples: pd.DataFrame, metric: str) -> pd.DataFrame:
    s = samples[samples["metric"] == metric]
    return s.groupby("t_ns", as_index=False)["value"].sum()


def queue_evidence(
    samples: pd.DataFrame, scrapes: pd.DataFrame, inject_ns: int, base_lo_ns: int,
    waiting_metric: str, incident_end_ns: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Queue peak after the injection and when it came back to its baseline."""
    sc = scrapes[scrapes["ok"]] if len(scrapes) else scrapes
    wait = (
        _series(samples, waiting_metric)
        if len(samples)
        else pd.DataFrame(columns=["t_ns", "value"])
    )
    q = sc[["t_ns", "client_in_flight"]].merge(wait, on="t_ns", how="left").fillna({"value": 0.0})
    q = q.rename(columns={"value": "server_waiting"})
    base = q[(q["t_ns"] >= base_lo_ns) & (q["t_ns"] < inject_ns)]
    inc = q[(q["t_ns"] >= inject_ns) & (q["t_ns"] <= (incident_end_ns or q["t_ns"].max()))]
    out: dict[str, Any] = {"waiting_metric": waiting_metric, "scrapes": int(len(q))}
    if not len(base) or not len(inc):
        out["note"] = "too few scrapes around the injection"
        return out
    b_wait, b_fl = float(base["server_waiting"].max()), float(base["client_in_flight"].max())
    peak_i = (inc["server_waiting"] + inc["client_in_flight"]).idxmax()
    peak = inc.loc[peak_i]
    after = q[q["t_ns"] > peak["t_ns"]]
    back = after[(after["server_waiting"] <= b_wait) & (after["client_in_flight"] <= 1.2 * b_fl)]
    out.update(
        baseline_server_waiting_max=b_wait,
        baseline_client_in_flight_max=b_fl,
        peak_t_s=_s(int(peak["t_ns"])),
        peak_server_waiting=float(inc["server_waiting"].max()),
        peak_client_in_flight=float(inc["client_in_flight"].max()),
        recovered_t_s=_s(int(back["t_ns"].iloc[0])) if len(back) else None,
    )
    return out


def counter_increase(samples: pd.DataFrame, metric: str) -> float | None:
    """Increase of a counter summed over its series across the run (resets counted)."""
    s = samples[samples["metric"] == metric]
    if not len(s):
        return None
    total = 0.0
    for _, g in s.groupby("labels"):
        v = g.sort_values("t_ns")["value"].to_numpy()
        d = np.diff(v)
        total += float(np.where(d < 0, v[1:], d).sum())
    return total


def alert_episodes(rules_path: Path, samples: pd.DataFrame, scrapes: pd.DataFrame) -> pd.DataFrame:
    """The pack's alert rules evaluated at every scrape (capacity_pack.drills.promql)."""
    from capacity_pack.drills import promql

    rules = promql.load_rules(rules_path)
    ok = scrapes[scrapes["ok"]] if len(scrapes) else scrapes
    if not len(ok):
        return pd.DataFrame(columns=["alert", "labels", "pending_t_ns", "firing_t_ns",
                                     "resolved_t_ns", "max_value", "mechanism"])  # fmt: skip
    store = promql.SeriesStore.from_frame(samples, ok["t_ns"].to_numpy(dtype=np.int64))
    ep = promql.evaluate_alerts(rules, store, ok["t_ns"].to_numpy(dtype=np.int64))
    mech = {r.alert: r.labels.get("mechanism") for r in rules}
    ep["mechanism"] = ep["alert"].map(mech)
    return ep


def analyze_drill(
    drill_dir: str | Path, rules_path: str | Path, spec: DrillAnalysisSpec
) -> dict[str, Any]:
    """The failure-test fields of one drill, all from its records, scrapes and events."""
    d = Path(drill_dir)
    facts = json.loads((d / "drill.json").read_text())
    plan = DrillPlan.model_validate(facts["plan"])
    name, kind = plan.drill.name, plan.drill.kind
    report: dict[str, Any] = {
        "drill": name,
        "kind": kind,
        "mechanism": MECHANISM[kind],
        "plan": facts["plan"],
    }
    if facts.get("skipped"):
        report["skipped"] = facts["skipped"]
        return report
    from capacity_pack.drills.dashboard import engine_metrics

    req = request_frame(d / "records.jsonl", spec, name)
    samples = pd.read_parquet(d / "samples.parquet")
    scrapes = pd.read_parquet(d / "scrapes.parquet")
    events = json.loads((d / "events.json").read_text()).get("events") or []
    start = int(facts["profile_start_s"] * NS)
    inject_planned = start + int(plan.inject_at_s * NS)
    t0_rt = int(facts["t0_realtime_ns"])
    for e in events:
        e["t_s"] = (int(e["unix_ns"]) - t0_rt) / NS
    actions = facts.get("actions") or []
    inject_act = next((a for a in actions if a["action"] == "inject"), None)
    restore_act = next((a for a in actions if a["action"] == "restore"), None)
    injection = _injection_time(kind, plan, events, inject_act, inject_planned)
    # The schedule must be complete: every scheduled request recorded exactly once, terminal.
    sched = pd.read_parquet(d / "schedule.parquet")
    from capacity_pack.evidence.normalize import reconcile

    rec_ids = req[["request_id"]] if len(req) else pd.DataFrame(columns=["request_id"])
    completeness = reconcile(rec_ids, sched, f"{d}/records.jsonl")
    last_due = int(req["end_offset_ns"].max()) if len(req) else start
    base_lo = start + int(spec.warmup_s * NS)
    wins = windows(req, base_lo, last_due + 1, spec.window_s)
    inj_ns = int(injection["t_s"] * NS)
    cleared_ns, cleared_how = _fault_cleared(kind, plan, events, restore_act, inj_ns, start)
    recovered_ns, recovery_how = _recovery(wins, inj_ns, cleared_ns, spec, start_s=base_lo)
    waiting = engine_metrics(spec.engine_name).waiting or "vllm:num_requests_waiting"
    queue = queue_evidence(samples, scrapes, inj_ns, base_lo, waiting, recovered_ns)
    # Alerts over the same scrapes, on the same clock.
    ep = alert_episodes(Path(rules_path), samples, scrapes)
    fired = []
    for row in ep.itertuples():
        first = row.firing_t_ns
        fired.append(
            {
                "alert": row.alert,
                "mechanism": row.mechanism,
                "labels": row.labels,
                "pending_t_s": _s(row.pending_t_ns),
                "firing_t_s": None if pd.isna(first) else _s(first),
                "resolved_t_s": None if pd.isna(row.resolved_t_ns) else _s(row.resolved_t_ns),
                "max_value": float(row.max_value),
            }
        )
    firing = [a for a in fired if a["firing_t_s"] is not None]
    after_inj = [a for a in firing if a["firing_t_s"] >= injection["t_s"]]
    own = [a for a in after_inj if a["mechanism"] == MECHANISM[kind]]
    detection = min((a["firing_t_s"] for a in own), default=None)
    if detection is None:
        detection = min((a["firing_t_s"] for a in after_inj), default=None)
    removed = [
        e for e in events
        if e["event"] == "removed" and e.get("replica") == plan.drill.replica
        and e["t_s"] >= injection["t_s"] - 1e-3
    ]  # fmt: skip
    router_removal = removed[0]["t_s"] if removed and kind == "replica_kill" else None
    fails = req[req["failed"]] if len(req) else req
    fails_after = fails[fails["end_ns"] - fails["sent_ns"] + fails["sent_offset_ns"] >= inj_ns]
    end_off = fails_after["sent_offset_ns"] + (fails_after["end_ns"] - fails_after["sent_ns"])
    mech_fired = {a["mechanism"] for a in firing}
    others = sorted(mech_fired - {MECHANISM[kind]} - CONSEQUENCES[kind] - SYMPTOMS)
    end_ns = last_due + 1
    lost = fails_after[fails_after["status"].isin(["error", "timeout"])]
    report.update(
        clock=facts["clock"] + "; router events mapped from CLOCK_REALTIME via t0_realtime_ns",
        clock_check=clock_check(req),
        schedule_completeness=completeness,
        terminal_statuses=req["status"].value_counts().to_dict() if len(req) else {},
        rate_rps=plan.rate_rps,
        rate_after_rps=plan.rate_after_rps,
        replicas=plan.replicas,
        admission_max_outstanding=plan.admission_max_outstanding,
        injection_time_s=injection["t_s"],
        injection_source=injection["source"],
        detection_time_s=detection,
        detection_source="first firing of the alert naming the mechanism (else of any alert)",
        router_removal_time_s=router_removal,
        router_events=[e for e in events if e["t_s"] >= -1.0],
        fault_cleared_time_s=_s(cleared_ns),
        fault_cleared_by=cleared_how,
        first_error_time_s=float(end_off.min() / NS) if len(end_off) else None,
        last_error_time_s=float(end_off.max() / NS) if len(end_off) else None,
        recovery_time_s=_s(recovered_ns),
        recovery_rule=recovery_how,
        phases={
            "before": phase_stats(req, base_lo, inj_ns, spec),
            "during": phase_stats(req, inj_ns, recovered_ns or end_ns, spec),
            "after": phase_stats(req, recovered_ns, end_ns, spec) if recovered_ns else None,
        },
        queue=queue,
        requests_retried=counter_increase(samples, "router:retries_total"),
        retried_source="router:retries_total increase (the client does not retry: "
        "automatic_retries is false)",
        requests_rejected=int((fails_after["status"] == "rejected").sum()),
        requests_lost=int(len(lost)),
        requests_cancelled=int((req["status"] == "cancelled").sum()) if len(req) else 0,
        admission_rejected=counter_increase(samples, "router:admission_rejected_total"),
        alerts=fired,
        alerts_fired=sorted({a["alert"] for a in firing}),
        expected_alert_fired=bool(own),
        unexpected_mechanisms_fired=others,
        windows=wins.replace({np.nan: None}).to_dict("records"),
    )
    report["capacity_returned_without_manual_repair"] = _capacity_returned(
        report, kind, events, plan, spec
    )
    return report


def _injection_time(kind, plan, events, act, planned_ns) -> dict[str, Any]:
    if kind == "replica_kill":
        ev = [
            e for e in events if e["event"] == "killed" and e.get("replica") == plan.drill.replica
        ]
        if ev:
            return {"t_s": ev[0]["t_s"], "source": "router event 'killed' (SIGKILL sent)"}
    if kind == "cold_replica":
        ev = [e for e in events if e["event"] == "added"]
        if ev:
            return {"t_s": ev[0]["t_s"], "source": "router event 'added' (replica spawned)"}
    if act is not None:
        return {
            "t_s": act["t_s"],
            "source": "injector action started "
            f"({act.get('request') or act.get('command') or 'client side'})",
        }
    return {"t_s": planned_ns / NS, "source": "planned injection time (no action recorded)"}


def _fault_cleared(kind, plan, events, restore_act, inj_ns, start_ns) -> tuple[int | None, str]:
    if kind in ("replica_kill", "cold_replica"):
        want = plan.drill.replica if kind == "replica_kill" else None
        ready = [
            e for e in events
            if e["event"] == "ready" and e["t_s"] * NS > inj_ns
            and (want is None or e.get("replica") == want)
        ]  # fmt: skip
        if ready:
            what = "restarted replica" if kind == "replica_kill" else "added replica"
            return int(ready[0]["t_s"] * NS), f"router event 'ready': the {what} is in rotation"
        if kind == "replica_kill" and plan.drill.commands is not None and not events:
            return None, "unknown: a real target exposes no router events"
        return None, "never: the replica did not come back into rotation during the run"
    if restore_act is not None:
        return int(restore_act["done_t_s"] * NS), "the drill lifted the fault"
    return None, "never: the fault was not lifted"


def _recovery(wins: pd.DataFrame, inj_ns: int, cleared_ns, spec, start_s: int):
    width = int(spec.window_s * NS)
    after = wins[(wins["start_s"] * NS) >= inj_ns - width]
    ok = (after["attainment"].fillna(0) >= spec.attainment_min) & (
        after["failure_share"].fillna(0) <= spec.error_rate_max
    )
    # The first window from which every later one passes.
    tail_ok = ok[::-1].cummin()[::-1]
    first = after.loc[tail_ok[tail_ok].index, "start_s"]
    rule = (
        "later of: fault cleared, and the start of the first window from which every window "
        f"has attainment >= {spec.attainment_min} and failure share <= {spec.error_rate_max}"
    )
    if not len(first) or cleared_ns is None:
        return None, rule + " (not reached during the run)"
    return max(int(first.iloc[0] * NS), int(cleared_ns), inj_ns), rule


def _capacity_returned(report, kind, events, plan, spec) -> dict[str, Any]:
    """Did the service get back to passing its gates with nobody repairing anything?"""
    after = (report["phases"] or {}).get("after")
    evidence = []
    passing = bool(
        after
        and after["attainment"] is not None
        and after["attainment"] >= spec.attainment_min
        and (after["error_rate"] or 0.0) <= spec.error_rate_max
    )
    if kind == "replica_kill":
        restarted = [e for e in events if e["event"] == "restarted"]
        evidence.append(
            f"supervisor restarts: {len(restarted)}; the replica was back in rotation at "
            f"{report['fault_cleared_time_s']} s (router event)"
        )
    elif report["fault_cleared_by"]:
        evidence.append(f"fault cleared: {report['fault_cleared_by']}")
    if after:
        evidence.append(
            f"after recovery ({after['from_s']:.1f}-{after['to_s']:.1f} s): attainment "
            f"{after['attainment']}, error rate {after['error_rate']}"
        )
    else:
        evidence.append("no recovered window during the run")
    return {
        "value": bool(passing and report["recovery_time_s"] is not None),
        # The drill only lifts the fault it injected; nothing touches data or replicas by hand.
        "manual_actions": 0,
        "evidence": evidence,
    }


# ---------------------------------------------------------------------------------------------
# failure-test.md and its JSON twin
# ---------------------------------------------------------------------------------------------


def _fmt(v: Any, unit: str = "", digits: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}{unit}"
    return f"{v}{unit}"


def _rel(t: float | None, inj: float | None) -> str:
    if t is None:
        return "n/a"
    if inj is None:
        return f"{t:.2f} s"
    return f"{t:.2f} s (injection {t - inj:+.2f} s)"


def failure_test(reports: list[dict[str, Any]], pack: dict[str, Any]) -> dict[str, Any]:
    """The JSON twin of failure-test.md: every drill's fields plus the checks across them."""
    ran = [r for r in reports if not r.get("skipped")]
    return {
        "pack": pack,
        "clock": ran[0]["clock"] if ran else None,
        "drills": reports,
        "summary": {
            "drills_run": [r["drill"] for r in ran],
            "drills_skipped": {r["drill"]: r["skipped"] for r in reports if r.get("skipped")},
            "any_alert_fired": any(r["alerts_fired"] for r in ran),
            "expected_alerts_fired": {r["drill"]: r["expected_alert_fired"] for r in ran},
            "unexpected_mechanisms": {r["drill"]: r["unexpected_mechanisms_fired"] for r in ran},
        },
    }


def failure_test_markdown(doc: dict[str, Any]) -> str:
    """failure-test.md: the seed's fields per drill, from measured data, with the clock named."""
    pack = doc["pack"]
    lines = [
        f"# Failure test: {pack.get('title') or pack.get('name')}",
        "",
        f"> {pack['label']}" if pack.get("label") else "",
        "",
        "Each drill is its own experiment with one failure mechanism (no combined chaos score). "
        "Every time below is in seconds on one clock: "
        f"{doc['clock'] or 'n/a'}. Fields come from the per-request records, the scraped "
        "`/metrics` series and the router's event log of each drill.",
        "",
    ]
    s = doc["summary"]
    lines += [
        "## Summary",
        "",
        "| drill | mechanism | expected alert fired | alerts fired | detection | recovery | "
        "capacity returned |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["drills"]:
        if r.get("skipped"):
            lines.append(f"| {r['drill']} | {r['mechanism']} | skipped | | | | |")
            continue
        inj = r["injection_time_s"]
        det = r["detection_time_s"]
        rec = r["recovery_time_s"]
        lines.append(
            f"| {r['drill']} | {r['mechanism']} | {'yes' if r['expected_alert_fired'] else 'NO'}"
            f" | {', '.join(r['alerts_fired']) or 'none'} | "
            f"{_fmt(det - inj if det is not None else None, ' s')} after injection | "
            f"{_fmt(rec - inj if rec is not None else None, ' s')} after injection | "
            f"{'yes' if r['capacity_returned_without_manual_repair']['value'] else 'no'} |"
        )
    lines.append("")
    for name, why in s["drills_skipped"].items():
        lines += [f"- `{name}` skipped: {why}"]
    for r in doc["drills"]:
        if r.get("skipped"):
            continue
        lines += _drill_section(r)
    return "\n".join(lines).rstrip() + "\n"


def _drill_section(r: dict[str, Any]) -> list[str]:
    inj = r["injection_time_s"]
    p = r["plan"]
    q = r["queue"]
    lines = [
        "",
        f"## Drill `{r['drill']}` ({r['kind']}, mechanism `{r['mechanism']}`)",
        "",
        f"- Load: {r['rate_rps']:.1f} RPS open loop against {r['replicas']} replicas "
        f"({p['rate_source']}); from the injection on {r['rate_after_rps']:.1f} RPS.",
        f"- Router admission limit: {r['admission_max_outstanding'] or 'off'} requests per "
        f"healthy replica ({p['admission_source']}).",
        f"- Schedule completeness: {r['schedule_completeness']}; terminal statuses: "
        f"{r['terminal_statuses']} (no request without a terminal status).",
        f"- Clock check: monotonic vs realtime divergence over the run "
        f"{_fmt(r['clock_check'].get('max_divergence_us'), ' us', 1)}.",
        "",
        "| field | value |",
        "|---|---|",
        f"| injection_time | {_rel(inj, None)} ({r['injection_source']}) |",
        f"| detection_time | {_rel(r['detection_time_s'], inj)} ({r['detection_source']}) |",
        f"| router_removal_time | {_rel(r['router_removal_time_s'], inj)} |",
        f"| fault cleared | {_rel(r['fault_cleared_time_s'], inj)} ({r['fault_cleared_by']}) |",
        f"| first_error_time | {_rel(r['first_error_time_s'], inj)} |",
        f"| last_error_time | {_rel(r['last_error_time_s'], inj)} |",
        f"| queue peak | {_fmt(q.get('peak_server_waiting'), '', 0)} waiting in the engines, "
        f"{_fmt(q.get('peak_client_in_flight'), '', 0)} in flight at the client (baseline max "
        f"{_fmt(q.get('baseline_server_waiting_max'), '', 0)} / "
        f"{_fmt(q.get('baseline_client_in_flight_max'), '', 0)}) |",
        f"| queue recovery time | {_rel(q.get('recovered_t_s'), inj)} |",
        f"| recovery_time | {_rel(r['recovery_time_s'], inj)} |",
        f"| requests retried | {_fmt(r['requests_retried'], '', 0)} ({r['retried_source']}) |",
        f"| requests rejected | {r['requests_rejected']} (429/503 answers; router admission "
        f"control shed {_fmt(r['admission_rejected'], '', 0)}) |",
        f"| requests lost | {r['requests_lost']} (errors and timeouts after the injection) |",
        f"| requests cancelled | {r['requests_cancelled']} (client policy) |",
        f"| alerts fired | {', '.join(r['alerts_fired']) or 'none'} |",
        f"| capacity returned without manual repair | "
        f"{'yes' if r['capacity_returned_without_manual_repair']['value'] else 'no'}: "
        f"{'; '.join(r['capacity_returned_without_manual_repair']['evidence'])} |",
        "",
        "TTFT, TPOT and SLO attainment by phase (requests binned by when they ended; "
        "attainment = share of successful requests meeting both class cutoffs):",
        "",
        "| phase | window | attempted | ok | failed | error rate | attainment | goodput | "
        "worst-class p95 TTFT | worst-class p95 TPOT |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for phase in ("before", "during", "after"):
        st = r["phases"].get(phase)
        if not st:
            lines.append(f"| {phase} | not reached | | | | | | | | |")
            continue
        cls = st["classes"].values()
        ttft = max((c["ttft_p95_ms"] for c in cls if c["ttft_p95_ms"] is not None), default=None)
        tpot = max((c["tpot_p95_ms"] for c in cls if c["tpot_p95_ms"] is not None), default=None)
        lines.append(
            f"| {phase} | {st['from_s']:.1f}-{st['to_s']:.1f} s | {st['attempted']} | {st['ok']}"
            f" | {st['failed']} | {_fmt(st['error_rate'], '', 3)} | "
            f"{_fmt(st['attainment'], '', 3)} | {_fmt(st['goodput_rps'], ' RPS', 1)} | "
            f"{_fmt(ttft, ' ms', 1)} | {_fmt(tpot, ' ms', 1)} |"
        )
    lines += ["", "Alerts (evaluated by the project over the scraped series with the pack's "
              "rule file; times on the drill clock):", ""]  # fmt: skip
    if not r["alerts"]:
        lines.append("- none fired")
    for a in r["alerts"]:
        lines.append(
            f"- `{a['alert']}` ({a['mechanism']}) {a['labels']}: pending "
            f"{_rel(a['pending_t_s'], inj)}, firing {_rel(a['firing_t_s'], inj)}, resolved "
            f"{_rel(a['resolved_t_s'], inj)}"
        )
    verdict = "yes" if r["expected_alert_fired"] else "NO"
    lines += [
        "",
        f"Expected mechanism alert fired: {verdict}. Other mechanisms' alerts fired: "
        f"{', '.join(r['unexpected_mechanisms_fired']) or 'none'} (allowed consequences of "
        f"this drill: {', '.join(sorted(CONSEQUENCES[r['kind']])) or 'none'}).",
    ]
    return lines


def tracking_record(report: dict[str, Any]) -> dict[str, Any]:
    """The MLflow child run of one drill (keyword arguments of ``log_child_run``)."""
    inj = report.get("injection_time_s")

    def after(t: float | None) -> float | None:
        return None if t is None or inj is None else t - inj

    metrics: dict[str, Any] = {}
    params: dict[str, Any] = {"kind": report["kind"], "mechanism": report["mechanism"]}
    tags = {"capacity_pack.drill": report["drill"]}
    if report.get("skipped"):
        tags["capacity_pack.skipped"] = "true"
    else:
        before = report["phases"]["before"]
        during = report["phases"]["during"]
        params.update(
            rate_rps=report["rate_rps"],
            replicas=report["replicas"],
            admission_max_outstanding=report["admission_max_outstanding"],
        )
        metrics = {
            "detection_after_injection_s": after(report["detection_time_s"]),
            "router_removal_after_injection_s": after(report["router_removal_time_s"]),
            "recovery_after_injection_s": after(report["recovery_time_s"]),
            "requests_rejected": report["requests_rejected"],
            "requests_lost": report["requests_lost"],
            "requests_retried": report["requests_retried"],
            "attainment_before": before["attainment"],
            "attainment_during": during["attainment"],
            "error_rate_during": during["error_rate"],
            "queue_peak_waiting": report["queue"].get("peak_server_waiting"),
            "alerts_fired": len(report["alerts_fired"]),
            "expected_alert_fired": float(report["expected_alert_fired"]),
        }
        tags["capacity_pack.alerts_fired"] = ",".join(report["alerts_fired"]) or "none"
    return {
        "stage": "failure",
        "job": f"failure/{report['drill']}",
        "point": f"drill-{report['drill']}",
        "params": {k: v for k, v in params.items() if v is not None},
        "metrics": metrics,
        "tags": tags,
    }
