"""Rule `dashboard`: alert rules and Grafana dashboard (logic in capacity_pack.drills.dashboard)."""

import json

from capacity_pack.drills import dashboard
from capacity_pack.io import write_json_atomic
from capacity_pack.logs import job_logging
from capacity_pack.plan.manifest import Pack

with job_logging(snakemake.log[0]) as log:
    pack = Pack.model_validate(json.loads(snakemake.params.inputs))
    omitted = dashboard.write_alert_rules(pack, snakemake.output.rules)
    write_json_atomic(snakemake.output.omitted, {"omitted": omitted})
    dashboard.write_grafana_dashboard(pack, snakemake.output.dashboard)
    log.info("alert rules and dashboard for engine %s; omitted: %s", pack.engine.name, omitted)
