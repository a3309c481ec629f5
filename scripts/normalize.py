"""Rule `normalize`: stage `normalize` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    p, i, o = snakemake.params, snakemake.input, snakemake.output
    entry("normalize")(
        inputs=p.inputs,
        point=p.point,
        cache_state=p.cache_state,
        repeat=p.repeat,
        records=i.records,
        sweep_metrics=i.metrics,
        sweep_summary=i.summary,
        schedule=i.schedule,
        requests=o.requests,
        chunks=o.chunks,
        metrics=o.metrics,
        csv=o.csv,
        summary=o.summary,
        log=log,
    )
