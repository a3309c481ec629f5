"""What the console says when the pipeline ends: the decision, the plan, the failure answer and
where the pack is, read from the pack's own files (``capacity.json``, ``plan.json``,
``failure-test.json``), so the terminal and the pack never disagree (each cache state's line is
:func:`capacity_pack.vocab.words.decision_sentence`). Presentation only: the Snakefile's
``onsuccess`` handler prints the lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capacity_pack.artifacts import ArtifactError, Capacity, FailureTest, Plan
from capacity_pack.artifacts.capacity import OpenLoopState
from capacity_pack.plan.words import target_words
from capacity_pack.vocab.words import decision_sentence


def _read(model, path: Path):
    try:
        return model.read(path)
    except ArtifactError:
        return None


def _manifest(pack_dir: Path) -> dict[str, Any] | None:
    import yaml

    try:
        data = yaml.safe_load((pack_dir / "workload-manifest.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) and "target" in data and "engine" in data else None


def decision_line(state: str, sel: OpenLoopState) -> str:
    """One cache state's decision sentence (:func:`capacity_pack.vocab.words.
    decision_sentence`), as the README states it."""
    b = sel.bracket
    if b is None:
        return decision_sentence(state, sel.capacity_rps, None, None)
    return decision_sentence(state, b.pass_rps, b.fail_rps, b.reached)


def console_lines(pack_dir: str | Path) -> list[str]:
    """The closing lines for a finished pack folder; none when it holds no decision yet."""
    pack_dir = Path(pack_dir)
    capacity = _read(Capacity, pack_dir / "capacity.json")
    if capacity is None:
        return []
    lines = [f"capacity pack {capacity.pack or pack_dir.parent.name}: {pack_dir}/README.md"]
    if capacity.pack_label:
        lines.append(f"  {capacity.pack_label}")
    primary = capacity.primary_cache_state
    for state in sorted(capacity.open_loop, key=lambda s: s != primary):
        lines.append("  decision, " + decision_line(state, capacity.open_loop[state]))
    lines += [f"  MEASUREMENT FAULT ({f.kind}): {f.message}" for f in capacity.measurement_faults]
    lines += [f"  note ({n.kind}): {n.message}" for n in capacity.measurement_notes]
    plan = _read(Plan, pack_dir / "plan.json")
    if plan is not None and plan.required_replicas is not None:
        gpus = plan.required_gpus
        manifest = _manifest(pack_dir)
        unit = target_words(manifest).unit if manifest is not None else "GPU"
        lines.append(
            f"  plan: {plan.required_replicas} replica(s)"
            + (f", {gpus} {unit}(s)" if gpus is not None else "")
            + f", bound by {plan.bound_by or 'n/a'} ({plan.capacity_cache_state} cache)"
        )
    failure = _read(FailureTest, pack_dir / "failure-test.json")
    if failure is not None and failure.plan_drill is not None:
        lines.append(f"  when a replica fails: {failure.plan_drill.sentence}")
    return lines
