"""Stage ``preflight``: the pack's planned open-loop points and capacity bracket predicted in
virtual time before any is measured (:mod:`capacity_pack.twin.preflight`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from capacity_pack.plan.manifest import validate_pack
from capacity_pack.twin.preflight import preflight as predict
from capacity_pack.twin.preflight import write


def run(*, pack: str, preflight: str | Path, log: logging.Logger) -> dict[str, Any]:
    """Write ``preflight.json`` (the prediction, its profile and sha256, its cap); return it."""
    validated = validate_pack(json.loads(pack), "preflight params")
    # The long-run centring places the search's first rates; a pack whose search does not start
    # from the prediction (a fixed sweep, or rates of its own) keeps the short-window bracket.
    search = validated.sweep.search
    doc = predict(validated, long_run=search is not None and search.initial == "predicted")
    write(doc, preflight)
    if doc.unavailable:
        log.info("preflight: %s", doc.unavailable)
    for b in doc.brackets:
        log.info("preflight: %s: predicted bracket %s (%s)", b.cache_state, b.text(), b.why)
    for finding in doc.findings:
        log.warning("preflight: %s", finding)
    log.info("preflight: %d points predicted in %.1f s of CPU", len(doc.points), doc.cpu_s)
    return doc.to_dict()
