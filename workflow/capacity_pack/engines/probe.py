"""Which serving engine answers at a real target, and whether it is the one the manifest froze.

:func:`probe_engine` GETs ``/v1/models``, every engine's identity endpoints and ``/metrics``,
keeps every answer redacted in the :class:`EngineIdentity`, and takes the engine with the most
votes (``owned_by``, identity endpoints, metric prefix; a tie is unknown, except that an engine
and the one it mimics resolve to the mimic). :func:`check_identity` compares it with the
manifest; :func:`version_matches` matches ``0.11.0`` to ``0.11.0+cu128`` and ``b6123`` to
``b6123-a1b2c3d4``, never to ``0.11.0rc1``. Method: docs/packs.md, 'Which engine answers'.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from capacity_pack.engines import registry, weights
from capacity_pack.engines.base import IDENTITY_FIELDS, Engine
from capacity_pack.engines.exposition import name_prefixes, samples
from capacity_pack.engines.http import header_secrets, redact_json
from capacity_pack.redact import redact_text, secret_values

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
    model_sha256: str | None = Field(
        default=None,
        description="SHA-256 of the weights file at model_path, hashed on this host "
        "(capacity_pack.engines.weights); None: no path, or not a file here.",
    )
    context_length: int | None = Field(default=None, description="Max tokens per sequence.")
    total_slots: int | None = Field(default=None, description="llama.cpp parallel slots.")
    metric_families: list[str] = Field(default_factory=list, description="Prefixes on /metrics.")
    reachable: bool = Field(default=False, description="Whether any endpoint answered at all.")
    answers: dict[str, ProbeAnswer] = Field(default_factory=dict, description="Raw, by path.")
    # Field -> URL of the answer it was read from, for the messages that quote it.
    _field_urls: dict[str, str] = PrivateAttr(default_factory=dict)

    def field_url(self, name: str) -> str:
        return self._field_urls.get(name, self.base_url)

    def answer_json(self, path: str) -> Any:
        """The JSON body of a 200 answer at ``path``, else None."""
        a = self.answers.get(path)
        return a.body if a is not None and a.status == 200 else None


def _families() -> dict[str, str]:
    """Metric-name prefix -> kind, over the registered engines."""
    return {prefix: e.kind for e in registry.engines() for prefix in e.families}


def metric_families(text: str) -> tuple[list[str], int]:
    """The name prefixes (``vllm:``, ``tgi_``...) of a Prometheus text, and its sample count."""
    found = samples(text)
    return name_prefixes(found, _families()), len(found)


def _probe(client: httpx.Client, base_url: str, path: str, secrets: Sequence[str]) -> ProbeAnswer:
    url = f"{base_url}{path}"
    try:
        resp = client.get(url)
    except httpx.HTTPError as exc:
        return ProbeAnswer(url=url, error=redact_text(f"{type(exc).__name__}: {exc}", [*secrets]))
    answer = ProbeAnswer(url=url, status=resp.status_code)
    ctype = resp.headers.get("content-type", "")
    if path.endswith("/metrics") and resp.status_code == 200 and "json" not in ctype:
        families, count = metric_families(resp.text)
        answer.body = {"prometheus_families": families, "samples": count}
        return answer
    try:
        answer.body = redact_json(resp.json(), secrets)
    except ValueError:
        answer.body = redact_text(resp.text[:TEXT_EXCERPT], [*secrets])
    return answer


def probe_engine(
    base_url: str,
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
    *,
    verify: bool | ssl.SSLContext = True,
) -> EngineIdentity:
    """Ask ``base_url``'s identity endpoints (GET only) and infer which engine answers."""
    base_url = base_url.rstrip("/")
    secrets = header_secrets(headers)
    ident = EngineIdentity(base_url=base_url)
    with httpx.Client(headers=dict(headers or {}), timeout=timeout, verify=verify) as client:
        for path in registry.probe_paths():
            ident.answers[path] = _probe(client, base_url, path, secrets)
        ident.reachable = any(a.status is not None for a in ident.answers.values())
        votes = _votes(ident)
        for kind in votes:
            # Its Prometheus series live apart from /metrics (trtllm-serve's).
            path = registry.metrics_path(kind)
            if path not in ident.answers:
                ident.answers[path] = _probe(client, base_url, path, secrets)
    _read_fields(ident)
    _infer_kind(ident, votes)
    if ident.model_path:
        ident.model_sha256 = weights.file_sha256(ident.model_path)
    return ident


def unreachable(identity: EngineIdentity) -> str:
    """The sentence for a server that answered none of the probe's requests: its URL and the
    cause (the first connection error: refused, timed out, name not resolved, TLS)."""
    causes = [a.error for a in identity.answers.values() if a.error]
    return f"no server answers at {identity.base_url} ({causes[0] if causes else 'no answer'})"


def _votes(ident: EngineIdentity) -> dict[str, list[str]]:
    """Per kind, the answers that point to it."""
    votes: dict[str, list[str]] = {}

    def vote(kind: str, why: str) -> None:
        votes.setdefault(kind, []).append(why)

    owners = {owner: e.kind for e in registry.engines() for owner in e.owned_by}
    models = ident.answer_json("/v1/models")
    if isinstance(models, Mapping):
        for card in models.get("data") or []:
            owner = card.get("owned_by") if isinstance(card, Mapping) else None
            if isinstance(owner, str) and owner in owners:
                vote(owners[owner], f"/v1/models owned_by {owner!r}")
                break
    for engine in registry.engines():
        for endpoint in engine.identity:
            if endpoint.identifies is None:
                continue
            for path in endpoint.paths:
                body = ident.answer_json(path)
                why = endpoint.identifies(path, body) if body is not None else None
                if why:
                    vote(engine.kind, why)
                    break
    metrics = ident.answers.get("/metrics")
    if metrics is not None and metrics.status == 200 and isinstance(metrics.body, Mapping):
        found = metrics.body.get("prometheus_families", [])
        families = _families()
        kinds = list(dict.fromkeys(families[f] for f in found if f in families))
        # An engine that speaks another's wire format exposes its names too: its own decide.
        mimics = [k for k in kinds if _engine(k).mimics is not None]
        for kind in mimics or kinds:
            names = [f for f in found if families.get(f) == kind]
            vote(kind, f"/metrics has {'/'.join(n + '*' for n in names)} series")
    return votes


def _engine(kind: str) -> Engine:
    engine = registry.get(kind)
    assert engine is not None
    return engine


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dig(body: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(body, Mapping):
            return None
        body = body.get(part)
    return body


def _read_fields(ident: EngineIdentity) -> None:
    models = ident.answer_json("/v1/models")
    if isinstance(models, Mapping):
        cards = [c for c in models.get("data") or [] if isinstance(c, Mapping)]
        ident.served_models = [str(c["id"]) for c in cards if "id" in c]
        ident.models_url = ident.answers["/v1/models"].url
        lengths = [_int(c.get("max_model_len")) for c in cards]
        ident.context_length = next((n for n in lengths if n is not None), None)
    for engine in registry.engines():
        for endpoint in engine.identity:
            for path in endpoint.paths:
                body = ident.answer_json(path)
                if not isinstance(body, Mapping):
                    continue
                for name, key in endpoint.fields.items():
                    value = _dig(body, key)
                    wanted = IDENTITY_FIELDS[name]
                    value = _int(value) if wanted is int else value
                    if getattr(ident, name) is None and isinstance(value, wanted):
                        setattr(ident, name, value)
                        ident._field_urls[name] = ident.answers[path].url
    metrics = ident.answers.get("/metrics")
    if metrics is not None and isinstance(metrics.body, Mapping):
        ident.metric_families = list(metrics.body.get("prometheus_families", []))


def _version_sources(kind: str | None) -> list[tuple[str, str]]:
    """(path, field) where ``kind`` reports its version; every engine's for an unknown kind."""
    chosen = [_engine(kind)] if kind is not None else list(registry.engines())
    sources = [(p, ep.version) for e in chosen for ep in e.identity if ep.version for p in ep.paths]
    return list(dict.fromkeys(sources))


def _infer_kind(ident: EngineIdentity, votes: dict[str, list[str]]) -> None:
    if votes:
        ranked = sorted(votes, key=lambda k: -len(votes[k]))
        top = [k for k in ranked if len(votes[k]) == len(votes[ranked[0]])]
        for kind in votes:
            mimicked = _engine(kind).mimics
            if mimicked is not None and set(votes) <= {kind, mimicked}:
                top = [kind]  # it answers in the other engine's wire format
        ident.kind = top[0] if len(top) == 1 else None
        ident.evidence = [f"{k}: {why}" for k in ranked for why in votes[k]]
        if len(top) > 1:
            ident.evidence.append(f"undecided between {', '.join(top)}")
    for path, field in _version_sources(ident.kind):
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
    if not identity.reachable:
        errors = "; ".join(
            f"{p}: {a.error}" for p, a in identity.answers.items() if a.error is not None
        )
        problem = f"the server at {url} answered none of the identity endpoints ({errors})"
        return [redact_text(problem, list(secrets))]
    problems = [
        *_engine_problems(identity, getattr(pack, "engine", None)),
        *_model_problems(identity, getattr(pack, "model", None)),
    ]
    reset = getattr(target, "cache_reset", None)
    engine = registry.get(identity.kind)
    generic = (None, *registry.GENERIC_RESETS)
    if engine is not None and reset not in generic and reset not in engine.reset_names:
        usable = sorted(engine.reset_names | {"restart"})
        problems.append(
            f"target.cache_reset: manifest says {reset}, the server at {url} is "
            f"{identity.kind}, which that cannot reset (use {' or '.join(usable)})"
        )
    return [redact_text(p, list(secrets)) for p in problems]


def _engine_problems(identity: EngineIdentity, engine: Any) -> list[str]:
    if engine is None:
        return []
    problems = []
    want = registry.engine_kind(engine.name)
    if want is not None and identity.kind != want:
        seen = (
            f"identifies as {identity.kind}"
            if identity.kind is not None
            else "answered no endpoint that identifies an engine"
        )
        why = "; ".join(identity.evidence) or _answer_summary(identity)
        problems.append(
            f"engine.name: manifest says {engine.name}, the server at {identity.base_url} "
            f"{seen} ({why})"
        )
    if identity.version is not None and not version_matches(engine.version, identity.version):
        problems.append(
            f"engine.version: manifest says {engine.version}, the server at "
            f"{identity.version_url} reports {identity.version}"
        )
    return problems


def _model_problems(identity: EngineIdentity, model: Any) -> list[str]:
    if model is None:
        return []
    problems = []
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
            f"{field}: manifest says {served}, the server at {identity.field_url('model_id')} "
            f"serves {identity.model_id}"
        )
    pinned = weights.pinned_sha256(model.revision)
    if pinned is not None and identity.model_sha256 not in (None, pinned):
        problems.append(
            f"model.revision: manifest pins {model.revision}, the weights the server at "
            f"{identity.field_url('model_path')} loaded ({identity.model_path}) have sha256 "
            f"{identity.model_sha256}"
        )
    if (
        identity.model_sha is not None
        and _is_sha(model.revision)
        and not version_matches(model.revision, identity.model_sha)
    ):
        problems.append(
            f"model.revision: manifest says {model.revision}, the server at "
            f"{identity.field_url('model_sha')} reports model_sha {identity.model_sha}"
        )
    return problems


def _answer_summary(identity: EngineIdentity) -> str:
    parts = []
    for path, a in identity.answers.items():
        parts.append(f"{path} {a.status if a.status is not None else 'no answer'}")
    return "answers: " + ", ".join(parts)
