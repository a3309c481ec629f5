"""Rule `twin_predict`: stage `twin_predict` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    entry("twin_predict")(
        pack=snakemake.params.pack,
        profile=snakemake.input.profile,
        calibration=snakemake.input.calibration,
        prediction=snakemake.output.prediction,
        log=log,
    )
