"""Rule `freeze`: lint, freeze and open the MLflow parent run (logic in capacity_pack)."""

import json

from capacity_pack.decide.capacity import preflight_fit
from capacity_pack.io import write_json_atomic
from capacity_pack.logs import job_logging
from capacity_pack.plan.lint import lint_data
from capacity_pack.plan.manifest import freeze, validate_pack
from capacity_pack.track import tracking

with job_logging(snakemake.log[0]) as log:
    source = snakemake.params.source
    data = json.loads(snakemake.params.manifest)
    findings = lint_data(data, source)
    if findings:
        lines = [f"{source}: {f.code}: {f.message} (why: {f.reason})" for f in findings]
        raise SystemExit("benchmark anti-patterns found; fix the pack:\n" + "\n".join(lines))
    pack = validate_pack(data, source)
    fit = preflight_fit(pack)
    if fit["checked"] and fit["verdict"] == "does-not-fit":
        raise SystemExit(f"fit probe: does-not-fit: {fit}")
    frozen = freeze(pack, source)
    write_json_atomic(snakemake.output.fit, fit)
    write_json_atomic(snakemake.output.frozen, frozen)
    run_id = tracking.ensure_parent_run(frozen, results_dir=snakemake.params.results_root)
    log.info("froze %s (sha256 %s), MLflow parent run %s", source, frozen["sha256"], run_id)
