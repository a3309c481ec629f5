"""Rule `search`: stage `search` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    entry("search")(
        inputs=snakemake.params.inputs,
        cache_state=snakemake.wildcards.cache,
        max_rounds=snakemake.params.max_rounds,
        rounds=list(snakemake.input.rounds),
        summary=snakemake.output.summary,
        log=log,
    )
