"""What each tracked job puts on its MLflow run: the records the ``track`` stage logs.

A point's schedule, measurement and analysis each give a share (:func:`schedule`, :func:`sweep`,
:func:`analysis`) under one job key, which :func:`capacity_pack.track.tracking.log_stage`
merges into one run; a drill gives one (:func:`drill`). Kept apart from the code that writes
the summaries so that a change to what MLflow shows does not change a measurement's code hash.

Docs: docs/reading.md, "MLflow"; docs/tracking-server.md, "How the pack writes to a store".
"""

from __future__ import annotations

from typing import Any

from capacity_pack.artifacts import SloReport
from capacity_pack.plan.schedule import Point

LATENCY_METRICS = (
    "p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p95_tpot_ms", "p99_tpot_ms",
    "p95_e2e_ms",
)  # fmt: skip


def _share(
    summary: dict[str, Any],
    part: str,
    *,
    params: dict[str, Any],
    metrics: dict[str, Any],
    tags: dict[str, str],
) -> dict[str, Any]:
    """One job's share of its point's run: the point's identity and defining params plus the
    job's own params, metrics and tags; its summary goes to the artifact folder ``part``."""
    point = Point.parse(summary["point"], summary["cache_state"], int(summary["repeat"]))
    defining = {
        "mode": point.mode,
        "offered_rps": point.rate_rps,
        "concurrency": point.concurrency,
        "experiment": point.experiment,
        "cache_state": point.cache_state,
        "repeat": point.repeat,
    }
    return {
        "stage": "point",
        "job": f"point/{point.key}",
        "run_name": f"{point.point_id} · {point.cache_state} · rep{point.repeat}",
        "point": point.point_id,
        "cache_state": point.cache_state,
        "repeat": point.repeat,
        "artifact_dir": part,
        "params": {k: v for k, v in {**defining, **params}.items() if v is not None},
        "metrics": metrics,
        "tags": tags,
    }


def schedule(summary: dict[str, Any]) -> dict[str, Any]:
    """A schedule's share of its point's run: seeds, arrival process, sizes."""
    metrics = {
        "scheduled_requests": summary["requests"],
        "measured_requests": summary["phase_counts"]["measure"],
        "warmup_requests": summary["phase_counts"]["warmup"],
        "schedule_duration_s": summary["duration_s"],
        "realised_rps": summary.get("realised_rps"),
        "gap_cv": summary.get("gap_cv"),
    }
    params = {
        "arrival_pattern": summary["arrival_pattern"],
        "arrival_cv": summary.get("arrival_cv"),
        # Words, not a JSON list: the UI parses a list's 64-bit integers as doubles and shows
        # them rounded.
        "seed_entropy": " ".join(str(x) for x in summary["seed_entropy"]),
        "class_counts": summary["class_counts"]["measure"],
    }
    return _share(
        summary,
        "schedule",
        params=params,
        metrics=metrics,
        tags={"capacity_pack.schedule_sha256": summary["schedule_sha256"]},
    )


def sweep(summary: dict[str, Any]) -> dict[str, Any]:
    """A measurement's share of its point's run: the client's health, cache state, statuses."""
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
        # The garbage collector inside the measured window (capacity_pack.measure.collector).
        "gc_collections": summary.get("gc_collections"),
        "gc_pause_max_ms": summary.get("gc_pause_max_ms"),
        "gc_pauses_over_1ms_count": summary.get("gc_pauses_over_1ms_count"),
        "client_bound": float(summary["client_bound"]),
        # Other work on the host over the point (capacity_pack.measure.host).
        "disturbed": float(bool(summary.get("disturbed"))),
        "host_other_cpu_share": (summary.get("host") or {}).get("other_cpu_share"),
        "host_other_cpu_s": (summary.get("host") or {}).get("other_cpu_s"),
        "engine_step_lateness_p99_ms": (summary.get("engine_step_lateness") or {}).get("p99_ms"),
        "server_prefix_hit_rate": summary.get("server_prefix_hit_rate"),
        "client_cached_token_fraction": summary.get("client_cached_token_fraction"),
        "prefix_cache_evictions": summary.get("prefix_cache_evictions"),
        "extension_blocks": summary["extension_blocks"],
        "prewarm_requests": summary["prewarm_requests"],
        "stopped_early": float(bool(summary.get("stopped_early"))),
        "unsent_requests": summary.get("unsent_requests", 0),
    }
    metrics.update({f"status_{k}_requests": v for k, v in summary.get("status_counts", {}).items()})
    params = {
        "cache_preparation": summary.get("cache_preparation"),
        "lateness_bound_ms": summary["lateness_bound_ms"],
    }
    tags = {
        "capacity_pack.client_bound": str(summary["client_bound"]).lower(),
        "capacity_pack.disturbed": str(bool(summary.get("disturbed"))).lower(),
    }
    if summary.get("host"):  # where the target and the load generator ran
        tags["capacity_pack.placement"] = summary["host"]["placement"]["detail"]
    if summary.get("thread_placement"):  # the loop and dispatcher threads on CPUs of their own
        tags["capacity_pack.threads_pinned"] = str(summary["thread_placement"]["pinned"]).lower()
    if summary.get("sequential"):
        tags["capacity_pack.sequential_decision"] = summary["sequential"]["decision"]
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
    return _share(summary, "sweep", params=params, metrics=metrics, tags=tags)


def analysis(summary: dict[str, Any]) -> dict[str, Any]:
    """An analysis's share of its point's run: goodput, attainment and latency per class, the
    verdict; its measurement window is the run's start and end time."""
    r = SloReport.parse(summary, f"slo-report.json of {summary.get('key')}")
    metrics: dict[str, Any] = {
        "attempted_requests": r.attempted,
        "successful_requests": r.successful,
        "error_rate": r.error_rate,
        "observed_goodput_rps": r.observed_goodput_rps,
        "request_throughput_rps": r.request_throughput_rps,
        "output_throughput_tps": r.output_throughput_tps,
        "measured_window_s": r.measured_window_s,
        "offered_rate_achieved_rps": r.offered_rate_rps,
        "verdict_pass": float(bool(r.verdict_pass)),
        "point_estimate_gates_pass": float(bool(r.point_estimate_gates_pass)),
        "queue_trend_flat": float(r.queue_trend == "flat"),
        "prefix_cache_hit_rate": r.prefix_cache_hit_rate,
        "little_relative_gap": (r.littles_law or {}).get("relative_gap"),
        "client_scheduling_delay_p99_ms": (r.client_scheduling_delay_ms or {}).get("p99"),
    }
    # System against per-user throughput, and whether the lengths sent match the manifest:
    # the columns a compare view sets side by side for a tailed workload.
    throughput = r.throughput or {}
    metrics["system_output_tps"] = throughput.get("system_output_tps")
    for q in ("p5", "p50", "p95"):
        metrics[f"per_user_output_tps_{q}"] = (throughput.get("per_user_output_tps") or {}).get(q)
    if r.lengths_match_manifest is not None:
        metrics["lengths_match_manifest"] = float(r.lengths_match_manifest)
    for name, c in r.classes.items():
        metrics[f"{name}.attainment"] = c.attainment
        metrics[f"{name}.all_attempt_attainment"] = c.all_attempt_attainment
        if c.attainment_ci:
            metrics[f"{name}.attainment_ci_low"], metrics[f"{name}.attainment_ci_high"] = (
                c.attainment_ci
            )
        metrics[f"{name}.successful_requests"] = c.successful_count
        for key in LATENCY_METRICS:
            metrics[f"{name}.{key}"] = getattr(c, key)
        metrics[f"{name}.itl_p99_ms"] = (c.itl_ms or {}).get("p99")
    record = _share(
        summary,
        "analysis",
        params={"percentile_method": r.percentile_method},
        metrics=metrics,
        tags={"capacity_pack.verdict": r.verdict, "capacity_pack.queue_trend": r.queue_trend},
    )
    if r.window_start_unix_ns and r.window_end_unix_ns:
        record["start_time_ms"] = r.window_start_unix_ns // 1_000_000
        record["end_time_ms"] = -(-r.window_end_unix_ns // 1_000_000)
    return record


def drill(report: dict[str, Any]) -> dict[str, Any]:
    """One failure drill's run (keyword arguments of ``log_child_run``)."""
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
            "all_attempt_attainment_during": during.get("all_attempt_attainment"),
            "error_rate_during": during["error_rate"],
            "queue_peak_waiting": report["queue"].get("peak_server_waiting"),
        }
        # Alerts not evaluated (no promtool) are withheld, not logged as none fired.
        evaluated = report.get("alerts_evaluated", True)
        metrics["alerts_fired"] = len(report["alerts_fired"]) if evaluated else None
        metrics["expected_alert_fired"] = (
            float(report["expected_alert_fired"]) if evaluated else None
        )
        tags["capacity_pack.alerts_fired"] = (
            (",".join(report["alerts_fired"]) or "none") if evaluated else "not evaluated"
        )
        tags["capacity_pack.drill_scope"] = report.get("scope", "capacity_point")
        tags["capacity_pack.execution"] = report.get("execution", "live")
        if report.get("n_plus_one"):
            n = report["n_plus_one"]
            tags["capacity_pack.n_plus_one"] = n["verdict"]
            metrics["n_plus_one_pass"] = float(n["verdict"] == "PASS")
    return {
        "stage": "failure",
        "job": f"failure/{report['drill']}",
        "point": f"drill-{report['drill']}",
        "run_name": f"drill · {report['drill']}",
        "params": {k: v for k, v in params.items() if v is not None},
        "metrics": metrics,
        "tags": tags,
    }
