"""Rule `schedule`: build, validate and write one point's schedule; log its MLflow child run."""

from pathlib import Path

from capacity_pack import tracking
from capacity_pack.logs import job_logging
from capacity_pack.manifest import load_frozen
from capacity_pack.schedule import build_schedule, find_point, write_schedule

with job_logging(snakemake.log[0]) as log:
    p = snakemake.params
    pack, frozen = load_frozen(snakemake.input.frozen)
    point = find_point(pack, p.point, p.cache_state, p.repeat)
    frame = build_schedule(pack, point)
    summary = write_schedule(
        frame, pack, point, snakemake.output.schedule, snakemake.output.summary
    )
    metrics = {
        "scheduled_requests": summary["requests"],
        "measured_requests": summary["phase_counts"]["measure"],
        "warmup_requests": summary["phase_counts"]["warmup"],
        "schedule_duration_s": summary["duration_s"],
    }
    for key in ("realised_rps", "gap_cv"):
        if summary.get(key) is not None:
            metrics[key] = summary[key]
    params = {
        "arrival_pattern": summary["arrival_pattern"],
        "offered_rps": summary.get("offered_rps"),
        "concurrency": summary.get("concurrency"),
        "schedule_sha256": summary["schedule_sha256"],
    }
    run_id = tracking.log_child_run(
        frozen,
        stage="schedule",
        job=f"schedule/{point.key}",
        point=point.point_id,
        cache_state=point.cache_state,
        repeat=point.repeat,
        params={k: v for k, v in params.items() if v is not None},
        metrics=metrics,
        artifacts=[Path(snakemake.output.summary)],
        results_dir=p.results_root,
    )
    log.info("schedule %s: %d requests, MLflow child run %s", point.key, len(frame), run_id)
