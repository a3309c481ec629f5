"""Benchmark anti-pattern findings: what makes a load test produce a number but no evidence.

:func:`lint_file` accepts either a pack configuration (anything with a ``workload`` list) or a
plain, flat benchmark description such as this deliberately broken one (the shape of
``tests/data/broken-benchmark.yaml``, which trips all six findings)::

    load_mode: concurrency_only      concurrency: 128         request_count: 100
    prompts: repeat_the_same_prompt  prefix_cache: enabled    clear_cache_before_run: false
    warmup_requests: 0               report: [mean_latency, total_tokens_per_second]
    model_revision: latest           engine_version: latest

and reports each anti-pattern as a named finding with its reason:

- ``concurrency-only-load``: closed-loop traffic self-throttles and cannot validate an arrival rate;
- ``too-few-requests``: fewer requests per class than the sample gate gives no tail evidence;
- ``uncontrolled-prefix-cache``: repeated prompts with the prefix cache on and no clearing mix
  cold and warm cache states in one number;
- ``no-warmup``: compilation, graph capture and cold caches land inside the measured window;
- ``mean-only-reporting``: means hide tail latency and per-class failures;
- ``mutable-versions``: ``latest``-style revisions make the run impossible to reproduce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capacity_pack.plan.manifest import (
    ManifestError,
    OpenAITarget,
    Pack,
    format_validation_error,
    is_mutable_revision,
    load_yaml,
    mutable_revision_fields,
    validate_pack,
)

# Successful requests per class before a percentile or attainment counts as evidence (the
# full-size tutorial-70b pack's ``acceptance.min_successful_samples_per_class``), used when a
# plain description states none. A reporting policy, not a statistical guarantee.
DEFAULT_MIN_SAMPLES = 2000
PERCENTILE_WORDS = ("p50", "p90", "p95", "p99", "percentile", "quantile", "attainment", "median")

REASONS = {
    "concurrency-only-load": (
        "concurrency-only traffic self-throttles: as latency rises the client slows its own "
        "arrivals, so it cannot show that the service absorbs an independent arrival rate; add an "
        "open-loop rate sweep"
    ),
    "too-few-requests": (
        "too few requests give almost no tail evidence: every class needs at least the sample "
        "gate's successful observations before a percentile or attainment means anything"
    ),
    "uncontrolled-prefix-cache": (
        "repeated prompts with the prefix cache on and no clearing mix cold and warm cache "
        "states in one unlabeled number and inflate throughput; clear or restart before cold "
        "points, use unique prefixes, and report warm runs separately"
    ),
    "no-warmup": (
        "without warm-up, compilation, graph capture and model-load effects land inside the "
        "measured window"
    ),
    "mean-only-reporting": (
        "means hide tail latency and class failures; report per-class percentiles and "
        "request-level SLO attainment"
    ),
    "mutable-versions": (
        "mutable versions such as 'latest' prevent reproduction: the model, tokenizer and "
        "engine under test can change between runs"
    ),
}


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="Stable finding id, e.g. 'no-warmup'.")
    message: str = Field(description="What was found, naming the field(s).")
    reason: str = Field(description="Why it breaks a capacity benchmark.")


def _finding(code: str, message: str) -> Finding:
    return Finding(code=code, message=message, reason=REASONS[code])


class BenchmarkDescription(BaseModel):
    """A flat, tool-agnostic benchmark description (load mode, counts, cache and version fields)."""

    model_config = ConfigDict(extra="forbid")

    load_mode: str | None = Field(default=None, description="concurrency_only, open_loop, both.")
    concurrency: int | None = Field(default=None, ge=1, description="Closed-loop concurrency.")
    request_rate: float | None = Field(default=None, gt=0, description="Open-loop rate (RPS).")
    request_count: int | None = Field(default=None, ge=0, description="Requests per run.")
    min_successful_samples_per_class: int | None = Field(default=None, ge=1)
    prompts: str | None = Field(default=None, description="Prompt source.")
    prefix_cache: str | bool | None = Field(default=None, description="enabled/disabled.")
    clear_cache_before_run: bool | None = Field(default=None)
    warmup_requests: int | None = Field(default=None, ge=0)
    warmup_seconds: float | None = Field(default=None, ge=0)
    report: list[str] = Field(default_factory=list, description="Reported statistics.")
    model_revision: str | None = Field(default=None)
    tokenizer_revision: str | None = Field(default=None)
    engine_version: str | None = Field(default=None)


def _reports_percentiles(stats: list[str]) -> bool:
    return any(word in s.lower() for s in stats for word in PERCENTILE_WORDS)


def lint_description(d: BenchmarkDescription) -> list[Finding]:
    findings: list[Finding] = []
    mode = (d.load_mode or "").lower()
    if mode in {"concurrency_only", "concurrency", "closed_loop", "burst"} or (
        d.concurrency is not None and d.request_rate is None and "open" not in mode
    ):
        findings.append(
            _finding(
                "concurrency-only-load",
                f"load_mode {d.load_mode!r} (concurrency {d.concurrency}) with no open-loop rate",
            )
        )
    gate = d.min_successful_samples_per_class or DEFAULT_MIN_SAMPLES
    if d.request_count is None or d.request_count < gate:
        findings.append(
            _finding(
                "too-few-requests",
                f"request_count {d.request_count} is below the sample gate of {gate} "
                "successful requests per class",
            )
        )
    repeated = d.prompts is not None and any(w in d.prompts.lower() for w in ("repeat", "same"))
    cache_on = d.prefix_cache in (True, "enabled", "on", "true")
    if repeated and cache_on and not d.clear_cache_before_run:
        findings.append(
            _finding(
                "uncontrolled-prefix-cache",
                f"prompts {d.prompts!r} with prefix_cache {d.prefix_cache!r} and "
                f"clear_cache_before_run {d.clear_cache_before_run!r}",
            )
        )
    if not d.warmup_requests and not d.warmup_seconds:
        findings.append(
            _finding(
                "no-warmup",
                f"warmup_requests {d.warmup_requests!r}, warmup_seconds {d.warmup_seconds!r}",
            )
        )
    if not _reports_percentiles(d.report):
        findings.append(_finding("mean-only-reporting", f"report lists only {d.report}"))
    revisions = {
        "model_revision": d.model_revision,
        "tokenizer_revision": d.tokenizer_revision,
        "engine_version": d.engine_version,
    }
    bad = [f"{k} = {v!r}" for k, v in revisions.items() if v is not None and is_mutable_revision(v)]
    missing = [k for k in ("model_revision", "engine_version") if revisions[k] is None]
    if bad or missing:
        parts = bad + [f"{k} not pinned" for k in missing]
        findings.append(_finding("mutable-versions", "; ".join(parts)))
    return findings


def lint_pack(pack: Pack) -> list[Finding]:
    findings: list[Finding] = []
    open_rates = bool(pack.sweep.open_loop_rps) or bool(pack.experiments)
    if not open_rates:
        findings.append(
            _finding(
                "concurrency-only-load",
                "sweep.open_loop_rps is empty and there are no rate experiments: only "
                f"closed-loop concurrency {pack.sweep.closed_loop_concurrency} is measured",
            )
        )
    gate = pack.acceptance.min_successful_samples_per_class
    counts = pack.class_counts(pack.client.initial_scheduled_requests)
    short = {c: n for c, n in counts.items() if n < gate}
    if short:
        findings.append(
            _finding(
                "too-few-requests",
                f"client.initial_scheduled_requests {pack.client.initial_scheduled_requests} "
                f"gives {short} scheduled requests, below "
                f"acceptance.min_successful_samples_per_class {gate}",
            )
        )
    cache_on = pack.engine.prefix_cache == "enabled"
    if cache_on and pack.prompts.source == "repeat":
        findings.append(
            _finding(
                "uncontrolled-prefix-cache",
                "prompts.source 'repeat' with engine.prefix_cache 'enabled'",
            )
        )
    elif (
        cache_on
        and "cold" in pack.all_cache_states()
        and isinstance(pack.target, OpenAITarget)
        and pack.target.cache_reset == "none"
        # A managed server is started fresh for every point: cold by construction.
        and pack.target.managed is None
    ):
        findings.append(
            _finding(
                "uncontrolled-prefix-cache",
                "cold-cache points against a target with engine.prefix_cache 'enabled' but "
                "target.cache_reset 'none': the cache cannot be cleared between points",
            )
        )
    if pack.client.warmup_seconds <= 0:
        findings.append(_finding("no-warmup", "client.warmup_seconds is 0"))
    if not _reports_percentiles(list(pack.report.latency_statistics)):
        findings.append(
            _finding(
                "mean-only-reporting",
                f"report.latency_statistics {list(pack.report.latency_statistics)} has no "
                "percentile",
            )
        )
    bad = mutable_revision_fields(pack)
    if bad:
        findings.append(_finding("mutable-versions", "; ".join(f"{k} = {v!r}" for k, v in bad)))
    return findings


def lint_data(data: Any, source: str) -> list[Finding]:
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: expected a mapping at the top level")
    if "workload" in data:
        return lint_pack(validate_pack(data, source))
    try:
        description = BenchmarkDescription.model_validate(data)
    except ValidationError as err:
        raise ManifestError(format_validation_error(err, source)) from None
    return lint_description(description)


def lint_file(path: str | Path) -> list[Finding]:
    return lint_data(load_yaml(path), str(path))
