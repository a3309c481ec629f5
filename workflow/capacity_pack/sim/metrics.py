"""Prometheus text exposition (format 0.0.4) for the simulator, and a strict parser for it.

Hand-written rather than ``prometheus_client`` because the engine observes a histogram per
generated token: a bisect and two adds here, against a lock and several calls there. The output
follows ``prometheus_client``'s conventions, as vLLM's ``/metrics`` shows (``# HELP``/``# TYPE``
once per family, a counter named with its ``_total``, cumulative ``_bucket{le}`` ending at
``+Inf`` = ``_count``, then ``_count`` and ``_sum``); bucket bounds are vLLM V1's
(``vllm/v1/metrics/loggers.py``).

The parser (:func:`parse`: the router's merge of its replicas' scrapes, and the tests) is
hand-written too, because prometheus_client's renames a counter declared without ``_total``
(the router re-emits each family under the name and type its replica declared,
:meth:`Exposition.raw_family`), accepts an untyped sample or a family declared twice, and checks
no histogram; :func:`parse` refuses all of these (the router then leaves that replica's scrape
out). :mod:`capacity_pack.engines.exposition` reads other engines' text with prometheus_client's
parser; the simulator imports nothing of the project outside :mod:`capacity_pack.sim`.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Fine enough at the bottom to read "p99 under 2 ms" straight off the buckets.
LATENESS_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
)  # fmt: skip
STEP_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0,
)  # fmt: skip


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


class Histogram:
    """Bucket counts (non-cumulative until exposition), sum and count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("bucket bounds must be strictly increasing")
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[int]:
        out, running = [], 0
        for c in self.counts:
            running += c
            out.append(running)
        return out


def format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_labels(labels: Sequence[tuple[str, str]]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels) + "}"


class Exposition:
    """Builds one scrape: families are added in order, each with its samples; rendered as text
    (:meth:`text`) or read as samples (:meth:`samples`, what a parser of the text returns)."""

    def __init__(self) -> None:
        # ("#", name, kind, help) headers and (name, labels, value) samples, in order.
        self._items: list[tuple] = []
        self._seen: set[str] = set()

    def _family(self, name: str, kind: str, help_text: str) -> None:
        if name in self._seen:
            raise ValueError(f"metric family {name} added twice")
        self._seen.add(name)
        self._items.append(("#", name, kind, help_text))

    def gauge(
        self, name: str, help_text: str, series: Iterable[tuple[Sequence[tuple[str, str]], float]]
    ) -> None:
        self._family(name, "gauge", help_text)
        self._items += [(name, labels, float(value)) for labels, value in series]

    def counter(
        self, name: str, help_text: str, series: Iterable[tuple[Sequence[tuple[str, str]], float]]
    ) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name} must end in _total")
        self._family(name, "counter", help_text)
        self._items += [(name, labels, float(value)) for labels, value in series]

    def histogram(
        self,
        name: str,
        help_text: str,
        series: Iterable[tuple[Sequence[tuple[str, str]], Histogram]],
    ) -> None:
        self._family(name, "histogram", help_text)
        items = self._items
        for labels, hist in series:
            labels = list(labels)
            cumulative = hist.cumulative()
            for bound, count in zip((*hist.bounds, math.inf), cumulative, strict=True):
                bucket = [*labels, ("le", format_value(bound))]
                items.append((f"{name}_bucket", bucket, float(count)))
            items.append((f"{name}_count", labels, float(hist.count)))
            items.append((f"{name}_sum", labels, float(hist.sum)))

    def raw_family(self, family: MetricFamily) -> None:
        """Re-emit a parsed family (the cluster router merges replicas' scrapes this way)."""
        self._family(family.name, family.type, family.help)
        self._items += [(s.name, s.labels, s.value) for s in family.samples]

    def samples(self) -> list[tuple[str, Sequence[tuple[str, str]], float]]:
        """Every sample as (name, labels, value): what parsing :meth:`text` gives back."""
        return [item for item in self._items if item[0] != "#"]

    def text(self) -> str:
        lines = []
        for item in self._items:
            if item[0] == "#":
                _, name, kind, help_text = item
                lines.append(f"# HELP {name} {help_text}")
                lines.append(f"# TYPE {name} {kind}")
            else:
                name, labels, value = item
                lines.append(f"{name}{format_labels(labels)} {format_value(value)}")
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------


@dataclass
class Sample:
    name: str
    labels: list[tuple[str, str]]
    value: float

    def label(self, key: str) -> str | None:
        return next((v for k, v in self.labels if k == key), None)


@dataclass
class MetricFamily:
    name: str
    type: str
    help: str
    samples: list[Sample] = field(default_factory=list)


class ExpositionError(ValueError):
    """Text that is not valid Prometheus exposition format."""


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE_RE = re.compile(rf"^({_NAME})(\{{(.*)\}})?\s+(\S+)(\s+-?\d+)?$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "untyped": ("",),
}


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


def _parse_labels(text: str, lineno: int) -> list[tuple[str, str]]:
    labels: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _LABEL_RE.match(text, pos)
        if not m or m.end() == pos:
            raise ExpositionError(f"line {lineno}: bad labels {{{text}}}")
        labels.append((m.group(1), _unescape(m.group(2))))
        pos = m.end()
    if len({k for k, _ in labels}) != len(labels):
        raise ExpositionError(f"line {lineno}: duplicate label name")
    return labels


def _family_of(sample_name: str, families: dict[str, MetricFamily]) -> MetricFamily | None:
    # The text format (0.0.4) names a counter's sample as its family, usually ending in _total;
    # an engine's counter without the suffix (llama.cpp's llamacpp:n_tokens_max) is one too.
    fam = families.get(sample_name)
    if fam is not None and fam.type in ("counter", "gauge", "untyped"):
        return fam
    for fam in families.values():
        for suffix in _SUFFIXES.get(fam.type, ("",)):
            base = fam.name.removesuffix("_total") if fam.type == "counter" else fam.name
            if sample_name == base + suffix:
                return fam
    return None


def parse(text: str) -> dict[str, MetricFamily]:
    """Parse exposition text strictly: every sample must belong to a declared family, and every
    histogram must have monotonic cumulative buckets ending at ``+Inf`` equal to ``_count``."""
    families: dict[str, MetricFamily] = {}
    helps: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("# HELP "):
            parts = line[7:].split(" ", 1)
            helps[parts[0]] = parts[1] if len(parts) > 1 else ""
            continue
        if line.startswith("# TYPE "):
            parts = line[7:].split()
            if len(parts) != 2 or parts[1] not in _SUFFIXES:
                raise ExpositionError(f"line {lineno}: bad TYPE line {line!r}")
            if parts[0] in families:
                raise ExpositionError(f"line {lineno}: family {parts[0]} declared twice")
            families[parts[0]] = MetricFamily(parts[0], parts[1], helps.get(parts[0], ""))
            continue
        if line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            raise ExpositionError(f"line {lineno}: not a sample: {line!r}")
        name, labels_text, value_text = m.group(1), m.group(3), m.group(4)
        try:
            value = float(value_text)
        except ValueError:
            raise ExpositionError(f"line {lineno}: bad value {value_text!r}") from None
        fam = _family_of(name, families)
        if fam is None:
            raise ExpositionError(f"line {lineno}: sample {name} has no # TYPE declaration")
        fam.samples.append(Sample(name, _parse_labels(labels_text or "", lineno), value))
    for fam in families.values():
        if fam.type == "histogram":
            _check_histogram(fam)
    return families


def _check_histogram(fam: MetricFamily) -> None:
    series: dict[tuple, list[tuple[float, float]]] = {}
    counts: dict[tuple, float] = {}
    for s in fam.samples:
        key = tuple(sorted((k, v) for k, v in s.labels if k != "le"))
        if s.name.endswith("_bucket"):
            le = s.label("le")
            if le is None:
                raise ExpositionError(f"{fam.name}: bucket without le")
            series.setdefault(key, []).append((float(le), s.value))
        elif s.name.endswith("_count"):
            counts[key] = s.value
    for key, buckets in series.items():
        bounds = [b for b, _ in buckets]
        values = [v for _, v in buckets]
        if bounds != sorted(bounds) or not math.isinf(bounds[-1]):
            raise ExpositionError(f"{fam.name}{dict(key)}: buckets unsorted or no +Inf")
        if any(b < a for a, b in zip(values, values[1:], strict=False)):
            raise ExpositionError(f"{fam.name}{dict(key)}: cumulative buckets decrease")
        if counts.get(key) != values[-1]:
            raise ExpositionError(f"{fam.name}{dict(key)}: +Inf bucket differs from _count")


def value(families: dict[str, MetricFamily], sample_name: str, **labels: str) -> float | None:
    """The value of one sample whose labels include ``labels`` (summed over the rest)."""
    total, found = 0.0, False
    for fam in families.values():
        for s in fam.samples:
            if s.name == sample_name and all(s.label(k) == v for k, v in labels.items()):
                total += s.value
                found = True
    return total if found else None
