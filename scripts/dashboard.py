"""Rule `dashboard`: stage `dashboard` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    o = snakemake.output
    entry("dashboard")(
        inputs=snakemake.params.inputs,
        rules=o.rules,
        omitted=o.omitted,
        dashboard_path=o.dashboard,
        log=log,
    )
