"""One measurement point end to end: target up, cache state prepared, schedule run, facts kept.

:class:`SweepInputs` is exactly the manifest content a measurement reads (target, model, client,
request shape, prompts and the sample gate that drives extension blocks); the sweep rule passes
it in its params, so a changed acceptance threshold does not re-measure anything, while a changed
timeout or target does.

Cache-state facts in the summary:

- ``cold``: how the cache was emptied (fresh simulated process, restart, reset endpoint) and that
  the engine was idle with no KV blocks in use before the first request;
- ``warm``: the prewarm requests (one per shared prefix) sent before the clock started;
- both: the prefix-cache hit rate of the measured window, from the server's counters
  (delta hits / delta queries, in tokens) and from the client's usage (cached / prompt tokens of
  measured successful requests), and the eviction count where the engine exposes one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.io import canonical_json
from capacity_pack.measure.loadgen import LoadSettings, read_records, run_point
from capacity_pack.plan.manifest import (
    Client,
    Engine,
    Model,
    OpenAITarget,
    Pack,
    Prompts,
    RequestShape,
    SimTarget,
)
from capacity_pack.plan.schedule import (
    Point,
    ScheduleInputs,
    build_schedule,
    prewarm_rows,
)


class SweepInputs(BaseModel):
    """The manifest content one measurement depends on (beyond its schedule)."""

    model_config = ConfigDict(extra="forbid")

    schedule: ScheduleInputs = Field(description="To rebuild extension blocks and prewarm rows.")
    target: SimTarget | OpenAITarget = Field(discriminator="kind")
    model: Model
    client: Client
    request: RequestShape
    prompts: Prompts
    min_successful_samples_per_class: int = Field(description="Sample gate for extensions.")
    engine: Engine | None = Field(
        default=None, description="What a real target must identify as (None: a simulated one)."
    )

    @classmethod
    def for_point(cls, pack: Pack, point: Point) -> SweepInputs:
        return cls(
            schedule=ScheduleInputs.for_point(pack, point),
            engine=pack.engine if isinstance(pack.target, OpenAITarget) else None,
            target=pack.target,
            model=pack.model,
            client=pack.client,
            request=pack.request,
            prompts=pack.prompts,
            min_successful_samples_per_class=pack.acceptance.min_successful_samples_per_class,
        )

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json")
        if data["engine"] is None:
            del data["engine"]  # a simulated target's inputs read as before the field existed
        return canonical_json(data)


def load_settings(
    inputs: SweepInputs, point: Point, base_url: str, *, progress: bool
) -> LoadSettings:
    c, r = inputs.client, inputs.request
    sampling: dict[str, Any] = {"temperature": r.sampling.temperature, "top_p": r.sampling.top_p}
    if r.sampling.top_k != -1:
        sampling["top_k"] = r.sampling.top_k
    if r.sampling.seed is not None:
        sampling["seed"] = r.sampling.seed
    prefix = inputs.prompts.prefix
    return LoadSettings(
        base_url=base_url,
        model=inputs.model.served_name or inputs.model.id,
        endpoint=c.endpoint,
        api_key_env=getattr(inputs.target, "api_key_env", None),
        mode=point.mode,
        concurrency=point.concurrency,
        request_timeout_s=c.request_timeout_seconds,
        max_in_flight=c.max_in_flight,
        lateness_bound_ms=c.lateness_bound_ms,
        metrics_interval_s=c.metrics_interval_seconds,
        sampling=sampling,
        ignore_eos=r.stop.ignore_eos,
        stop_sequences=r.stop.stop_sequences,
        include_usage=r.include_usage,
        prefix_revision=prefix.revision if prefix else None,
        tls_verify=getattr(inputs.target, "tls_verify", True),
        keep_alive=getattr(inputs.target, "keep_alive", True),
        ca_bundle=getattr(inputs.target, "ca_bundle", None),
        corpus_revision=inputs.prompts.corpus_revision,
        cold_unique_prefix_tokens=inputs.prompts.cold_unique_prefix_tokens,
        min_successful_per_class=inputs.min_successful_samples_per_class,
        maximum_duration_s=c.warmup_seconds + c.maximum_duration_seconds,
        progress=progress,
    )


def token_counter(inputs: SweepInputs, base_url: str):
    """The target's tokenizer for exact prompt lengths: a tokenizer.json, /tokenize, or None
    (the project tokenizer, exact for the simulated engine)."""
    import os

    from capacity_pack.engines.tokenize import EndpointCounter
    from capacity_pack.plan.prompts import FileTokenizerCounter

    target = inputs.target
    if not isinstance(target, OpenAITarget):
        return None
    if target.tokenizer_path is not None:
        return FileTokenizerCounter(target.tokenizer_path)
    if target.tokenize_endpoint:
        key = os.environ.get(target.api_key_env, "") if target.api_key_env else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        from capacity_pack.engines import verify_setting

        verify = verify_setting(target.tls_verify, target.ca_bundle)
        return EndpointCounter(
            base_url, inputs.model.served_name or inputs.model.id, headers, verify=verify
        )
    return None


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
    measured = [
        r for r in records if r["phase"] in ("measure", "extension") and r["status"] == "ok"
    ]
    prompt = sum(r["prompt_tokens"] or 0 for r in measured)
    cached = [r["cached_tokens"] for r in measured]
    reported = any(c is not None for c in cached)
    out["client_cached_token_fraction"] = (
        sum(c or 0 for c in cached) / prompt if prompt and reported else (0.0 if prompt else None)
    )
    out["prompt_tokens_mismatches"] = sum(bool(r["prompt_tokens_mismatch"]) for r in records)
    return out


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
) -> dict[str, Any]:
    """Run a point as K shard processes; write the merged records and series; its summary."""
    import shutil

    from capacity_pack.io import atomic_path
    from capacity_pack.measure.shards import (
        ShardSpec,
        assignment_seed,
        merge_series,
        merge_summaries,
        run_shards,
    )

    c = inputs.client
    k = shard_count(inputs, point)
    seed = assignment_seed(c.request_schedule_seed, point.key)
    work = out / "shards"
    if work.exists():
        shutil.rmtree(work)  # a rerun meets in a fresh rendezvous, never with an old shard
    work.mkdir(parents=True)
    schedule_path = work / "schedule.parquet"
    schedule.to_parquet(schedule_path, index=False)
    prewarm_path = None
    if len(prewarm):
        prewarm_path = work / "prewarm.parquet"
        prewarm.to_parquet(prewarm_path, index=False)
    specs = [
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
            rendezvous_dir=str((work / "rendezvous").resolve()),
            out_dir=str((work / f"shard-{i}").resolve()),
            lead_s=c.shard_start_lead_seconds,
            ready_timeout_s=c.shard_ready_timeout_seconds,
        )
        for i in range(k)
    ]
    budget = (
        c.shard_ready_timeout_seconds
        + c.shard_start_lead_seconds
        + c.warmup_seconds
        + c.maximum_duration_seconds
        + c.request_timeout_seconds
        + 60
    )
    summaries = run_shards(specs, c.shard_launcher, work, timeout_s=budget)
    # The point's records: each shard's file in shard order (every record says its shard);
    # normalization checks the merge against the assignment.
    with atomic_path(out / "records.jsonl") as tmp, Path(tmp).open("wb") as dst:
        for spec in specs:
            with (Path(spec.out_dir) / "records.jsonl").open("rb") as src:
                shutil.copyfileobj(src, dst)
    frames = [pd.read_parquet(Path(sp.out_dir) / "metrics.parquet") for sp in specs]
    with atomic_path(out / "metrics.parquet") as tmp:
        merge_series(frames, c.metrics_interval_seconds).to_parquet(tmp, index=False)
    from capacity_pack.evidence.normalize import records_frame

    stamps = records_frame(out / "records.jsonl")
    summary = merge_summaries(
        summaries, stamps, c.lateness_bound_ms, c.shard_clock_tolerance_ms, seed
    )
    summary["shards"]["launcher"] = c.shard_launcher
    return summary


def measure_point(
    pack_or_inputs: Pack | SweepInputs,
    point: Point,
    schedule: pd.DataFrame,
    out_dir: str | Path,
    *,
    progress: bool = False,
) -> dict[str, Any]:
    """Run one point; write records.jsonl, metrics.parquet, summary.json (and server files)."""
    from capacity_pack.measure.target import open_target

    inputs = (
        pack_or_inputs
        if isinstance(pack_or_inputs, SweepInputs)
        else SweepInputs.for_point(pack_or_inputs, point)
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records_path = out / "records.jsonl"
    if records_path.exists():
        records_path.unlink()  # a rerun starts a new cohort, never appends to an old one
    is_sim = isinstance(inputs.target, SimTarget)
    ground_truth = out / "ground_truth.jsonl" if is_sim and inputs.target.ground_truth else None
    if ground_truth is not None and ground_truth.exists():
        ground_truth.unlink()
    prewarm = prewarm_rows(inputs.schedule, point)
    with open_target(
        inputs.target,
        inputs.model.served_name or inputs.model.id,
        point.cache_state,
        ground_truth=ground_truth,
        log_path=out / "server.log" if is_sim or getattr(inputs.target, "managed", None) else None,
        expected=inputs,
    ) as (base_url, facts):
        settings = load_settings(inputs, point, base_url, progress=progress)
        settings.token_counter = token_counter(inputs, base_url)

        def extension(block: int) -> pd.DataFrame:
            full = build_schedule(inputs.schedule, point, extension_blocks=block - 1)
            return full[full["block"] == block]

        # The seed's extension rule is for open-loop rate points: a closed-loop level traces the
        # frontier and a load-shape experiment is its profile, so neither is extended.
        if point.mode == "open":
            settings.extension_block = extension
        else:
            settings.min_successful_per_class = None
        if shard_count(inputs, point) > 1:
            summary = run_sharded(inputs, point, schedule, prewarm, base_url, out)
        else:
            summary = run_point(
                schedule,
                settings,
                records_path,
                metrics_path=out / "metrics.parquet",
                prewarm=prewarm if len(prewarm) else None,
            )
    records = read_records(records_path)
    series = pd.read_parquet(out / "metrics.parquet")
    summary.update(facts)
    summary.update(hit_rates(series, records))
    summary.update(
        point=point.point_id,
        key=point.key,
        cache_state=point.cache_state,
        repeat=point.repeat,
        offered_rps=point.rate_rps,
        prewarm_requests=int(len(prewarm)),
        pack=inputs.schedule.pack.name,
        pack_label=inputs.schedule.pack.label,
        target_kind=inputs.target.kind,
        ground_truth=ground_truth.name if ground_truth is not None else None,
    )
    statuses = pd.Series([r["status"] for r in records]).value_counts().to_dict()
    summary["status_counts"] = {k: int(v) for k, v in statuses.items()}
    return summary


def measurement_error(records_path: str | Path, ground_truth_path: str | Path) -> dict[str, Any]:
    """Client vs server timing for the same requests (the simulator's ground-truth log).

    Both processes read CLOCK_MONOTONIC, so server times (epoch - clock offset) and client
    perf_counter_ns stamps are directly comparable; the errors are
    |client TTFT - server TTFT| and |client E2E - server E2E| with the server's TTFT measured
    from its arrival to its first token *sent*, and E2E to its last token sent.
    """
    import json

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


def tracking_record(summary: dict[str, Any]) -> dict[str, Any]:
    """The MLflow child run of one measurement job: keyword arguments of ``log_child_run``."""
    late, lag = summary["dispatch_lateness_ms"], summary["event_loop_lag_ms"]
    metrics = {
        "requests_recorded": summary["requests_recorded"],
        "failed_requests": summary["failed"],
        "streamed_tokens": summary["streamed_tokens"],
        "wall_s": summary["wall_s"],
        "client_cpu_s": summary["client_cpu_s"],
        "client_cpu_ms_per_1k_tokens": summary["client_cpu_ms_per_1k_tokens"],
        "dispatch_lateness_p50_ms": late["p50"],
        "dispatch_lateness_p99_ms": late["p99"],
        "event_loop_lag_p99_ms": lag["p99"],
        "client_bound": float(summary["client_bound"]),
        "server_prefix_hit_rate": summary.get("server_prefix_hit_rate"),
        "client_cached_token_fraction": summary.get("client_cached_token_fraction"),
        "prefix_cache_evictions": summary.get("prefix_cache_evictions"),
        "extension_blocks": summary["extension_blocks"],
        "prewarm_requests": summary["prewarm_requests"],
    }
    metrics.update({f"status_{k}_requests": v for k, v in summary.get("status_counts", {}).items()})
    params = {
        "mode": summary["mode"],
        "offered_rps": summary.get("offered_rps"),
        "concurrency": summary.get("concurrency"),
        "target_kind": summary["target_kind"],
        "cache_preparation": summary.get("cache_preparation"),
        "lateness_bound_ms": summary["lateness_bound_ms"],
    }
    tags = {"capacity_pack.client_bound": str(summary["client_bound"]).lower()}
    shards = summary.get("shards")
    params["client_shards"] = shards["count"] if shards else 1
    if shards:
        for p in shards["per_shard"]:
            metrics[f"shard{p['shard']}_dispatch_lateness_p99_ms"] = p["dispatch_lateness_ms"][
                "p99"
            ]
            metrics[f"shard{p['shard']}_client_cpu_s"] = p["client_cpu_s"]
        check = shards["clock_check"]
        drift = [abs(d["drift_ms"]) for d in check["drift"]]
        spread = [s["spread_ms"] for s in check["same_host_skew"]]
        metrics["shard_clock_drift_max_ms"] = max(drift) if drift else None
        metrics["shard_clock_skew_max_ms"] = max(spread) if spread else None
        valid = summary.get("shard_clock_valid")
        tags["capacity_pack.shard_clock_valid"] = (
            "unverified" if valid is None else str(valid).lower()
        )
    if "cache_empty_verified" in summary:
        tags["capacity_pack.cache_empty_verified"] = str(summary["cache_empty_verified"]).lower()
    return {
        "stage": "sweep",
        "job": f"sweep/{summary['key']}",
        "point": summary["point"],
        "cache_state": summary["cache_state"],
        "repeat": summary["repeat"],
        "params": {k: v for k, v in params.items() if v is not None},
        "metrics": metrics,
        "tags": tags,
    }
