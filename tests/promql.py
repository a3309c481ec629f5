"""PromQL for the tests: Prometheus' grammar through ``promql-parser`` (a maintained Rust parser,
the ``test`` extra), and promtool wherever Prometheus itself must accept a file.

- :func:`parse`: the expression's syntax tree, or ``ValueError`` with the parser's message;
- :func:`selected_metrics`: the metric names an expression selects: every vector selector's
  name, or its ``__name__="..."`` matcher; a selector naming no metric exactly is an error;
- :data:`needs_promtool` and :func:`require_promtool`: ``promtool`` (Debian package
  ``prometheus``); outside CI a test needing it skips when it is absent, under ``CI=true`` it
  fails.
"""

from __future__ import annotations

import os
import shutil

import promql_parser
import pytest

PROMTOOL = shutil.which("promtool")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


WHY = "promtool is not installed (Debian package 'prometheus'; .ci/run installs it)"
# Outside CI a missing promtool skips the test; under CI=true the test runs and
# require_promtool() fails it, naming the package.
needs_promtool = pytest.mark.skipif(PROMTOOL is None and not IN_CI, reason=WHY)


def require_promtool() -> str:
    """promtool's path; a skip outside CI, a failure in CI, when it is absent."""
    if PROMTOOL is None:
        if IN_CI:
            pytest.fail(WHY)
        pytest.skip(WHY)
    return PROMTOOL


def parse(expr: str) -> promql_parser.Expr:
    """The expression's syntax tree (``ValueError`` naming the parse error)."""
    return promql_parser.parse(expr)


def selected_metrics(expr: str) -> set[str]:
    """The metric names ``expr`` selects (in ranges, subqueries and function arguments too)."""
    names: set[str] = set()

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            exact = [
                m.value
                for m in node.matchers.matchers
                if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal
            ]
            if node.name is None and not exact:
                raise ValueError(f"a selector names no metric exactly in {expr!r}")
            names.update([node.name] if node.name else exact)
        return True

    promql_parser.walk(parse(expr), visit)
    return names
