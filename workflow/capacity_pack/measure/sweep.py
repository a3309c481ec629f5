"""One measurement point end to end: target up, cache state prepared, schedule run, facts kept.

The point's inputs are :class:`capacity_pack.measure.inputs.SweepInputs`; the run itself is
:func:`capacity_pack.measure.run.run_point` in one client process, or
:mod:`capacity_pack.measure.shards` over K of them (``client.shards``, open-loop points).

Cache-state facts in the summary:

- ``cold``: how the cache was emptied (fresh simulated process, restart, reset endpoint) and that
  the engine was idle with no KV blocks in use before the first request;
- ``warm``: the prewarm requests (one per shared prefix) sent before the clock started;
- both: the prefix-cache hit rate of the measured window, from the server's counters
  (delta hits / delta queries, in tokens) and from the client's usage (cached / prompt tokens of
  measured successful requests), and the eviction count where the engine exposes one.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pandas as pd

from capacity_pack import engines
from capacity_pack.io import atomic_path
from capacity_pack.measure import host
from capacity_pack.measure.cluster import is_local
from capacity_pack.measure.inputs import (
    SweepInputs,
    load_settings,
    sequential_settings,
    token_counter,
)
from capacity_pack.measure.interrupt import Interrupted, interruption
from capacity_pack.measure.records import read_records, records_frame
from capacity_pack.measure.run import BUILD_AHEAD_S, run_point
from capacity_pack.measure.shards import (
    ShardSpec,
    assignment_seed,
    merge_series,
    merge_summaries,
    run_shards,
    shard_rows,
    write_shard_prompts,
)
from capacity_pack.measure.target import open_target
from capacity_pack.plan.manifest import Pack
from capacity_pack.plan.schedule import (
    Point,
    build_schedule,
    extension_block_size,
    load_trace,
    prewarm_rows,
    trace_facts,
)
from capacity_pack.plan.system import SimTarget
from capacity_pack.vocab.phases import MEASURED_PHASES


def hit_rates(series: pd.DataFrame, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Prefix-cache hit rate of the measured window, from the server and from the client."""
    out: dict[str, Any] = {}
    server = series[(series["source"] == "server") & (series["t_offset_ns"] >= 0)]

    def delta(metric: str) -> float | None:
        s = server.loc[server["metric"] == metric, "value"]
        return float(s.iloc[-1] - s.iloc[0]) if len(s) >= 2 else None

    hits, queries = delta("prefix_cache_hits"), delta("prefix_cache_queries")
    out["server_prefix_hit_rate"] = hits / queries if hits is not None and queries else None
    out["server_prefix_cache_queries_tokens"] = queries
    out["prefix_cache_evictions"] = delta("prefix_cache_evictions")
    measured = [r for r in records if r["phase"] in MEASURED_PHASES and r["status"] == "ok"]
    prompt = sum(r["prompt_tokens"] or 0 for r in measured)
    cached = [r["cached_tokens"] for r in measured]
    reported = any(c is not None for c in cached)
    out["client_cached_token_fraction"] = (
        sum(c or 0 for c in cached) / prompt if prompt and reported else (0.0 if prompt else None)
    )
    out["prompt_tokens_mismatches"] = sum(bool(r["prompt_tokens_mismatch"]) for r in records)
    return out


#: What the client's cached share is, in the OpenAI usage object's own field names.
CLIENT_CACHED_SOURCE = (
    "usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens, summed over the measured "
    "window's successful requests"
)


def prefix_cache_sources(inputs: SweepInputs, summary: dict[str, Any]) -> dict[str, Any]:
    """Where each side's prefix-cache figure comes from (None: that side has none): the server's
    from its metric map's counters (the map the point's series were read with), the client's
    from the responses' usage."""
    e = inputs.engine
    name = (e.metric_names or e.name) if e is not None else "capacity-pack-sim"
    server = engines.prefix_cache_source(engines.metric_map(name))
    return {
        "server": f"{name} metric map: {server}" if server is not None else None,
        "client": CLIENT_CACHED_SOURCE if summary.get("client_cached_token_fraction") is not None
        else None,
    }  # fmt: skip


def shard_count(inputs: SweepInputs, point: Point) -> int:
    """Client processes of a point: ``client.shards`` for open-loop points, else 1."""
    return inputs.client.shards if point.mode != "closed" else 1


def run_sharded(
    inputs: SweepInputs,
    point: Point,
    schedule: pd.DataFrame,
    prewarm: pd.DataFrame,
    base_url: str,
    out: Path,
    prompts: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run a point as K shard processes; write the merged records and series; its summary.
    ``prompts``: the point's prepared prompts, handed to each shard as its own rows' file."""
    c = inputs.client
    seed = assignment_seed(c.request_schedule_seed, point.key)
    work = out / "shards"
    if work.exists():
        shutil.rmtree(work)  # a rerun meets in a fresh rendezvous, never with an old shard
    work.mkdir(parents=True)
    specs = _shard_specs(inputs, point, schedule, prewarm, base_url, work, prompts, seed)
    budget = (
        c.shard_ready_timeout_seconds
        + c.shard_start_lead_seconds
        + c.warmup_seconds
        + c.maximum_duration_seconds
        + c.request_timeout_seconds
        + 60
    )
    stop: Interrupted | None = None
    try:
        summaries = run_shards(specs, c.shard_launcher, work, timeout_s=budget)
    except Interrupted as exc:
        # Each shard recorded its requests in flight and wrote its summary: merge those. A
        # shard stopped before its run began wrote nothing, and then neither does the point.
        stop = exc
        paths = [Path(sp.out_dir) / "summary.json" for sp in specs]
        if not all(p.exists() for p in paths):
            raise
        summaries = [json.loads(p.read_text()) for p in paths]
    # The point's records: each shard's file in shard order (every record says its shard);
    # normalization checks the merge against the assignment.
    with atomic_path(out / "records.jsonl") as tmp, Path(tmp).open("wb") as dst:
        for spec in specs:
            with (Path(spec.out_dir) / "records.jsonl").open("rb") as src:
                shutil.copyfileobj(src, dst)
    frames = [pd.read_parquet(Path(sp.out_dir) / "metrics.parquet") for sp in specs]
    with atomic_path(out / "metrics.parquet") as tmp:
        merge_series(frames, c.metrics_interval_seconds).to_parquet(tmp, index=False)
    stamps = records_frame(out / "records.jsonl")
    summary = merge_summaries(
        summaries, stamps, c.lateness_bound_ms, c.shard_clock_tolerance_ms, seed
    )
    summary["shards"]["launcher"] = c.shard_launcher
    if stop is not None:
        # Interrupted just as the shards finished, none of them saw it: the point still stops.
        summary["interrupted"] = summary["interrupted"] or interruption(
            stop.signame, len(schedule) + len(prewarm), summary["requests_recorded"], 0
        )
        stop.summary = summary
        raise stop
    return summary


def _shard_specs(
    inputs: SweepInputs,
    point: Point,
    schedule: pd.DataFrame,
    prewarm: pd.DataFrame,
    base_url: str,
    work: Path,
    prompts: dict[str, str] | None,
    seed: int,
) -> list[ShardSpec]:
    """Write the schedule, prewarm and each shard's prompts under ``work``; one spec a shard
    (shard 0 alone runs the prewarm)."""
    c = inputs.client
    k = shard_count(inputs, point)
    schedule_path = work / "schedule.parquet"
    schedule.to_parquet(schedule_path, index=False)
    prewarm_path = None
    if len(prewarm):
        prewarm_path = work / "prewarm.parquet"
        prewarm.to_parquet(prewarm_path, index=False)
    prompt_paths: list[str | None] = [None] * k
    if prompts:
        for i in range(k):
            ids = shard_rows(schedule, k, seed, i)["request_id"].tolist()
            path = work / f"prompts-{i}.parquet"
            write_shard_prompts(path, {r: prompts[r] for r in ids if r in prompts})
            prompt_paths[i] = str(path.resolve())
    return [
        ShardSpec(
            inputs_json=inputs.canonical_json(),
            point=point.point_id,
            cache_state=point.cache_state,
            repeat=point.repeat,
            base_url=base_url,
            shards=k,
            index=i,
            seed=seed,
            schedule_path=str(schedule_path.resolve()),
            prewarm_path=str(prewarm_path.resolve()) if prewarm_path and i == 0 else None,
            prompts_path=prompt_paths[i],
            rendezvous_dir=str((work / "rendezvous").resolve()),
            out_dir=str((work / f"shard-{i}").resolve()),
            lead_s=c.shard_start_lead_seconds,
            ready_timeout_s=c.shard_ready_timeout_seconds,
            share_cpus=not c.shard_launcher,
        )
        for i in range(k)
    ]


class ExtensionBlocks:
    """``extension_block(k)``: block k of the point's schedule (blocks 2, 3, ... continue the
    seeded arrival process on the same clock).

    Built before the run for the blocks of the span the run builds requests for before its
    clock (the minimum duration and two build leads, :data:`capacity_pack.measure.run.
    BUILD_AHEAD_S`) at the nominal rate, and half again for a slow draw of the process. The
    schedule with k blocks is a prefix of the one with more, so a block past those is built
    the same way, doubling the blocks built (by the worker thread that builds the block's
    requests, :class:`capacity_pack.measure.arrivals.BlocksAhead`)."""

    def __init__(self, inputs: SweepInputs, point: Point) -> None:
        self.inputs, self.point = inputs, point
        c = inputs.schedule.client
        size = extension_block_size(inputs.schedule)
        span = min(c.maximum_duration_seconds, c.minimum_duration_seconds + 2 * BUILD_AHEAD_S)
        horizon = (point.rate_rps or 0.0) * (c.warmup_seconds + span)
        self.built = 0
        self.blocks: dict[int, pd.DataFrame] = {}
        self._build(max(1, math.ceil(1.5 * horizon / size) + 2))

    def _build(self, extensions: int) -> None:
        frame = build_schedule(self.inputs.schedule, self.point, extension_blocks=extensions)
        frame = frame[frame["block"] >= 2]
        self.blocks = {int(k): g for k, g in frame.groupby("block")}
        self.built = extensions

    def __call__(self, block: int) -> pd.DataFrame | None:
        if block - 1 > self.built:
            self._build(max(block - 1, 2 * self.built))
        return self.blocks.get(block)


def starts_target(inputs: SweepInputs) -> bool:
    """Whether the point starts its own target (simulated engine, managed server)."""
    return (
        isinstance(inputs.target, SimTarget) or getattr(inputs.target, "managed", None) is not None
    )


def _lateness(base_url: str, ours: bool) -> dict[float, float] | None:
    """The simulated engine's step-lateness buckets now, when the point started its target
    (None: another engine, which has no such histogram, or /metrics did not answer: the point
    then states no step lateness)."""
    if not ours:
        return None
    try:
        resp = httpx.get(f"{base_url}/metrics", timeout=5.0)
    except httpx.HTTPError:
        return None
    return host.lateness_buckets(resp.text) if resp.status_code == 200 else None


def target_processes(inputs: SweepInputs) -> tuple[list[int], str | None]:
    """The target's processes that are not this job's descendants, and why other processes'
    CPU is not checked against ``client.other_cpu_bound`` (None: it is). A target the point
    starts is its descendant; a server on a loopback port is found by its listening socket
    (/proc/net/tcp), and when it is another user's its CPU would count as other, so the check
    is off; a remote target's points share this host with the rest of the pipeline by design
    (its client is checked by its dispatch lateness)."""
    target = inputs.target
    if starts_target(inputs):
        return [], None
    if not is_local(target):
        return [], "not checked: a remote target (the client's dispatch lateness is)"
    url = urlsplit(target.base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    pids = host.listening_pids(port)
    if not pids:
        return [], (
            f"not checked: the process listening on port {port} is not readable by this "
            "user, so its CPU would count as another process's"
        )
    return pids, None


def disturbance(
    inputs: SweepInputs,
    placement: host.Placement,
    before: tuple[host.CpuSnapshot, dict[float, float] | None],
    after_lateness: dict[float, float] | None,
    roots: tuple[list[int], str | None],
) -> dict[str, Any]:
    """The summary's host facts (capacity_pack.measure.host): other processes' CPU over the
    run, the simulated engine's step lateness, the placement, and whether (and why) the point
    was disturbed beyond the pack's bounds."""
    c = inputs.client
    cpu = host.other_cpu(before[0], host.cpu_snapshot(roots[0]))
    steps = host.step_lateness(before[1], after_lateness, c.step_lateness_bound_ms)
    cpu_bound = c.other_cpu_bound if roots[1] is None else None
    why = host.judge(cpu, steps, cpu_bound, c.step_lateness_bound_ms)
    return {
        "host": {
            **cpu,
            "other_cpu_bound": cpu_bound,
            "other_cpu_check": roots[1]
            or ("checked" if cpu_bound is not None else "not checked: client.other_cpu_bound null"),
            "target_pids": roots[0],
            "placement": placement.report(),
        },
        "engine_step_lateness": steps,
        "disturbed": bool(why),
        "disturbance_reasons": why,
    }


def measure_point(
    pack_or_inputs: Pack | SweepInputs,
    point: Point,
    schedule: pd.DataFrame,
    out_dir: str | Path,
    *,
    progress: bool = False,
    report: Callable[[str], None] | None = None,
    in_run: bool = True,
    prompts: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one point; write records.jsonl, metrics.parquet, summary.json (and server files).

    ``report`` gets a progress line at a steady cadence (a pipeline job's log and console).
    ``in_run`` False runs an open-loop point's planned schedule as a sharded one does: no
    in-run decision, no extension block. ``prompts``: prepared prompt texts by request id
    (stage ``prompts``); any other request's prompt is fitted here."""
    inputs = pack_or_inputs
    if not isinstance(inputs, SweepInputs):
        inputs = SweepInputs.for_point(inputs, point)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records_path = out / "records.jsonl"
    records_path.unlink(missing_ok=True)  # a rerun starts a new cohort, never appends to one
    is_sim = isinstance(inputs.target, SimTarget)
    ground_truth = out / "ground_truth.jsonl" if is_sim and inputs.target.ground_truth else None
    if ground_truth is not None:
        ground_truth.unlink(missing_ok=True)
    prewarm = prewarm_rows(inputs.schedule, point)
    placement = host.Placement.plan(starts_target=starts_target(inputs))
    with contextlib.ExitStack() as stack:
        stack.callback(placement.restore)
        placement.bind_target()  # the target's processes inherit its CPUs
        base_url, facts = stack.enter_context(
            open_target(
                inputs.target,
                inputs.model.served_name or inputs.model.id,
                point.cache_state,
                ground_truth=ground_truth,
                log_path=out / "server.log" if starts_target(inputs) else None,
                expected=inputs,
            )
        )
        placement.bind_client()
        settings = load_settings(inputs, point, base_url, progress=progress)
        settings.report, settings.label = report, point.key
        settings.token_counter = token_counter(inputs, base_url)
        settings.prepared_prompts = prompts
        _extension_and_decision(settings, inputs, point, in_run)
        stop: Interrupted | None = None
        roots = target_processes(inputs)
        before = host.cpu_snapshot(roots[0]), _lateness(base_url, starts_target(inputs))
        try:
            if shard_count(inputs, point) > 1:
                summary = run_sharded(
                    inputs, point, schedule, prewarm, base_url, out, prompts=prompts
                )
            else:
                summary = run_point(
                    schedule,
                    settings,
                    records_path,
                    metrics_path=out / "metrics.parquet",
                    prewarm=prewarm if len(prewarm) else None,
                )
        except Interrupted as exc:  # records and series are written: complete the summary
            if not exc.summary:
                raise
            stop, summary = exc, exc.summary
        summary.update(
            disturbance(
                inputs, placement, before, _lateness(base_url, starts_target(inputs)), roots
            )
        )
    _point_facts(summary, inputs, point, out, facts, len(prewarm), ground_truth)
    if stop is not None:
        stop.summary = summary
        raise stop
    return summary


def _extension_and_decision(settings, inputs: SweepInputs, point: Point, in_run: bool) -> None:
    """Extension blocks and the in-run decision are for open-loop rate points: a closed-loop
    level traces the frontier and a load-shape experiment is its profile, so neither is extended
    or stopped early. A sharded point runs its planned schedule (the decision would need every
    shard's counts at once): the analysis judges it. A verbatim trace is replayed as recorded:
    neither extended nor cut short."""
    if point.mode != "open" or not in_run or inputs.client.replays_verbatim:
        settings.min_successful_per_class = None
    elif shard_count(inputs, point) == 1:
        settings.extension_block = ExtensionBlocks(inputs, point)
        settings.sequential = sequential_settings(inputs)


def _point_facts(
    summary: dict[str, Any],
    inputs: SweepInputs,
    point: Point,
    out: Path,
    facts: dict[str, Any],
    prewarm_requests: int,
    ground_truth: Path | None,
) -> None:
    """Add to the summary what the run itself does not know: the target's facts, the prefix
    cache's hit rates, the point's identity, the trace replay and the status counts."""
    records = read_records(out / "records.jsonl")
    series = pd.read_parquet(out / "metrics.parquet")
    summary.update(facts)
    summary.update(hit_rates(series, records))
    summary["prefix_cache_sources"] = prefix_cache_sources(inputs, summary)
    summary.update(
        point=point.point_id,
        key=point.key,
        cache_state=point.cache_state,
        repeat=point.repeat,
        offered_rps=point.rate_rps,
        prewarm_requests=prewarm_requests,
        pack=inputs.schedule.pack.name,
        pack_label=inputs.schedule.pack.label,
        target_kind=inputs.target.kind,
        ground_truth=ground_truth.name if ground_truth is not None else None,
    )
    if inputs.client.arrival_pattern == "trace" and point.mode == "open":
        summary["trace_replay"] = trace_facts(inputs.schedule, load_trace(inputs.schedule), point)
    statuses = pd.Series([r["status"] for r in records]).value_counts().to_dict()
    summary["status_counts"] = {k: int(v) for k, v in statuses.items()}


def measurement_error(records_path: str | Path, ground_truth_path: str | Path) -> dict[str, Any]:
    """Client vs server timing for the same requests (the simulator's ground-truth log).

    Both processes read CLOCK_MONOTONIC, so server times (epoch - clock offset) and client
    perf_counter_ns stamps are directly comparable; the errors are
    |client TTFT - server TTFT| and |client E2E - server E2E| with the server's TTFT measured
    from its arrival to its first token *sent*, and E2E to its last token sent.
    """
    client = pd.DataFrame(
        [r for r in read_records(records_path) if r["status"] == "ok" and r["phase"] != "prewarm"]
    )
    with Path(ground_truth_path).open() as fh:
        server = pd.DataFrame([json.loads(line) for line in fh if line.endswith("\n")])
    if client.empty or server.empty:
        return {"matched": 0}
    m = client.merge(server, on="request_id", suffixes=("", "_srv"))
    mono = lambda col: m[col] - m["clock_offset_ns"]  # noqa: E731
    c_ttft = m["first_token_ns"] - m["sent_ns"]
    c_e2e = m["last_token_ns"] - m["sent_ns"]
    s_ttft = mono("first_token_sent_ns") - mono("arrival_ns")
    s_e2e = mono("last_token_sent_ns") - mono("arrival_ns")
    err_ttft = (c_ttft - s_ttft).abs().to_numpy() / 1e6
    err_e2e = (c_e2e - s_e2e).abs().to_numpy() / 1e6
    return {
        "matched": int(len(m)),
        "ttft_abs_error_ms": {"p50": float(np.percentile(err_ttft, 50)),
                              "p99": float(np.percentile(err_ttft, 99)),
                              "max": float(err_ttft.max())},
        "e2e_abs_error_ms": {"p50": float(np.percentile(err_e2e, 50)),
                             "p99": float(np.percentile(err_e2e, 99)),
                             "max": float(err_e2e.max())},
    }  # fmt: skip
