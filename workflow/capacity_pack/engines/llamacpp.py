"""llama.cpp's ``llama-server``.

Identity: ``GET /props`` -> ``model_path``, ``build_info`` (``b<build>-<commit>``; ``b0-unknown``
when built outside a git checkout), ``total_slots`` and ``default_generation_settings.n_ctx``;
``GET /health``; ``/v1/models`` cards ``owned_by "llamacpp"``; ``llamacpp:*`` series (with
``--metrics``).

Metrics: a deferred request waits for a free slot, a processing one holds a slot.
``kv_cache_usage_ratio`` left ``/metrics`` in mid-2025 (ggml-org/llama.cpp #13660), so newer
builds expose no KV-usage gauge and the signal reads as missing there; none exposes preemptions
or latency histograms. Prefix-cache hits are ``llamacpp:prompt_tokens_cached_total`` (prompt
tokens reused from a slot's cache: in the b1-0c1e570 build the real-engine pack uses; a build
without it reads as missing evidence) and the misses
``llamacpp:prompt_tokens_total`` (which excludes the cached ones): queries = hits + misses.

Cache (``cache_reset: llamacpp``): ``POST /slots/{id}?action=erase`` for each of ``/props``'s
``total_slots``, once no slot is processing (``GET /slots``; the metrics when the server runs
``--no-slots``). Slot actions need ``--slot-save-path``; without it the server answers 501.
Cold evidence (:func:`slot_evidence`) stands in for the missing KV gauge: a second erase pass
must find nothing in any slot, and the host-memory prompt cache (``--cache-ram``, on by default
in recent builds), which slot erase does not clear and no endpoint reports, counts as empty only
when ``engine.config`` declares ``cache_ram: 0``.

Tokenize: ``POST /tokenize`` ``{"content", "add_special"}`` -> ``{"tokens"}``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capacity_pack.engines.base import (
    CacheReset,
    Engine,
    EngineClient,
    IdentityEndpoint,
    ResetError,
    TokenizeFormat,
)
from capacity_pack.engines.metric_map import EngineMetrics
from capacity_pack.engines.registry import register

# engine.config keys under which a pack may declare llama-server's --cache-ram.
CACHE_RAM_KEYS = ("cache_ram", "cache-ram", "cram")


def _props(path: str, body: Any) -> str | None:
    if isinstance(body, Mapping) and (
        "total_slots" in body or "default_generation_settings" in body
    ):
        return f"{path} has total_slots/default_generation_settings"
    return None


def _slot_count(client: EngineClient, total_slots: int | None) -> int:
    if total_slots is None:
        resp = client.get("/props")
        props = resp.json() if resp.status_code == 200 else {}
        total_slots = props.get("total_slots") if isinstance(props, dict) else None
    if not isinstance(total_slots, int) or total_slots < 1:
        raise ResetError(
            f"{client.base_url}/props reports no total_slots: the llama.cpp slots cannot be erased"
        )
    return total_slots


def _wait_slots_idle(client: EngineClient, timeout_s: float) -> None:
    """Until no slot processes (GET /slots); the metrics when llama-server runs --no-slots."""
    deadline = time.monotonic() + timeout_s
    while True:
        resp = client.get("/slots")
        if resp.status_code != 200 or not isinstance(resp.json(), list):
            client.wait_idle(timeout_s)
            return
        busy = [s.get("id") for s in resp.json() if isinstance(s, dict) and s.get("is_processing")]
        if not busy:
            return
        if time.monotonic() > deadline:
            raise ResetError(f"{client.base_url} slots {busy} still processing after {timeout_s} s")
        time.sleep(0.2)


def erase_slots(client: EngineClient, total_slots: int | None, timeout_s: float) -> tuple[int, int]:
    """Erase every llama.cpp slot; (slots, tokens erased)."""
    n = _slot_count(client, total_slots)
    _wait_slots_idle(client, timeout_s)
    erased = 0
    for i in range(n):
        path = f"/slots/{i}?action=erase"
        resp = client.post(path)
        if resp.status_code == 501:
            raise ResetError(
                f"POST {path} answered 501: llama-server runs slot actions only when started "
                f"with --slot-save-path DIR ({client.redact(resp.text[:200])})"
            )
        if resp.status_code >= 400:
            raise ResetError(
                f"POST {path} answered {resp.status_code}: {client.redact(resp.text[:300])}"
            )
        body = resp.json()
        erased += int(body.get("n_erased", 0)) if isinstance(body, dict) else 0
    return n, erased


@dataclass(frozen=True)
class SlotErase(CacheReset):
    """``cache_reset: llamacpp``: erase every slot."""

    name: str = "llamacpp"
    describe: str = "llama.cpp's POST /slots/{id}?action=erase for every slot"

    def perform(self, client: EngineClient, timeout_s: float, total_slots: int | None) -> str:
        n, erased = erase_slots(client, total_slots, timeout_s)
        return f"POST /slots/{{id}}?action=erase x{n} ({erased} tokens erased)"


def slot_evidence(
    client: EngineClient,
    total_slots: int | None,
    config: Mapping[str, Any],
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Whether llama.cpp's caches are empty: a second erase pass must find nothing in any slot,
    and the host-memory prompt cache must be declared off by ``engine.config``."""
    n, left = erase_slots(client, total_slots, timeout_s)
    declared = next((config[k] for k in CACHE_RAM_KEYS if k in config), None)
    host_cache_off = declared is not None and str(declared).strip() == "0"
    reasons = []
    if left:
        reasons.append(f"a second erase pass found {left} tokens in the {n} slots")
    if not host_cache_off:
        reasons.append(
            "llama-server's host-memory prompt cache (--cache-ram, on by default in recent "
            "builds) is neither cleared by slot erase nor reported by any endpoint; declare "
            "engine.config cache_ram: 0 and start the server with --cache-ram 0"
        )
    return {
        "slots_checked": n,
        "tokens_left_in_slots": left,
        "host_prompt_cache": "declared off (engine.config)" if host_cache_off else "unknown",
        "reasons": reasons,
    }


ENGINE = register(
    Engine(
        kind="llamacpp",
        aliases=("llama.cpp", "llama-cpp", "llama-server"),
        owned_by=("llamacpp",),
        families=("llamacpp:",),
        identity=(
            IdentityEndpoint(
                paths=("/props",),
                identifies=_props,
                fields={
                    "total_slots": "total_slots",
                    "model_path": "model_path",
                    "context_length": "default_generation_settings.n_ctx",
                },
                version="build_info",
            ),
            IdentityEndpoint(paths=("/health",)),
        ),
        signals={
            "queue_depth": ("llamacpp:requests_deferred",),
            "running": ("llamacpp:requests_processing",),
            "kv_usage": ("llamacpp:kv_cache_usage_ratio",),
            "prompt_tokens": ("llamacpp:prompt_tokens_total",),
            "generation_tokens": ("llamacpp:tokens_predicted_total",),
            # Prompt tokens taken from a slot's cache, and those computed (the counter above
            # excludes the cached ones): queries = hits + misses (capacity_pack.engines.signals).
            "prefix_cache_hits": ("llamacpp:prompt_tokens_cached_total",),
            "prefix_cache_misses": ("llamacpp:prompt_tokens_total",),
        },
        metrics=EngineMetrics(
            waiting="llamacpp:requests_deferred",
            running="llamacpp:requests_processing",
            kv_usage="llamacpp:kv_cache_usage_ratio",
            prompt_tokens="llamacpp:prompt_tokens_total",
            generation_tokens="llamacpp:tokens_predicted_total",
            prefix_hits="llamacpp:prompt_tokens_cached_total",
            prefix_misses="llamacpp:prompt_tokens_total",
        ),
        resets=(SlotErase(),),
        cold_evidence=slot_evidence,
        tokenize=TokenizeFormat(
            name="llamacpp", body=lambda model, text: {"content": text, "add_special": False}
        ),
    )
)
