"""Hugging Face Text Generation Inference (``text-generation-launcher``).

Identity: ``GET /info`` -> ``model_id``, ``model_sha`` (compared with ``model.revision`` when that
is a commit), ``max_total_tokens``, ``version`` and ``router "text-generation-router"``;
``tgi_*`` series on ``/metrics``.

Metrics: the router's queue and batch gauges and the end-to-end histogram; it exposes no KV
usage, prefix cache, preemption or TTFT series, and its token counts are histograms.

Cache: no reset endpoint; ``cache_reset: restart`` (a restart command) is the only way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capacity_pack.engines.base import Engine, IdentityEndpoint
from capacity_pack.engines.metric_map import EngineMetrics
from capacity_pack.engines.registry import register


def _info(path: str, body: Any) -> str | None:
    if isinstance(body, Mapping) and (
        str(body.get("router", "")).startswith("text-generation")
        or {"model_id", "max_total_tokens"} <= set(body)
    ):
        return f"{path} router {body.get('router')!r}"
    return None


ENGINE = register(
    Engine(
        kind="tgi",
        aliases=("text-generation-inference",),
        families=("tgi_",),
        identity=(
            IdentityEndpoint(
                paths=("/info",),
                identifies=_info,
                fields={
                    "model_id": "model_id",
                    "model_sha": "model_sha",
                    "context_length": "max_total_tokens",
                },
                version="version",
            ),
        ),
        signals={"queue_depth": ("tgi_queue_size",), "running": ("tgi_batch_current_size",)},
        metrics=EngineMetrics(
            waiting="tgi_queue_size",
            running="tgi_batch_current_size",
            e2e_hist="tgi_request_duration",
        ),
    )
)
