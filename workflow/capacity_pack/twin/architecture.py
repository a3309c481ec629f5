"""The base profile a calibration starts from: the target's model shape, hardware and limits.

A simulated target's own profile, or, for a real target, ``model.architecture`` (a Hugging Face
``config.json``-style file) and ``engine.hardware`` mapped onto
:class:`capacity_pack.sim.profile.Profile`. Mapping: docs/twin.md, "The base profile of a real
target".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from capacity_pack.errors import StatedError
from capacity_pack.sim.profile import GIB, ModelShape, Profile, ProfileError, load_profile

PROJECT_ROOT = Path(__file__).resolve().parents[3]
REQUIRED = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)
DEFAULT_BATCH_TOKENS = 2048  # llama-server's default logical batch (-b)


class ArchitectureError(StatedError, ValueError):
    """An architecture file or engine setting that cannot give a profile; names file and field."""


def architecture_missing(pack: Any) -> str | None:
    """Why ``pack``'s target has no base profile (``None``: it has one)."""
    if pack.target.kind == "sim" or pack.model.architecture is not None:
        return None
    return (
        "a real target without model.architecture (a config.json-style file of the model's "
        "shape): the engine model has no shape to calibrate"
    )


def config_path(path: str) -> Path:
    """``path`` as given if it exists from the working directory, else under the project."""
    p = Path(path)
    return p if p.is_absolute() or p.exists() else PROJECT_ROOT / p


def read_config(path: str) -> dict[str, Any]:
    p = config_path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise ArchitectureError(
            f"{path}: cannot read the architecture file: {err.strerror}"
        ) from None
    except json.JSONDecodeError as err:
        raise ArchitectureError(f"{path}: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ArchitectureError(f"{path}: expected a JSON object at the top level")
    for key in REQUIRED:
        v = data.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ArchitectureError(f"{path}: {key}: expected a positive integer, got {v!r}")
    return data


def _int_setting(config: dict[str, Any], *names: str) -> int | None:
    for name in names:
        if name in config:
            v = config[name]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ArchitectureError(f"engine.config.{name}: expected a positive integer")
            return v
    return None


def shape_of(arch: Any, cfg: dict[str, Any], name: str, max_model_len: int) -> dict[str, Any]:
    """The profile's ``model`` section from the architecture file ``cfg``."""
    heads = cfg["num_attention_heads"]
    return {
        "name": name,
        "num_layers": cfg["num_hidden_layers"],
        "hidden_size": cfg["hidden_size"],
        "num_attention_heads": heads,
        "num_kv_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "intermediate_size": cfg["intermediate_size"],
        "vocab_size": cfg["vocab_size"],
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "bytes_per_param": arch.bytes_per_param,
        "kv_bytes_per_element": arch.kv_bytes_per_element,
        "max_model_len": max_model_len,
    }


def base_profile(pack: Any) -> tuple[Profile, bool, str]:
    """``(profile, peaks_known, source)`` of ``pack``'s target (see the module docstring)."""
    if pack.target.kind == "sim":
        try:
            prof = load_profile(pack.target.profile)
        except ProfileError as err:
            raise ArchitectureError(str(err)) from None
        return prof, True, f"simulated target profile {pack.target.profile!r}"
    arch = pack.model.architecture
    if arch is None:
        raise ArchitectureError(f"model.architecture: {architecture_missing(pack)}")
    cfg = read_config(arch.config)
    conf = pack.engine.config
    slots = _int_setting(conf, "max_num_seqs", "parallel_slots") or 256
    ctx = _int_setting(conf, "ctx_size")
    max_len = (
        _int_setting(conf, "max_model_len")
        or (ctx // slots if ctx else None)
        or cfg.get("max_position_embeddings")
        or 4096
    )
    util = float(conf.get("gpu_memory_utilization", 0.9))
    hw = pack.engine.hardware
    shape = shape_of(arch, cfg, pack.model.served_name or pack.model.id, max(16, int(max_len)))
    engine = {
        "engine_version": pack.engine.version,
        "tensor_parallel": pack.engine.placement.tp,
        "max_num_batched_tokens": _int_setting(conf, "max_num_batched_tokens", "batch_size")
        or DEFAULT_BATCH_TOKENS,
        "max_num_seqs": slots,
        "block_size": _int_setting(conf, "block_size") or 16,
        "gpu_memory_utilization": util,
        "enable_prefix_caching": pack.engine.prefix_cache == "enabled",
    }
    peaks_known = hw is not None and hw.bandwidth_tb_s is not None and hw.dense_tflops is not None
    data: dict[str, Any] = {
        "name": "calibration-base",
        "description": f"{pack.model.id} on {pack.engine.name}, shape from {arch.config}",
        "model": shape,
        "hardware": {
            "name": hw.name if hw is not None else "undeclared",
            "hbm_gib": 1.0,
            "bandwidth_tb_s": hw.bandwidth_tb_s if peaks_known else 1.0,
            "dense_tflops": hw.dense_tflops if peaks_known else 1.0,
        },
        "efficiency": {"mfu": 0.5, "mbu": 0.5, "step_overhead_ms": 0.0},
        "engine": engine,
    }
    try:
        if hw is not None:
            data["hardware"]["hbm_gib"] = hw.memory_gib
        else:
            m = ModelShape.model_validate(shape)
            tokens = ctx or slots * shape["max_model_len"]
            engine["non_kv_memory_gib"] = 0.0
            # One block of slack: the floor of the block count must still hold every token.
            need = m.weight_bytes + (tokens + engine["block_size"]) * m.kv_bytes_per_token
            data["hardware"]["hbm_gib"] = need / util / GIB
        prof = Profile.model_validate(data)
    except ValueError as err:
        detail = " ".join(str(err).split())
        raise ArchitectureError(f"{arch.config}: does not give a valid profile: {detail}") from None
    return prof, peaks_known, f"architecture {arch.config} of {pack.model.id}"
