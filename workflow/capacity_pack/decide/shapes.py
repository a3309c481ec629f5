"""Each load shape's own answer: what a k6-style experiment (``experiments:`` of a pack, points
``exp-<name>``) was run to find out, from the point's normalized requests and scraped series.

A registry keyed by ``test_type`` (:data:`SHAPES`, filled by the ``shape`` decorator; one
registration in :mod:`capacity_pack.decide.shapes_answers` per shape); the common ground is in
:mod:`capacity_pack.decide.shapes_common`. :func:`answer_points` writes ``pack/shapes.json``,
:func:`readme_lines` renders it, :func:`draw` writes ``pack/shape-<experiment>.png``.
Method: docs/metrics.md, "Load shapes".
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

# Imported for its registrations: every shape's answer and plot lands in SHAPES.
import capacity_pack.decide.shapes_answers  # noqa: F401
from capacity_pack.decide.plots import pyplot, save_figure
from capacity_pack.decide.shapes_common import (
    MIN_CLASS_ATTEMPTS,
    RAMP_WINDOWS,
    SHAPES,
    PointData,
    ShapesInputs,
    caveat,
    context,
)

__all__ = [
    "RAMP_WINDOWS",
    "SHAPES",
    "PointData",
    "ShapesInputs",
    "answer_points",
    "draw",
    "experiment_lines",
    "readme_lines",
]


def answer_points(points: list[PointData], inputs: ShapesInputs) -> dict[str, Any]:
    """shapes.json: per experiment (in the pack's order) its question and, per point (cache
    state, then repeat), the answer."""
    by_exp: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(points, key=lambda p: p.key):
        ctx = context(p, inputs)
        doc = SHAPES[ctx.experiment.test_type].answer(ctx)
        doc.update(
            key=p.key,
            verdict=p.report.get("verdict"),
            client_bound=bool(p.report.get("client_bound")),
            caveat=caveat(p.report),
        )
        by_exp.setdefault(ctx.experiment.name, []).append(doc)
    experiments = []
    for e in inputs.experiments:
        if e.name not in by_exp:
            continue
        experiments.append(
            {
                "name": e.name,
                "test_type": e.test_type,
                "question": SHAPES[e.test_type].question,
                "plot": f"shape-{e.name}.png",
                "points": by_exp[e.name],
            }
        )
    return {
        "attainment_gate": inputs.attainment_gate,
        "min_class_attempts": MIN_CLASS_ATTEMPTS,
        "cutoffs": {k: list(v) for k, v in inputs.cutoffs.items()},
        "experiments": experiments,
    }


def readme_lines(doc: dict[str, Any] | None) -> list[str]:
    """The README's "Load shapes" section: each experiment's question, answer and plot."""
    if not doc or not doc["experiments"]:
        return []
    lines = [
        "## Load shapes",
        "",
        "Each load-shape experiment answers its own question, from its requests (sent, ended, "
        "status, TTFT and TPOT against the class cutoffs) and the server's scraped queue, "
        'running and KV series; methods in docs/metrics.md ("Load shapes"), numbers in '
        "`shapes.json`. The point's generic SLO verdict is given beside each answer.",
        "",
    ]
    for e in doc["experiments"]:
        lines += [*experiment_lines(e), f"![{e['name']}: {e['question']}]({e['plot']})", ""]
    return lines


def experiment_lines(e: dict[str, Any]) -> list[str]:
    """One experiment's heading (its question) and each point's answer, as Markdown."""
    lines = [f"### {e['name']} ({e['test_type']}): {e['question']}", ""]
    for p in e["points"]:
        lines.append(f"- `{p['key']}` (SLO verdict {p['verdict']}): {p['answer']}")
        if p.get("caveat"):
            lines.append(f"  Caveat: {p['caveat']}.")
    return [*lines, ""]


def draw(doc: dict[str, Any], folder: Path) -> list[Path]:
    """``shape-<name>.png`` per experiment: its first point's answer, drawn by its shape."""
    plt = pyplot()
    out = []
    inputs = {
        "gate": doc["attainment_gate"],
        "classes": list(doc["cutoffs"]),
        "cutoffs": doc["cutoffs"],
    }
    layout = {"stress": (1, 3), "spike": (2, 1), "soak": (2, 2)}
    for e in doc["experiments"]:
        p = e["points"][0]
        rows, cols = layout.get(e["test_type"], (1, 1))
        fig, axes = plt.subplots(
            rows, cols, figsize=(4.2 * cols + 1.5, 2.8 * rows + 1.6), squeeze=False,
            sharex=e["test_type"] == "spike",
        )  # fmt: skip
        # What each shape's plot function takes: one axes, a row of them, a column, a grid.
        if rows == 1:
            target = axes[0, 0] if cols == 1 else axes[0]
        else:
            target = axes[:, 0] if cols == 1 else axes
        SHAPES[e["test_type"]].plot(target, p, inputs)
        answer = "\n".join(textwrap.wrap(p["answer"].replace("**", ""), 130))
        fig.suptitle(f"{e['name']} ({e['test_type']}): {e['question']}\npoint {p['key']}",
                     fontsize=10)  # fmt: skip
        fig.text(0.5, 0.0, answer, ha="center", va="top", fontsize=7.5, color="dimgray")
        fig.tight_layout(rect=(0, 0, 1, 0.93))
        path = folder / e["plot"]
        save_figure(fig, path)
        out.append(path)
    return out
