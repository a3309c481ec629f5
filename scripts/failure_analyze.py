"""Rule `failure_analyze`: one drill's failure-test fields (capacity_pack.drills.analyze)."""

from pathlib import Path

from capacity_pack.drills.analyze import DrillAnalysisSpec, analyze_drill
from capacity_pack.io import write_json_atomic
from capacity_pack.logs import job_logging

with job_logging(snakemake.log[0]) as log:
    spec = DrillAnalysisSpec.model_validate_json(snakemake.params.spec)
    report = analyze_drill(Path(snakemake.input.drill).parent, snakemake.input.rules, spec)
    write_json_atomic(snakemake.output.report, report)
    log.info(
        "drill %s: alerts fired %s; expected alert fired: %s",
        report["drill"],
        report.get("alerts_fired"),
        report.get("expected_alert_fired"),
    )
