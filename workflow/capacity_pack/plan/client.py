"""The client section: how the load generator sends (arrival process, seed, durations,
timeouts, cancellations, shards, thread placement), and the arrival trace it may replay."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from capacity_pack.io import file_sha256
from capacity_pack.plan.limits import MAX_ARRIVAL_CV, MAX_INT, MAX_TOKENS
from capacity_pack.plan.section import NAME_PATTERN, Section


class TraceClassRule(Section):
    """One class rule of a trace without a class column: requests up to ``max_input_tokens``
    input tokens (any, when unset) that no earlier rule took go to class ``name``."""

    name: str = Field(pattern=NAME_PATTERN, description="A workload class of the pack.")
    max_input_tokens: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS, description="Upper bound of input length (inclusive)."
    )


class TraceSpec(Section):
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
        # Imported here: the trace reader brings pandas, and the manifest (this model's home) is
        # loaded by every Snakemake invocation and job, most of which read no trace.
        from capacity_pack.plan.traces import read_trace

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


class Client(Section):
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
