"""Rule `analyze`: one point's SLO report (logic in capacity_pack.evidence.analysis)."""

import json
from pathlib import Path

import pandas as pd

from capacity_pack.evidence.analysis import AnalysisSpec, analyze_point
from capacity_pack.io import write_json_atomic
from capacity_pack.logs import job_logging
from capacity_pack.plan.schedule import Point

with job_logging(snakemake.log[0]) as log:
    p, i = snakemake.params, snakemake.input
    point = Point.parse(p.point, p.cache_state, p.repeat)
    spec = AnalysisSpec.model_validate_json(p.spec)
    sweep = json.loads(Path(i.sweep).read_text())
    report = analyze_point(
        pd.read_parquet(i.requests),
        pd.read_parquet(i.chunks),
        pd.read_parquet(i.metrics),
        sweep,
        spec.classes(),
        spec.gates(),
    )
    report.update(
        point=point.point_id,
        key=point.key,
        cache_state=point.cache_state,
        repeat=point.repeat,
        mode=point.mode,
        offered_rps=point.rate_rps,
        concurrency=point.concurrency,
        pack_label=spec.pack_label,
    )
    write_json_atomic(snakemake.output.report, report)
    log.info("%s: %s (%s)", point.key, report["verdict"], "; ".join(report["verdict_reasons"]))
