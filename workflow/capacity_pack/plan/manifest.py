"""The pack manifest: one pydantic schema, validation, and the canonical frozen form.

A *pack* is everything that defines a capacity experiment: the frozen serving system (model,
engine, placement), the client (arrival process, seed, durations, timeouts), the request
shape (sampling, stop behaviour, chat template), the prompt source and prefix distribution,
the workload classes with their per-request SLO cutoffs, the acceptance gate, the target
endpoint, the sweep, named load-shape experiments, and the sizing plan. Its sections are those
of a workload manifest (``model``, ``engine``, ``client``, ``workload``, ``acceptance``), with
key names such as ``model.revision``, ``client.warmup_seconds``,
``workload[].request_ttft_cutoff_ms`` and ``acceptance.class_slo_attainment_min``.

Formulas held here:

- weighted mean tokens = sum_c mix_c * E[tokens_c]; for a 0.70/0.20/0.10 mix of
  1,024/8,192/512 input and 128/256/1,024 output tokens: 2,406.4 input / 243.2 output
- lognormal lengths from a stated p50 and p95:  mu = ln p50,  sigma = (ln p95 - ln p50) / z_0.95
  with z_0.95 = 1.6448536; draws are rounded and clipped to [min, max], and the reported mean is
  that of the clipped distribution: E[clip(X, a, b)] = a Phi(la) + b (1 - Phi(lb))
  + e^(mu + sigma^2/2) (Phi(lb - sigma) - Phi(la - sigma)), with lx = (ln x - mu) / sigma.
- class schedule counts: largest remainder over n * mix_c (ties broken by class order), so the
  counts always sum to n exactly (22,000 x 0.7/0.2/0.1 -> 15,400/4,400/2,200).

Freezing (:func:`freeze`) validates the pack, refuses mutable revisions, hashes referenced data
files into the manifest, and returns a canonical document with a sha256 of the whole pack and of
each top-level section (every field of :class:`Pack` is a section, ``failure`` included). The
Snakefile hashes the same sections into rule ``params`` so that a change reruns only the stages
that read it.

Input hygiene. A pack file must be UTF-8 text, YAML without duplicate keys
(:mod:`capacity_pack.plan.yamlfile`), and a mapping at the top. ``cutoff`` is a date (YAML
``2026-11-29`` or the string "2026-11-29"), never a number or a date-time. Every number is
finite and within the bound of its unit, every revision-like field is checked for mutable
names (both in :mod:`capacity_pack.plan.limits`); a pack may schedule at most
``MAX_REQUESTS`` requests per point (open: max(initial, rate x minimum duration) + rate x
warm-up; closed: max(min requests, per-worker x concurrency) + one warm-up request per worker;
an experiment: the area under its rate profile plus its peak rate x warm-up; a drill: its rate
x duration), and an open-loop point's initial requests must arrive within ``MAX_DURATION_S``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import date, datetime
from pathlib import Path
from statistics import NormalDist
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from capacity_pack import __version__
from capacity_pack.errors import StatedError
from capacity_pack.io import file_sha256, sha256_of_obj
from capacity_pack.plan.limits import (
    MAX_ARRIVAL_CV,
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_INT,
    MAX_REQUESTS,
    MAX_SHARED_PREFIXES,
    MAX_TOKENS,
    MIN_OPEN_LOOP_RPS,
    check_bound,
    is_mutable_revision,
)
from capacity_pack.plan.traces import check_classes, read_trace, trace_summary, verbatim_rates
from capacity_pack.plan.yamlfile import TextInputError, decode_utf8, parse_yaml, shorten
from capacity_pack.redact import watch_env
from capacity_pack.vocab.percentile import rank_index

FROZEN_FORMAT = "capacity-pack/frozen-manifest/v1"
Z_95 = NormalDist().inv_cdf(0.95)

SECTIONS = (
    "pack",
    "cutoff",
    "model",
    "engine",
    "client",
    "request",
    "prompts",
    "workload",
    "acceptance",
    "target",
    "sweep",
    "experiments",
    "plan",
    "report",
    "failure",
)

NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
SLUG_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"


class ManifestError(StatedError, ValueError):
    """A pack configuration that cannot be used; the message names the file and field."""


# A pack's commands (restart_command, managed.prepare, drill commands) run with a timeout of
# their own; a day is beyond any restart or build, and a larger number is a typo.
COMMAND_TIMEOUT_MAX_S = 86_400.0


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=False, validate_default=True, allow_inf_nan=False
    )

    @field_validator("*", mode="after")
    @classmethod
    def _bounded(cls, value: Any, info: ValidationInfo) -> Any:
        # Every number of every section, in lists and mappings too: no stage then overflows.
        name = info.field_name or ""
        if isinstance(value, dict | list | tuple):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                try:
                    check_bound(name, item)
                except ValueError as err:
                    raise ValueError(f"[{key!r}] = {item!r}: {err}") from None
        else:
            check_bound(name, value)
        return value


# ---------------------------------------------------------------------------------------------
# Length distributions
# ---------------------------------------------------------------------------------------------


class LengthStats(_Model):
    """Summary of a token-length distribution, as reported in the frozen manifest."""

    mean: float = Field(description="Expected tokens per request (after rounding and clipping).")
    p50: int = Field(description="Median tokens (nearest rank for empirical data).")
    p95: int = Field(description="95th percentile tokens.")
    p99: int = Field(description="99th percentile tokens.")
    max: int = Field(description="Largest possible (or observed) tokens.")
    fixed: bool = Field(description="True when every request has exactly this length.")


class LognormalLength(_Model):
    """Lognormal token lengths parameterised by their median and 95th percentile."""

    distribution: Literal["lognormal"] = Field(description="Distribution kind.")
    p50: float = Field(gt=0, le=MAX_TOKENS, description="Median length in tokens.")
    p95: float = Field(
        gt=0, le=MAX_TOKENS, description="95th percentile length in tokens; must exceed p50."
    )
    min: int = Field(default=1, ge=1, le=MAX_TOKENS, description="Draws below this are raised.")
    max: int = Field(
        ge=1, le=MAX_TOKENS, description="Draws above this are clipped to it (context limit)."
    )

    @model_validator(mode="after")
    def _check(self) -> LognormalLength:
        if self.p95 <= self.p50:
            raise ValueError(f"p95 ({self.p95}) must be greater than p50 ({self.p50})")
        if self.max < self.p95:
            raise ValueError(f"max ({self.max}) must be at least p95 ({self.p95})")
        if self.min > self.p50:
            raise ValueError(f"min ({self.min}) must not exceed p50 ({self.p50})")
        return self

    @property
    def mu(self) -> float:
        return math.log(self.p50)

    @property
    def sigma(self) -> float:
        return (math.log(self.p95) - math.log(self.p50)) / Z_95

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        draws = rng.lognormal(self.mu, self.sigma, size=n)
        return np.clip(np.rint(draws), self.min, self.max).astype(np.int64)

    def stats(self) -> LengthStats:
        nd = NormalDist()
        mu, s, hi, lo = self.mu, self.sigma, self.max, self.min

        def q(p: float) -> int:
            return int(min(hi, max(lo, round(math.exp(mu + s * nd.inv_cdf(p))))))

        def cdf(x: float, shift: float = 0.0) -> float:
            return nd.cdf((math.log(x) - mu - shift) / s)

        # E[clip(X, lo, hi)] = lo P(X<lo) + E[X; lo<=X<=hi] + hi P(X>hi)
        partial = math.exp(mu + s * s / 2) * (cdf(hi, s * s) - cdf(lo, s * s))
        mean = lo * cdf(lo) + partial + hi * (1 - cdf(hi))
        return LengthStats(mean=mean, p50=q(0.5), p95=q(0.95), p99=q(0.99), max=hi, fixed=False)


class EmpiricalLength(_Model):
    """Token lengths resampled from a file of observed lengths (CSV or parquet column)."""

    distribution: Literal["empirical"] = Field(description="Distribution kind.")
    path: str = Field(description="CSV or parquet file, relative to the working directory.")
    column: str = Field(default="tokens", description="Column holding one length per row.")
    sha256: str | None = Field(
        default=None,
        description="sha256 of the file; filled in at freeze, verified when given.",
    )
    _values: np.ndarray | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _load(self) -> EmpiricalLength:
        path = Path(self.path)
        if not path.is_file():
            raise ValueError(f"empirical length file {self.path!r} does not exist")
        digest = file_sha256(path)
        if self.sha256 is not None and self.sha256 != digest:
            raise ValueError(
                f"empirical length file {self.path!r} has sha256 {digest}, "
                f"but the manifest pins {self.sha256}: the file changed"
            )
        self.sha256 = digest
        values = _read_column(path, self.column)
        if values.size == 0:
            raise ValueError(f"empirical length file {self.path!r} has no rows")
        if not np.all(np.isfinite(values)) or np.any(values < 1) or np.any(values % 1 != 0):
            bad = int(np.argmax(~np.isfinite(values) | (values < 1) | (values % 1 != 0)))
            raise ValueError(
                f"{self.path}: row {bad + 1} of column {self.column!r} is {values[bad]!r}; "
                "expected a positive whole number of tokens"
            )
        self._values = values.astype(np.int64)
        return self

    @property
    def values(self) -> np.ndarray:
        assert self._values is not None
        return self._values

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(self.values, size=n, replace=True)

    def stats(self) -> LengthStats:
        v = np.sort(self.values)

        def q(p: float) -> int:
            return int(v[rank_index(p, v.size)])

        return LengthStats(
            mean=float(v.mean()), p50=q(0.5), p95=q(0.95), p99=q(0.99), max=int(v[-1]), fixed=False
        )


def _read_column(path: Path, column: str) -> np.ndarray:
    import pandas as pd

    if path.suffix in {".parquet", ".pq"}:
        frame = pd.read_parquet(path, columns=[column])
    else:
        frame = pd.read_csv(path)
        if column not in frame.columns:
            raise ValueError(f"{path}: no column {column!r} (columns: {list(frame.columns)})")
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)


LengthSpec = Annotated[
    int | LognormalLength | EmpiricalLength,
    Field(description="A fixed token count, or a lognormal/empirical distribution."),
]


def length_stats(spec: int | LognormalLength | EmpiricalLength) -> LengthStats:
    if isinstance(spec, int):
        return LengthStats(mean=float(spec), p50=spec, p95=spec, p99=spec, max=spec, fixed=True)
    return spec.stats()


def sample_lengths(
    spec: int | LognormalLength | EmpiricalLength, rng: np.random.Generator, n: int
) -> np.ndarray:
    if isinstance(spec, int):
        return np.full(n, spec, dtype=np.int64)
    return spec.sample(rng, n)


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


class PackInfo(_Model):
    name: str = Field(pattern=SLUG_PATTERN, description="Pack id; names results/<name>/.")
    title: str = Field(description="Human title shown in reports.")
    size: Literal["rehearsal", "full"] = Field(
        description="'rehearsal' marks a scaled-down pack whose numbers are not a capacity claim."
    )
    description: str = Field(default="", description="What this pack is for.")

    @property
    def label(self) -> str:
        if self.size == "rehearsal":
            return "REHEARSAL-SIZE PACK: scaled-down sample sizes; not a capacity claim"
        return "FULL-SIZE PACK"


class Placement(_Model):
    tp: int = Field(ge=1, description="Tensor-parallel degree.")
    pp: int = Field(default=1, ge=1, description="Pipeline-parallel degree.")
    dp: int = Field(ge=1, description="Data-parallel degree (engine instances).")
    replicas: int = Field(ge=1, description="Independently routed serving replicas.")
    gpus: int = Field(ge=1, description="Total GPUs of the deployment under test.")

    @model_validator(mode="after")
    def _check(self) -> Placement:
        if self.gpus != self.tp * self.pp * self.dp:
            raise ValueError(
                f"gpus ({self.gpus}) must equal tp x pp x dp = {self.tp * self.pp * self.dp}"
            )
        return self


class ModelArchitecture(_Model):
    """The served model's shape for its engine model (``capacity_pack.twin.architecture``)."""

    config: str = Field(
        min_length=1,
        description="Path of a Hugging Face config.json-style file (num_hidden_layers, "
        "hidden_size, num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, "
        "tie_word_embeddings), relative to the working directory or the project root.",
    )
    bytes_per_param: float = Field(gt=0, description="Weight bytes per parameter (bf16: 2).")
    kv_bytes_per_element: float = Field(default=2.0, gt=0, description="KV-cache element bytes.")


class HardwarePeaks(_Model):
    """Peak figures of one accelerator (or host) of a replica, where they are known."""

    name: str = Field(default="declared", min_length=1, description="Accelerator name.")
    memory_gib: float = Field(gt=0, description="Memory per GPU in GiB.")
    bandwidth_tb_s: float | None = Field(default=None, gt=0, description="Peak TB/s per GPU.")
    dense_tflops: float | None = Field(default=None, gt=0, description="Peak TFLOP/s per GPU.")


class Model(_Model):
    id: str = Field(min_length=1, description="Model identifier.")
    revision: str = Field(description="Immutable model revision (checkpoint hash or tag).")
    tokenizer_revision: str = Field(description="Immutable tokenizer revision.")
    precision: str = Field(min_length=1, description="Weight precision, e.g. bf16, fp8.")
    served_name: str | None = Field(
        default=None, description="Model name sent in requests; defaults to id."
    )
    architecture: ModelArchitecture | None = Field(
        default=None,
        description="The model's shape, for calibrating its engine model (a real target).",
    )


class Engine(_Model):
    name: str = Field(min_length=1, description="Serving engine, e.g. vllm, sglang.")
    version: str = Field(description='Immutable engine version (quote it in YAML: "1.0").')
    placement: Placement = Field(description="Parallelism and GPU count of the deployment.")
    prefix_cache: Literal["enabled", "disabled"] = Field(description="Automatic prefix caching.")
    speculative_decoding: Literal["enabled", "disabled"] = Field(default="disabled")
    disaggregated_prefill: Literal["enabled", "disabled"] = Field(default="disabled")
    scheduler: str = Field(
        default="default", description="Scheduler policy/revision, frozen with the engine."
    )
    config: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Further engine arguments (max_num_seqs, max_num_batched_tokens, ...).",
    )
    metric_names: str | None = Field(
        default=None,
        description="Metric-name map for alerts and dashboards (vllm, sglang, capacity-pack-sim);"
        " default: the simulator's for a simulated target, else chosen by the engine name.",
    )
    device: Literal["gpu", "cpu"] = Field(
        default="gpu",
        description="What the engine computes on, which the reports' words follow: 'gpu' (an "
        "accelerator; the plan counts GPUs) or 'cpu' (a CPU server such as llama.cpp's "
        "llama-server; the plan counts hosts, placement.gpus and plan.gpus_per_replica then "
        "count hosts).",
    )
    hardware: HardwarePeaks | None = Field(
        default=None,
        description="Peaks of one accelerator of a replica, for the calibrated engine model "
        "(unknown: the fit's achieved rates stand as nominal peaks).",
    )


class TraceClassRule(_Model):
    """One class rule of a trace without a class column: requests up to ``max_input_tokens``
    input tokens (any, when unset) that no earlier rule took go to class ``name``."""

    name: str = Field(pattern=NAME_PATTERN, description="A workload class of the pack.")
    max_input_tokens: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS, description="Upper bound of input length (inclusive)."
    )


class TraceSpec(_Model):
    path: str = Field(description="The trace file, relative to the working directory.")
    format: Literal["capacity-pack", "mooncake", "azure"] = Field(
        default="capacity-pack",
        description="Layout: 'capacity-pack' (CSV/parquet: offset_s, class, input_tokens, "
        "output_tokens), 'mooncake' (JSON Lines: timestamp ms, input_length, output_length, "
        "hash_ids) or 'azure' (CSV: TIMESTAMP, ContextTokens, GeneratedTokens).",
    )
    replay: Literal["stretch", "verbatim"] | None = Field(
        default=None,
        description="'stretch': offsets scaled so the trace's mean rate is each open-loop "
        "point's rate; 'verbatim': timestamps as recorded (times a time scale), one open-loop "
        "point per time scale at the trace's own rate. Default: stretch for capacity-pack, "
        "verbatim for mooncake and azure.",
    )
    time_scales: list[Annotated[float, Field(gt=0, le=1000)]] = Field(
        default_factory=lambda: [1.0],
        min_length=1,
        description="Verbatim replay: each factor s replays t' = s x t (0.5: twice as fast), "
        "one open-loop point each.",
    )
    classes: list[TraceClassRule] = Field(
        default_factory=list,
        description="Class rules for a layout without a class column (mooncake, azure), first "
        "match wins; empty: every request is the pack's only class.",
    )
    block_tokens: int = Field(
        default=512, ge=1, le=MAX_TOKENS, description="Tokens per hash id (mooncake: 512)."
    )
    time_column: str = Field(default="offset_s", description="Arrival offset in seconds.")
    class_column: str = Field(default="class", description="Workload class of each arrival.")
    input_column: str | None = Field(default="input_tokens", description="Input tokens column.")
    output_column: str | None = Field(default="output_tokens", description="Output tokens column.")
    sha256: str | None = Field(default=None, description="Filled in when read; verified if given.")

    @model_validator(mode="after")
    def _pin(self) -> TraceSpec:
        # The file's content is part of the manifest, so a changed trace is a changed manifest.
        path = Path(self.path)
        if not path.is_file():
            raise ValueError(f"trace file {self.path!r} does not exist")
        digest = file_sha256(path)
        if self.sha256 is not None and self.sha256 != digest:
            raise ValueError(
                f"trace file {self.path!r} has sha256 {digest} but the manifest pins "
                f"{self.sha256}: the file changed"
            )
        self.sha256 = digest
        if self.replay is None:
            self.replay = "stretch" if self.format == "capacity-pack" else "verbatim"
        if self.replay == "stretch" and self.time_scales != [1.0]:
            raise ValueError("time_scales apply to replay 'verbatim' only")
        if self.format == "capacity-pack" and self.classes:
            raise ValueError("classes (rules) are for mooncake and azure traces; this one has "
                             f"a class column ({self.class_column!r})")  # fmt: skip
        if len(set(self.time_scales)) != len(self.time_scales):
            raise ValueError(f"time_scales has duplicates: {self.time_scales}")
        if self.format != "capacity-pack" and self.classes:
            self.arrivals()  # every row parses and takes a class: an error names the row
        return self

    @property
    def verbatim(self) -> bool:
        return self.replay == "verbatim"

    def arrivals(self, default_class: str | None = None) -> Any:
        """The trace's requests (:func:`capacity_pack.plan.traces.read_trace`); ``default_class``
        takes every request of a trace without class column or rules."""
        rules = [(r.name, r.max_input_tokens) for r in self.classes]
        if not rules and default_class is not None and self.format != "capacity-pack":
            rules = [(default_class, None)]
        return read_trace(
            self.path,
            self.format,
            class_rules=rules,
            time_column=self.time_column,
            class_column=self.class_column,
            input_column=self.input_column,
            output_column=self.output_column,
            block_tokens=self.block_tokens,
            sha256=self.sha256,
        )


class Client(_Model):
    location: str = Field(description="Where the load generator runs (host/zone).")
    streaming: bool = Field(default=True, description="Stream tokens (required for TTFT/ITL).")
    endpoint: Literal["completions", "chat_completions"] = Field(
        default="completions", description="OpenAI endpoint used for every request."
    )
    arrival_pattern: Literal["poisson", "gamma", "constant", "trace"] = Field(
        description="Arrival process of open-loop points."
    )
    arrival_cv: float = Field(
        default=1.0,
        gt=0,
        le=MAX_ARRIVAL_CV,
        description="Coefficient of variation of gamma inter-arrival gaps.",
    )
    trace: TraceSpec | None = Field(default=None, description="Arrival trace for 'trace'.")
    minimum_duration_seconds: float = Field(ge=0, description="Minimum measured window.")
    initial_scheduled_requests: int = Field(ge=1, description="Measured requests per point.")
    request_schedule_seed: int = Field(
        ge=0, le=MAX_INT, description="Seed every schedule derives from."
    )
    class_schedule_counts: dict[str, int] | None = Field(
        default=None, description="Optional check: must equal the stratified counts."
    )
    warmup_seconds: float = Field(ge=0, description="Warm-up traffic excluded from measurement.")
    maximum_duration_seconds: float = Field(gt=0, description="Hard stop for extension blocks.")
    extension_block_requests: int | None = Field(
        default=None, ge=1, description="Requests per extension block (default 10% of initial)."
    )
    request_timeout_seconds: float = Field(gt=0, description="Per-request timeout.")
    automatic_retries: bool = Field(default=False, description="Must be false.")
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="Optional client-side in-flight ceiling: an open-loop arrival beyond it is "
        "recorded as 'rejected', never delayed.",
    )
    lateness_bound_ms: float = Field(
        default=5.0,
        gt=0,
        description="Dispatch-lateness p99 above this marks the point client-bound.",
    )
    other_cpu_bound: float | None = Field(
        default=0.10,
        gt=0,
        le=1,
        description="Other processes' CPU (not niced) as a share of all the host's CPUs over a "
        "point's run, above which the point is disturbed: it decides nothing and a search "
        "measures the rate again (capacity_pack.measure.host); null: not checked.",
    )
    step_lateness_bound_ms: float | None = Field(
        default=25.0,
        gt=0,
        description="Simulated engine only: its step lateness p99 (loop wake-up minus the "
        "step's deadline) above this marks the point disturbed (the engine was starved of "
        "CPU); null: not checked.",
    )
    metrics_interval_seconds: float = Field(
        default=1.0, gt=0, description="Interval of the /metrics scrape and the backlog series."
    )
    cancellation_policy: Literal["none", "seeded_fraction"] = Field(
        default="none", description="'seeded_fraction' cancels a seeded share of requests."
    )
    cancel_fraction: float = Field(default=0.0, ge=0, le=1, description="Share to cancel.")
    cancel_after_seconds: float = Field(default=1.0, gt=0, description="Cancel after this long.")
    shards: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Client processes per open-loop point: the schedule is split into this many "
        "interleaved, seeded shards started against one shared start time (closed-loop points "
        "always run one process).",
    )
    shard_launcher: list[str] = Field(
        default_factory=list,
        description="argv prefix that starts each shard process ({shard} and {shards} are "
        "replaced), e.g. ['srun', '--nodes=1', '--ntasks=1', '--exclusive'] inside a Slurm "
        "allocation, or ['taskset', '-c', '{shard}']; empty: a local subprocess.",
    )
    shard_start_lead_seconds: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="The shared start is this long after the last shard reports ready.",
    )
    shard_ready_timeout_seconds: float = Field(
        default=120.0, gt=0, description="How long a shard waits for the others to be ready."
    )
    shard_clock_tolerance_ms: float = Field(
        default=1.0,
        gt=0,
        description="Realtime-vs-monotonic skew between shards (or drift within one) above this "
        "marks a sharded point invalid.",
    )
    realtime_dispatch: bool = Field(
        default=False,
        strict=True,  # true or false only: a privilege is never granted by a stray "1" or "on"
        description="Run the load generator's dispatcher thread under SCHED_FIFO (real-time, "
        "lowest priority) where the process is permitted (root or CAP_SYS_NICE): punctual sends "
        "on a busy client host, but a real-time thread is beyond what nice or a fair-share "
        "scheduler limits, so it is opt-in. The run summary reports whether it was requested "
        "and whether it took effect (realtime_dispatch, dispatcher_scheduling).",
    )

    pin_threads: bool = Field(
        default=True,
        strict=True,
        description="For each run, bind the load generator's event-loop thread and its "
        "dispatcher thread to CPUs of their own (the dispatcher to the highest CPU the process "
        "may use, the loop to the rest; local shards split the CPUs between them first), so a "
        "due send never waits behind the loop's stream reading. Needs two CPUs; the run "
        "summary says where each ran (thread_placement). Set false where other load generators "
        "(another pack's measurement) run on the same host at the same time: each would pin "
        "to the same CPUs.",
    )

    @field_validator("automatic_retries")
    @classmethod
    def _no_retries(cls, v: bool) -> bool:
        if v:
            raise ValueError(
                "automatic retries must be false: a retried request would mix logical requests "
                "and attempts in one population"
            )
        return v

    @property
    def replays_verbatim(self) -> bool:
        """Open-loop points replay the trace as recorded: never extended nor stopped early."""
        return self.arrival_pattern == "trace" and self.trace is not None and self.trace.verbatim

    @model_validator(mode="after")
    def _check(self) -> Client:
        if self.arrival_pattern == "trace" and self.trace is None:
            raise ValueError("arrival_pattern 'trace' needs a 'trace' block with the file path")
        if self.maximum_duration_seconds < self.minimum_duration_seconds:
            raise ValueError("maximum_duration_seconds must be >= minimum_duration_seconds")
        if self.cancellation_policy == "none" and self.cancel_fraction > 0:
            raise ValueError("cancel_fraction > 0 needs cancellation_policy 'seeded_fraction'")
        return self


class Sampling(_Model):
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(default=-1, description="Top-k (-1: off).")
    seed: int | None = Field(default=None, description="Per-request sampling seed, if any.")


class Stop(_Model):
    ignore_eos: bool = Field(
        default=True, description="Generate exactly max_tokens (fixed-length classes need it)."
    )
    stop_sequences: list[str] = Field(default_factory=list, description="Stop strings.")


class RequestShape(_Model):
    sampling: Sampling = Field(default_factory=Sampling, description="Sampling parameters.")
    stop: Stop = Field(default_factory=Stop, description="Stop behaviour.")
    chat_template: str = Field(
        default="none", description="Chat template revision ('none' for raw completions)."
    )
    include_usage: bool = Field(default=True, description="Ask for the final usage chunk.")


class PrefixSpec(_Model):
    shared_prefixes: int = Field(
        ge=1, le=MAX_SHARED_PREFIXES, description="Size of the versioned shared-prefix set."
    )
    prefix_tokens: int = Field(ge=1, description="Tokens in each shared prefix.")
    distribution: Literal["zipf", "uniform"] = Field(
        default="zipf", description="How often each prefix is used."
    )
    zipf_exponent: float = Field(default=1.1, gt=0, description="Zipf exponent s (zipf only).")
    revision: str = Field(description="Version of the prefix set (immutable).")


class Prompts(_Model):
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


class GeometricTurns(_Model):
    """Turns per session on {1, 2, ...}: geometric with success probability 1 / mean, clipped."""

    distribution: Literal["geometric"] = Field(description="Distribution kind.")
    mean: float = Field(ge=1, le=MAX_TOKENS, description="Mean turns before clipping.")
    max: int = Field(ge=1, le=MAX_TOKENS, description="Draws above this are clipped to it.")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.minimum(rng.geometric(1.0 / self.mean, size=n), self.max).astype(np.int64)


class ThinkTime(_Model):
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


class SessionSpec(_Model):
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


class WorkloadClass(_Model):
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


class Acceptance(_Model):
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


class SimTarget(_Model):
    kind: Literal["sim"] = Field(description="The embedded simulated engine.")
    profile: str = Field(pattern=SLUG_PATTERN, description="Simulator performance profile.")
    replicas: int = Field(default=1, ge=1, description="Simulated replicas behind a router.")
    router: Literal["round_robin", "least_outstanding"] = Field(default="least_outstanding")
    ground_truth: bool = Field(default=True, description="Write the server ground-truth log.")


class ManagedProcess(_Model):
    """A server the pack starts itself for every point (capacity_pack.measure.managed)."""

    prepare: list[str] | None = Field(
        default=None,
        description="argv run before the server starts (build-or-find); its last output line "
        "is {prepared}.",
    )
    prepare_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        le=COMMAND_TIMEOUT_MAX_S,
        allow_inf_nan=False,
        description="Most seconds prepare may run (then it is killed and the point fails).",
    )
    command: list[str] = Field(
        min_length=1,
        description="argv starting the server; placeholders {host}, {port}, {prepared}, "
        "{python} (the pipeline's interpreter), {package_file:PKG/PATH}.",
    )
    ready_path: str = Field(default="/health", description="GET path answering 200 when ready.")
    startup_timeout_s: float = Field(default=120.0, gt=0, description="Most seconds to ready.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")


class OpenAITarget(_Model):
    kind: Literal["openai"] = Field(description="Any OpenAI-compatible endpoint.")
    base_url: str = Field(pattern=r"^https?://", description="e.g. http://127.0.0.1:8000")
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable holding the API key (never the key).",
    )
    # The allowed names are the engines' (capacity_pack.engines, a layer above this one):
    # the pipeline, `capacity-pack freeze` and every measured point check the name there.
    cache_reset: str = Field(
        pattern=r"^[a-z][a-z0-9_.-]*$",
        description="How the prefix cache is cleared before a cold point: 'none', 'restart' "
        "(restart_command: the only way for an engine without a reset endpoint, such as TGI or "
        "TensorRT-LLM), or an engine's own reset as capacity_pack.engines registers it, e.g. "
        "'vllm' (POST /reset_prefix_cache), 'sglang' (POST /flush_cache), 'llamacpp' (POST "
        "/slots/{id}?action=erase for every slot; llama-server needs --slot-save-path).",
    )
    restart_command: list[str] | None = Field(
        default=None, description="argv that restarts the engine (cache_reset: restart)."
    )
    restart_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=COMMAND_TIMEOUT_MAX_S,
        allow_inf_nan=False,
        description="Most seconds restart_command may run (then it is killed and the point "
        "fails); the engine then has 120 s to answer /health.",
    )
    tokenizer_path: str | None = Field(
        default=None,
        description="Local tokenizer.json: prompts get exactly the scheduled input tokens.",
    )
    tokenize_endpoint: bool = Field(
        default=False,
        description="Fit prompts with the server's POST /tokenize instead (vLLM, SGLang).",
    )
    keep_alive: bool = Field(
        default=True,
        description="Reuse HTTP connections between requests; false sends Connection: close "
        "(llama.cpp's llama-server drops a reused connection after a few streamed responses).",
    )
    managed: ManagedProcess | None = Field(
        default=None,
        description="Start the server for every point on 127.0.0.1 and a free port (base_url is "
        "then replaced by the managed server's); a fresh process makes every point cold.",
    )
    identity_check: Literal["enforce", "warn", "off"] = Field(
        default="enforce",
        description="Before each point the server's engine, version and served model are probed "
        "and compared with the manifest: 'enforce' stops the measurement on a mismatch, 'warn' "
        "records it and measures, 'off' records the probe without comparing.",
    )
    tls_verify: bool = Field(
        default=True,
        description="Verify the https:// server's certificate; false measures an endpoint whose "
        "certificate cannot be checked, and every point's summary says so.",
    )
    ca_bundle: str | None = Field(
        default=None,
        description="PEM file of the CA certificates that sign the server's certificate (a "
        "private CA); default: the system's.",
    )

    @field_validator("api_key_env")
    @classmethod
    def _watch_key(cls, v: str | None) -> str | None:
        # The key's variable may have any name: from now on every log line, console write and
        # captured command output of this process redacts its value (capacity_pack.redact).
        watch_env(v)
        return v

    @model_validator(mode="after")
    def _one_tokenizer(self) -> OpenAITarget:
        if self.tokenizer_path is not None and self.tokenize_endpoint:
            raise ValueError("give tokenizer_path or tokenize_endpoint, not both")
        if self.tokenizer_path is not None and not Path(self.tokenizer_path).is_file():
            raise ValueError(f"tokenizer file {self.tokenizer_path!r} does not exist")
        return self

    @model_validator(mode="after")
    def _check(self) -> OpenAITarget:
        if self.cache_reset == "restart" and not self.restart_command:
            raise ValueError("cache_reset 'restart' needs restart_command")
        if self.ca_bundle is not None:
            if not self.tls_verify:
                raise ValueError("ca_bundle is unused with tls_verify false: give one or the other")
            if not self.base_url.startswith("https://"):
                raise ValueError("ca_bundle applies to an https:// base_url only")
            if not Path(self.ca_bundle).is_file():
                raise ValueError(f"ca_bundle {self.ca_bundle!r} does not exist")
        return self


#: The most rounds a boundary search may run (each a Snakemake checkpoint).
MAX_SEARCH_ROUNDS = 50


class ConcurrencySearch(_Model):
    """The closed-loop search: ``sweep.closed_loop_concurrency`` is its first round."""

    resolution: int = Field(
        default=1,
        ge=1,
        le=MAX_CONCURRENCY,
        description="Stop when the highest level meeting every class's SLO and the lowest "
        "level above it that does not differ by at most this many workers.",
    )
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        le=MAX_CONCURRENCY,
        description="Bound of the upward search (default 4 x the highest declared level).",
    )


class RateSearch(_Model):
    """The open-loop boundary search (capacity_pack.decide.search): round 1 is ``initial``,
    each later round bisects the bracket [highest passing rate, lowest failing rate above it]
    until it is within the resolution, or ``max_rounds`` search rounds ran."""

    initial: (
        list[Annotated[float, Field(ge=MIN_OPEN_LOOP_RPS)]] | Literal["auto", "predicted"] | None
    ) = Field(
        default=None,
        description="Round 1's rates; 'auto': 0.5, 0.75 and 1 x the closed-loop saturation "
        "request throughput; 'predicted': the ends and midpoint of the preflight prediction's "
        "bracket (a simulated target); omitted: sweep.open_loop_rps.",
    )
    resolution_rps: float | None = Field(
        default=None, gt=0, description="Stop when the bracket is at most this wide (RPS)."
    )
    resolution_rel: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="Stop when the bracket is at most this fraction of its passing rate wide.",
    )
    max_rounds: int = Field(
        default=6,
        ge=1,
        le=MAX_SEARCH_ROUNDS,
        description="Search rounds at most (round 1 included; confirmation rounds are not).",
    )
    min_rps: float | None = Field(
        default=None,
        ge=MIN_OPEN_LOOP_RPS,
        description="Bound of the downward search (default round 1's lowest rate / 8).",
    )
    max_rps: float | None = Field(
        default=None,
        ge=MIN_OPEN_LOOP_RPS,
        description="Bound of the upward search (default 4 x round 1's highest rate).",
    )
    extra_repeats: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Measurements beyond sweep.repeats the search may spend on an open-loop "
        "rate whose repeats decided nothing (client-bound: the load generator fell behind its "
        "schedule; disturbed: other work on the host beyond client.other_cpu_bound or "
        "step_lateness_bound_ms; or superseded: decided in run under another attainment gate "
        "and undecided at the pack's): such a rate is measured again at the next repeat index "
        "instead of being taken as not passing.",
    )
    pooled_steps: bool = Field(
        default=False,
        description="Each open-loop search step measures every repeat (sweep.repeats) of its "
        "new rates in one round, so a rate is decided on its pooled repeats as soon as it is "
        "measured; false: repeat 0 only, the other repeats confirming the final bracket's ends. "
        "For a search that starts near the boundary ('predicted'), where every rate it "
        "measures decides.",
    )
    concurrency: ConcurrencySearch | None = Field(
        default=None, description="Search the closed loop too (its operating point)."
    )

    @model_validator(mode="after")
    def _check(self) -> RateSearch:
        if (self.resolution_rps is None) == (self.resolution_rel is None):
            raise ValueError("give exactly one of resolution_rps and resolution_rel")
        if isinstance(self.initial, list):
            if not self.initial:
                raise ValueError("initial: give at least one rate, or 'auto'")
            ids = [f"{r:.6f}".rstrip("0").rstrip(".") for r in self.initial]
            if len(set(ids)) != len(ids):
                raise ValueError(f"initial has rates equal to 6 decimals: {self.initial}")
        if self.min_rps is not None and self.max_rps is not None and self.min_rps >= self.max_rps:
            raise ValueError(f"min_rps ({self.min_rps:g}) must be below max_rps ({self.max_rps:g})")
        return self

    def rate_bounds(self, first_round: Sequence[float]) -> tuple[float, float]:
        """The lowest and highest rate the search may measure, given round 1's rates."""
        return search_rate_bounds(self.min_rps, self.max_rps, first_round)


def judged_by_engine_model(target: Any, client: Any, workload: Sequence[Any]) -> bool:
    """Whether a pack's open-loop rate points are judged by the engine model as control variate
    (:mod:`capacity_pack.twin.control`): a simulated target of one replica (its profile is the
    model, whose long run is computed for one engine) and independent requests (no trace
    replay, no multi-turn sessions). Such a point measures to its maximum duration, no in-run
    stop (:func:`capacity_pack.measure.inputs.sequential_settings`)."""
    return (
        isinstance(target, SimTarget)
        and target.replicas == 1
        and client.arrival_pattern != "trace"
        and all(c.session is None for c in workload)
    )


def search_rate_bounds(
    min_rps: float | None, max_rps: float | None, first_round: Sequence[float]
) -> tuple[float, float]:
    """A rate search's bounds: ``min_rps`` (default round 1's lowest rate / 8, at least
    MIN_OPEN_LOOP_RPS) and ``max_rps`` (default 4 x round 1's highest), widened to round 1."""
    low = min_rps if min_rps is not None else max(MIN_OPEN_LOOP_RPS, min(first_round) / 8)
    high = max_rps if max_rps is not None else 4 * max(first_round)
    return min(low, min(first_round)), max(high, max(first_round))


class Sweep(_Model):
    open_loop_rps: list[Annotated[float, Field(ge=MIN_OPEN_LOOP_RPS)]] = Field(
        default_factory=list, description="Offered rates of the open-loop sweep."
    )
    closed_loop_concurrency: list[Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]] = Field(
        default_factory=list, description="Concurrency levels of the saturation sweep."
    )
    closed_loop_requests_per_worker: int = Field(
        default=10, ge=1, description="Closed-loop requests per point = this x concurrency..."
    )
    closed_loop_min_requests: int = Field(default=50, ge=1, description="...but at least this.")
    cache_states: list[Literal["cold", "warm"]] = Field(
        min_length=1, description="Cache-state families; never mixed in one point."
    )
    repeats: int = Field(default=1, ge=1, description="Repeats of every point (variance).")
    search: RateSearch | None = Field(
        default=None,
        description="Search the SLO boundary round by round instead of measuring only the "
        "declared rates (each round's points run repeat 0; the final bracket's, every repeat).",
    )

    @model_validator(mode="after")
    def _check(self) -> Sweep:
        for name in ("open_loop_rps", "closed_loop_concurrency", "cache_states"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name} has duplicates: {values}")
        # Point ids print a rate to 6 decimals (plan.schedule.format_level): two rates that print
        # alike would be one point.
        ids = [f"{r:.6f}".rstrip("0").rstrip(".") for r in self.open_loop_rps]
        if len(set(ids)) != len(ids):
            raise ValueError(f"open_loop_rps has rates equal to 6 decimals: {self.open_loop_rps}")
        if self.closed_loop_concurrency and 1 not in self.closed_loop_concurrency:
            raise ValueError(
                "closed_loop_concurrency must include 1: the single-user regime is always measured"
            )
        if self.search is not None:
            self._check_search(self.search)
        return self

    def _check_search(self, search: RateSearch) -> None:
        if (isinstance(search.initial, list) or search.initial == "predicted") and (
            self.open_loop_rps
        ):
            raise ValueError(
                "search.initial and open_loop_rps both name round 1's rates: give one of them"
            )
        if search.initial is None and not self.open_loop_rps:
            raise ValueError(
                "search: round 1 is sweep.open_loop_rps, which is empty; give it, or "
                "search.initial (rates, 'auto' or 'predicted')"
            )
        if search.initial == "auto" and not self.closed_loop_concurrency:
            raise ValueError(
                "search.initial 'auto' derives round 1 from the closed-loop throughput: "
                "closed_loop_concurrency is empty"
            )
        if search.concurrency is not None and not self.closed_loop_concurrency:
            raise ValueError(
                "search.concurrency: round 1 of the closed-loop search is "
                "closed_loop_concurrency, which is empty"
            )
        first = self.search_initial_rps
        if first is not None:
            if search.min_rps is not None and search.min_rps > min(first):
                raise ValueError(
                    f"search.min_rps ({search.min_rps:g}) is above round 1's lowest rate "
                    f"({min(first):g})"
                )
            if search.max_rps is not None and search.max_rps < max(first):
                raise ValueError(
                    f"search.max_rps ({search.max_rps:g}) is below round 1's highest rate "
                    f"({max(first):g})"
                )
        limit = search.concurrency.max_concurrency if search.concurrency else None
        if limit is not None and limit < max(self.closed_loop_concurrency):
            raise ValueError(
                f"search.concurrency.max_concurrency ({limit}) is below the highest level of "
                f"closed_loop_concurrency ({max(self.closed_loop_concurrency)})"
            )

    @property
    def search_initial_rps(self) -> list[float] | None:
        """Round 1's rates of the search (None: derived at run time, 'auto'; or no search)."""
        if self.search is None or self.search.initial in ("auto", "predicted"):
            return None
        return list(self.search.initial or self.open_loop_rps)

    @property
    def has_open_loop(self) -> bool:
        """Whether the pack measures open-loop rates (declared or searched)."""
        return bool(self.open_loop_rps) or self.search is not None

    @property
    def concurrency_bound(self) -> int | None:
        """The highest level the closed-loop search may measure (None: no closed search)."""
        if self.search is None or self.search.concurrency is None:
            return None
        limit = self.search.concurrency.max_concurrency
        return limit or min(MAX_CONCURRENCY, 4 * max(self.closed_loop_concurrency))


class Segment(_Model):
    duration_s: float = Field(gt=0, description="Segment length in seconds.")
    rate_rps: float | None = Field(default=None, ge=0, description="Constant rate (a step).")
    from_rps: float | None = Field(default=None, ge=0, description="Ramp start rate.")
    to_rps: float | None = Field(default=None, ge=0, description="Ramp end rate.")

    @model_validator(mode="after")
    def _check(self) -> Segment:
        step = self.rate_rps is not None
        ramp = self.from_rps is not None or self.to_rps is not None
        if step == ramp or (ramp and (self.from_rps is None or self.to_rps is None)):
            raise ValueError("a segment is either a step (rate_rps) or a ramp (from_rps, to_rps)")
        return self


class Spike(_Model):
    at_s: float = Field(ge=0, description="Spike start, seconds from the profile start.")
    duration_s: float = Field(gt=0, description="Spike length.")
    rate_rps: float = Field(gt=0, description="Rate added on top of the base profile.")


K6_TEST_TYPES = ("smoke", "average-load", "stress", "spike", "soak", "breakpoint")


class Experiment(_Model):
    name: str = Field(pattern=NAME_PATTERN, description="Experiment name.")
    test_type: Literal["smoke", "average-load", "stress", "spike", "soak", "breakpoint"] = Field(
        description="k6 load-test type this profile implements."
    )
    arrival_pattern: Literal["poisson", "gamma", "constant"] | None = Field(
        default=None, description="Defaults to client.arrival_pattern."
    )
    arrival_cv: float | None = Field(
        default=None, gt=0, le=MAX_ARRIVAL_CV, description="Gamma CV override."
    )
    segments: list[Segment] = Field(min_length=1, description="Piecewise rate profile.")
    spike: Spike | None = Field(default=None, description="A burst on top of the base profile.")
    cache_states: list[Literal["cold", "warm"]] = Field(default_factory=lambda: ["warm"])
    repeats: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> Experiment:
        if self.test_type == "spike" and self.spike is None:
            raise ValueError("a 'spike' experiment needs a 'spike' block")
        if self.test_type == "breakpoint":
            last = self.segments[-1]
            if last.to_rps is None or last.from_rps is None or last.to_rps <= last.from_rps:
                raise ValueError("a 'breakpoint' experiment must end in an increasing ramp")
        if self.spike is not None and self.spike.at_s >= self.total_duration_s:
            raise ValueError("the spike starts after the profile ends")
        area = sum(
            s.duration_s * (s.rate_rps if s.rate_rps is not None else (s.from_rps + s.to_rps) / 2)
            for s in self.segments
        )
        if area <= 0:
            raise ValueError("the rate profile sends no requests (every rate is 0)")
        if self.total_duration_s > MAX_DURATION_S:
            raise ValueError(
                f"the rate profile lasts {self.total_duration_s:g} s, above the bound of "
                f"{MAX_DURATION_S:,} seconds (30 days)"
            )
        if self.expected_requests > MAX_REQUESTS:
            raise ValueError(
                f"the rate profile sends {self.expected_requests:.4g} requests, above the bound of "
                f"{MAX_REQUESTS:,} requests per point"
            )
        return self

    @property
    def total_duration_s(self) -> float:
        return float(sum(s.duration_s for s in self.segments))

    @property
    def peak_rps(self) -> float:
        """The highest rate of the profile, spike included."""
        peak = max(max(g.rate_rps or 0, g.from_rps or 0, g.to_rps or 0) for g in self.segments)
        return peak + (self.spike.rate_rps if self.spike is not None else 0)

    @property
    def expected_requests(self) -> float:
        """Lambda(T), the area under the rate profile, plus the spike's rate x duration."""
        area = math.fsum(
            g.duration_s * (g.rate_rps if g.rate_rps is not None else (g.from_rps + g.to_rps) / 2)
            for g in self.segments
        )
        return area + (self.spike.rate_rps * self.spike.duration_s if self.spike else 0)


class MemorySpec(_Model):
    """What memory sizing and the fit probe need when the target is not the simulator."""

    accelerator_memory_gb: float = Field(gt=0, description="Memory of one replica's GPUs, GB.")
    weights_gb: float = Field(ge=0, description="Weights resident on one replica, GB.")
    overhead_gb: float = Field(ge=0, description="Runtime overhead (activations, graphs), GB.")
    kv_bytes_per_token: float = Field(gt=0, description="2 x layers x kv_heads x head_dim x bytes.")
    memory_utilization: float = Field(default=0.9, gt=0, le=1, description="Usable share.")
    margin_gb: float = Field(default=0.0, ge=0, description="Declared margin of the fit probe.")


class Plan(_Model):
    peak_rps: float = Field(gt=0, description="Forecast peak load to plan for.")
    target_utilization: float | None = Field(
        default=None, gt=0, le=1, description="Defaults to acceptance.target_utilization."
    )
    gpus_per_replica: int = Field(ge=1, description="GPUs in one replica (tp x pp).")
    replicas_under_test: int = Field(ge=1, description="Replicas the sweep measured.")
    redundancy_replicas: int = Field(default=0, ge=0, description="N+k: replicas for failures.")
    warm_pool_replicas: int = Field(default=0, ge=0, description="Warm pool for cold starts.")
    price_per_gpu_hour: float | None = Field(
        default=None, ge=0, description="GPU-hour price for cost per request (any currency)."
    )
    requests_per_task: float = Field(
        default=1.0, gt=0, description="Requests one completed task takes (agents: several)."
    )
    memory: MemorySpec | None = Field(
        default=None,
        description="Memory sizing inputs; for a simulated target they come from its profile.",
    )


DrillKind = Literal["replica_kill", "cold_replica", "kv_pressure", "cancellation", "degraded_link"]


class DrillCommands(_Model):
    """What a drill runs against a real target: argv lists, run as given (no shell)."""

    inject: list[str] = Field(
        min_length=1, description="argv run at the injection time, e.g. a kubectl delete pod line."
    )
    restore: list[str] | None = Field(
        default=None, description="argv run when the fault ends (none: the system heals itself)."
    )
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=COMMAND_TIMEOUT_MAX_S,
        allow_inf_nan=False,
        description="Most seconds inject or restore may run (then it is killed, and the drill "
        "records the action as timed out).",
    )


class Drill(_Model):
    """One failure drill: one mechanism, its own named experiment (never a combined score)."""

    name: str = Field(
        pattern=NAME_PATTERN, description="Drill name (results/<pack>/failure/<name>)."
    )
    kind: DrillKind = Field(description="The failure mechanism the drill injects.")
    replica: int = Field(default=0, ge=0, description="Replica the fault hits (simulated cluster).")
    inject_at_s: float | None = Field(
        default=None, gt=0, description="Injection time after the load starts (default baseline_s)."
    )
    fault_s: float = Field(
        default=8.0,
        gt=0,
        description="How long a reversible fault (KV, link, cancellations) lasts before the "
        "drill lifts it; a killed replica is restarted by the supervisor instead.",
    )
    kv_capacity_fraction: float = Field(
        default=0.01, gt=0, le=1, description="kv_pressure: share of KV blocks left usable."
    )
    latency_ms: float = Field(
        default=150.0, ge=0, description="degraded_link: one-way latency added to the link."
    )
    bandwidth_bytes_per_s: float = Field(
        default=0.0, ge=0, description="degraded_link: bandwidth cap of the link (0: none)."
    )
    cancel_fraction: float = Field(
        default=0.3, gt=0, le=1, description="cancellation: share of requests the client cancels."
    )
    cancel_after_s: float = Field(
        default=0.3,
        gt=0,
        description="cancellation: seconds after sending that they are cancelled.",
    )
    rate_multiplier: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="Offered rate from the injection on, relative to the drill rate (a "
        "cold_replica drill defaults to (replicas + 1) / replicas: the load that made the "
        "autoscaler add a replica).",
    )
    commands: DrillCommands | None = Field(
        default=None, description="Real targets: the commands that inject (and lift) the fault."
    )


def default_drills() -> list[Drill]:
    return [
        Drill(name="replica_kill", kind="replica_kill"),
        Drill(name="cold_replica", kind="cold_replica"),
        Drill(name="kv_pressure", kind="kv_pressure"),
        Drill(name="cancellation", kind="cancellation"),
        Drill(name="degraded_link", kind="degraded_link"),
    ]


# The plan drill's name (results/<pack>/failure/<name>); no configured drill may take it.
PLAN_DRILL = "plan_replica_kill"


class PlanDrill(_Model):
    """The N+1 check: the replica-kill drill on the planned topology at the planned peak."""

    enabled: bool = Field(
        default=True,
        description="Run it: plan.required_replicas behind the router at plan.peak_rps, one "
        "replica killed at baseline_s, the supervisor's restart as in the other drills.",
    )
    mode: Literal["auto", "live", "virtual"] = Field(
        default="auto",
        description="live: real processes on this host; virtual: the engine model in virtual "
        "time (simulated targets only); auto: live when the plan fits live_max_replicas and "
        "live_max_rps, else virtual (a real target that does not fit is skipped, saying why).",
    )
    # Measured on a 2-core host: the project's router (one Python process relaying every
    # streamed chunk) used 75 % of a core at a steady 60 RPS of ~50-token streams and 100 %
    # after a replica's restart, and then fell behind; at 40 RPS live and virtual drills agree.
    live_max_replicas: int = Field(
        default=2, ge=1, description="auto: the most replicas this host runs live."
    )
    live_max_rps: float = Field(
        default=40.0, gt=0, description="auto: the highest offered rate this host runs live."
    )
    replica: int = Field(default=0, ge=0, description="The replica killed.")
    commands: DrillCommands | None = Field(
        default=None,
        description="A real target the pack does not start: the commands that kill (and bring "
        "back) one replica of the planned fleet, which must be deployed at the plan's size.",
    )

    def drill(self) -> Drill:
        return Drill(
            name=PLAN_DRILL, kind="replica_kill", replica=self.replica, commands=self.commands
        )


class Failure(_Model):
    """Failure drills against N replicas behind a router at the selected capacity point (the
    mechanism tests), and the plan drill on the recommended fleet at its peak."""

    replicas: int | None = Field(
        default=None,
        ge=1,
        description="Replicas behind the router in the drill (default: follows the target: "
        "max(2, replicas under test) simulated ones; for a real target the replicas under "
        "test). The drill starts this many simulated replicas, or copies of a managed target's "
        "command.",
    )
    rate_rps: float | None = Field(
        default=None,
        gt=0,
        description="Offered rate of the drill (default: the selected capacity per replica x "
        "replicas, i.e. every replica at its capacity point).",
    )
    fallback_rate_per_replica_rps: float | None = Field(
        default=None,
        gt=0,
        description="Per-replica rate when the sweep selected no capacity point (default: the "
        "lowest tested open-loop rate, labelled so in the report).",
    )
    duration_s: float = Field(default=30.0, gt=0, description="Length of each drill's schedule.")
    baseline_s: float = Field(default=10.0, gt=0, description="Healthy window before injection.")
    warmup_s: float = Field(
        default=2.0, ge=0, description="Start of the baseline window (caches warm up before)."
    )
    window_s: float = Field(default=2.0, gt=0, description="Width of the windowed metrics.")
    scrape_interval_s: float = Field(default=0.5, gt=0, description="Metrics scrape period.")
    health_interval_s: float = Field(
        default=0.25, gt=0, description="Simulated router's health-check period."
    )
    restart_after_s: float | None = Field(
        default=3.0,
        gt=0,
        description="Simulated supervisor: restart a dead replica this long after it is noticed "
        "(none: no restarts, capacity does not return by itself).",
    )
    cold_start_s: float = Field(
        default=4.0,
        ge=0,
        description="Simulated target: seconds a restarted or added replica loads before it "
        "serves (weights and warm-up); the drill's initial replicas are already running.",
    )
    admission_max_outstanding: int | None = Field(
        default=None,
        ge=1,
        description="Router admission limit per healthy replica (default: admission_headroom x "
        "the in-flight requests per replica measured at the capacity point).",
    )
    admission_headroom: float = Field(
        default=2.0,
        ge=1.0,
        description="See above; Poisson bursts at the capacity point reach about 1.5x the mean.",
    )
    drain_timeout_s: float = Field(
        default=60.0, gt=0, description="Most seconds to wait for the last requests to end."
    )
    alert_thresholds: dict[str, float] = Field(
        default_factory=dict,
        description="Overrides of the alert thresholds (drills.alerts.AlertThresholds).",
    )
    drills: list[Drill] = Field(default_factory=default_drills, min_length=1)
    plan_drill: PlanDrill = Field(
        default_factory=PlanDrill,
        description="The plan drill: one replica of the recommended fleet killed at its peak.",
    )

    @model_validator(mode="after")
    def _check(self) -> Failure:
        names = [d.name for d in self.drills]
        if len(set(names)) != len(names):
            raise ValueError(f"drill names must be unique: {names}")
        # Only the plan drill itself may carry its name (a drill's inputs hold just that drill).
        if any(d.name == PLAN_DRILL and d != self.plan_drill.drill() for d in self.drills):
            raise ValueError(f"the drill name {PLAN_DRILL!r} is the plan drill's (plan_drill)")
        if not self.warmup_s < self.baseline_s < self.duration_s:
            raise ValueError("need warmup_s < baseline_s < duration_s")
        for d in self.drills:
            if d.inject_at_s is not None and not self.warmup_s < d.inject_at_s < self.duration_s:
                raise ValueError(f"drill {d.name!r}: inject_at_s must lie in the schedule")
        return self

    @property
    def all_drills(self) -> list[Drill]:
        """The capacity-point drills, then the plan drill when it is enabled."""
        return [*self.drills, *([self.plan_drill.drill()] if self.plan_drill.enabled else [])]


class Report(_Model):
    latency_statistics: list[Literal["mean", "p50", "p90", "p95", "p99", "p99.9", "max"]] = Field(
        default_factory=lambda: ["p50", "p95", "p99"],
        description="Latency statistics reported per class.",
    )
    percentile_method: Literal["nearest_rank"] = Field(default="nearest_rank")


class Pack(_Model):
    """A complete, validated pack definition."""

    pack: PackInfo
    cutoff: date = Field(description="Date the manifest was frozen for.")
    model: Model
    engine: Engine
    client: Client
    request: RequestShape = Field(default_factory=RequestShape)
    prompts: Prompts
    workload: list[WorkloadClass] = Field(min_length=1)
    acceptance: Acceptance
    target: Annotated[SimTarget | OpenAITarget, Field(discriminator="kind")]
    sweep: Sweep
    experiments: list[Experiment] = Field(default_factory=list)
    plan: Plan
    report: Report = Field(default_factory=Report)
    failure: Failure | None = Field(
        default=None, description="Failure drills (none: the pack runs no drill)."
    )

    @field_validator("cutoff", mode="before")
    @classmethod
    def _iso_date(cls, value: Any) -> Any:
        # pydantic's lax dates take 0 as 1970-01-01 and a date-time with a zero time as its day.
        if isinstance(value, date) and not isinstance(value, datetime):
            return value
        if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            return value
        raise ValueError(f"expected a date as YYYY-MM-DD, not {type(value).__name__}")

    @model_validator(mode="after")
    def _predicted_search(self) -> Pack:
        """Only a simulated target is predicted before it is measured (its own profile)."""
        search = self.sweep.search
        if search is not None and search.initial == "predicted" and self.target.kind != "sim":
            raise ValueError(
                "sweep.search.initial 'predicted' starts from the preflight prediction, which "
                "needs an engine model: target.kind sim (a real target has none before it is "
                "measured); give round 1's rates or 'auto'"
            )
        return self

    @model_validator(mode="after")
    def _trace_replay(self) -> Pack:
        """A trace's classes are the pack's; a verbatim trace's open-loop rates are its own
        (filled into ``sweep.open_loop_rps``, so the frozen manifest records them)."""
        spec, names, sweep = self.client.trace, self.class_names, self.sweep
        if spec is None or self.client.arrival_pattern != "trace":
            return self
        if spec.format != "capacity-pack" and not spec.classes and len(names) > 1:
            raise ValueError(
                f"client.trace.classes: a {spec.format} trace has no class column; declare "
                f"class rules (name, max_input_tokens) over the pack's classes {names}"
            )
        trace = spec.arrivals(default_class=names[0])
        check_classes(trace, names, spec.path, spec.format)
        if "hash_ids" in trace.columns and "warm" in sweep.cache_states:
            raise ValueError(
                f"sweep.cache_states: a {spec.format} trace carries its own prefix reuse "
                "(hash_ids), which its prompts replay; measure it cold (warm points prewarm "
                "prompts.prefix's set, which these prompts do not use)"
            )
        if not spec.verbatim:
            return self
        if sweep.search is not None:
            raise ValueError(
                "sweep.search: a verbatim trace is replayed at its own rate (client.trace."
                "time_scales), never at a rate a search bisects; drop the search or use "
                "replay 'stretch'"
            )
        rates = verbatim_rates(trace, spec.time_scales)
        if len(set(rates)) != len(rates) or min(rates) < MIN_OPEN_LOOP_RPS:
            raise ValueError(
                f"client.trace.time_scales {spec.time_scales} give open-loop rates {rates}: "
                f"each must be distinct and at least {MIN_OPEN_LOOP_RPS} RPS"
            )
        if sweep.open_loop_rps and sweep.open_loop_rps != rates:
            raise ValueError(
                f"sweep.open_loop_rps {sweep.open_loop_rps}: a verbatim trace's rates are its "
                f"own, {rates} for time_scales {spec.time_scales}; leave the list empty"
            )
        sweep.open_loop_rps = rates
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> Pack:
        names = [c.name for c in self.workload]
        if len(set(names)) != len(names):
            raise ValueError(f"workload class names must be unique: {names}")
        total = math.fsum(c.mix for c in self.workload)
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"workload mix must sum to 1, got {total}")
        if self.client.class_schedule_counts is not None:
            expected = self.class_counts(self.client.initial_scheduled_requests)
            if self.client.class_schedule_counts != expected:
                raise ValueError(
                    f"client.class_schedule_counts {self.client.class_schedule_counts} differ from "
                    f"the stratified counts {expected} of {self.client.initial_scheduled_requests} "
                    "requests"
                )
        exp_names = [e.name for e in self.experiments]
        if len(set(exp_names)) != len(exp_names):
            raise ValueError(f"experiment names must be unique: {exp_names}")
        if not (self.sweep.has_open_loop or self.sweep.closed_loop_concurrency or self.experiments):
            raise ValueError("nothing to measure: the sweep and experiments are all empty")
        placement = self.engine.placement
        if self.plan.gpus_per_replica * placement.replicas != placement.gpus:
            raise ValueError(
                f"plan.gpus_per_replica ({self.plan.gpus_per_replica}) x engine.placement.replicas"
                f" ({placement.replicas}) must equal engine.placement.gpus ({placement.gpus})"
            )
        if self.plan.replicas_under_test != placement.replicas:
            raise ValueError(
                f"plan.replicas_under_test ({self.plan.replicas_under_test}) must equal "
                f"engine.placement.replicas ({placement.replicas})"
            )
        if isinstance(self.target, SimTarget) and self.target.replicas != placement.replicas:
            raise ValueError(
                f"target.replicas ({self.target.replicas}) must equal engine.placement.replicas "
                f"({placement.replicas})"
            )
        if (
            self.plan.target_utilization is not None
            and self.plan.target_utilization != self.acceptance.target_utilization
        ):
            raise ValueError(
                f"plan.target_utilization ({self.plan.target_utilization}) disagrees with "
                f"acceptance.target_utilization ({self.acceptance.target_utilization})"
            )
        if self.failure is not None:
            n = self.failure.replicas or max(2, placement.replicas)
            for d in self.failure.drills:
                if d.replica >= n:
                    raise ValueError(
                        f"failure drill {d.name!r}: replica {d.replica} does not exist in a "
                        f"{n}-replica drill (0..{n - 1})"
                    )
        sessions = [c.name for c in self.workload if c.session is not None]
        if sessions and self.client.shards > 1:
            raise ValueError(
                f"session classes {sessions} need client.shards: 1 (a session's turns follow "
                "each other in one client process)"
            )
        if "warm" in self.all_cache_states() and self.prompts.prefix is None:
            raise ValueError("warm-cache points need prompts.prefix (the shared-prefix set)")
        if self.prompts.prefix is not None:
            for c in self.workload:
                if (
                    c.session is None  # a session's system prompt comes on top of its input
                    and isinstance(c.input_tokens, int)
                    and c.input_tokens <= self.prompts.prefix.prefix_tokens
                ):
                    raise ValueError(
                        f"class {c.name!r}: input_tokens ({c.input_tokens}) must exceed "
                        f"prompts.prefix.prefix_tokens ({self.prompts.prefix.prefix_tokens})"
                    )
        return self

    @model_validator(mode="after")
    def _point_sizes(self) -> Pack:
        """Every point's schedule within MAX_REQUESTS requests and its measured block within
        MAX_DURATION_S (the formulas of plan.schedule's block sizes, as upper bounds)."""
        c, s = self.client, self.sweep
        sizes: list[tuple[str, float]] = []
        rates = list(s.open_loop_rps)
        if s.search is not None and (first := s.search_initial_rps) is not None:
            # The search measures between its bounds; the schedule grows with the rate.
            rates += sorted({*first, *s.search.rate_bounds(first)} - set(rates))
        elif s.search is not None and s.search.max_rps is not None:
            rates = [s.search.max_rps]
        for r in rates:
            where = "sweep.open_loop_rps" if r in s.open_loop_rps else "sweep.search's rate"
            measured = max(c.initial_scheduled_requests, r * c.minimum_duration_seconds)
            sizes.append((f"{where} {r:g}", measured + r * c.warmup_seconds))
            if c.initial_scheduled_requests / r > MAX_DURATION_S:
                raise ValueError(
                    f"{where} {r:g}: client.initial_scheduled_requests "
                    f"({c.initial_scheduled_requests}) take {c.initial_scheduled_requests / r:.4g}"
                    f" s to arrive, above the bound of {MAX_DURATION_S:,} seconds (30 days)"
                )
        levels = [*s.closed_loop_concurrency, *filter(None, [s.concurrency_bound])]
        for k in levels:
            measured = max(s.closed_loop_min_requests, s.closed_loop_requests_per_worker * k)
            where = (
                "sweep.closed_loop_concurrency"
                if k in s.closed_loop_concurrency
                else ("sweep.search.concurrency's bound")
            )
            sizes.append((f"{where} {k}", measured + k))
        for e in self.experiments:
            sizes.append(
                (f"experiment {e.name!r}", e.expected_requests + e.peak_rps * c.warmup_seconds)
            )
        if (f := self.failure) is not None:
            replicas = f.replicas or max(2, self.engine.placement.replicas)
            if f.rate_rps is not None:
                sizes.append(("failure.rate_rps", f.rate_rps * f.duration_s))
            if f.fallback_rate_per_replica_rps is not None:
                rate = f.fallback_rate_per_replica_rps * replicas
                sizes.append(("failure.fallback_rate_per_replica_rps", rate * f.duration_s))
        # A session class's arrival is up to max_turns requests (capacity_pack.plan.sessions).
        turns = max((w.session.max_turns for w in self.workload if w.session), default=1)
        for where, n in sizes:
            if n * turns > MAX_REQUESTS:
                raise ValueError(
                    f"{where}: the point schedules about {n * turns:.4g} requests"
                    + (f" ({n:.4g} arrivals, sessions of up to {turns} turns)" if turns > 1 else "")
                    + f", above the bound of {MAX_REQUESTS:,} requests per point"
                )
        return self

    # -- derived values ---------------------------------------------------------------------

    @property
    def class_names(self) -> list[str]:
        return [c.name for c in self.workload]

    @property
    def effective_target_utilization(self) -> float:
        return self.plan.target_utilization or self.acceptance.target_utilization

    def all_cache_states(self) -> set[str]:
        states = set(self.sweep.cache_states)
        for e in self.experiments:
            states.update(e.cache_states)
        return states

    def class_counts(self, n: int) -> dict[str, int]:
        return stratified_counts(n, {c.name: c.mix for c in self.workload})

    def weighted_mean_tokens(self) -> tuple[float, float]:
        inp = math.fsum(c.mix * length_stats(c.input_tokens).mean for c in self.workload)
        out = math.fsum(c.mix * length_stats(c.output_tokens).mean for c in self.workload)
        return round(inp, 6), round(out, 6)

    def section(self, name: str) -> Any:
        if name not in SECTIONS:
            raise KeyError(f"unknown manifest section {name!r}; known: {', '.join(SECTIONS)}")
        return self.model_dump(mode="json")[name]

    def section_hashes(self) -> dict[str, str]:
        dumped = self.model_dump(mode="json")
        return {name: sha256_of_obj(dumped[name]) for name in SECTIONS}

    def sha256(self) -> str:
        return sha256_of_obj(self.model_dump(mode="json"))


def stratified_counts(n: int, mix: dict[str, float]) -> dict[str, int]:
    """Exact class counts summing to ``n`` by the largest-remainder method."""
    # Rounding the quotas first keeps 22,000 x 0.7 = 15399.999... from losing to float error.
    quotas = {k: round(n * v, 9) for k, v in mix.items()}
    counts = {k: math.floor(q) for k, q in quotas.items()}
    left = n - sum(counts.values())
    order = sorted(mix, key=lambda k: (-(quotas[k] - counts[k]), list(mix).index(k)))
    for k in order[:left]:
        counts[k] += 1
    return counts


# ---------------------------------------------------------------------------------------------
# Loading, validation errors, immutability
# ---------------------------------------------------------------------------------------------


def format_validation_error(err: ValidationError, source: str) -> str:
    """File, dotted field path, what was expected, what was given: on one line for one
    problem, else a line per problem under a line naming the file."""
    problems = []
    for e in err.errors():
        parts = [p for p in e["loc"] if not str(p).startswith("function-")]
        # An odd key (a space, a colon, a newline) is quoted, so the line stays one line.
        loc = ".".join(str(p) if re.fullmatch(r"[\w-]+", str(p)) else repr(p) for p in parts)
        loc = loc or "<root>"
        msg = " ".join(e["msg"].removeprefix("Value error, ").split())
        given = e.get("input")
        shown = "" if isinstance(given, dict | list) else f" (got {shorten(given)})"
        problems.append(f"{loc}: {msg}{shown}")
    if len(problems) == 1:
        return f"{source}: invalid pack configuration: {problems[0]}"
    head = f"{source}: invalid pack configuration ({len(problems)} problems):"
    return "\n".join([head, *(f"  - {p}" for p in problems)])


def validate_pack(data: dict[str, Any], source: str = "<config>") -> Pack:
    """Validate a config mapping into a :class:`Pack` or raise :class:`ManifestError`."""
    if not isinstance(data, dict):
        raise ManifestError(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    try:
        return Pack.model_validate(data)
    except ValidationError as err:
        raise ManifestError(format_validation_error(err, source)) from None


def load_yaml(path: str | Path) -> Any:
    """The data of a YAML (or JSON) file, or :class:`ManifestError` naming the file and the
    first bad byte, line or key (:mod:`capacity_pack.plan.yamlfile`)."""
    path = Path(path)
    try:
        return parse_yaml(decode_utf8(path.read_bytes(), str(path)), str(path))
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ManifestError(f"{path}: a directory, not a file") from None
    except TextInputError as err:
        raise ManifestError(str(err)) from None


def load_pack(path: str | Path) -> Pack:
    """Load and validate a pack YAML file (or a frozen manifest JSON)."""
    path = Path(path)
    return validate_pack(unwrap_frozen(load_yaml(path)), str(path))


def unwrap_frozen(data: Any) -> Any:
    """The pack inside a frozen manifest document, or inside a pack folder's
    ``workload-manifest.yaml`` (the pack under its ``frozen_sha256``); any other data as it is."""
    if isinstance(data, dict) and data.get("format") == FROZEN_FORMAT:
        return data.get("manifest")
    if isinstance(data, dict) and "frozen_sha256" in data:
        return {k: v for k, v in data.items() if k != "frozen_sha256"}
    return data


def mutable_revision_fields(pack: Pack) -> list[tuple[str, str]]:
    """Every revision-like field that names a moving target: (dotted field, value)."""
    fields = {
        "model.revision": pack.model.revision,
        "model.tokenizer_revision": pack.model.tokenizer_revision,
        "model.precision": pack.model.precision,
        "engine.version": pack.engine.version,
        "engine.scheduler": pack.engine.scheduler,
        "request.chat_template": pack.request.chat_template,
        "prompts.corpus_revision": pack.prompts.corpus_revision,
    }
    if pack.prompts.prefix is not None:
        fields["prompts.prefix.revision"] = pack.prompts.prefix.revision
    return [(k, v) for k, v in fields.items() if is_mutable_revision(v)]


# ---------------------------------------------------------------------------------------------
# Freeze
# ---------------------------------------------------------------------------------------------


def freeze(pack: Pack, source: str = "<config>") -> dict[str, Any]:
    """The canonical frozen manifest of ``pack`` (a JSON-ready dict).

    Raises :class:`ManifestError` naming every field that holds a mutable revision.
    """
    bad = mutable_revision_fields(pack)
    if bad:
        listed = "; ".join(f"{k} = {v!r}" for k, v in bad)
        raise ManifestError(
            f"{source}: refusing to freeze mutable revisions ({listed}); pin each to an "
            "immutable revision (a commit hash, a released version or a dated tag)"
        )
    manifest = pack.model_dump(mode="json")
    inp, out = pack.weighted_mean_tokens()
    n = pack.client.initial_scheduled_requests
    derived = {
        "pack_label": pack.pack.label,
        "weighted_mean_input_tokens": inp,
        "weighted_mean_output_tokens": out,
        "class_schedule_counts": pack.class_counts(n),
        "length_stats": {
            c.name: {
                "input_tokens": length_stats(c.input_tokens).model_dump(),
                "output_tokens": length_stats(c.output_tokens).model_dump(),
            }
            for c in pack.workload
        },
        "fixed_length_classes": [
            c.name
            for c in pack.workload
            if isinstance(c.input_tokens, int) and isinstance(c.output_tokens, int)
        ],
    }
    if (spec := pack.client.trace) is not None and pack.client.arrival_pattern == "trace":
        # What the trace sends, per class: its own lengths, not the classes' declared ones.
        trace = spec.arrivals(default_class=pack.class_names[0])
        derived["trace"] = trace_summary(trace, pack.class_names)
    return {
        "format": FROZEN_FORMAT,
        "sha256": sha256_of_obj(manifest),
        "section_sha256": {name: sha256_of_obj(manifest[name]) for name in SECTIONS},
        "manifest": manifest,
        "derived": derived,
        "tool": {"capacity_pack_version": __version__},
    }


def load_frozen(path: str | Path) -> tuple[Pack, dict[str, Any]]:
    """Read a frozen manifest, verify its hash, and return the pack and the document."""
    import json

    path = Path(path)
    try:
        doc = json.loads(decode_utf8(path.read_bytes(), str(path)))
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file") from None
    except TextInputError as err:
        raise ManifestError(str(err)) from None
    except json.JSONDecodeError as err:
        raise ManifestError(f"{path}: not valid JSON: {err}") from None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != FROZEN_FORMAT
        or not isinstance(doc.get("manifest"), dict)
    ):
        raise ManifestError(f"{path}: not a frozen manifest (format {FROZEN_FORMAT!r} expected)")
    try:
        digest = sha256_of_obj(doc["manifest"])
    except ValueError:  # NaN or infinity, which JSON has no words for
        digest = None
    if digest is None or digest != doc.get("sha256"):
        raise ManifestError(f"{path}: manifest content does not match its sha256 (edited?)")
    return validate_pack(doc["manifest"], str(path)), doc


def json_schema(cache_resets: Sequence[str] | None = None) -> dict[str, Any]:
    """JSON schema of the pack configuration, for editors; ``cache_resets``: the allowed
    ``target.cache_reset`` values (the engines' registry knows them), as its enum."""
    schema = Pack.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "capacity-pack configuration"
    if cache_resets is not None:
        prop = schema["$defs"]["OpenAITarget"]["properties"]["cache_reset"]
        prop.pop("pattern", None)
        prop["enum"] = list(cache_resets)
    return schema
