"""Rule `failure_drill`: stage `failure_drill` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    entry("failure_drill")(
        inputs=snakemake.params.inputs,
        # The decision's numbers (rules/failure.smk reads them once capacity has run).
        numbers=snakemake.params.numbers,
        # The plan drill of a real target that the pack calibrates (rules/failure.smk).
        twin_profile=snakemake.input.get("twin_profile"),
        twin_validation=snakemake.input.get("twin_validation"),
        drill=snakemake.output.drill,
        log=log,
        # This invocation's target-lock settings (--config target_lock_wait=false ...).
        lock=snakemake.config,
    )
