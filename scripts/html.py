"""Rule `html`: stage `html` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    entry("html")(
        index=snakemake.output.index,
        reports=list(snakemake.input.reports),
        log=log,
    )
