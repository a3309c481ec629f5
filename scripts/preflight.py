"""Rule `preflight`: stage `preflight` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    entry("preflight")(
        pack=snakemake.params.pack,
        preflight=snakemake.output.preflight,
        log=log,
    )
