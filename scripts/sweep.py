"""Rule `sweep`: stage `sweep` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    p, o = snakemake.params, snakemake.output
    entry("sweep")(
        inputs=p.inputs,
        point=p.point,
        cache_state=p.cache_state,
        repeat=p.repeat,
        schedule=snakemake.input.schedule,
        prompts=snakemake.input.prompts,
        # A searching pack's in-run decisions read the attainment gate from the config, not
        # the params: a changed gate re-analyzes and re-decides, never re-measures.
        gate=snakemake.config["acceptance"] if p.gate_from_config else None,
        records=o.records,
        summary=o.summary,
        log=log,
        # This invocation's target-lock settings (--config target_lock_wait=false ...).
        lock=snakemake.config,
    )
