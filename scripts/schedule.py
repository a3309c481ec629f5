"""Rule `schedule`: stage `schedule` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    p, o = snakemake.params, snakemake.output
    entry("schedule")(
        inputs=p.inputs,
        point=p.point,
        cache_state=p.cache_state,
        repeat=p.repeat,
        schedule=o.schedule,
        summary=o.summary,
        log=log,
    )
