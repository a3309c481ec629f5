"""The registry of engines: which engines exist and what engine X does, answered by iterating the
registered :class:`~capacity_pack.engines.base.Engine` specs in registration order.

:func:`register` / :func:`unregister` (kinds, aliases, ``owned_by`` values and metric-name
prefixes must not collide); :func:`engine_kind` maps ``engine.name`` to a kind (a kind or alias,
exactly or followed by a non-alphanumeric suffix, ``vllm-0.11``; longest name first, so
``vllmx`` is no engine); the metric maps, cache resets (``none``, ``restart`` and each engine's
own), probe paths and tokenize formats by kind.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from capacity_pack.engines.base import CacheReset, Engine, TokenizeFormat
from capacity_pack.engines.metric_map import EngineMetrics, MetricMapError
from capacity_pack.validation import problems

_ENGINES: dict[str, Engine] = {}
# target.cache_reset values that need no engine: nothing, or the restart command.
GENERIC_RESETS = ("none", "restart")


def register(engine: Engine) -> Engine:
    """Add ``engine`` to the registry; returns it (``ENGINE = register(Engine(...))``)."""
    for other in _ENGINES.values():
        clash = (
            set(engine.names) & set(other.names)
            or set(engine.owned_by) & set(other.owned_by)
            or set(engine.families) & set(other.families)
        )
        if clash:
            raise ValueError(f"engine {engine.kind!r} collides with {other.kind!r} on {clash}")
    for reset in engine.resets:
        if reset.name in GENERIC_RESETS:
            raise ValueError(f"engine {engine.kind!r}: reset name {reset.name!r} is reserved")
    _ENGINES[engine.kind] = engine
    metric_names.cache_clear()
    return engine


def unregister(kind: str) -> None:
    _ENGINES.pop(kind, None)
    metric_names.cache_clear()


def engines() -> tuple[Engine, ...]:
    """Every registered engine, in registration order."""
    return tuple(_ENGINES.values())


def get(kind: str | None) -> Engine | None:
    return _ENGINES.get(kind) if kind else None


def _by_name(name: str, names: dict[str, Engine]) -> Engine | None:
    name = name.strip().lower()
    if name in names:
        return names[name]
    # Longest name first, so a future "vllm-ascend" entry would win over "vllm".
    for known in sorted(names, key=len, reverse=True):
        if name.startswith(known) and not name[len(known)].isalnum():
            return names[known]
    return None


def engine_kind(name: str | None) -> str | None:
    """The engine kind a manifest's ``engine.name`` denotes, or None for an unknown engine."""
    if not name:
        return None
    found = _by_name(name, {n: e for e in _ENGINES.values() for n in e.names})
    return found.kind if found is not None else None


def metrics_path(kind: str | None) -> str:
    """Where ``kind`` serves Prometheus text (``/metrics`` unless its module says otherwise)."""
    engine = get(kind)
    return engine.metrics_path if engine is not None else "/metrics"


def probe_paths() -> tuple[str, ...]:
    """The GET endpoints the identity probe asks: the OpenAI model list, every registered
    engine's identity endpoints, and the metrics."""
    paths = dict.fromkeys(["/v1/models", *(p for e in _ENGINES.values() for p in e.probe_paths())])
    paths.pop("/metrics", None)
    return (*paths, "/metrics")


@functools.cache
def metric_names() -> Mapping[str, tuple[str, ...]]:
    """Canonical server signal -> the names engines expose it under (first match wins)."""
    out: dict[str, list[str]] = {}
    for engine in _ENGINES.values():
        for signal, names in engine.signals.items():
            known = out.setdefault(signal, [])
            known.extend(n for n in names if n not in known)
    return MappingProxyType({signal: tuple(names) for signal, names in out.items()})


def tokenize_formats() -> tuple[TokenizeFormat, ...]:
    """The ``/tokenize`` formats of the registered engines, each once, in registration order."""
    formats: dict[str, TokenizeFormat] = {}
    for engine in _ENGINES.values():
        if engine.tokenize is not None:
            formats.setdefault(engine.tokenize.name, engine.tokenize)
    return tuple(formats.values())


# --- Cache resets ---


def cache_reset_names() -> tuple[str, ...]:
    """Every allowed ``target.cache_reset``: ``none``, ``restart``, then the engines' own."""
    own = (r.name for e in _ENGINES.values() for r in e.resets)
    return tuple(dict.fromkeys((*GENERIC_RESETS, *own)))


def cache_reset(name: str) -> CacheReset | None:
    """The reset ``target.cache_reset: name`` performs (the first engine declaring it)."""
    return next((r for e in _ENGINES.values() for r in e.resets if r.name == name), None)


def reset_owner(name: str | None) -> Engine | None:
    """The engine whose own reset ``name`` is (vLLM for ``vllm``, not the simulator)."""
    return next((e for e in _ENGINES.values() if name in e.reset_names), None)


def check_cache_reset(target: Any) -> str | None:
    """The one-line error of a target whose ``cache_reset`` no registered engine performs."""
    value = getattr(target, "cache_reset", None)
    if value is None or value in cache_reset_names():
        return None
    allowed = [repr(n) for n in cache_reset_names()]
    return (
        f"target.cache_reset: Input should be {', '.join(allowed[:-1])} or {allowed[-1]} "
        f"(got {value!r})"
    )


# --- Metric maps ---


def metric_maps() -> dict[str, EngineMetrics]:
    """Kind -> metric map, for every registered engine that has one."""
    return {e.kind: e.metrics for e in _ENGINES.values() if e.metrics is not None}


def _lookup(engine_name: str) -> EngineMetrics | None:
    # By kind only (exact or kind prefix): an alias such as "llama.cpp" names a map through
    # engine.metric_names.
    found = _by_name(engine_name, {e.kind: e for e in _ENGINES.values() if e.metrics is not None})
    return found.metrics if found is not None else None


def metric_map_name(pack: Any) -> str:
    """Which map a pack's series follow: the configured one, else the engine's own name when
    a map is known for it, else the simulator's for a simulated target (whatever engine it
    stands in for), else the engine name (and :func:`engine_metrics` says what is missing)."""
    if pack.engine.metric_names:
        return pack.engine.metric_names
    if _lookup(pack.engine.name) is None and pack.target.kind == "sim":
        return "capacity-pack-sim"
    return pack.engine.name


def engine_metrics(engine_name: str, overrides: dict[str, Any] | None = None) -> EngineMetrics:
    """The metric map of ``engine_name`` (exact or prefix match: ``vllm-0.11`` is vLLM), with
    ``overrides`` (field -> name, ``None`` to drop a signal) applied.

    An engine with no known map needs overrides naming its series; they are then the whole map.
    """
    base = _lookup(engine_name)
    if base is None and not overrides:
        raise MetricMapError(
            f"no metric map for engine {engine_name!r}; known engines: "
            f"{', '.join(sorted(metric_maps()))} (a name may also start with one of them, e.g. "
            "'vllm-0.11'). Give overrides naming the engine's series (fields of "
            "capacity_pack.engines.EngineMetrics: waiting, running, kv_usage, ...)"
        )
    data = base.model_dump() if base is not None else {}
    data.update(overrides or {})
    try:
        return EngineMetrics.model_validate(data)
    except ValidationError as err:
        raise MetricMapError(
            f"engine {engine_name!r}: invalid metric map ({problems(err, '<map>')}); valid fields: "
            f"{', '.join(EngineMetrics.model_fields)}"
        ) from None


def metric_map(name: str | None) -> EngineMetrics | None:
    """The metric map of a kind or any engine name (aliases too), or None."""
    if not name:
        return None
    kind = engine_kind(name)
    found = _lookup(name) or (_lookup(kind) if kind is not None else None)
    return found.model_copy() if found is not None else None
