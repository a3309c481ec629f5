"""Rule `report`: stage `report` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    i = snakemake.input
    entry("report")(
        frozen=i.frozen,
        fit=i.fit,
        capacity=i.capacity,
        plan=i.plan,
        reports=list(i.reports),
        tables=list(i.tables),
        metrics=list(i.metrics),
        readme=snakemake.output.readme,
        log=log,
        # The failure test's JSON when the pack has drills (an empty input otherwise).
        failure=i.failure[0] if len(i.failure) else None,
        # The load shapes' answers when the pack has experiments (an empty input otherwise).
        shapes=i.shapes[0] if len(i.shapes) else None,
        # The twin's validation when the pack calibrates one (an empty input otherwise).
        twin=i.twin[0] if len(i.twin) else None,
    )
