"""Serving engines: what each one answers, how to read its metrics, empty its cache and count
its tokens, and which one answers at a real target.

Each engine is one module that registers an :class:`~capacity_pack.engines.base.Engine` spec
(its docstring states what identifies the engine and how its cache and metrics behave):

==================  ===========================================================================
engine              endpoints and what identifies it
==================  ===========================================================================
vLLM                ``GET /version`` -> ``{"version"}``; ``GET /v1/models`` -> ``owned_by
                    "vllm"``, ``max_model_len``; ``vllm:*`` series on ``/metrics``
                    (:mod:`~capacity_pack.engines.vllm`)
SGLang              ``GET /get_server_info`` (newer: ``/server_info``) -> server args,
                    ``internal_states``, ``version``; ``GET /get_model_info`` -> ``model_path``,
                    ``is_generation``; ``owned_by "sglang"``; ``sglang:*`` series
                    (:mod:`~capacity_pack.engines.sglang`)
TGI                 ``GET /info`` -> ``model_id``, ``model_sha``, ``version``, ``router
                    "text-generation-router"``; ``tgi_*`` series (:mod:`~capacity_pack.engines.tgi`)
TensorRT-LLM        ``trtllm-serve``: ``GET /version`` -> ``{"version"}``; ``owned_by
                    "tensorrt_llm"``; ``/metrics`` answers JSON iteration stats, Prometheus
                    series (``trtllm_*``) are under ``/prometheus/metrics``
                    (:mod:`~capacity_pack.engines.trtllm`)
llama.cpp           ``GET /props`` -> ``model_path``, ``build_info`` (``b<build>-<commit>``),
                    ``total_slots``, ``default_generation_settings.n_ctx``; ``GET /health``;
                    ``owned_by "llamacpp"``; ``llamacpp:*`` series (with ``--metrics``)
                    (:mod:`~capacity_pack.engines.llamacpp`)
capacity-pack-sim   vLLM's answers plus ``sim:*`` series (the simulator speaks vLLM's wire
                    format) (:mod:`~capacity_pack.engines.sim`)
==================  ===========================================================================

Adding an engine is one new module here that calls
:func:`~capacity_pack.engines.registry.register`, and one import line below; everything that
asks which engines exist iterates the registry: the identity probe
(:mod:`~capacity_pack.engines.probe`), the signals the load generator and the cold check read
(:mod:`~capacity_pack.engines.signals`), the ``target.cache_reset`` values and how each is done,
the alert and dashboard metric maps (:mod:`~capacity_pack.engines.metric_map`), and the
``/tokenize`` formats (:mod:`~capacity_pack.engines.tokenize`). Prometheus text is read by
:mod:`~capacity_pack.engines.exposition` only.
"""

# The engines, in registration order (it orders the probe, the name maps and the /tokenize
# formats tried).
# isort: off
from capacity_pack.engines import vllm
from capacity_pack.engines import sglang
from capacity_pack.engines import tgi
from capacity_pack.engines import trtllm
from capacity_pack.engines import llamacpp
from capacity_pack.engines import sim

# isort: on
from capacity_pack.engines.base import (
    CacheReset,
    Engine,
    EngineClient,
    HttpReset,
    IdentityEndpoint,
    ResetError,
    TokenizeFormat,
)
from capacity_pack.engines.http import auth_headers, header_secrets, verify_setting
from capacity_pack.engines.metric_map import EngineMetrics, MetricMapError, prefix_cache_source
from capacity_pack.engines.probe import (
    EngineIdentity,
    ProbeAnswer,
    check_identity,
    probe_engine,
    unreachable,
    version_matches,
)
from capacity_pack.engines.registry import (
    cache_reset,
    cache_reset_names,
    check_cache_reset,
    engine_kind,
    engine_metrics,
    get,
    metric_map,
    metric_map_name,
    metric_maps,
    metrics_path,
    probe_paths,
    register,
    reset_owner,
    unregister,
)
from capacity_pack.engines.signals import parse_metrics, read_signals

__all__ = [
    "CacheReset",
    "Engine",
    "EngineClient",
    "EngineIdentity",
    "EngineMetrics",
    "HttpReset",
    "IdentityEndpoint",
    "MetricMapError",
    "ProbeAnswer",
    "ResetError",
    "TokenizeFormat",
    "auth_headers",
    "cache_reset",
    "cache_reset_names",
    "check_cache_reset",
    "check_identity",
    "engine_kind",
    "engine_metrics",
    "get",
    "header_secrets",
    "llamacpp",
    "metric_map",
    "metric_map_name",
    "metric_maps",
    "metrics_path",
    "parse_metrics",
    "prefix_cache_source",
    "probe_engine",
    "unreachable",
    "probe_paths",
    "read_signals",
    "register",
    "reset_owner",
    "sglang",
    "sim",
    "tgi",
    "trtllm",
    "unregister",
    "verify_setting",
    "version_matches",
    "vllm",
]
