"""Rule `failure_drill`: run one drill (logic in capacity_pack.drills.plan and .run)."""

import json
from pathlib import Path

from capacity_pack.drills.plan import DrillInputs, plan_drill
from capacity_pack.drills.run import run_drill
from capacity_pack.logs import job_logging

with job_logging(snakemake.log[0]) as log:
    inputs = DrillInputs.model_validate_json(snakemake.params.inputs)
    capacity = json.loads(Path(snakemake.input.capacity).read_text())
    reports = {p: json.loads(Path(p).read_text()) for p in snakemake.input.reports}
    plan = plan_drill(inputs, capacity, reports)
    log.info(
        "drill %s: %.1f RPS (%s), %d replicas, admission %s (%s)",
        plan.drill.name,
        plan.rate_rps,
        plan.rate_source,
        plan.replicas,
        plan.admission_max_outstanding,
        plan.admission_source,
    )
    facts = run_drill(inputs, plan, Path(snakemake.output.drill).parent)
    if facts.get("skipped"):
        log.warning("drill %s skipped: %s", plan.drill.name, facts["skipped"])
    else:
        log.info("drill %s: actions %s", plan.drill.name, facts["actions"])
