"""Stage ``dashboard``: Prometheus alert rules and a Grafana dashboard for the pack's engine."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from capacity_pack.drills import alerts, dashboard
from capacity_pack.io import write_json_atomic
from capacity_pack.plan.manifest import Pack


def run(
    *,
    inputs: str | Pack,
    rules: str | Path,
    log: logging.Logger,
    omitted: str | Path | None = None,
    dashboard_path: str | Path | None = None,
) -> list[dict[str, str]]:
    """Write the alert rules (and, where given, the omissions JSON and the dashboard); return
    the alerts left out, with why."""
    pack = Pack.model_validate(json.loads(inputs)) if isinstance(inputs, str) else inputs
    left_out = alerts.write_alert_rules(pack, rules)
    if omitted is not None:
        write_json_atomic(omitted, {"omitted": left_out})
    if dashboard_path is not None:
        dashboard.write_grafana_dashboard(pack, dashboard_path)
    log.info("alert rules and dashboard for engine %s; omitted: %s", pack.engine.name, left_out)
    return left_out
