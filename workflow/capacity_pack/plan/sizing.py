"""The plan section: the forecast peak and what the fleet arithmetic needs
(:mod:`capacity_pack.decide.sizing`), with the memory sizing inputs of a real target."""

from __future__ import annotations

from pydantic import Field

from capacity_pack.plan.section import Section


class MemorySpec(Section):
    """What memory sizing and the fit probe need when the target is not the simulator."""

    accelerator_memory_gb: float = Field(gt=0, description="Memory of one replica's GPUs, GB.")
    weights_gb: float = Field(ge=0, description="Weights resident on one replica, GB.")
    overhead_gb: float = Field(ge=0, description="Runtime overhead (activations, graphs), GB.")
    kv_bytes_per_token: float = Field(gt=0, description="2 x layers x kv_heads x head_dim x bytes.")
    memory_utilization: float = Field(default=0.9, gt=0, le=1, description="Usable share.")
    margin_gb: float = Field(default=0.0, ge=0, description="Declared margin of the fit probe.")


class Plan(Section):
    peak_rps: float = Field(gt=0, description="Forecast peak load to plan for.")
    target_utilization: float | None = Field(
        default=None, gt=0, le=1, description="Defaults to acceptance.target_utilization."
    )
    gpus_per_replica: int = Field(ge=1, description="GPUs in one replica (tp x pp).")
    replicas_under_test: int = Field(ge=1, description="Replicas the sweep measured.")
    redundancy_replicas: int = Field(default=0, ge=0, description="N+k: replicas for failures.")
    warm_pool_replicas: int = Field(default=0, ge=0, description="Warm pool for cold starts.")
    price_per_gpu_hour: float | None = Field(
        default=None, ge=0, description="GPU-hour price for cost per request (any currency)."
    )
    requests_per_task: float = Field(
        default=1.0, gt=0, description="Requests one completed task takes (agents: several)."
    )
    memory: MemorySpec | None = Field(
        default=None,
        description="Memory sizing inputs; for a simulated target they come from its profile.",
    )
