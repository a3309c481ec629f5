"""``capacity-pack init``: a pack skeleton written from what a running server says about itself.

:func:`survey` asks the server, with GET requests only (and one ``POST /tokenize`` of a short
text, which changes nothing on the server):

- who it is: :func:`~capacity_pack.engines.probe.probe_engine` (``/v1/models``, the engines'
  identity endpoints, ``/metrics``): engine kind and version, served models, context length,
  TGI's model sha or the SHA-256 of a llama.cpp weights file (an immutable model revision);
- ``/metrics``: whether the engine's own series are there (queue, KV, prefix cache evidence);
- ``/tokenize``: whether prompts can get exactly their input tokens under the served model's
  tokenizer (``target.tokenize_endpoint``);
- the prefix-cache reset a cold point needs: the engine's reset route (:mod:`.registry`), looked
  up in the server's ``/openapi.json`` where it publishes one (vLLM and SGLang do; vLLM mounts
  ``/reset_prefix_cache`` only under ``VLLM_SERVER_DEV_MODE=1``), never called; a server whose
  reset cannot be confirmed gets it with a note that the first cold point verifies it, and one
  without a reset gets a warm-only pack.

:func:`skeleton` writes the pack as commented YAML: what was found, with its evidence, and
``null`` where only the user can decide (the SLO cutoffs; the model revision and precision
when the server does not report them). ``capacity-pack lint`` refuses the skeleton until those
are filled; :attr:`Survey.todo` lists them. A server that does not answer, or answers without
the OpenAI API, is one line naming the URL and the cause.
"""

from __future__ import annotations

import datetime as dt
import re
import ssl
from dataclasses import dataclass, field
from typing import Any

import httpx

from capacity_pack.engines import registry
from capacity_pack.engines.http import header_secrets
from capacity_pack.engines.probe import EngineIdentity, probe_engine, unreachable
from capacity_pack.engines.tokenize import EndpointCounter
from capacity_pack.errors import StatedError
from capacity_pack.redact import redact_text

#: What the skeleton leaves to the user whatever the server says.
ALWAYS_TODO = ("workload[0].request_ttft_cutoff_ms", "workload[0].request_tpot_cutoff_ms")


class InitError(StatedError):
    """A server ``init`` cannot write a pack for; the message names the URL and the cause."""


@dataclass
class Survey:
    """What the server answered, and what the skeleton still needs from the user."""

    url: str
    identity: EngineIdentity
    model: str
    engine_name: str | None
    tokenize: bool
    tokenize_note: str
    reset: str
    reset_note: str
    metrics_note: str
    revision: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def todo(self) -> list[str]:
        """The fields left ``null`` for the user, dotted."""
        out = list(ALWAYS_TODO)
        if self.revision is None:
            out += ["model.revision", "model.tokenizer_revision"]
        out.append("model.precision")
        if self.engine_name is None:
            out.append("engine.name")
        if not self.identity.version:
            out.append("engine.version")
        return out


def _models(identity: EngineIdentity, url: str) -> list[str]:
    answer = identity.answers.get("/v1/models")
    if answer is None or answer.status != 200 or not identity.served_models:
        code = answer.status if answer is not None else None
        if code in (401, 403):
            raise InitError(
                f"the server at {url} refused GET /v1/models (HTTP {code}): name the variable "
                "holding its API key with --api-key-env"
            )
        raise InitError(
            f"the server at {url} answers, but not with the OpenAI API's GET /v1/models "
            f"({f'HTTP {code}' if code else 'no answer'}): give the API's base URL (e.g. "
            "http://127.0.0.1:8000, without /v1)"
        )
    return identity.served_models


def _reset(client: httpx.Client, url: str, identity: EngineIdentity) -> tuple[str, str]:
    """The ``target.cache_reset`` to write and why."""
    engine = registry.get(identity.kind)
    if engine is not None and engine.mimics and not engine.resets:
        engine = registry.get(engine.mimics)
    resets = engine.resets if engine is not None else ()
    if not resets:
        return "none", (
            f"{identity.kind or 'this engine'} has no prefix-cache reset the pack knows: cold "
            "points need cache_reset: restart and a restart_command, so the skeleton is warm-only"
        )
    reset = resets[0]
    path = getattr(reset, "path", None)
    try:
        resp = client.get(f"{url}/openapi.json")
        routes = resp.json().get("paths", {}) if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        routes = None
    if path and isinstance(routes, dict):
        if path in routes:
            return reset.name, f"{path} is served (the server's /openapi.json lists it)"
        hint = " (vLLM mounts it only with VLLM_SERVER_DEV_MODE=1)" if reset.name == "vllm" else ""
        return "none", (
            f"{path} is not served (absent from /openapi.json){hint}: the skeleton is warm-only; "
            f"serve it and set target.cache_reset: {reset.name} with cold in sweep.cache_states"
        )
    return reset.name, (
        f"{reset.describe or reset.name}: not confirmed from outside (no /openapi.json); the "
        "first cold point calls it and verifies the cache is empty, or stops saying why"
    )


def _tokenize(url: str, model: str, headers: dict[str, str], verify: Any) -> tuple[bool, str]:
    counter = EndpointCounter(url, model, headers=headers, verify=verify)
    try:
        n = counter.count("How many replicas carry the peak?")
    except (httpx.HTTPError, ValueError) as exc:
        why = (
            f"HTTP {exc.response.status_code}"
            if isinstance(exc, httpx.HTTPStatusError)
            else type(exc).__name__
        )
        return False, redact_text(
            f"POST /tokenize did not count tokens ({why}); prompts are fitted "
            "by the pack's own word tokenizer, or give target.tokenizer_path",
            header_secrets(headers),
        )
    return True, f"POST /tokenize counts tokens ({counter.flavor} format; {n} for a test text)"


def survey(
    url: str, headers: dict[str, str] | None = None, *, verify: bool | ssl.SSLContext = True
) -> Survey:
    """Ask the server at ``url`` what a pack needs to know; :class:`InitError` if it cannot."""
    url = url.rstrip("/")
    if not re.match(r"^https?://", url):
        raise InitError(f"--url {url!r}: expected http:// or https://, e.g. http://127.0.0.1:8000")
    headers = dict(headers or {})
    identity = probe_engine(url, headers, 5.0, verify=verify)
    if not identity.reachable:
        raise InitError(unreachable(identity))
    models = _models(identity, url)
    model = models[0]
    notes = []
    if len(models) > 1:
        notes.append(f"the server serves {len(models)} models ({', '.join(models)}): took {model}")
    kind = identity.kind
    engine_name = kind
    if kind is None:
        notes.append("the engine kind is unknown (" + "; ".join(identity.evidence) + ")")
    families = identity.metric_families
    metrics_note = (
        f"/metrics serves {', '.join(families)} series: queue, KV and prefix-cache evidence"
        if families
        else "no /metrics: points record no server series (queue, KV, prefix cache)"
    )
    with httpx.Client(headers=headers, timeout=5.0, verify=verify) as client:
        reset, reset_note = _reset(client, url, identity)
    tokenize, tokenize_note = _tokenize(url, model, headers, verify)
    revision = None
    if identity.model_sha:
        revision = identity.model_sha
    elif identity.model_sha256:
        revision = f"sha256:{identity.model_sha256}"
    return Survey(
        url=url,
        identity=identity,
        model=model,
        engine_name=engine_name,
        tokenize=tokenize,
        tokenize_note=tokenize_note,
        reset=reset,
        reset_note=reset_note,
        metrics_note=metrics_note,
        revision=revision,
        notes=notes,
    )


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "my-pack"


def _q(value: Any) -> str:
    """A YAML scalar: null for unknown, quoted text otherwise."""
    if value is None:
        return "null"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def skeleton(s: Survey, *, api_key_env: str | None = None, name: str | None = None) -> str:
    """The pack as commented YAML (see the module docstring)."""
    # Over 80 lines on purpose: the body is the pack file itself, line for line, top to bottom.
    ident = s.identity
    engine = s.engine_name or "engine"
    name = name or _slug(f"{s.model.rsplit('/', 1)[-1]}-{engine}")
    today = dt.date.today().isoformat()
    context = ident.context_length
    device = "cpu" if ident.kind == "llamacpp" else "gpu"
    states = "[cold, warm]" if s.reset != "none" else "[warm]"
    lines = [
        f"# Written by `capacity-pack init --url {s.url}` on {today}",
        "# from what the server answered:",
        "#",
        f"# engine:    {engine} {ident.version or '(no version reported)'}",
        f"# model:     {s.model}" + (f" (context {context} tokens)" if context else ""),
        f"# metrics:   {s.metrics_note}",
        f"# tokenize:  {s.tokenize_note}",
        f"# cache:     {s.reset_note}",
        *(f"# note:      {n}" for n in s.notes),
        "#",
        "# Still yours to decide (null below; `capacity-pack lint` refuses the pack until set):",
        *(f"#   {t}" for t in s.todo),
        "# and what the defaults below assume: one class, its lengths and share, the gate,",
        "# the placement, the plan's peak. Then: snakemake --cores 2 --configfile THIS_FILE",
        "pack:",
        f"  name: {name}",
        f"  title: {_q(f'{s.model} on {engine}')}",
        "  size: full",
        "  description: >-",
        f"    Capacity of {s.model} served by {engine} at {s.url}.",
        f"cutoff: {today}",
        "model:",
        f"  id: {_q(s.model)}",
        f"  revision: {_q(s.revision)}  # an immutable checkpoint id, never 'main'",
        f"  tokenizer_revision: {_q(s.revision)}",
        "  precision: null  # bf16, fp8, q4_k_m ...",
        f"  served_name: {_q(s.model)}",
        "engine:",
        f"  name: {s.engine_name or 'null'}",
        f"  version: {_q(ident.version)}",
        "  placement: {tp: 1, pp: 1, dp: 1, replicas: 1, gpus: 1}  # one replica under test",
        "  prefix_cache: enabled",
        f"  scheduler: {engine}-default",
        f"  device: {device}",
        "client:",
        "  location: 127.0.0.1/loopback",
        "  streaming: true",
        "  endpoint: completions",
        "  arrival_pattern: poisson",
        "  minimum_duration_seconds: 60",
        "  initial_scheduled_requests: 600",
        f"  request_schedule_seed: {today.replace('-', '')}",
        "  warmup_seconds: 10",
        "  maximum_duration_seconds: 600",
        "  request_timeout_seconds: 120",
        "  automatic_retries: false",
        "  cancellation_policy: none",
        "request:",
        "  sampling: {temperature: 0.0, top_p: 1.0, top_k: -1}",
        "  stop: {ignore_eos: true, stop_sequences: []}",
        "  chat_template: none",
        "  include_usage: true",
        "prompts:",
        "  source: synthetic",
        "  corpus_revision: capacity-pack-text-v1",
        "  cold_unique_prefix_tokens: 8",
        "  prefix: {shared_prefixes: 8, prefix_tokens: 256, distribution: zipf,",
        f"           zipf_exponent: 1.1, revision: {name}-prefixes-v1}}",
        "workload:",
        "  # Your classes: share of traffic, lengths, and per-request SLO cutoffs (time to first",
        "  # token; time per output token after the first).",
        "  - {name: chat, mix: 1.0, input_tokens: 1024, output_tokens: 256,",
        "     request_ttft_cutoff_ms: null, request_tpot_cutoff_ms: null}",
        "acceptance:",
        "  # A class passes a rate once the lower end of its attainment's confidence sequence",
        "  # reaches 0.95 at 95 %: at least 81 successful requests of the class per point.",
        "  class_slo_attainment_min: 0.95",
        "  min_successful_samples_per_class: 100",
        "  error_rate_max: 0.01",
        "  queue_trend_required: flat",
        "  target_utilization: 0.75",
        "target:",
        "  kind: openai",
        f"  base_url: {s.url}",
        *([f"  api_key_env: {api_key_env}"] if api_key_env else []),
        f"  cache_reset: {s.reset}",
        f"  tokenize_endpoint: {'true' if s.tokenize else 'false'}",
        "sweep:",
        "  # The boundary search starts from the closed loop's saturation throughput.",
        "  open_loop_rps: []",
        "  closed_loop_concurrency: [1, 16, 64]",
        "  closed_loop_requests_per_worker: 4",
        "  closed_loop_min_requests: 64",
        f"  cache_states: {states}",
        "  repeats: 2",
        "  search: {initial: auto, resolution_rel: 0.1, max_rounds: 6}",
        "plan:",
        "  peak_rps: 10  # the peak you must carry",
        "  gpus_per_replica: 1",
        "  replicas_under_test: 1",
        "  redundancy_replicas: 1",
    ]
    return "\n".join(lines) + "\n"
