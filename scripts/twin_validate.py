"""Rule `twin_validate`: stage `twin_validate` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    entry("twin_validate")(
        pack=snakemake.params.pack,
        profile=snakemake.input.profile,
        prediction=snakemake.input.prediction,
        capacity=snakemake.input.capacity,
        validation=snakemake.output.validation,
        log=log,
    )
