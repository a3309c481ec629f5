"""Rule `freeze`: stage `freeze` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    p, o = snakemake.params, snakemake.output
    entry("freeze")(
        manifest=p.manifest,
        source=p.source,
        frozen=o.frozen,
        fit=o.fit,
        results_root=p.results_root,
        log=log,
    )
