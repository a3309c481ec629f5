"""Rule `failure_analyze`: stage `failure_analyze` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    entry("failure_analyze")(
        spec=snakemake.params.spec,
        drill=snakemake.input.drill,
        rules=snakemake.input.rules,
        report=snakemake.output.report,
        timeline=snakemake.output.timeline,
        log=log,
    )
