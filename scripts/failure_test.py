"""Rule `failure_test`: stage `failure_test` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    entry("failure_test")(
        pack=snakemake.params.pack,
        reports=list(snakemake.input.reports),
        markdown=snakemake.output.markdown,
        json_path=snakemake.output.json,
        log=log,
        timelines=list(zip(snakemake.input.timelines, snakemake.output.timelines, strict=True)),
    )
