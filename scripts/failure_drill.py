"""Rule `failure_drill`: stage `failure_drill` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    entry("failure_drill")(
        inputs=snakemake.params.inputs,
        capacity=snakemake.input.capacity,
        plan=snakemake.input.plan,
        # The plan drill of a real target that the pack calibrates (rules/failure.smk).
        twin_profile=snakemake.input.get("twin_profile"),
        twin_validation=snakemake.input.get("twin_validation"),
        reports=list(snakemake.input.reports),
        drill=snakemake.output.drill,
        log=log,
        # This invocation's target-lock settings (--config target_lock_wait=false ...).
        lock=snakemake.config,
    )
