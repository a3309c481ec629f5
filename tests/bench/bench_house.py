"""Benchmark: the size of the house (issue 41's counts), measured on the tree as it stands.

Run (from the repository root):

    python tests/bench/bench_house.py

Method. Every ``.py`` file under ``workflow/capacity_pack`` is read as text and parsed with
:mod:`ast`; nothing is imported or run.

- library: lines (``wc -l``: every line, blank and comment lines included) and modules;
- modules over 800 lines, each named;
- functions over 80 lines (``end_lineno - lineno + 1`` of a ``def``, decorators excluded, a
  nested ``def`` counted inside its parent and on its own), split into those that say why they
  stay whole (a comment naming "80 lines" on the line above the ``def``, its decorators, or the
  first lines of its body) and those that do not;
- README.md: lines and kilobytes;
- the same public name defined by ``def`` at module level in more than one module (a sign of
  one concept written twice; ``run``, ``main`` and the like are stage and entry-point names by
  design and are left out).

The CI and fast-tier times are measured by running them (``.ci/run`` on a fresh clone;
``pytest -m "not slow"``); docs/architecture.md keeps the last figures with their commands.
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "workflow" / "capacity_pack"
MODULE_MAX = 800
FUNCTION_MAX = 80
# Entry points every stage and command module has by design (capacity_pack.stages' table).
ENTRY_NAMES = {"run", "main", "app", "cli", "entry"}


def says_why(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    around = lines[max(0, first - 3) : first - 1] + lines[node.lineno : node.lineno + 4]
    return any("#" in line and "80 lines" in line for line in around)


def measure(root: Path = LIBRARY) -> dict:
    modules = sorted(root.rglob("*.py"))
    total = 0
    big: list[tuple[str, int]] = []
    long_why: list[tuple[str, int]] = []
    long_bare: list[tuple[str, int]] = []
    defined: dict[str, set[str]] = defaultdict(set)
    for path in modules:
        text = path.read_text()
        lines = text.splitlines()
        rel = str(path.relative_to(root))
        total += len(lines)
        if len(lines) > MODULE_MAX:
            big.append((rel, len(lines)))
        tree = ast.parse(text)
        for node in tree.body:
            is_def = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_def and not node.name.startswith("_") and node.name not in ENTRY_NAMES:
                defined[node.name].add(rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_MAX:
                    where = (f"{rel}:{node.lineno} {node.name}", n)
                    (long_why if says_why(lines, node) else long_bare).append(where)
    readme = ROOT / "README.md"
    return {
        "modules": len(modules),
        "lines": total,
        "big": sorted(big, key=lambda x: -x[1]),
        "long_why": sorted(long_why, key=lambda x: -x[1]),
        "long_bare": sorted(long_bare, key=lambda x: -x[1]),
        "twice": {k: sorted(v) for k, v in sorted(defined.items()) if len(v) > 1},
        "readme_lines": len(readme.read_text().splitlines()),
        "readme_kb": readme.stat().st_size / 1000,
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    m = measure()
    print(f"library: {m['lines']:,} lines in {m['modules']} modules (workflow/capacity_pack)")
    print(f"modules over {MODULE_MAX} lines: {len(m['big'])}")
    for name, n in m["big"]:
        print(f"  {n:5d}  {name}")
    print(
        f"functions over {FUNCTION_MAX} lines: {len(m['long_why']) + len(m['long_bare'])} "
        f"({len(m['long_why'])} saying why, {len(m['long_bare'])} not)"
    )
    for name, n in m["long_bare"]:
        print(f"  {n:5d}  {name}")
    print(f"public names defined in more than one module: {len(m['twice'])}")
    for name, where in m["twice"].items():
        print(f"  {name}: {', '.join(where)}")
    print(f"README.md: {m['readme_lines']} lines, {m['readme_kb']:.1f} kB")


if __name__ == "__main__":
    main()
