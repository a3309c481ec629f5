"""The one reader of Prometheus text exposition (format 0.0.4) in the project, over
``prometheus_client.parser.text_string_to_metric_families``.

Only sample lines are handed to prometheus_client: ``# HELP``/``# TYPE`` comments are dropped
first. Nothing here needs a family's type, and prometheus_client renames the samples of a
``counter`` family whose name lacks ``_total`` (``# TYPE tgi_request_count counter`` turns
``tgi_request_count 3`` into ``tgi_request_count_total``): without the comments every sample keeps
the name the server wrote.

- :func:`samples` reads every sample: name, labels (unescaped), value. Tolerant by default: when
  prometheus_client rejects the text (it stops at the first malformed line), the lines are read
  one at a time and the malformed ones are skipped, so one junk line costs that line only.
  ``strict=True`` raises :class:`ExpositionError` instead, and also rejects a histogram whose
  cumulative buckets are unsorted, decrease, lack ``+Inf`` or end away from ``_count``
  (the drills keep only whole, consistent scrapes).
- :func:`sample_sums` sums wanted series over their label sets. It first selects the lines
  that start with a wanted name (``str.startswith`` over the lines), then parses only those:
  prometheus_client's parser is pure Python (about 0.1 ms a sample line on a busy core), and the
  load generator reads about ten series out of a vLLM scrape of about 500 lines every second.
- :func:`name_prefixes` lists the metric-family prefixes present (``vllm:``, ``tgi_``...).
- :func:`format_labels` writes a label set back in exposition syntax, keys sorted.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Iterable, Mapping
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families


class ExpositionError(ValueError):
    """Prometheus text that cannot be read (strict mode)."""


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


def _sample_lines(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and stripped[0] != "#":
            out.append(stripped)
    return out


def _parse(lines: list[str]) -> list[Sample]:
    """Samples of ``lines``; ValueError on the first malformed one."""
    if not lines:
        return []
    return [
        Sample(s.name, s.labels, float(s.value))
        for family in text_string_to_metric_families("\n".join(lines) + "\n")
        for s in family.samples
    ]


def _tolerant(lines: list[str]) -> list[Sample]:
    try:
        return _parse(lines)
    except (ValueError, IndexError):
        pass
    out: list[Sample] = []
    for line in lines:
        try:
            out += _parse([line])
        except (ValueError, IndexError):
            continue
    return out


def samples(text: str, *, strict: bool = False) -> list[Sample]:
    """Every sample of ``text``; malformed lines skipped (or :class:`ExpositionError`)."""
    lines = _sample_lines(text)
    if not strict:
        return _tolerant(lines)
    try:
        out = _parse(lines)
    except (ValueError, IndexError) as err:
        raise ExpositionError(f"not Prometheus text: {err or 'malformed sample line'}") from None
    _check_histograms(out)
    return out


def _check_histograms(found: Iterable[Sample]) -> None:
    buckets: dict[tuple, list[tuple[float, float]]] = {}
    counts: dict[tuple, float] = {}
    for s in found:
        if s.name.endswith("_bucket") and "le" in s.labels:
            key = (
                s.name[: -len("_bucket")],
                *sorted((k, v) for k, v in s.labels.items() if k != "le"),
            )
            try:
                buckets.setdefault(key, []).append((float(s.labels["le"]), s.value))
            except ValueError:
                raise ExpositionError(f"{s.name}: le {s.labels['le']!r} is not a number") from None
        elif s.name.endswith("_count"):
            counts[(s.name[: -len("_count")], *sorted(s.labels.items()))] = s.value
    for key, series in buckets.items():
        bounds = [b for b, _ in series]
        values = [v for _, v in series]
        where = f"{key[0]}{dict(key[1:])}"
        if bounds != sorted(bounds) or not math.isinf(bounds[-1]):
            raise ExpositionError(f"{where}: buckets unsorted or no +Inf")
        if any(b < a for a, b in zip(values, values[1:], strict=False)):
            raise ExpositionError(f"{where}: cumulative buckets decrease")
        if counts.get(key) != values[-1]:
            raise ExpositionError(f"{where}: +Inf bucket differs from _count")


@functools.lru_cache(maxsize=64)
def _prefixes(wanted: frozenset[str]) -> tuple[str, ...]:
    return tuple(sorted(wanted))


def sample_sums(text: str, wanted: Collection[str]) -> dict[str, float]:
    """Per wanted series name present in ``text``, its sum over label sets."""
    if not wanted:
        return {}
    keep = frozenset(wanted)
    # A prefix match also keeps longer names (..._waiting_by_reason); the parse drops them.
    starts = _prefixes(keep)
    lines = [line for line in text.splitlines() if line.startswith(starts)]
    sums: dict[str, float] = {}
    for s in _tolerant(lines):
        if s.name in keep:
            sums[s.name] = sums.get(s.name, 0.0) + s.value
    return sums


def name_prefixes(found: Iterable[Sample], prefixes: Collection[str]) -> list[str]:
    """The family prefixes of the sample names: the part up to ``:`` of a name with one
    (``vllm:``, ``router:``), else each of ``prefixes`` ending in ``_`` that the name starts with
    (``tgi_``; a name such as ``python_gc_objects_collected_total`` belongs to none)."""
    underscored = [p for p in prefixes if p.endswith("_")]
    out: set[str] = set()
    for name in {s.name for s in found}:
        if ":" in name:
            out.add(name.split(":", 1)[0] + ":")
        else:
            out.update(p for p in underscored if name.startswith(p))
    return sorted(out)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_labels(labels: Mapping[str, str]) -> str:
    """``{a="1",b="x"}`` with keys sorted; ``""`` for no labels."""
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(labels[k]))}"' for k in sorted(labels)) + "}"
