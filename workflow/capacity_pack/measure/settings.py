"""The settings of one load-generator run: the target, the request shape, the client's limits.

:class:`LoadSettings` is everything :class:`capacity_pack.measure.run.Run` needs besides the
schedule. A measurement builds it from the pack
(:func:`capacity_pack.measure.inputs.load_settings`); a drill or a shard adjusts a few fields
(side tasks, the shared start, the shard index, a shared-out in-flight ceiling).
``sequential`` (:class:`~capacity_pack.measure.sequential.SequentialSettings`) is what the
in-run decision of an open-loop rate point reads; a run without it never stops a point early.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.measure.sequential import SequentialSettings


class LoadSettings(BaseModel):
    """Everything one measurement run needs besides the schedule."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="Endpoint root, e.g. http://127.0.0.1:8000.")
    model: str = Field(description="Model name sent in every request.")
    endpoint: Literal["completions", "chat_completions"] = Field(default="completions")
    api_key_env: str | None = Field(default=None, description="Env var holding the API key.")
    mode: Literal["open", "closed", "exp"] = Field(description="Load mode of the point.")
    concurrency: int | None = Field(default=None, ge=1, description="Closed-loop workers.")
    request_timeout_s: float = Field(gt=0, description="Per-request timeout.")
    max_in_flight: int | None = Field(default=None, ge=1, description="Client-side ceiling.")
    lateness_bound_ms: float = Field(default=5.0, gt=0)
    metrics_interval_s: float = Field(default=1.0, gt=0)
    scrape_metrics: bool = Field(default=True)
    sampling: dict[str, Any] = Field(default_factory=dict, description="temperature, top_p, ...")
    ignore_eos: bool = Field(default=True)
    stop_sequences: list[str] = Field(default_factory=list)
    include_usage: bool = Field(default=True)
    prefix_revision: str | None = Field(default=None)
    corpus_revision: str = Field(default="capacity-pack-text-v1")
    cold_unique_prefix_tokens: int = Field(default=8, ge=1)
    prefix_block_tokens: int = Field(
        default=512, ge=1, description="Tokens per hash id of a block-hash trace's prompts."
    )
    min_successful_per_class: int | None = Field(
        default=None, description="Sample gate: extend the schedule until each class has this."
    )
    maximum_duration_s: float | None = Field(default=None, description="Stop extending after.")
    sequential: SequentialSettings | None = Field(
        default=None, description="The in-run decision (open-loop points): stop when certain."
    )
    extension_block: Any = Field(default=None, exclude=True, description="Callable(k) -> rows.")
    side_tasks: Any = Field(
        default=None,
        exclude=True,
        description="Callable(run, stop_event) -> coroutines run beside the load once t0 is set "
        "(a drill's scraper and fault injector); they must return when stop_event is set.",
    )
    token_counter: Any = Field(
        default=None, exclude=True, description="prompts.TokenCounter of a real target, or None."
    )
    prepared_prompts: Any = Field(
        default=None,
        exclude=True,
        description="Prompt texts by request id, prepared before the run (plan.prepared), or None.",
    )
    progress: bool = Field(default=False, description="Live progress line on stderr.")
    report: Any = Field(
        default=None,
        exclude=True,
        description="callable(line) given a progress line at a steady cadence (a pipeline job: "
        "its log and the console), or None.",
    )
    label: str = Field(default="", description="The point's key, heading each progress line.")
    keep_alive: bool = Field(
        default=True, description="Reuse connections (false: Connection: close per request)."
    )
    tls_verify: bool = Field(default=True, description="Verify an https:// server's certificate.")
    ca_bundle: str | None = Field(default=None, description="PEM of the CAs to verify it with.")
    shard: int | None = Field(
        default=None, ge=0, description="This process's shard of a sharded point (records say so)."
    )
    start_at: Any = Field(
        default=None,
        exclude=True,
        description="Callable() -> the start as realtime ns (a sharded point's shared start), "
        "called once the requests are built; None: start now.",
    )
    realtime_dispatch: bool = Field(
        default=False,
        description="Ask for SCHED_FIFO for the dispatcher thread (client.realtime_dispatch).",
    )
    pin_threads: bool = Field(
        default=True,
        description="Bind the event loop and the dispatcher thread to CPUs of their own for the "
        "run (client.pin_threads).",
    )
    cpu_part: tuple[int, int] | None = Field(
        default=None,
        description="(i, K): this process is local shard i of K sharing the CPU set; it pins "
        "within the i-th of K parts.",
    )
    transport: Literal["auto", "capacity_pack", "httpx"] = Field(
        default="auto",
        description="HTTP transport under the httpx client: auto (ours for http://, httpx's "
        "default for https://), capacity_pack (ours) or httpx (httpx's default).",
    )
