"""Failure drills, run: one drill against its target, with every request, scrape and event kept.

For the simulated target the drill starts ``replicas`` simulated replicas behind the router
(admission control at the planned limit, one retry on connect failures, health checks every
``health_interval_s``, supervisor restarts after ``restart_after_s``, restarted or added
replicas loading for ``cold_start_s``). For a managed target (``target.managed``) it starts
``replicas`` copies of the managed command behind the same router
(:class:`capacity_pack.measure.managed.ManagedFleet`), so a replica the pack started is killed,
detected, removed and restarted by the router's supervisor as a simulated one is, and a
restarted copy loads for as long as the real server takes; the placeholder ``base_url`` of a
managed target is never contacted. Any other real target must answer ``/health`` and injects
its faults with the drill's configured commands (each killed after the drill's
``commands.timeout_s``, its output redacted: :mod:`capacity_pack.measure.commands`). The load
generator runs the drill's open-loop schedule and never extends it (no minimum sample count, no
maximum duration).

One clock: every time in a drill's files is an offset in seconds (or ns) from the load
generator's t0 on its CLOCK_MONOTONIC (``perf_counter_ns``). The scraper and the injector are
side tasks on the load generator's event loop, so they share that clock: the scraper reads
``/metrics`` every ``scrape_interval_s`` with a client of its own (as Prometheus would) and
keeps the raw text, parsed only after the run so that parsing never delays a send; the
injector acts at ``profile start + inject_at_s`` (and lifts a reversible fault at
``restore_at_s``), recording when each action started and finished. Router events carry
CLOCK_REALTIME stamps from another process; the run's (t0, t0_realtime) anchor, written to
``drill.json``, maps them onto the drill clock at analysis time.

Outputs of one drill directory: ``records.jsonl`` (per-request records), ``schedule.parquet``,
``samples.parquet`` (t_ns, metric, labels, value), ``scrapes.parquet`` (t_ns, realtime_ns, ok,
client_in_flight), ``events.json`` (router events, null for a target the drill does not start)
and ``drill.json`` (the plan, the clock anchor, the injector's actions and the load summary). A
drill that cannot run on its target (see :func:`capacity_pack.drills.plan.plan_drill`) writes
the same files, empty, and says why in ``drill.json``.
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
from capacity_pack.drills.plan import (
    NS,
    DrillError,
    DrillInputs,
    DrillPlan,
    drill_point,
    drill_schedule,
)
from capacity_pack.engines import exposition
from capacity_pack.measure.commands import run_command
from capacity_pack.plan.manifest import OpenAITarget, SimTarget


class _Recorder:
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
    from capacity_pack.measure.target import SimProcess, healthy

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
    model = inputs.sweep.model.served_name or inputs.sweep.model.id
    proc: Any = None
    control: dict[str, str] = {}
    f = inputs.failure
    try:
        # The router's settings, for simulated and managed replicas alike.
        extra = ["--health-interval-s", str(f.health_interval_s), "--retries", "1"]
        if plan.admission_max_outstanding:
            extra += ["--admission-max-outstanding", str(plan.admission_max_outstanding)]
        if f.restart_after_s is not None:
            extra += ["--restart-after-s", str(f.restart_after_s)]
        if managed:
            from capacity_pack.measure.managed import ManagedError, ManagedFleet

            assert isinstance(target, OpenAITarget) and target.managed is not None
            proc = ManagedFleet(
                target.managed,
                plan.replicas,
                keep_alive=target.keep_alive,
                extra_args=extra,
                log_path=out / "server.log",
            )
            try:
                base_url = proc.start()
            except ManagedError as err:
                proc = None
                raise DrillError(f"the managed target did not start for the drill: {err}") from None
            control = proc.control_headers
        elif sim:
            assert isinstance(target, SimTarget)
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
            control = proc.control_headers
        else:
            assert isinstance(target, OpenAITarget)
            base_url = target.base_url.rstrip("/")
            if not healthy(base_url, timeout_s=5.0):
                raise DrillError(f"{base_url}/health does not answer 200: is the target up?")
        routed = sim or managed  # behind the project's router, whose control plane acts
        recorder = _Recorder(base_url, plan, start_ns, f.scrape_interval_s, routed, control)
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
