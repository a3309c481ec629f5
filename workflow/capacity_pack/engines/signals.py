"""Canonical server signals (queue depth, running, KV usage, prefix-cache queries and hits,
preemptions, token counters) read out of an engine's Prometheus text.

The names come from the registered engines (each module's ``signals``;
:func:`capacity_pack.engines.registry.metric_names` joins them in registration order).

- :func:`parse_metrics` (the load generator's scrape loop, once a second; a target without a
  metric map): each signal is the sum over label sets of the first of its names that the text
  holds, so an engine that exports both an old and a new name is not counted twice.
- :func:`read_signals` (the cold check and the idle wait of a real target): the signals through
  the engine's :class:`~capacity_pack.engines.metric_map.EngineMetrics`, and each one the engine
  does not expose or the scrape lacks, as a sentence of missing evidence; nothing is estimated
  in its place. A signal the map names is also read under the older names the same engine's
  module lists (vLLM's ``gpu_cache_usage_perc`` before ``kv_cache_usage_perc``).

Prefix-cache queries (prompt tokens looked up) are read as such where the engine counts them
(vLLM, the simulator); llama.cpp counts the hits (``llamacpp:prompt_tokens_cached_total``) and
the prompt tokens it computed (``llamacpp:prompt_tokens_total``, excluding the cached ones), so
there ``prefix_cache_queries`` = hits + misses (:func:`with_queries`).
"""

from __future__ import annotations

import re

from capacity_pack.engines.exposition import sample_sums
from capacity_pack.engines.metric_map import SIGNALS, EngineMetrics
from capacity_pack.engines.registry import metric_names


def _first_present(names: dict[str, tuple[str, ...]], sums: dict[str, float]) -> dict[str, float]:
    values: dict[str, float] = {}
    for signal, candidates in names.items():
        found = next((n for n in candidates if n in sums), None)
        if found is not None:
            values[signal] = sums[found]
    return values


def with_queries(values: dict[str, float]) -> dict[str, float]:
    """``values`` with ``prefix_cache_queries`` = hits + misses where the engine counts misses
    instead of queries."""
    if "prefix_cache_queries" not in values and {
        "prefix_cache_hits",
        "prefix_cache_misses",
    } <= set(values):
        values["prefix_cache_queries"] = values["prefix_cache_hits"] + values["prefix_cache_misses"]
    return values


def parse_metrics(text: str) -> dict[str, float]:
    """Canonical signals from Prometheus text, summed over label sets; tolerant of any engine."""
    names = dict(metric_names())
    sums = sample_sums(text, _all_names(names))
    return with_queries(_first_present(names, sums))


def _all_names(names: dict[str, tuple[str, ...]]) -> frozenset[str]:
    return frozenset(n for ns in names.values() for n in ns)


def read_signals(
    text: str, emap: EngineMetrics, *, map_name: str, url: str
) -> tuple[dict[str, float], list[str]]:
    """Canonical signals from ``text`` through ``emap``, and the missing ones, each a sentence."""
    known = metric_names()
    names: dict[str, tuple[str, ...]] = {}
    for signal, field in SIGNALS.items():
        primary = getattr(emap, field, None)
        if primary is None:
            continue
        prefix = re.match(r"[a-z]+[:_]", primary)
        older = [
            n
            for n in known.get(signal, ())
            if prefix is not None and n.startswith(prefix.group()) and n != primary
        ]
        names[signal] = (primary, *older)
    values = with_queries(_first_present(names, sample_sums(text, _all_names(names))))
    missing = []
    for signal in ("queue_depth", "running", "kv_usage"):
        if signal in values:
            continue
        if signal not in names:
            missing.append(f"{signal}: the {map_name} metric map has no series for it")
        else:
            missing.append(f"{signal}: {names[signal][0]} absent from {url}")
    if not {"prefix_cache_hits", "prefix_cache_hit_rate"} & set(values):
        if "prefix_cache_hits" in names or "prefix_cache_hit_rate" in names:
            wanted = (names.get("prefix_cache_hits") or names["prefix_cache_hit_rate"])[0]
            missing.append(f"prefix_cache_hits: {wanted} absent from {url}")
        else:
            missing.append(f"prefix_cache_hits: the {map_name} metric map has no series for it")
    return values, missing
