"""Label sets and their text form.

A label set is a tuple of ``(name, value)`` pairs sorted by name (:data:`Labels`): hashable and
cheap to compare. Its text is the exposition format's
(https://prometheus.io/docs/instrumenting/exposition_formats/): ``{a="x",b="y\\"z"}`` with
``\\\\``, ``\\"`` and ``\\n`` as the only escapes; :func:`format_labels` writes the canonical form
(sorted, escaped) that names an alert instance. Label names follow the data model's
``[a-zA-Z_][a-zA-Z0-9_]*`` (https://prometheus.io/docs/concepts/data_model/).

An instant vector is a list of ``(Labels, value)``; :func:`check_unique` enforces Prometheus'
rule that a vector never holds two samples with one label set (an operation that drops the
metric name can produce that, and Prometheus then fails the query).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from capacity_pack.drills.promql.errors import PromQLError

# A label set as a tuple of (name, value) pairs sorted by name: hashable, cheap to compare.
Labels = tuple[tuple[str, str], ...]

LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

_LABEL_PAIR_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*', re.S)
_EXPOSITION_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


def _unescape_label_value(raw: str, text: str) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1) not in _EXPOSITION_ESCAPES:
            raise ValueError(f"invalid escape \\{m.group(1)} in label text {text!r}")
        return _EXPOSITION_ESCAPES[m.group(1)]

    return re.sub(r"\\(.)", one, raw, flags=re.S)


def parse_labels(text: str) -> dict[str, str]:
    """Label text as exposed (``{a="x",b="y\\"z"}``, or empty) -> dict; raises ValueError."""
    body = text.strip()
    if not body:
        return {}
    if len(body) < 2 or body[0] != "{" or body[-1] != "}":
        raise ValueError(f"label text must be enclosed in braces: {text!r}")
    body = body[1:-1]
    out: dict[str, str] = {}
    pos = 0
    while True:
        m = _LABEL_PAIR_RE.match(body, pos)
        if m is None:
            if body[pos:].strip():
                raise ValueError(f"malformed label text {text!r} at {body[pos:]!r}")
            return out
        name = m.group(1)
        if name in out:
            raise ValueError(f"duplicate label {name!r} in {text!r}")
        out[name] = _unescape_label_value(m.group(2), text)
        pos = m.end()
        if pos == len(body):
            return out
        if body[pos] != ",":
            raise ValueError(f"expected ',' between labels in {text!r}")
        pos += 1


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_labels(labels: Mapping[str, str] | Labels) -> str:
    """Canonical label text: sorted by name, values escaped; ``""`` for no labels."""
    items = sorted(labels.items() if isinstance(labels, Mapping) else labels)
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in items) + "}"


def drop_name(labels: Labels) -> Labels:
    """The label set without ``__name__``."""
    return tuple(p for p in labels if p[0] != "__name__")


def check_unique(vec: list[tuple[Labels, float]]) -> list[tuple[Labels, float]]:
    """``vec`` itself; raises :class:`PromQLError` if two samples share a label set."""
    seen: set[Labels] = set()
    for labels, _ in vec:
        if labels in seen:
            raise PromQLError(
                f"vector cannot contain metrics with the same labelset {format_labels(labels)}"
            )
        seen.add(labels)
    return vec
