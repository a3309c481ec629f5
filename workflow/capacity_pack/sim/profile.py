"""Simulator performance profiles: model shape, hardware, efficiencies and engine limits.

A profile is a YAML file. The shipped ones live in ``capacity_pack/profiles/<name>.yaml``;
:func:`load_profile` takes either such a name or a path to a YAML file of the same schema.

Derived quantities (the formulas the performance model in :mod:`capacity_pack.sim.perf` uses):

- parameters from the shape, when ``num_params`` is not given (Llama-style blocks):
  per layer  ``h (q_heads d + 2 kv_heads d) + q_heads d h + 3 h ffn + 2 h``  (QKV, O, gated
  MLP, two RMS norms), plus embeddings ``vocab h`` (twice if the LM head is untied) and a final
  norm ``h``;
  a given ``num_params`` must agree with this within 5% (a guard against typos in the shape);
- weight bytes ``W = num_params x bytes_per_param`` (all GPUs of the replica together);
- KV bytes per token ``= 2 x layers x kv_heads x head_dim x kv_bytes_per_element``;
  per block ``= block_size x`` that;
- KV blocks ``= floor((tp x HBM x gpu_memory_utilization - W - tp x non_kv_memory) /
  kv_bytes_per_block)``, the vLLM sizing rule: what the memory budget leaves after weights and
  activations/graphs goes to the KV cache.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

GIB = 1 << 30


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the profile and field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class ModelShape(_Model):
    name: str = Field(min_length=1, description="Default served model name.")
    num_layers: int = Field(ge=1, description="Transformer layers.")
    hidden_size: int = Field(ge=1, description="Model (residual stream) width.")
    num_attention_heads: int = Field(ge=1, description="Query heads.")
    num_kv_heads: int = Field(ge=1, description="Key/value heads (grouped-query attention).")
    head_dim: int = Field(ge=1, description="Width of one attention head.")
    intermediate_size: int = Field(ge=1, description="FFN (gated MLP) width.")
    vocab_size: int = Field(ge=1, description="Vocabulary size (embedding rows).")
    tie_word_embeddings: bool = Field(default=False, description="LM head shares the embedding.")
    num_params: float | None = Field(
        default=None, gt=0, description="Total parameters; derived from the shape when omitted."
    )
    bytes_per_param: float = Field(gt=0, description="Weight bytes per parameter (bf16: 2).")
    kv_bytes_per_element: float = Field(gt=0, description="KV-cache bytes per element (bf16: 2).")
    max_model_len: int = Field(ge=16, description="Context limit: prompt + output tokens.")

    @model_validator(mode="after")
    def _check(self) -> ModelShape:
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_kv_heads")
        derived = self.shape_params()
        if self.num_params is None:
            self.num_params = derived
        elif abs(self.num_params - derived) > 0.05 * derived:
            raise ValueError(
                f"num_params ({self.num_params:.4g}) disagrees with the shape ({derived:.4g}) by "
                "more than 5%: check layers, hidden_size, heads, intermediate_size and vocab_size"
            )
        return self

    def shape_params(self) -> float:
        h, d = self.hidden_size, self.head_dim
        per_layer = (
            h * (self.num_attention_heads * d + 2 * self.num_kv_heads * d)
            + self.num_attention_heads * d * h
            + 3 * h * self.intermediate_size
            + 2 * h
        )
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return float(self.num_layers * per_layer + embeddings + h)

    @property
    def params(self) -> float:
        assert self.num_params is not None
        return self.num_params

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bytes_per_element


class Hardware(_Model):
    name: str = Field(min_length=1, description="Accelerator name, for reports.")
    hbm_gib: float = Field(gt=0, description="Memory per GPU in GiB.")
    bandwidth_tb_s: float = Field(gt=0, description="Peak memory bandwidth per GPU, TB/s.")
    dense_tflops: float = Field(gt=0, description="Peak dense TFLOP/s per GPU at this precision.")
    interconnect_gb_s: float = Field(
        default=450.0, gt=0, description="All-reduce bus bandwidth per GPU, GB/s (TP > 1 only)."
    )


class Efficiency(_Model):
    mfu: float = Field(gt=0, le=1, description="Achieved share of peak FLOP/s (compute-bound).")
    mbu: float = Field(gt=0, le=1, description="Achieved share of peak bandwidth (memory-bound).")
    step_overhead_ms: float = Field(ge=0, description="Fixed cost of every engine step.")
    per_sequence_overhead_us: float = Field(
        default=0.0, ge=0, description="Extra cost per scheduled sequence per step (sampling, CPU)."
    )


class EngineLimits(_Model):
    engine_version: str = Field(min_length=1, description="Version reported by GET /version.")
    tensor_parallel: int = Field(default=1, ge=1, description="GPUs of one replica (TP degree).")
    max_num_batched_tokens: int = Field(default=8192, ge=1, description="Token budget per step.")
    max_num_seqs: int = Field(default=256, ge=1, description="Most sequences in one step.")
    block_size: int = Field(default=16, ge=1, description="Tokens per KV block.")
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="Share of HBM the engine may use."
    )
    non_kv_memory_gib: float = Field(
        default=2.0, ge=0, description="Per-GPU memory for activations, graphs and allocator slack."
    )
    max_waiting_requests: int = Field(
        default=1024, ge=1, description="Admission control: waiting-queue length that rejects."
    )
    enable_prefix_caching: bool = Field(default=True, description="Automatic prefix caching.")
    eos_mean_output_tokens: float = Field(
        default=256.0,
        ge=1,
        description="Mean output length when a request may stop at EOS (ignore_eos false).",
    )


class Profile(_Model):
    """One simulated serving replica: a model on TP GPUs, with its efficiencies and limits."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", description="Profile id.")
    description: str = Field(default="", description="What this profile stands for.")
    model: ModelShape
    hardware: Hardware
    efficiency: Efficiency
    engine: EngineLimits

    @model_validator(mode="after")
    def _check(self) -> Profile:
        if self.num_gpu_blocks < 2:
            raise ValueError(
                f"no KV-cache memory left: {self.kv_budget_bytes / GIB:.2f} GiB after weights "
                f"({self.model.weight_bytes / GIB:.2f} GiB) and overhead"
            )
        return self

    @property
    def kv_bytes_per_block(self) -> float:
        return self.model.kv_bytes_per_token * self.engine.block_size

    @property
    def kv_budget_bytes(self) -> float:
        tp = self.engine.tensor_parallel
        return (
            tp * self.hardware.hbm_gib * GIB * self.engine.gpu_memory_utilization
            - self.model.weight_bytes
            - tp * self.engine.non_kv_memory_gib * GIB
        )

    @property
    def num_gpu_blocks(self) -> int:
        return max(0, math.floor(self.kv_budget_bytes / self.kv_bytes_per_block))

    def with_overrides(self, **engine_fields: Any) -> Profile:
        """A copy with some ``engine`` fields replaced (validated)."""
        data = self.model_dump()
        data["engine"].update({k: v for k, v in engine_fields.items() if v is not None})
        return Profile.model_validate(data)


def _profiles_dir() -> Any:
    return resources.files("capacity_pack").joinpath("profiles")


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    return sorted(
        p.name.removesuffix(".yaml") for p in _profiles_dir().iterdir() if p.name.endswith(".yaml")
    )


def _format_error(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid simulator profile ({err.error_count()} problem(s)):"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        lines.append(f"  - {loc}: {e['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped profile by name, or a profile YAML file by path.

    Raises :class:`ProfileError` for an unknown name (listing the shipped profiles), a missing
    or unreadable file, or a profile that fails validation.
    """
    text_ref = str(name_or_path)
    path = Path(text_ref)
    if path.suffix in {".yaml", ".yml"} or path.is_file():
        if not path.is_file():
            raise ProfileError(f"{path}: no such profile file")
        source = str(path)
        raw = path.read_text(encoding="utf-8")
    else:
        entry = _profiles_dir().joinpath(f"{text_ref}.yaml")
        if not entry.is_file():
            raise ProfileError(
                f"unknown simulator profile {text_ref!r}; shipped profiles: "
                f"{', '.join(shipped_profiles())} (or give the path of a profile YAML file)"
            )
        source = f"profile {text_ref!r}"
        raw = entry.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ProfileError(f"{source}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: expected a mapping at the top level")
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise ProfileError(_format_error(err, source)) from None
