"""Stage ``freeze``: lint the pack, refuse mutable revisions and a pack that cannot fit, write
the frozen manifest and the fit probe, open the MLflow parent run."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from capacity_pack.decide.capacity import preflight_fit
from capacity_pack.io import write_json_atomic
from capacity_pack.plan.lint import lint_data, lint_notes
from capacity_pack.plan.manifest import freeze, validate_pack
from capacity_pack.track import tracking


def run(
    *,
    manifest: str,
    source: str,
    frozen: str | Path,
    fit: str | Path,
    results_root: str | Path,
    log: logging.Logger,
) -> dict:
    """Freeze ``manifest`` (the pack's JSON, as read from ``source``); return the frozen doc."""
    data = json.loads(manifest)
    findings = lint_data(data, source)
    if findings:
        lines = [
            f"{source}: {f.code}{' (extra)' * f.extra}: {f.message} (why: {f.reason})"
            for f in findings
        ]
        raise SystemExit("benchmark anti-patterns found; fix the pack:\n" + "\n".join(lines))
    pack = validate_pack(data, source)
    probe = preflight_fit(pack)
    if probe["checked"] and probe["verdict"] == "does-not-fit":
        raise SystemExit(f"fit probe: does-not-fit: {probe}")
    doc = freeze(pack, source)
    # Outside the hashed manifest: what the pack's author should know, refusing nothing.
    doc["lint_notes"] = lint_notes(pack)
    for note in doc["lint_notes"]:
        log.warning("%s: note: %s", source, note)
    write_json_atomic(fit, probe)
    write_json_atomic(frozen, doc)
    run_id = tracking.ensure_parent_run(doc, results_dir=results_root)
    log.info("froze %s (sha256 %s), MLflow parent run %s", source, doc["sha256"], run_id)
    return doc
