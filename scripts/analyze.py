"""Rule `analyze`: stage `analyze` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    p, i = snakemake.params, snakemake.input
    entry("analyze")(
        spec=p.spec,
        control=p.control,
        point=p.point,
        cache_state=p.cache_state,
        repeat=p.repeat,
        requests=i.requests,
        chunks=i.chunks,
        metrics=i.metrics,
        sweep=i.sweep,
        report=snakemake.output.report,
        log=log,
    )
