"""Rule `search_round`: stage `search_round` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    entry("search_round")(
        inputs=snakemake.params.inputs,
        cache_state=snakemake.wildcards.cache,
        round_index=int(snakemake.wildcards.round),
        reports=list(snakemake.input.reports),
        round_file=snakemake.output.round,
        log=log,
        preflight=snakemake.input.get("preflight") or None,
    )
