"""Rule `schedule`: build, validate and write one point's schedule (logic in capacity_pack)."""

from capacity_pack.logs import job_logging
from capacity_pack.plan.schedule import Point, ScheduleInputs, build_schedule, write_schedule

with job_logging(snakemake.log[0]) as log:
    p = snakemake.params
    inputs = ScheduleInputs.model_validate_json(p.inputs)
    point = Point.parse(p.point, p.cache_state, p.repeat)
    frame = build_schedule(inputs, point)
    summary = write_schedule(
        frame, inputs, point, snakemake.output.schedule, snakemake.output.summary
    )
    log.info("schedule %s: %d requests over %.1f s", point.key, len(frame), summary["duration_s"])
