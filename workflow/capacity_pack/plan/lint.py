"""Benchmark anti-patterns: what makes a load test produce a number but no evidence.

:func:`lint_file` accepts a pack configuration (or a frozen manifest) or a plain, flat
benchmark description (``tests/data/broken-benchmark.yaml`` trips every finding); it reports
the six anti-patterns (``concurrency-only-load``, ``too-few-requests``,
``uncontrolled-prefix-cache``, ``mean-only-reporting``, ``missing-operational-evidence``,
``mutable-versions``) and the extras (``no-warmup``, ``single-run``,
``unvalidated-token-counts``, ``undecidable-gate``); :func:`lint_notes` says what refuses
nothing. Each finding, its fields and its reason: docs/packs.md, 'Lint: the benchmark
anti-patterns'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capacity_pack.binomial import min_samples_to_pass
from capacity_pack.plan.limits import is_mutable_revision
from capacity_pack.plan.manifest import (
    SECTIONS,
    ManifestError,
    Pack,
    format_validation_error,
    load_yaml,
    mutable_revision_fields,
    unwrap_frozen,
    validate_pack,
)
from capacity_pack.plan.sessions import mean_turns
from capacity_pack.plan.system import OpenAITarget
from capacity_pack.plan.trace_lint import verbatim_trace_notes

# Successful requests per class before a percentile or attainment counts as evidence (the
# full-size tutorial-70b pack's ``acceptance.min_successful_samples_per_class``), used when a
# plain description states none. A reporting policy, not a statistical guarantee.
DEFAULT_MIN_SAMPLES = 2000
PERCENTILE_WORDS = ("p50", "p90", "p95", "p99", "percentile", "quantile", "attainment", "median")
# What a report must name for each kind of operational evidence (finding 5).
EVIDENCE_WORDS = {
    "errors": ("error", "fail", "status", "timeout"),
    "queue growth": ("queue", "backlog", "waiting", "pending"),
    "cancellations": ("cancel",),
    "cache state": ("cache",),
}

SIX = (
    "concurrency-only-load",
    "too-few-requests",
    "uncontrolled-prefix-cache",
    "mean-only-reporting",
    "missing-operational-evidence",
    "mutable-versions",
)
EXTRA = ("no-warmup", "single-run", "unvalidated-token-counts")
# Extras only a pack can trip (a plain description states no gate or confidence).
PACK_EXTRA = ("undecidable-gate",)
PACK_ONLY_SECTIONS = frozenset(SECTIONS) - {"prompts", "report"}

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
    "mean-only-reporting": (
        "means hide tail latency and class failures; report per-class percentiles and "
        "request-level SLO attainment"
    ),
    "missing-operational-evidence": (
        "a throughput number without its errors, queue growth, cancellations and cache state "
        "cannot tell a sustainable load from one the server survived by failing, queueing or "
        "dropping requests; record every request's terminal status, the queue trend, the "
        "cancellations and the cache state of every point, and gate on them"
    ),
    "mutable-versions": (
        "mutable versions such as 'latest' prevent reproduction: the model, tokenizer and "
        "engine under test can change between runs"
    ),
    "no-warmup": (
        "without warm-up, compilation, graph capture and model-load effects land inside the "
        "measured window: a cold start is measured as the steady state"
    ),
    "single-run": (
        "one run per point shows no run-to-run variance: repeat every point and report the "
        "spread before a capacity claim rests on it"
    ),
    "unvalidated-token-counts": (
        "token counts the server never confirms are the client's own estimate: throughput and "
        "TPOT per token are then unchecked; pin the tokenizer revision and read the server's "
        "usage"
    ),
    "undecidable-gate": (
        "a pack whose points can never collect the sample its confidence gate needs can only "
        "ever report 'no SLO-compliant capacity': let the points run long enough (or start "
        "the sweep at a higher rate), or state a gate and confidence the sample can meet"
    ),
}


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="Stable finding id, e.g. 'no-warmup'.")
    message: str = Field(description="What was found, naming the field(s).")
    reason: str = Field(description="Why it breaks a capacity benchmark.")
    extra: bool = Field(
        default=False, description="True for a check beyond the six anti-patterns (module doc)."
    )


def _finding(code: str, message: str) -> Finding:
    extra = code in EXTRA or code in PACK_EXTRA
    return Finding(code=code, message=message, reason=REASONS[code], extra=extra)


class BenchmarkDescription(BaseModel):
    """A flat, tool-agnostic benchmark description (load mode, counts, cache and version fields)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    load_mode: str | None = Field(default=None, description="concurrency_only, open_loop, both.")
    concurrency: int | None = Field(default=None, ge=1, description="Closed-loop concurrency.")
    request_rate: float | None = Field(default=None, gt=0, description="Open-loop rate (RPS).")
    request_count: int | None = Field(default=None, ge=0, description="Requests per run.")
    min_successful_samples_per_class: int | None = Field(default=None, ge=1)
    repeats: int | None = Field(default=None, ge=1, description="Runs of every point.")
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


def _absent_evidence(stats: list[str]) -> list[str]:
    """The kinds of operational evidence (EVIDENCE_WORDS) that no reported statistic names."""
    text = [s.lower() for s in stats]
    return [
        kind
        for kind, words in EVIDENCE_WORDS.items()
        if not any(w in s for s in text for w in words)
    ]


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
    if not _reports_percentiles(d.report):
        findings.append(_finding("mean-only-reporting", f"report lists only {d.report}"))
    if absent := _absent_evidence(d.report):
        findings.append(
            _finding(
                "missing-operational-evidence",
                f"report {d.report} names no {', '.join(absent)}",
            )
        )
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
    return findings + _description_extras(d)


def _description_extras(d: BenchmarkDescription) -> list[Finding]:
    findings: list[Finding] = []
    if not d.warmup_requests and not d.warmup_seconds:
        findings.append(
            _finding(
                "no-warmup",
                f"warmup_requests {d.warmup_requests!r}, warmup_seconds {d.warmup_seconds!r}",
            )
        )
    if (d.repeats or 1) < 2:
        findings.append(_finding("single-run", f"repeats {d.repeats!r}: one run per point"))
    if d.tokenizer_revision is None:
        findings.append(
            _finding(
                "unvalidated-token-counts",
                "tokenizer_revision not given: token counts are tied to no tokenizer",
            )
        )
    return findings


def lint_pack(pack: Pack) -> list[Finding]:
    findings: list[Finding] = []
    open_rates = pack.sweep.has_open_loop or bool(pack.experiments)
    if not open_rates:
        findings.append(
            _finding(
                "concurrency-only-load",
                "sweep.open_loop_rps is empty and there are no rate experiments: only "
                f"closed-loop concurrency {pack.sweep.closed_loop_concurrency} is measured",
            )
        )
    gate = pack.acceptance.min_successful_samples_per_class
    counts = in_turns(pack, pack.class_counts(pack.client.initial_scheduled_requests))
    short = {c: n for c, n in counts.items() if n < gate}
    if short and not pack.client.replays_verbatim:  # its rows, not the quota: trace_lint
        findings.append(
            _finding(
                "too-few-requests",
                f"client.initial_scheduled_requests {pack.client.initial_scheduled_requests} "
                f"gives {short} scheduled requests, below "
                f"acceptance.min_successful_samples_per_class {gate}",
            )
        )
    findings += _pack_cache_findings(pack)
    if not _reports_percentiles(list(pack.report.latency_statistics)):
        findings.append(
            _finding(
                "mean-only-reporting",
                f"report.latency_statistics {list(pack.report.latency_statistics)} has no "
                "percentile",
            )
        )
    if pack.acceptance.error_rate_max >= 1:
        findings.append(
            _finding(
                "missing-operational-evidence",
                f"acceptance.error_rate_max {pack.acceptance.error_rate_max:g} accepts a point "
                "whatever share of its requests fail: errors are absent from the decision",
            )
        )
    bad = mutable_revision_fields(pack)
    if bad:
        findings.append(_finding("mutable-versions", "; ".join(f"{k} = {v!r}" for k, v in bad)))
    return findings + _pack_extras(pack)


def _pack_cache_findings(pack: Pack) -> list[Finding]:
    cache_on = pack.engine.prefix_cache == "enabled"
    if cache_on and pack.prompts.source == "repeat":
        return [
            _finding(
                "uncontrolled-prefix-cache",
                "prompts.source 'repeat' with engine.prefix_cache 'enabled'",
            )
        ]
    if (
        cache_on
        and "cold" in pack.all_cache_states()
        and isinstance(pack.target, OpenAITarget)
        and pack.target.cache_reset == "none"
        # A managed server is started fresh for every point: cold by construction.
        and pack.target.managed is None
    ):
        return [
            _finding(
                "uncontrolled-prefix-cache",
                "cold-cache points against a target with engine.prefix_cache 'enabled' but "
                "target.cache_reset 'none': the cache cannot be cleared between points",
            )
        ]
    return []


def _pack_extras(pack: Pack) -> list[Finding]:
    findings: list[Finding] = []
    if pack.client.warmup_seconds <= 0:
        findings.append(_finding("no-warmup", "client.warmup_seconds is 0"))
    has_points = pack.sweep.has_open_loop or bool(pack.sweep.closed_loop_concurrency)
    if pack.pack.size == "full" and has_points and pack.sweep.repeats < 2:
        findings.append(
            _finding(
                "single-run",
                f"sweep.repeats {pack.sweep.repeats} in a full-size pack (pack.size 'full')",
            )
        )
    findings += _undecidable_gate(pack)
    if not pack.request.include_usage:
        findings.append(
            _finding(
                "unvalidated-token-counts",
                "request.include_usage is false: the server's usage is never read, so the "
                "recorded output tokens are the client's own count",
            )
        )
    return findings


def decision_sample(pack: Pack) -> int | None:
    """N: the fewest successful requests of a class that can pass its attainment gate."""
    a = pack.acceptance
    return min_samples_to_pass(a.class_slo_attainment_min, a.attainment_confidence)


def _lowest_rate(pack: Pack) -> float | None:
    search = getattr(pack.sweep, "search", None)
    initial = getattr(search, "initial", None) if search is not None else None
    rates = initial if isinstance(initial, list) and initial else pack.sweep.open_loop_rps
    return min(rates) if rates else None


def class_reach(pack: Pack, rate: float) -> dict[str, int]:
    """The most requests of each class one open-loop point at ``rate`` sends: its initial quota
    or, extended, the rate x mix x ``client.maximum_duration_seconds``."""
    initial = pack.class_counts(pack.client.initial_scheduled_requests)
    span = pack.client.maximum_duration_seconds
    arrivals = {c.name: max(initial[c.name], int(rate * c.mix * span)) for c in pack.workload}
    return in_turns(pack, arrivals)


def in_turns(pack: Pack, arrivals: dict[str, int]) -> dict[str, int]:
    """Requests from scheduled arrivals: a session class's arrival is a session of E[K] turns
    on average (:func:`capacity_pack.plan.sessions.mean_turns`), each one request."""
    return {
        c.name: int(arrivals[c.name] * (mean_turns(c.session) if c.session else 1))
        for c in pack.workload
    }


def _undecidable_gate(pack: Pack) -> list[Finding]:
    need, rate = decision_sample(pack), _lowest_rate(pack)
    if need is None or rate is None or pack.client.replays_verbatim:
        return []
    short = {c: n for c, n in class_reach(pack, rate).items() if n < need}
    if not short:
        return []
    a = pack.acceptance
    return [
        _finding(
            "undecidable-gate",
            f"at the lowest rate {rate:g} RPS a point sends at most {short} requests (class "
            f"quota or rate x mix x client.maximum_duration_seconds "
            f"{pack.client.maximum_duration_seconds:g}); a class needs at least {need} successful "
            f"requests to pass acceptance.class_slo_attainment_min {a.class_slo_attainment_min:g} "
            f"at acceptance.attainment_confidence {a.attainment_confidence:g}, even when every "
            "request meets its SLO",
        )
    ]


def lint_notes(pack: Pack) -> list[str]:
    """What the pack's author should know that refuses nothing (module docstring)."""
    need, gate = decision_sample(pack), pack.acceptance.min_successful_samples_per_class
    if need is None or gate >= need or pack.client.replays_verbatim:
        return verbatim_trace_notes(pack)
    return [
        f"acceptance.min_successful_samples_per_class {gate} is below {need}, the fewest "
        f"successful requests at which a class can pass class_slo_attainment_min "
        f"{pack.acceptance.class_slo_attainment_min:g} at attainment_confidence "
        f"{pack.acceptance.attainment_confidence:g}: points extend past the sample gate until "
        f"every class reaches {need} or its verdict is certain (up to "
        f"client.maximum_duration_seconds)"
    ]


def is_pack_data(data: dict) -> bool:
    """Whether ``data`` is meant as a pack: it has a section no plain description has (both
    have ``prompts`` and ``report``)."""
    return any(key in PACK_ONLY_SECTIONS for key in data)


def lint_data(data: Any, source: str) -> list[Finding]:
    """The findings of a pack (validated as freeze validates it, :class:`ManifestError` if it
    is invalid) or of a plain benchmark description."""
    data = unwrap_frozen(data)
    if not isinstance(data, dict):
        raise ManifestError(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    if is_pack_data(data):
        return lint_pack(validate_pack(data, source))
    try:
        description = BenchmarkDescription.model_validate(data)
    except ValidationError as err:
        raise ManifestError(format_validation_error(err, source)) from None
    return lint_description(description)


def lint_file(path: str | Path) -> list[Finding]:
    return lint_data(load_yaml(path), str(path))
