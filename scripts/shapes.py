"""Rule `shapes`: stage `shapes` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    i = snakemake.input
    entry("shapes")(
        inputs=snakemake.params.inputs,
        requests=list(i.requests),
        metrics=list(i.metrics),
        reports=list(i.reports),
        json_path=snakemake.output.json,
        log=log,
    )
