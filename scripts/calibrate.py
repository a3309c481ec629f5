"""Rule `calibrate`: stage `calibrate` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    entry("calibrate")(
        inputs=snakemake.params.inputs,
        tables=list(snakemake.input.tables),
        calibration=snakemake.output.calibration,
        profile=snakemake.output.profile,
        log=log,
    )
