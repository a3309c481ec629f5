"""Reading a YAML file strictly: UTF-8 text only, no duplicate keys, every error on one line.

- Bytes that are not UTF-8: "FILE is not UTF-8 text (byte N)", N the offset of the first bad
  byte from 0 (as ``xxd`` and ``hexdump`` count).
- A key given twice in one mapping (PyYAML keeps the last silently): refused with its line;
  ``<<`` merge keys may still be overridden by explicit keys, as YAML specifies.
- A scalar PyYAML cannot build (a date such as 2026-02-30, an integer longer than Python's
  4,300-digit limit) and a character YAML does not allow (a NUL): the line and column.
- Every other YAML error: PyYAML's context and problem, with the line and column.
"""

from __future__ import annotations

from typing import Any

import yaml

from capacity_pack.errors import StatedError


class TextInputError(StatedError, ValueError):
    """A file that cannot be read as text data; the message names the file and where."""


def shorten(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decode_utf8(data: bytes, source: str) -> str:
    """``data`` as text, or :class:`TextInputError` naming the offset of its first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TextInputError(f"{source} is not UTF-8 text (byte {err.start})") from None


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys and reporting bad scalars with their line."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:
                    continue  # an unhashable key: the base class names it
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {shorten(key)}",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as err:
            raise yaml.constructor.ConstructorError(
                None, None, f"{shorten(node.value)} is not a valid value: {err}", node.start_mark
            ) from None


def _problem(err: yaml.YAMLError, text: str) -> str:
    """A YAML error on one line: what, and the line and column where."""
    if isinstance(err, yaml.reader.ReaderError):
        line = text.count("\n", 0, err.position) + 1
        column = err.position - (text.rfind("\n", 0, err.position) + 1) + 1
        return (
            f"character {text[err.position]!r} is not allowed in YAML "
            f"(line {line}, column {column})"
        )
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        what = " ".join(p for p in (err.context, err.problem) if p)
        return " ".join(f"{what}{where}".split())
    return " ".join(str(err).split())


def parse_yaml(text: str, source: str) -> Any:
    """The data of YAML ``text`` (read from ``source``), or :class:`TextInputError`."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as err:
        raise TextInputError(f"{source}: not valid YAML: {_problem(err, text)}") from None
    except RecursionError:
        raise TextInputError(f"{source}: not valid YAML: nested too deeply") from None
