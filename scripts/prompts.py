"""Rule `prompts`: stage `prompts` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    entry("prompts")(
        inputs=snakemake.params.inputs,
        schedule=snakemake.input.schedule,
        prompts=snakemake.output.prompts,
        log=log,
    )
