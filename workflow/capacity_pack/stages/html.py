"""Stage ``html``: the pack as one page, ``pack/index.html`` (:mod:`capacity_pack.decide.html`),
from the pack folder's own files and the points' SLO reports."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from capacity_pack.decide.html import write_page


def run(*, index: str | Path, reports: Sequence[str | Path], log: logging.Logger) -> Path:
    """Write ``index`` for the pack folder that holds it; ``reports`` are every measured point's
    ``slo-report.json`` (the evidence per point)."""
    path = write_page(Path(index).parent, reports, index)
    log.info("pack page written to %s (%d bytes)", path, path.stat().st_size)
    return path
