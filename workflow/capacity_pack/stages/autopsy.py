"""Stage ``autopsy``: where the run's wall clock and each SLO miss went (timeline, critical path,
buckets; per-request miss causes)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capacity_pack.autopsy import autopsy_markdown
from capacity_pack.autopsy.requests import request_autopsy
from capacity_pack.autopsy.run import NoRunLog, run_autopsy
from capacity_pack.io import write_json_atomic, write_text_atomic
from capacity_pack.plan.manifest import Pack, validate_pack
from capacity_pack.plan.words import target_words


def run(
    *,
    pack: str | Pack,
    results_dir: str | Path,
    log_dir: str | Path,
    repo_dir: str | Path,
    markdown: str | Path,
    json_path: str | Path,
    log: logging.Logger,
    requests: Sequence[str | Path] | None = None,
) -> dict[str, Any]:
    """Autopsy of the pack's results in ``results_dir`` (``results/<pack name>``, the MLflow
    store beside it) from Snakemake's logs in ``log_dir`` and the git history of ``repo_dir``.
    ``requests`` are the points' requests.parquet to look at (None: every point found)."""
    if isinstance(pack, str):
        pack = validate_pack(json.loads(pack), "autopsy params")
    results = Path(results_dir)
    try:
        run_doc = run_autopsy(
            results,
            Path(log_dir),
            Path(repo_dir),
            pack.pack.name,
            mlflow_db=results.parent / "mlflow.db",
            words=target_words(pack),
        )
    except NoRunLog as why:
        log.warning("autopsy: no run autopsy: %s", why)
        run_doc = {"unavailable": str(why)}
    tables = results / "tables"
    keys = None
    if requests is not None:
        keys = [Path(f).parent.relative_to(tables).as_posix() for f in requests]
    requests_doc = request_autopsy(tables, results / "raw", pack, keys=keys)
    doc = {"pack": pack.pack.name, "run": run_doc, "requests": requests_doc}
    write_json_atomic(json_path, doc)
    write_text_atomic(markdown, autopsy_markdown(doc, pack))
    log.info("autopsy of %s written", pack.pack.name)
    return doc
