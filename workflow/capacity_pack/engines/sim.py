"""capacity-pack-sim, the simulated engine (:mod:`capacity_pack.sim`).

It speaks vLLM's wire format (``/version``, ``/v1/models`` ``owned_by "vllm"``, vLLM's series
and ``POST /reset_prefix_cache``) and adds its own ``sim:*`` series, which identify it: when they
are on ``/metrics`` the simulator is the kind, not vLLM. Its reset, like vLLM's, needs no
credential; its own control routes (``/sim/*``, ``/cluster/*``) need the per-process token of
:mod:`capacity_pack.sim.control`, which only the process that started it knows.

Metrics: vLLM's map plus the prefix-cache eviction and engine-rejection counters, and the
router's ``router:*`` series (a simulated cluster runs behind the capacity-pack router). Its
latency histograms use the simulator's bucket bounds (the same as vLLM's defaults).
"""

from __future__ import annotations

from capacity_pack.engines.base import Engine, IdentityEndpoint
from capacity_pack.engines.registry import register
from capacity_pack.engines.vllm import METRICS as VLLM_METRICS
from capacity_pack.engines.vllm import RESET, TOKENIZE
from capacity_pack.sim.metrics import ITL_BUCKETS_S, TTFT_BUCKETS_S

METRICS = VLLM_METRICS.model_copy(
    update={
        "evictions": "sim:prefix_cache_evictions_total",
        "engine_rejections": "sim:requests_rejected_total",
        "ttft_buckets": TTFT_BUCKETS_S,
        "itl_buckets": ITL_BUCKETS_S,
        "router": True,
    }
)

ENGINE = register(
    Engine(
        kind="capacity-pack-sim",
        families=("sim:",),
        identity=(IdentityEndpoint(paths=("/version",), version="version"),),
        mimics="vllm",
        signals={"prefix_cache_evictions": ("sim:prefix_cache_evictions_total",)},
        metrics=METRICS,
        resets=(RESET,),
        tokenize=TOKENIZE,
    )
)
