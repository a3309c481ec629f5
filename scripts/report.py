"""Rule `report`: write the pack folder and put the decision on the MLflow parent run."""

import json
from pathlib import Path

import pandas as pd

from capacity_pack.decide.capacity import decision_metrics
from capacity_pack.decide.report import load_reports, selected_point, write_pack
from capacity_pack.logs import job_logging
from capacity_pack.track import tracking

with job_logging(snakemake.log[0]) as log:
    i = snakemake.input
    frozen = json.loads(Path(i.frozen).read_text())
    capacity = json.loads(Path(i.capacity).read_text())
    plan = json.loads(Path(i.plan).read_text())
    reports = load_reports(i.reports)
    selected = selected_point(capacity, reports)
    tables = Path(i.tables[0]).parents[3]
    series = {
        str(Path(p).parent.relative_to(tables)): pd.read_parquet(p)
        for p in i.metrics
        if Path(p).parts[-4].startswith("open-")
    }
    out_dir = Path(snakemake.output.readme).parent
    files = write_pack(
        out_dir,
        frozen=frozen,
        capacity=capacity,
        plan=plan,
        reports=reports,
        selected_tables=tables / selected["key"] if selected else None,
        selected_report=selected,
        series=series,
        extra_files=[Path(i.fit)],
    )
    tracking.log_parent_results(
        frozen,
        metrics=decision_metrics(capacity, plan),
        tags={
            "capacity_pack.decision": " | ".join(
                s["decision"] for s in capacity["open_loop"].values()
            )[:4000]
        },
        artifacts=files,
        results_dir=snakemake.params.results_root,
    )
    log.info("pack written to %s (%d files)", out_dir, len(files))
