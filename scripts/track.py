"""Rule `track`: stage `track` of capacity_pack.stages (the tracked stage's record by name)."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry, record

with job_logging(snakemake.log[0]) as log:
    p = snakemake.params
    entry("track")(
        frozen=snakemake.input.frozen,
        stage=p.stage,
        record_of=record(p.stage),
        summaries=list(snakemake.input.summaries),
        runs=snakemake.output.runs,
        results_root=p.results_root,
        log=log,
    )
