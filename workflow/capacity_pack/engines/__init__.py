"""Which serving engine answers at a real target, whether it is the one the manifest froze, and
how to read its metrics and empty its cache.

- :func:`probe_engine` asks the identity endpoints of every supported engine (GET, harmless on
  the others) and returns an :class:`EngineIdentity`: the engine kind inferred from what answered
  (with the evidence), the version, the served model ids and every raw answer (secret-looking
  fields and the API key replaced by ``[redacted]``; ``/metrics`` reduced to its metric
  families):

  ==================  ===========================================================================
  engine              endpoints and what identifies it
  ==================  ===========================================================================
  vLLM                ``GET /version`` -> ``{"version"}``; ``GET /v1/models`` -> ``owned_by
                      "vllm"``, ``max_model_len``; ``vllm:*`` series on ``/metrics``
  SGLang              ``GET /get_server_info`` (newer: ``/server_info``) -> server args,
                      ``internal_states``, ``version``; ``GET /get_model_info`` -> ``model_path``,
                      ``is_generation``; ``owned_by "sglang"``; ``sglang:*`` series
  TGI                 ``GET /info`` -> ``model_id``, ``model_sha``, ``version``, ``router
                      "text-generation-router"``; ``tgi_*`` series
  llama.cpp           ``GET /props`` -> ``model_path``, ``build_info`` (``b<build>-<commit>``),
                      ``total_slots``, ``default_generation_settings.n_ctx``; ``GET /health``;
                      ``owned_by "llamacpp"``; ``llamacpp:*`` series (with ``--metrics``)
  TensorRT-LLM        ``trtllm-serve``: ``GET /version`` -> ``{"version"}``; ``owned_by
                      "tensorrt_llm"``; ``/metrics`` answers JSON iteration stats, Prometheus
                      series (``trtllm_*``) are under ``/prometheus/metrics``
  capacity-pack-sim   vLLM's answers plus ``sim:*`` series (the simulator speaks vLLM's wire
                      format)
  ==================  ===========================================================================

- :func:`check_identity` compares an identity with the manifest: the engine kind of
  ``engine.name``, ``engine.version`` (when the server reports one), the served model
  (``model.served_name`` or ``model.id``), TGI's ``model_sha`` against ``model.revision``, and
  whether ``target.cache_reset`` can reset that engine. Each mismatch is one message naming both
  values and the URL that reported the server's.
- :func:`read_signals` reads the canonical signals (queue depth, running, KV usage, prefix-cache
  hits) from Prometheus text through the engine's map in
  :data:`capacity_pack.drills.dashboard.ENGINE_METRICS`, and lists each one the engine does not
  expose
  or the scrape lacks as missing evidence; nothing is estimated in its place.
- :func:`verify_setting` turns ``tls_verify``/``ca_bundle`` into httpx's ``verify``.

Version match: equal after dropping a leading ``v``; or equal to the reported version without
its local build tag (``0.11.0`` matches ``0.11.0+cu128``); or equal to one ``-``-separated part
of a llama.cpp build (``b6123`` or ``a1b2c3d`` match ``b6123-a1b2c3d4``, a commit also by
prefix). ``0.11.0`` never matches ``0.11.0rc1`` or ``0.11.1.dev3``. A llama.cpp built outside a
git checkout reports ``b0-unknown``: it has no version to compare, and the evidence says so.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.redact import looks_secret, redact_text, secret_values

# Engine kinds, and the names a manifest's engine.name may use for each (exact, or followed by
# a non-alphanumeric suffix: "vllm-0.11", "llamacpp-b6123").
KINDS = ("vllm", "sglang", "tgi", "trtllm", "llamacpp", "capacity-pack-sim")
ALIASES: dict[str, str] = {
    "vllm": "vllm",
    "sglang": "sglang",
    "tgi": "tgi",
    "text-generation-inference": "tgi",
    "trtllm": "trtllm",
    "trtllm-serve": "trtllm",
    "tensorrt-llm": "trtllm",
    "tensorrt_llm": "trtllm",
    "llamacpp": "llamacpp",
    "llama.cpp": "llamacpp",
    "llama-cpp": "llamacpp",
    "llama-server": "llamacpp",
    "capacity-pack-sim": "capacity-pack-sim",
}
# target.cache_reset values each kind supports besides "none" and "restart".
RESETS: dict[str, frozenset[str]] = {
    "vllm": frozenset({"vllm"}),
    "capacity-pack-sim": frozenset({"vllm"}),
    "sglang": frozenset({"sglang"}),
    "llamacpp": frozenset({"llamacpp"}),
    "tgi": frozenset(),
    "trtllm": frozenset(),
}
# Where each kind serves Prometheus text (default /metrics).
METRICS_PATHS: dict[str, str] = {"trtllm": "/prometheus/metrics"}
# owned_by of the /v1/models cards, per kind.
OWNED_BY: dict[str, str] = {
    "vllm": "vllm",
    "sglang": "sglang",
    "tensorrt_llm": "trtllm",
    "llamacpp": "llamacpp",
}
# Metric-name prefixes, per kind; sim:* wins over vllm:* (the simulator exposes both).
FAMILIES: dict[str, str] = {
    "sim:": "capacity-pack-sim",
    "vllm:": "vllm",
    "sglang:": "sglang",
    "llamacpp:": "llamacpp",
    "tgi_": "tgi",
    "trtllm_": "trtllm",
}
PROBE_PATHS = (
    "/version",
    "/v1/models",
    "/get_server_info",
    "/server_info",
    "/get_model_info",
    "/info",
    "/props",
    "/health",
    "/metrics",
)
# Canonical signal -> EngineMetrics field, for the signals a cold check and the idle wait read.
SIGNALS: dict[str, str] = {
    "queue_depth": "waiting",
    "running": "running",
    "kv_usage": "kv_usage",
    "prefix_cache_hits": "prefix_hits",
    "prefix_cache_queries": "prefix_queries",
    "prefix_cache_hit_rate": "prefix_hit_rate",
}
REDACTED = "[redacted]"
TEXT_EXCERPT = 500


class ProbeAnswer(BaseModel):
    """One identity endpoint's answer: JSON (redacted), a text excerpt, or the error."""

    model_config = ConfigDict(extra="forbid")

    url: str
    status: int | None = Field(default=None, description="HTTP status; None: no answer.")
    body: Any = Field(default=None, description="JSON body, text excerpt, or metrics summary.")
    error: str | None = Field(default=None, description="Why no answer came back.")


class EngineIdentity(BaseModel):
    """What a server says it is, from its identity endpoints."""

    model_config = ConfigDict(extra="forbid")

    base_url: str
    kind: str | None = Field(default=None, description="Inferred engine kind; None: unknown.")
    evidence: list[str] = Field(default_factory=list, description="Why that kind, per endpoint.")
    version: str | None = Field(default=None, description="Engine version the server reports.")
    version_url: str | None = None
    served_models: list[str] = Field(default_factory=list, description="/v1/models ids.")
    models_url: str | None = None
    model_path: str | None = Field(default=None, description="SGLang/llama.cpp model path.")
    model_id: str | None = Field(default=None, description="TGI model_id.")
    model_sha: str | None = Field(default=None, description="TGI model_sha.")
    context_length: int | None = Field(default=None, description="Max tokens per sequence.")
    total_slots: int | None = Field(default=None, description="llama.cpp parallel slots.")
    metric_families: list[str] = Field(default_factory=list, description="Prefixes on /metrics.")
    reachable: bool = Field(default=False, description="Whether any endpoint answered at all.")
    answers: dict[str, ProbeAnswer] = Field(default_factory=dict, description="Raw, by path.")

    def answer_json(self, path: str) -> Any:
        """The JSON body of a 200 answer at ``path``, else None."""
        a = self.answers.get(path)
        return a.body if a is not None and a.status == 200 else None


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------


def verify_setting(tls_verify: bool = True, ca_bundle: str | None = None) -> bool | ssl.SSLContext:
    """httpx's ``verify`` for a target: False, the system CAs (True), or a private CA bundle."""
    if not tls_verify:
        return False
    if ca_bundle is not None:
        return ssl.create_default_context(cafile=ca_bundle)
    return True


def auth_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def header_secrets(headers: Mapping[str, str] | None) -> list[str]:
    """The credentials carried by ``headers`` (a bearer token, any secret-named header)."""
    out = []
    for name, value in (headers or {}).items():
        if name.lower() == "authorization" or looks_secret(name):
            out.append(value)
            scheme, _, token = value.partition(" ")
            if token and scheme.lower() in ("bearer", "basic", "token"):
                out.append(token)
    return out


def _redact(obj: Any, secrets: Sequence[str]) -> Any:
    """``obj`` with secret-named fields and secret values replaced (SGLang's server args carry
    the server's own ``api_key``)."""
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            hidden = looks_secret(str(key)) and value not in (None, "", False)
            out[str(key)] = REDACTED if hidden else _redact(value, secrets)
        return out
    if isinstance(obj, list):
        return [_redact(v, secrets) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj, list(secrets))
    return obj


def metric_families(text: str) -> tuple[list[str], int]:
    """The name prefixes (``vllm:``, ``tgi_``...) of a Prometheus text, and its sample count."""
    families: set[str] = set()
    samples = 0
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        samples += 1
        name = re.split(r"[{\s]", line, maxsplit=1)[0]
        if ":" in name:
            families.add(name.split(":", 1)[0] + ":")
        else:
            families.update(p for p in FAMILIES if p.endswith("_") and name.startswith(p))
    return sorted(families), samples


def _probe(client: Any, base_url: str, path: str, secrets: Sequence[str]) -> ProbeAnswer:
    import httpx

    url = f"{base_url}{path}"
    try:
        resp = client.get(url)
    except httpx.HTTPError as exc:
        return ProbeAnswer(url=url, error=redact_text(f"{type(exc).__name__}: {exc}", [*secrets]))
    answer = ProbeAnswer(url=url, status=resp.status_code)
    ctype = resp.headers.get("content-type", "")
    if path.endswith("/metrics") and resp.status_code == 200 and "json" not in ctype:
        families, samples = metric_families(resp.text)
        answer.body = {"prometheus_families": families, "samples": samples}
        return answer
    try:
        answer.body = _redact(resp.json(), secrets)
    except ValueError:
        answer.body = redact_text(resp.text[:TEXT_EXCERPT], [*secrets])
    return answer


# ---------------------------------------------------------------------------------------------
# Probe
# ---------------------------------------------------------------------------------------------


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def probe_engine(
    base_url: str,
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
    *,
    verify: bool | ssl.SSLContext = True,
) -> EngineIdentity:
    """Ask ``base_url``'s identity endpoints (GET only) and infer which engine answers."""
    import httpx

    base_url = base_url.rstrip("/")
    secrets = header_secrets(headers)
    ident = EngineIdentity(base_url=base_url)
    with httpx.Client(headers=dict(headers or {}), timeout=timeout, verify=verify) as client:
        for path in PROBE_PATHS:
            ident.answers[path] = _probe(client, base_url, path, secrets)
        ident.reachable = any(a.status is not None for a in ident.answers.values())
        votes = _votes(ident)
        if "trtllm" in votes:
            # Its Prometheus series (with return_perf_metrics) live apart from /metrics.
            path = METRICS_PATHS["trtllm"]
            ident.answers[path] = _probe(client, base_url, path, secrets)
    _read_fields(ident)
    _infer_kind(ident, votes)
    return ident


def _votes(ident: EngineIdentity) -> dict[str, list[str]]:
    """Per kind, the answers that point to it."""
    votes: dict[str, list[str]] = {}

    def vote(kind: str, why: str) -> None:
        votes.setdefault(kind, []).append(why)

    models = ident.answer_json("/v1/models")
    if isinstance(models, Mapping):
        for card in models.get("data") or []:
            owner = card.get("owned_by") if isinstance(card, Mapping) else None
            if isinstance(owner, str) and owner in OWNED_BY:
                vote(OWNED_BY[owner], f"/v1/models owned_by {owner!r}")
                break
    for path in ("/get_server_info", "/server_info"):
        info = ident.answer_json(path)
        if isinstance(info, Mapping) and "internal_states" in info:
            vote("sglang", f"{path} has SGLang's internal_states")
            break
    model_info = ident.answer_json("/get_model_info")
    if isinstance(model_info, Mapping) and {"model_path", "is_generation"} <= set(model_info):
        vote("sglang", "/get_model_info has model_path and is_generation")
    info = ident.answer_json("/info")
    if isinstance(info, Mapping) and (
        str(info.get("router", "")).startswith("text-generation")
        or {"model_id", "max_total_tokens"} <= set(info)
    ):
        vote("tgi", f"/info router {info.get('router')!r}")
    props = ident.answer_json("/props")
    if isinstance(props, Mapping) and (
        "total_slots" in props or "default_generation_settings" in props
    ):
        vote("llamacpp", "/props has total_slots/default_generation_settings")
    metrics = ident.answers.get("/metrics")
    if metrics is not None and metrics.status == 200:
        body = metrics.body
        if isinstance(body, Mapping) and "prometheus_families" in body:
            families = body["prometheus_families"]
            kinds = [FAMILIES[f] for f in families if f in FAMILIES]
            # The simulator exposes vLLM's names too: its own family decides.
            for kind in ["capacity-pack-sim"] if "capacity-pack-sim" in kinds else kinds:
                names = [f for f in families if FAMILIES.get(f) == kind]
                vote(kind, f"/metrics has {'/'.join(n + '*' for n in names)} series")
        elif isinstance(body, list):
            vote("trtllm", "/metrics answers JSON iteration stats (trtllm-serve)")
    return votes


def _read_fields(ident: EngineIdentity) -> None:
    models = ident.answer_json("/v1/models")
    if isinstance(models, Mapping):
        cards = [c for c in models.get("data") or [] if isinstance(c, Mapping)]
        ident.served_models = [str(c["id"]) for c in cards if "id" in c]
        ident.models_url = ident.answers["/v1/models"].url
        lengths = [_int(c.get("max_model_len")) for c in cards]
        ident.context_length = next((n for n in lengths if n is not None), None)
    for path in ("/get_server_info", "/server_info"):
        info = ident.answer_json(path)
        if isinstance(info, Mapping):
            ident.context_length = ident.context_length or _int(info.get("context_length"))
            if isinstance(info.get("model_path"), str):
                ident.model_path = ident.model_path or info["model_path"]
    model_info = ident.answer_json("/get_model_info")
    if isinstance(model_info, Mapping) and isinstance(model_info.get("model_path"), str):
        ident.model_path = model_info["model_path"]
    info = ident.answer_json("/info")
    if isinstance(info, Mapping):
        ident.model_id = info.get("model_id") if isinstance(info.get("model_id"), str) else None
        ident.model_sha = info.get("model_sha") if isinstance(info.get("model_sha"), str) else None
        ident.context_length = ident.context_length or _int(info.get("max_total_tokens"))
    props = ident.answer_json("/props")
    if isinstance(props, Mapping):
        ident.total_slots = _int(props.get("total_slots"))
        if isinstance(props.get("model_path"), str):
            ident.model_path = props["model_path"]
        settings = props.get("default_generation_settings")
        if isinstance(settings, Mapping):
            ident.context_length = ident.context_length or _int(settings.get("n_ctx"))
    metrics = ident.answers.get("/metrics")
    if metrics is not None and isinstance(metrics.body, Mapping):
        ident.metric_families = list(metrics.body.get("prometheus_families", []))


# Where each kind reports its version: (path, field), first answer wins.
_VERSION_SOURCES: dict[str, tuple[tuple[str, str], ...]] = {
    "vllm": (("/version", "version"),),
    "capacity-pack-sim": (("/version", "version"),),
    "trtllm": (("/version", "version"),),
    "sglang": (("/get_server_info", "version"), ("/server_info", "version")),
    "tgi": (("/info", "version"),),
    "llamacpp": (("/props", "build_info"),),
}


def _infer_kind(ident: EngineIdentity, votes: dict[str, list[str]]) -> None:
    if votes:
        ranked = sorted(votes, key=lambda k: -len(votes[k]))
        top = [k for k in ranked if len(votes[k]) == len(votes[ranked[0]])]
        if "capacity-pack-sim" in votes and set(votes) <= {"capacity-pack-sim", "vllm"}:
            top = ["capacity-pack-sim"]  # the simulator answers in vLLM's wire format
        ident.kind = top[0] if len(top) == 1 else None
        ident.evidence = [f"{k}: {why}" for k in ranked for why in votes[k]]
        if len(top) > 1:
            ident.evidence.append(f"undecided between {', '.join(top)}")
    sources = _VERSION_SOURCES.get(ident.kind or "") or tuple(
        dict.fromkeys(s for kind in KINDS for s in _VERSION_SOURCES[kind])
    )
    for path, field in sources:
        body = ident.answer_json(path)
        if isinstance(body, Mapping) and isinstance(body.get(field), str | int | float):
            value = str(body[field])
            if re.fullmatch(r"b0-unknown|unknown", value):
                # llama.cpp built outside a git checkout does not know its build or commit.
                ident.evidence.append(f"{path} {field} {value!r}: the version is not known")
                break
            ident.version = value
            ident.version_url = ident.answers[path].url
            break


# ---------------------------------------------------------------------------------------------
# Comparison with the manifest
# ---------------------------------------------------------------------------------------------


def engine_kind(name: str | None) -> str | None:
    """The engine kind a manifest's ``engine.name`` denotes, or None for an unknown engine."""
    if not name:
        return None
    name = name.strip().lower()
    if name in ALIASES:
        return ALIASES[name]
    for alias in sorted(ALIASES, key=len, reverse=True):
        if name.startswith(alias) and not name[len(alias)].isalnum():
            return ALIASES[alias]
    return None


def version_matches(expected: str, reported: str) -> bool:
    e = expected.strip().lower().removeprefix("v")
    r = reported.strip().lower().removeprefix("v")
    if e == r or r.split("+", 1)[0] == e:
        return True
    parts = [p for p in re.split(r"[-+]", r) if p]
    if e in parts:
        return True
    hexes = [p for p in parts if re.fullmatch(r"[0-9a-f]{7,40}", p)]
    return bool(re.fullmatch(r"[0-9a-f]{7,40}", e)) and any(
        p.startswith(e) or e.startswith(p) for p in hexes
    )


def _is_sha(text: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-f]{7,40}", text.strip().lower()))


def check_identity(
    identity: EngineIdentity, pack: Any, *, secrets: Sequence[str] | None = None
) -> list[str]:
    """Mismatches between the server's identity and the manifest, one message each.

    ``pack`` is a :class:`~capacity_pack.plan.manifest.Pack` or anything with its ``engine`` (may be
    None: not compared), ``model`` and ``target``. Messages quote the server, so ``secrets``
    (default: the target's API key and secret-named environment variables) are redacted.
    """
    url = identity.base_url
    target = getattr(pack, "target", None)
    if secrets is None:
        secrets = secret_values(getattr(target, "api_key_env", None))
    problems: list[str] = []
    if not identity.reachable:
        errors = "; ".join(
            f"{p}: {a.error}" for p, a in identity.answers.items() if a.error is not None
        )
        problems = [f"the server at {url} answered none of the identity endpoints ({errors})"]
        return [redact_text(p, list(secrets)) for p in problems]
    engine = getattr(pack, "engine", None)
    if engine is not None:
        want = engine_kind(engine.name)
        if want is not None and identity.kind != want:
            seen = (
                f"identifies as {identity.kind}"
                if identity.kind is not None
                else "answered no endpoint that identifies an engine"
            )
            why = "; ".join(identity.evidence) or _answer_summary(identity)
            problems.append(
                f"engine.name: manifest says {engine.name}, the server at {url} {seen} ({why})"
            )
        if identity.version is not None and not version_matches(engine.version, identity.version):
            problems.append(
                f"engine.version: manifest says {engine.version}, the server at "
                f"{identity.version_url} reports {identity.version}"
            )
    model = getattr(pack, "model", None)
    if model is not None:
        served = model.served_name or model.id
        field = "model.served_name" if model.served_name else "model.id"
        if identity.models_url is not None:
            if served not in identity.served_models:
                listed = ", ".join(repr(m) for m in identity.served_models) or "no model"
                problems.append(
                    f"{field}: manifest says {served}, the server at {identity.models_url} "
                    f"serves {listed}"
                )
        elif identity.model_id is not None and served != identity.model_id:
            problems.append(
                f"{field}: manifest says {served}, the server at {url}/info serves "
                f"{identity.model_id}"
            )
        if (
            identity.model_sha is not None
            and _is_sha(model.revision)
            and not version_matches(model.revision, identity.model_sha)
        ):
            problems.append(
                f"model.revision: manifest says {model.revision}, the server at {url}/info "
                f"reports model_sha {identity.model_sha}"
            )
    reset = getattr(target, "cache_reset", None)
    if (
        identity.kind is not None
        and reset not in (None, "none", "restart")
        and reset not in RESETS.get(identity.kind, frozenset())
    ):
        usable = sorted(RESETS.get(identity.kind, frozenset()) | {"restart"})
        problems.append(
            f"target.cache_reset: manifest says {reset}, the server at {url} is "
            f"{identity.kind}, which that cannot reset (use {' or '.join(usable)})"
        )
    return [redact_text(p, list(secrets)) for p in problems]


def _answer_summary(identity: EngineIdentity) -> str:
    parts = []
    for path, a in identity.answers.items():
        parts.append(f"{path} {a.status if a.status is not None else 'no answer'}")
    return "answers: " + ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# Metrics through the engine's names
# ---------------------------------------------------------------------------------------------


def metric_map(name: str | None) -> Any:
    """The ``EngineMetrics`` of a kind or engine name, or None."""
    from capacity_pack.drills.dashboard import DashboardError, engine_metrics

    if not name:
        return None
    try:
        return engine_metrics(ALIASES.get(name.strip().lower(), name))
    except DashboardError:
        kind = engine_kind(name)
        return engine_metrics(kind) if kind is not None else None


def _sample_sums(text: str, wanted: set[str]) -> dict[str, float]:
    """Sum over label sets of each wanted series in Prometheus text."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = re.split(r"[{\s]", line, maxsplit=1)[0]
        if name not in wanted:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        sums[name] = sums.get(name, 0.0) + value
    return sums


def read_signals(
    text: str, emap: Any, *, map_name: str, url: str
) -> tuple[dict[str, float], list[str]]:
    """Canonical signals from ``text`` through ``emap``, and the missing ones, each a sentence.

    A signal the map names is also read under the older names ``engines.signals.METRIC_NAMES`` lists
    for the same engine (vLLM's ``gpu_cache_usage_perc`` before ``kv_cache_usage_perc``).
    """
    from capacity_pack.engines.signals import METRIC_NAMES

    names: dict[str, list[str]] = {}
    for signal, field in SIGNALS.items():
        primary = getattr(emap, field, None)
        if primary is None:
            continue
        prefix = re.match(r"[a-z]+[:_]", primary)
        older = [
            n
            for n in METRIC_NAMES.get(signal, ())
            if prefix is not None and n.startswith(prefix.group()) and n != primary
        ]
        names[signal] = [primary, *older]
    sums = _sample_sums(text, {n for ns in names.values() for n in ns})
    values: dict[str, float] = {}
    for signal, candidates in names.items():
        found = next((n for n in candidates if n in sums), None)
        if found is not None:
            values[signal] = sums[found]
    missing = []
    for signal in ("queue_depth", "running", "kv_usage"):
        if signal in values:
            continue
        if signal not in names:
            missing.append(f"{signal}: the {map_name} metric map has no series for it")
        else:
            missing.append(f"{signal}: {names[signal][0]} absent from {url}")
    if not {"prefix_cache_hits", "prefix_cache_hit_rate"} & set(values):
        if "prefix_cache_hits" in names or "prefix_cache_hit_rate" in names:
            wanted = (names.get("prefix_cache_hits") or names["prefix_cache_hit_rate"])[0]
            missing.append(f"prefix_cache_hits: {wanted} absent from {url}")
        else:
            missing.append(f"prefix_cache_hits: the {map_name} metric map has no series for it")
    return values, missing
