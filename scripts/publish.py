"""Rule `publish`: stage `publish` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    i = snakemake.input
    entry("publish")(
        frozen=i.frozen,
        capacity=i.capacity,
        plan=i.plan,
        readme=i.readme,
        published=snakemake.output.published,
        results_root=snakemake.params.results_root,
        log=log,
    )
