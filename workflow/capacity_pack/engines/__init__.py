"""Serving engines: what each one answers, how to read its metrics, empty its cache and count
its tokens, and which one answers at a real target.

Each engine is one module that registers an :class:`~capacity_pack.engines.base.Engine` spec
(its docstring states what identifies it); adding one is a new module calling
:func:`~capacity_pack.engines.registry.register` and one import line below. The engines and
their endpoints: docs/packs.md, 'Engines and what identifies them'.
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
