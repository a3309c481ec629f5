"""``plan.json``: the replica plan at the forecast peak.

Written by the ``capacity`` stage (:func:`capacity_pack.decide.capacity.build_plan`) beside
``capacity.json`` and copied into ``pack/``. Without an SLO-compliant capacity it holds only
``required_replicas``/``required_gpus`` (null) and ``reason``; its sections are the dumps of
the sizing models (:mod:`capacity_pack.decide.sizing`), whose schemas are stated there.
"""

from __future__ import annotations

from typing import Any

from capacity_pack.artifacts.base import Artifact, Num


class Plan(Artifact):
    """Replicas and GPUs from throughput and from memory, which bound it, the contexts sized
    from, fit probes, effective bandwidth and cost."""

    required_replicas: int | None
    required_gpus: int | None
    reason: str | None = None
    bound_by: str | None = None
    capacity_cache_state: str | None = None
    throughput: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    contexts: dict[str, Any] | None = None
    p95_context_tokens: int | None = None
    max_context_tokens: int | None = None
    p95_e2e_s_at_capacity: Num | None = None
    fit_probe_at_planned_concurrency: dict[str, Any] | None = None
    fit_probe_one_request_at_max_context: dict[str, Any] | None = None
    effective_bandwidth: dict[str, Any] | None = None
    cost: dict[str, Any] | None = None
    memory_note: str | None = None
