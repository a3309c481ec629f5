"""The two errors of the PromQL package.

:class:`PromQLError` is a malformed or unsupported expression, rendered with its position and a
caret under the offending character (as Prometheus' parser reports ``parse error at char N``), or
an evaluation error (e.g. many-to-many matching). :class:`RuleFileError` is a rule file that
``promtool check rules`` (or this evaluator) would reject; it lists every problem found, not
only the first.
"""

from __future__ import annotations

from collections.abc import Sequence


class PromQLError(ValueError):
    """A malformed or unsupported expression (with its position), or an evaluation error."""

    def __init__(self, message: str, expr: str | None = None, pos: int | None = None):
        self.message = message
        self.expr = expr
        self.pos = pos
        super().__init__(self._render())

    def _render(self) -> str:
        if self.expr is None or self.pos is None:
            return self.message
        start = self.expr.rfind("\n", 0, self.pos) + 1
        end = self.expr.find("\n", self.pos)
        end = len(self.expr) if end < 0 else end
        line = self.expr.count("\n", 0, self.pos) + 1
        col = self.pos - start + 1
        return (
            f"{self.message} at position {self.pos} (line {line}, column {col})\n"
            f"    {self.expr[start:end]}\n    {' ' * (col - 1)}^"
        )


class RuleFileError(ValueError):
    """A rule file that ``promtool check rules`` (or this evaluator) would reject; lists all."""

    def __init__(self, source: str, errors: Sequence[str]):
        self.source = source
        self.errors = list(errors)
        lines = "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(f"{source}: {len(self.errors)} error(s) in the rule file:\n{lines}")
