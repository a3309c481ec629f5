"""What the console says when the pipeline ends: the decision, the plan, the failure answer and
where the pack is, read from the pack's own files (``capacity.json``, ``plan.json``,
``failure-test.json``), so the terminal and the pack never disagree: each cache state's line is
the decision sentence the README, the HTML page and ``capacity-pack compare`` state
(:func:`capacity_pack.vocab.words.decision_sentence`).

Presentation only: JSON in, lines out (the Snakefile's ``onsuccess`` handler prints them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from capacity_pack.plan.words import target_words
from capacity_pack.vocab.words import decision_sentence


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _manifest(pack_dir: Path) -> dict[str, Any] | None:
    import yaml

    try:
        data = yaml.safe_load((pack_dir / "workload-manifest.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) and "target" in data and "engine" in data else None


def decision_line(state: str, sel: dict[str, Any]) -> str:
    """One cache state's decision sentence (:func:`capacity_pack.vocab.words.
    decision_sentence`), as the README states it."""
    b = sel.get("bracket") or {}
    return decision_sentence(
        state, b.get("pass_rps", sel.get("capacity_rps")), b.get("fail_rps"), b.get("reached")
    )


def console_lines(pack_dir: str | Path) -> list[str]:
    """The closing lines for a finished pack folder; none when it holds no decision yet."""
    pack_dir = Path(pack_dir)
    capacity = _read(pack_dir / "capacity.json")
    if capacity is None:
        return []
    lines = [f"capacity pack {capacity.get('pack', pack_dir.parent.name)}: {pack_dir}/README.md"]
    if capacity.get("pack_label"):
        lines.append(f"  {capacity['pack_label']}")
    open_loop = capacity.get("open_loop") or {}
    primary = capacity.get("primary_cache_state")
    states = sorted(open_loop, key=lambda s: s != primary)
    for state in states:
        lines.append("  decision, " + decision_line(state, open_loop[state]))
    for fault in capacity.get("measurement_faults") or []:
        lines.append(f"  MEASUREMENT FAULT ({fault['kind']}): {fault['message']}")
    for note in capacity.get("measurement_notes") or []:
        lines.append(f"  note ({note['kind']}): {note['message']}")
    plan = _read(pack_dir / "plan.json")
    if plan is not None and plan.get("required_replicas") is not None:
        gpus = plan.get("required_gpus")
        manifest = _manifest(pack_dir)
        unit = target_words(manifest).unit if manifest is not None else "GPU"
        lines.append(
            f"  plan: {plan['required_replicas']} replica(s)"
            + (f", {gpus} {unit}(s)" if gpus is not None else "")
            + f", bound by {plan.get('bound_by', 'n/a')} ({plan.get('capacity_cache_state')} cache)"
        )
    failure = _read(pack_dir / "failure-test.json")
    answer = (failure or {}).get("plan_drill") or {}
    if answer.get("sentence"):
        lines.append(f"  when a replica fails: {answer['sentence']}")
    return lines
