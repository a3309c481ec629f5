"""Failure drills, run: one drill against its target, with every request, scrape and event kept.

Simulated replicas, or copies of a managed command
(:class:`capacity_pack.measure.managed.ManagedFleet`), behind the project's router; another
real target injects with the drill's commands (:mod:`capacity_pack.measure.commands`). The
scraper and injector share the load generator's clock; router events are mapped through the
(t0, t0_realtime) anchor in ``drill.json``.

Files and clock: docs/failure-drills.md, "How a drill runs".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.drills.files import write_outputs
from capacity_pack.drills.kinds import kind
from capacity_pack.drills.plan import (
    NS,
    DrillError,
    DrillInputs,
    DrillPlan,
    drill_point,
    drill_schedule,
)
from capacity_pack.engines import exposition
from capacity_pack.measure.clock import realtime_at
from capacity_pack.measure.commands import run_command
from capacity_pack.plan.manifest import OpenAITarget, SimTarget


class DrillRecorder:
    """The drill's scraper and injector, on the load generator's loop and clock."""

    def __init__(
        self,
        base_url: str,
        plan: DrillPlan,
        start_ns: int,
        interval_s: float,
        routed: bool,
        control_headers: dict[str, str] | None = None,
    ):
        self.base_url = base_url
        self.plan = plan
        self.start_ns = start_ns
        self.interval_s = interval_s
        # Behind the project's router: faults go through its control plane.
        self.routed = routed
        # The router's control-plane token, for the injector's calls only.
        self.control_headers = dict(control_headers or {})
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
                rt = realtime_at(t)
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
                entry.update(await _run_command(argv, d.commands.timeout_s))
            elif self.routed:
                entry.update(await self._router_action(which))
            else:
                entry["outcome"] = "nothing to do (client-side fault)"
        except Exception as err:  # a failed injection is a drill result, not a crash
            entry["error"] = f"{type(err).__name__}: {err}"
        entry["done_t_s"] = (time.perf_counter_ns() - self.t0_ns) / NS
        self.actions.append(entry)

    async def _router_action(self, which: str) -> dict[str, Any]:
        import httpx

        d = self.plan.drill
        spec = kind(d.kind)
        if spec.router is None:
            return {"outcome": f"client-side fault: {spec.client_fault}"}
        method, path, body = spec.router(d, which == "restore")
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
            resp = await client.request(
                method, f"{self.base_url}{path}", json=body, headers=self.control_headers
            )
        return {"request": f"{method} {path}", "body": body, "status": resp.status_code}


async def _run_command(argv: list[str], timeout_s: float) -> dict[str, Any]:
    """Run a drill's command off the event loop (the load goes on), killed after ``timeout_s``;
    its output redacted."""
    done = await asyncio.to_thread(run_command, argv, timeout_s=timeout_s, what="drill command")
    entry: dict[str, Any] = {
        "command": argv,
        "returncode": done.returncode,
        "stdout_tail": done.stdout[-500:],
        "stderr_tail": done.stderr[-500:],
    }
    if done.timed_out:
        entry["timed_out"] = True
        entry["error"] = f"drill command {done.summary()}"
    return entry


def parse_scrapes(
    scrapes: list[tuple[int, int, int, str | None]],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(samples: t_ns, metric, labels, value; scrapes: t_ns, realtime_ns, ok, client_in_flight)."""
    rows: list[tuple[int, str, str, float]] = []
    index = []
    for t, rt, in_flight, text in scrapes:
        ok = text is not None
        if ok:
            try:
                found = exposition.samples(text, strict=True)
            except exposition.ExpositionError:
                ok = False
            else:
                rows += [(t, s.name, exposition.format_labels(s.labels), s.value) for s in found]
        index.append((t, rt, ok, in_flight))
    samples = pd.DataFrame(rows, columns=["t_ns", "metric", "labels", "value"])
    samples["t_ns"] = samples["t_ns"].astype(np.int64)
    frame = pd.DataFrame(index, columns=["t_ns", "realtime_ns", "ok", "client_in_flight"])
    return samples, frame.astype({"t_ns": np.int64, "realtime_ns": np.int64})


def _start_target(
    inputs: DrillInputs, plan: DrillPlan, out: Path
) -> tuple[Any, str, dict[str, str]]:
    """(the process the drill started or None, the base URL it drives, the control headers):
    simulated replicas or a managed command's copies behind the project's router, else the
    configured target, which must be up."""
    from capacity_pack.measure.target import SimProcess, healthy

    target, f = inputs.sweep.target, inputs.failure
    # The router's settings, for simulated and managed replicas alike.
    extra = ["--health-interval-s", str(f.health_interval_s), "--retries", "1"]
    if plan.admission_max_outstanding:
        extra += ["--admission-max-outstanding", str(plan.admission_max_outstanding)]
    if f.restart_after_s is not None:
        extra += ["--restart-after-s", str(f.restart_after_s)]
    if isinstance(target, OpenAITarget) and target.managed is not None:
        from capacity_pack.measure.managed import ManagedError, ManagedFleet

        fleet = ManagedFleet(
            target.managed,
            plan.replicas,
            keep_alive=target.keep_alive,
            extra_args=extra,
            log_path=out / "server.log",
        )
        try:
            base_url = fleet.start()
        except ManagedError as err:
            raise DrillError(f"the managed target did not start for the drill: {err}") from None
        return fleet, base_url, fleet.control_headers
    if isinstance(target, SimTarget):
        if f.cold_start_s:
            extra += ["--cold-start-s", str(f.cold_start_s)]
        gt = out / "ground_truth.jsonl"
        gt.unlink(missing_ok=True)
        model = inputs.sweep.model.served_name or inputs.sweep.model.id
        proc = SimProcess(
            target.model_copy(update={"replicas": plan.replicas}),
            model,
            ground_truth=gt if target.ground_truth else None,
            log_path=out / "server.log",
            extra_args=extra,
        )
        try:
            return proc, proc.start(), proc.control_headers
        except BaseException:
            proc.stop()  # a start that failed half-way leaves nothing running
            raise
    base_url = target.base_url.rstrip("/")
    if not healthy(base_url, timeout_s=5.0):
        raise DrillError(f"{base_url}/health does not answer 200: is the target up?")
    return None, base_url, {}


def run_drill(
    inputs: DrillInputs,
    plan: DrillPlan,
    out_dir: str | Path,
    *,
    progress: bool = False,
) -> dict[str, Any]:
    """Measure one drill; write records.jsonl, scrapes, events.json and drill.json."""
    from capacity_pack.measure.inputs import load_settings, token_counter
    from capacity_pack.measure.run import run_point

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    facts: dict[str, Any] = {"plan": plan.model_dump(mode="json"), "drill": plan.drill.name}
    if not plan.runnable:
        facts["skipped"] = plan.skip_reason
        write_outputs(out, facts, [], pd.DataFrame(), pd.DataFrame(), None)
        return facts
    if plan.execution == "virtual":
        from capacity_pack.drills.virtual import run_virtual_drill

        return run_virtual_drill(inputs, plan, out)
    schedule, start_ns = drill_schedule(inputs, plan)
    records_path = out / "records.jsonl"
    records_path.unlink(missing_ok=True)
    target = inputs.sweep.target
    sim = isinstance(target, SimTarget)
    managed = isinstance(target, OpenAITarget) and target.managed is not None
    proc: Any = None
    f = inputs.failure
    try:
        proc, base_url, control = _start_target(inputs, plan, out)
        routed = sim or managed  # behind the project's router, whose control plane acts
        recorder = DrillRecorder(base_url, plan, start_ns, f.scrape_interval_s, routed, control)
        settings = load_settings(inputs.sweep, drill_point(plan), base_url, progress=progress)
        settings.token_counter = token_counter(inputs.sweep, base_url)
        settings.min_successful_per_class = None  # a drill runs its profile, never extends it
        settings.maximum_duration_s = None
        settings.side_tasks = recorder.tasks
        summary = run_point(schedule, settings, records_path)
        events: list[dict[str, Any]] | None = None
        if routed:
            import httpx

            with contextlib.suppress(httpx.HTTPError, ValueError):
                events = httpx.get(
                    f"{base_url}/cluster/events", headers=control, timeout=5.0
                ).json()["events"]
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
        base_url=base_url if routed else "(configured target)",
        target_kind=target.kind,
        replicas_started_by=(
            "the pack: simulated replicas behind the project's router"
            if sim
            else "the pack: the managed command's servers behind the project's router"
            if managed
            else "the operator (a configured target the drill does not start)"
        ),
        scheduled_requests=int(len(schedule)),
        execution="live",
        clock="load generator CLOCK_MONOTONIC (perf_counter_ns), seconds from its t0",
    )
    write_outputs(out, facts, events, samples, scrape_index, schedule)
    return facts
