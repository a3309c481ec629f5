"""Rule `capacity`: select capacity and plan replicas (logic in capacity_pack.decide.capacity)."""

import json

from capacity_pack.decide.capacity import build_capacity, build_plan
from capacity_pack.decide.report import load_reports
from capacity_pack.io import write_json_atomic
from capacity_pack.logs import job_logging
from capacity_pack.plan.manifest import validate_pack

with job_logging(snakemake.log[0]) as log:
    pack = validate_pack(json.loads(snakemake.params.pack), "capacity params")
    reports = load_reports(snakemake.input.reports)
    capacity = build_capacity(reports, pack)
    plan = build_plan(capacity, reports, pack)
    write_json_atomic(snakemake.output.capacity, capacity)
    write_json_atomic(snakemake.output.plan, plan)
    for sel in capacity["open_loop"].values():
        log.info("%s", sel["decision"])
    log.info("plan: %s replicas, %s GPUs", plan.get("required_replicas"), plan.get("required_gpus"))
