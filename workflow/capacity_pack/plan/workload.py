"""What the pack sends and how it is judged: the request shape, the prompts and their shared
prefixes, the workload classes (lengths, SLO cutoffs, multi-turn sessions), the acceptance gate
and the latency statistics the report states."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_serializer

from capacity_pack.plan.lengths import EmpiricalLength, LengthSpec, LognormalLength
from capacity_pack.plan.limits import MAX_SHARED_PREFIXES, MAX_TOKENS
from capacity_pack.plan.section import NAME_PATTERN, Section


class Sampling(Section):
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(default=-1, description="Top-k (-1: off).")
    seed: int | None = Field(default=None, description="Per-request sampling seed, if any.")


class Stop(Section):
    ignore_eos: bool = Field(
        default=True, description="Generate exactly max_tokens (fixed-length classes need it)."
    )
    stop_sequences: list[str] = Field(default_factory=list, description="Stop strings.")


class RequestShape(Section):
    sampling: Sampling = Field(default_factory=Sampling, description="Sampling parameters.")
    stop: Stop = Field(default_factory=Stop, description="Stop behaviour.")
    chat_template: str = Field(
        default="none", description="Chat template revision ('none' for raw completions)."
    )
    include_usage: bool = Field(default=True, description="Ask for the final usage chunk.")


class PrefixSpec(Section):
    shared_prefixes: int = Field(
        ge=1, le=MAX_SHARED_PREFIXES, description="Size of the versioned shared-prefix set."
    )
    prefix_tokens: int = Field(ge=1, description="Tokens in each shared prefix.")
    distribution: Literal["zipf", "uniform"] = Field(
        default="zipf", description="How often each prefix is used."
    )
    zipf_exponent: float = Field(default=1.1, gt=0, description="Zipf exponent s (zipf only).")
    revision: str = Field(description="Version of the prefix set (immutable).")


class Prompts(Section):
    source: Literal["synthetic", "repeat"] = Field(
        description="'synthetic': seeded natural-language-like text; 'repeat': one prompt reused."
    )
    corpus_revision: str = Field(description="Revision of the text generator/corpus.")
    cold_unique_prefix_tokens: int = Field(
        default=8, ge=1, description="Unique leading tokens that defeat prefix reuse when cold."
    )
    prefix: PrefixSpec | None = Field(
        default=None, description="Shared-prefix distribution of warm-cache points."
    )


class GeometricTurns(Section):
    """Turns per session on {1, 2, ...}: geometric with success probability 1 / mean, clipped."""

    distribution: Literal["geometric"] = Field(description="Distribution kind.")
    mean: float = Field(ge=1, le=MAX_TOKENS, description="Mean turns before clipping.")
    max: int = Field(ge=1, le=MAX_TOKENS, description="Draws above this are clipped to it.")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.minimum(rng.geometric(1.0 / self.mean, size=n), self.max).astype(np.int64)


class ThinkTime(Section):
    """The user's pause between a turn's answer and the next turn's send."""

    distribution: Literal["exponential", "fixed"] = Field(
        default="exponential", description="Exponential with this mean, or always the mean."
    )
    mean_s: float = Field(ge=0, description="Mean think time in seconds.")
    max_s: float | None = Field(default=None, ge=0, description="Draws above this are clipped.")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        s = (
            rng.exponential(self.mean_s, size=n)
            if self.distribution == "exponential"
            else (np.full(n, self.mean_s))
        )
        return np.minimum(s, self.max_s) if self.max_s is not None else s


class SessionSpec(Section):
    """A multi-turn session class (:mod:`capacity_pack.plan.sessions`): each arrival of the
    class is a session whose turns resend the conversation so far plus a new user message."""

    turns: int | GeometricTurns | LognormalLength | EmpiricalLength = Field(
        description="Turns per session: fixed, or geometric/lognormal/empirical with a max."
    )
    think_time: ThinkTime = Field(description="Pause between an answer and the next turn.")

    @field_validator("turns")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 1:
            raise ValueError("a session needs at least one turn")
        return v

    @property
    def max_turns(self) -> int:
        t = self.turns
        return t if isinstance(t, int) else (t.max if hasattr(t, "max") else t.stats().max)


class WorkloadClass(Section):
    name: str = Field(pattern=NAME_PATTERN, description="Class name (lower_snake_case).")
    mix: float = Field(gt=0, le=1, description="Share of requests in this class.")
    input_tokens: LengthSpec
    output_tokens: LengthSpec
    request_ttft_cutoff_ms: float = Field(gt=0, description="Per-request TTFT cutoff.")
    request_tpot_cutoff_ms: float = Field(gt=0, description="Per-request TPOT cutoff.")
    session: SessionSpec | None = Field(
        default=None,
        description="Multi-turn sessions: each arrival is a session, input_tokens each turn's "
        "new user message, output_tokens each answer.",
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        # A class without sessions dumps as before: its manifest and section hashes are unchanged.
        out = handler(self)
        if isinstance(out, dict) and out.get("session") is None:
            out.pop("session", None)
        return out

    @field_validator("input_tokens", "output_tokens")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 1:
            raise ValueError("a fixed token count must be at least 1")
        return v


class Acceptance(Section):
    class_slo_attainment_min: float = Field(
        gt=0, le=1, description="Joint TTFT+TPOT attainment each class needs."
    )
    min_successful_samples_per_class: int = Field(
        ge=1, description="Successful rows each class needs for a decision."
    )
    error_rate_max: float = Field(ge=0, le=1, description="Global error-rate cap.")
    queue_trend_required: Literal["flat"] = Field(default="flat")
    target_utilization: float = Field(gt=0, le=1, description="Planned utilization policy.")
    p99_min_samples: int = Field(
        default=10_000, ge=1, description="P99 withheld below this many successful rows."
    )
    per_class_error_rate_max: float | None = Field(
        default=None, ge=0, le=1, description="Optional per-class error gate."
    )
    all_attempt_attainment_min: float | None = Field(
        default=None, gt=0, le=1, description="Optional attainment over all attempts."
    )
    attainment_confidence: float = Field(
        default=0.95,
        ge=0.5,
        le=0.999,
        description="Confidence of the attainment bound (a confidence sequence) that decides "
        "a class pass/fail, in the analysis and while a point runs.",
    )


class Report(Section):
    latency_statistics: list[Literal["mean", "p50", "p90", "p95", "p99", "p99.9", "max"]] = Field(
        default_factory=lambda: ["p50", "p95", "p99"],
        description="Latency statistics reported per class.",
    )
    percentile_method: Literal["nearest_rank"] = Field(default="nearest_rank")
