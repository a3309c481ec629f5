"""Rule `capacity`: stage `capacity` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    o = snakemake.output
    entry("capacity")(
        pack=snakemake.params.pack,
        reports=list(snakemake.input.reports),
        tables=list(snakemake.input.tables),
        capacity=o.capacity,
        plan=o.plan,
        log=log,
    )
