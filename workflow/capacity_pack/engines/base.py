"""What an engine module declares: :class:`Engine`, the spec the registry holds, and its parts.

An engine is known by what it answers, so the spec is mostly data:

- names: ``kind`` (what the registry, the metric maps and the reports call it) and ``aliases``
  (other spellings a manifest's ``engine.name`` may use: ``llama.cpp``, ``tensorrt-llm``);
- identity (:class:`IdentityEndpoint`): the GET endpoints whose answers point to it, the fields
  of :class:`~capacity_pack.engines.probe.EngineIdentity` they fill (version, model path, TGI's
  model sha, context length, slots), the ``owned_by`` of its ``/v1/models`` cards, and its
  metric-name prefixes (``vllm:``, ``tgi_``); ``mimics``: the engine whose wire format it speaks
  (the simulator speaks vLLM's: its own series then decide);
- metrics: where its Prometheus text lives (``metrics_path``), the names of the canonical
  signals the load generator records (``signals``: signal -> names, newest first, older names
  after), and its :class:`~capacity_pack.engines.metric_map.EngineMetrics` for alerts and
  dashboards;
- cache: the ``target.cache_reset`` names it supports (:class:`CacheReset`: an HTTP call such as
  :class:`HttpReset`, or an engine's own procedure) and, where its metrics cannot show an empty
  cache, ``cold_evidence`` that stands in for the KV-usage gauge;
- prompts: its ``POST /tokenize`` request and answer (:class:`TokenizeFormat`).

A reset talks to the server through an :class:`EngineClient` (the measuring side's endpoint:
authenticated HTTP, secret redaction and the wait until nothing runs); it raises
:class:`ResetError` with a sentence saying what the server answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from capacity_pack.engines.metric_map import EngineMetrics

# EngineIdentity fields an identity endpoint may fill, and the JSON type each must have.
IDENTITY_FIELDS: dict[str, type] = {
    "model_path": str,
    "model_id": str,
    "model_sha": str,
    "context_length": int,
    "total_slots": int,
}


class ResetError(RuntimeError):
    """A cache reset the server refused or could not do; the message says why."""


class EngineClient(Protocol):
    """The HTTP side a reset needs (``capacity_pack.measure.target.Endpoint`` is one)."""

    base_url: str

    def get(self, path: str, timeout_s: float = 5.0) -> Any: ...

    def post(self, path: str, timeout_s: float = 30.0) -> Any: ...

    def redact(self, text: str) -> str: ...

    def wait_idle(self, timeout_s: float) -> Any:
        """Return once nothing runs or waits (as far as the metrics show)."""
        ...


@dataclass(frozen=True)
class IdentityEndpoint:
    """A GET endpoint that tells about the engine.

    ``paths``: where it answers (the first of them that answers counts: SGLang renamed
    ``/get_server_info`` to ``/server_info``). ``identifies(path, body)`` reads a 200 answer's
    body (JSON, or a text excerpt) and returns the evidence sentence when it points to this
    engine, else None. ``fields``: EngineIdentity field -> dotted key in the JSON body
    (``default_generation_settings.n_ctx``); ``version``: the key of the version it reports.
    """

    paths: tuple[str, ...]
    identifies: Callable[[str, Any], str | None] | None = None
    fields: Mapping[str, str] = field(default_factory=dict)
    version: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.fields) - set(IDENTITY_FIELDS)
        if unknown:
            raise ValueError(f"unknown identity fields {sorted(unknown)}; known: {IDENTITY_FIELDS}")


class CacheReset:
    """One ``target.cache_reset`` value: how it empties the prefix cache."""

    name: str
    describe: str

    def perform(self, client: EngineClient, timeout_s: float, total_slots: int | None) -> str:
        """Empty the cache; return what was done (recorded as the point's cache preparation)."""
        raise NotImplementedError


@dataclass(frozen=True)
class HttpReset(CacheReset):
    """A reset endpoint: wait until the engine has drained, call it, and call again while it
    refuses (``refused_key`` false in a JSON answer: vLLM answers 200 ``{"reset": false}``
    while blocks are still in use) until ``timeout_s``."""

    name: str
    path: str
    method: str = "POST"
    refused_key: str | None = None
    describe: str = ""

    def perform(self, client: EngineClient, timeout_s: float, total_slots: int | None) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            client.wait_idle(timeout_s)
            resp = client.post(self.path) if self.method == "POST" else client.get(self.path)
            if resp.status_code >= 400:
                raise ResetError(
                    f"{self.method} {self.path} answered {resp.status_code}: "
                    f"{client.redact(resp.text[:300])}"
                )
            if not self._refused(resp):
                return self.path
            if time.monotonic() > deadline:
                raise ResetError(
                    f"{self.method} {self.path} kept refusing for {timeout_s} s: "
                    f"{client.redact(resp.text[:300])}"
                )
            time.sleep(0.5)

    def _refused(self, resp: Any) -> bool:
        if self.refused_key is None:
            return False
        try:
            return resp.json().get(self.refused_key) is False
        except (ValueError, AttributeError):
            return False


def count_or_tokens(body: Any) -> int | None:
    """A ``/tokenize`` answer's token count: ``count``, else the length of ``tokens``."""
    if not isinstance(body, Mapping):
        return None
    if "count" in body:
        return int(body["count"])
    if "tokens" in body:
        return len(body["tokens"])
    return None


@dataclass(frozen=True)
class TokenizeFormat:
    """An engine's ``POST /tokenize``: the JSON body for (model, text), and the token count
    read from the answer (None: not this format's answer)."""

    name: str
    body: Callable[[str, str], dict[str, Any]]
    read: Callable[[Any], int | None] = count_or_tokens
    path: str = "/tokenize"


@dataclass(frozen=True)
class Engine:
    """One serving engine, as the rest of capacity-pack knows it (see the module docstring)."""

    kind: str
    aliases: tuple[str, ...] = ()
    owned_by: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    identity: tuple[IdentityEndpoint, ...] = ()
    mimics: str | None = None
    metrics_path: str = "/metrics"
    signals: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    metrics: EngineMetrics | None = None
    resets: tuple[CacheReset, ...] = ()
    cold_evidence: (
        Callable[[EngineClient, int | None, Mapping[str, Any]], dict[str, Any]] | None
    ) = None
    tokenize: TokenizeFormat | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The kind and its aliases, lower case."""
        return tuple(dict.fromkeys(n.lower() for n in (self.kind, *self.aliases)))

    @property
    def reset_names(self) -> frozenset[str]:
        return frozenset(r.name for r in self.resets)

    def probe_paths(self) -> tuple[str, ...]:
        return tuple(p for ep in self.identity for p in ep.paths)
