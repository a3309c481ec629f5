"""The system under test: the model, the engine and its placement, and the target endpoint
(the embedded simulator, or any OpenAI-compatible server, started by the pack or not)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from capacity_pack.plan.section import COMMAND_TIMEOUT_MAX_S, SLUG_PATTERN, Section
from capacity_pack.redact import watch_env


class Placement(Section):
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


class ModelArchitecture(Section):
    """The served model's shape for its engine model (``capacity_pack.twin.architecture``)."""

    config: str = Field(
        min_length=1,
        description="Path of a Hugging Face config.json-style file (num_hidden_layers, "
        "hidden_size, num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, "
        "tie_word_embeddings), relative to the working directory or the project root.",
    )
    bytes_per_param: float = Field(gt=0, description="Weight bytes per parameter (bf16: 2).")
    kv_bytes_per_element: float = Field(default=2.0, gt=0, description="KV-cache element bytes.")


class HardwarePeaks(Section):
    """Peak figures of one accelerator (or host) of a replica, where they are known."""

    name: str = Field(default="declared", min_length=1, description="Accelerator name.")
    memory_gib: float = Field(gt=0, description="Memory per GPU in GiB.")
    bandwidth_tb_s: float | None = Field(default=None, gt=0, description="Peak TB/s per GPU.")
    dense_tflops: float | None = Field(default=None, gt=0, description="Peak TFLOP/s per GPU.")


class Model(Section):
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


class Engine(Section):
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


class SimTarget(Section):
    kind: Literal["sim"] = Field(description="The embedded simulated engine.")
    profile: str = Field(pattern=SLUG_PATTERN, description="Simulator performance profile.")
    replicas: int = Field(default=1, ge=1, description="Simulated replicas behind a router.")
    router: Literal["round_robin", "least_outstanding"] = Field(default="least_outstanding")
    ground_truth: bool = Field(default=True, description="Write the server ground-truth log.")


class ManagedProcess(Section):
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


class OpenAITarget(Section):
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
