"""Stage ``publish``: the finished pack on its MLflow parent run, last of all.

The parent gets the console's closing lines as its description, the decision metrics
(:func:`capacity_pack.decide.capacity.decision_metrics`), each cache state's ``decision`` as a
tag, and every file of the pack folder as an artifact under ``pack/``: it runs after them all.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from capacity_pack.artifacts import Capacity, Plan
from capacity_pack.decide.capacity import decision_metrics
from capacity_pack.decide.console import console_lines
from capacity_pack.io import write_json_atomic
from capacity_pack.track import tracking


def description(pack_dir: Path) -> str:
    """The parent run's description: the console's closing lines as Markdown, pointing at the
    run's own artifacts rather than at a path on the machine that built the pack."""
    lines = console_lines(pack_dir)
    if not lines:
        return ""
    head, rest = lines[0], lines[1:]
    name = head.split(":", 1)[0]
    body = [f"**{name}**: `pack/index.html` (or `pack/README.md`) in this run's artifacts.", ""]
    body += [f"- {line.strip()}" for line in rest]
    return "\n".join(body)


def run(
    *,
    frozen: str | Path,
    capacity: str | Path,
    plan: str | Path,
    readme: str | Path,
    published: str | Path,
    results_root: str | Path,
    log: logging.Logger,
) -> str:
    """Log the pack beside ``readme`` onto the parent run of ``frozen``; ``published`` gets the
    run id and the pack's file count. Returns the parent run's id."""
    frozen_doc = json.loads(Path(frozen).read_text())
    cap, replicas = Capacity.read(capacity), Plan.read(plan)
    pack_dir = Path(readme).parent
    decision = " | ".join(s.decision or "" for s in cap.open_loop.values())
    run_id = tracking.log_parent_results(
        frozen_doc,
        metrics=decision_metrics(cap, replicas),
        tags={"capacity_pack.decision": decision[:4000]},
        description=description(pack_dir),
        pack_dir=pack_dir,
        results_dir=results_root,
    )
    files = sorted(str(p.relative_to(pack_dir)) for p in pack_dir.rglob("*") if p.is_file())
    write_json_atomic(
        published,
        {"manifest_sha256": frozen_doc["sha256"], "parent_run": run_id, "pack_files": files},
    )
    log.info("pack published to MLflow parent run %s (%d files)", run_id, len(files))
    return run_id
