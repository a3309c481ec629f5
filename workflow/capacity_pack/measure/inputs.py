"""What one measurement reads of the manifest, and the load settings and tokenizer made from it.

:class:`SweepInputs` is exactly the manifest content a measurement reads (target, model, client,
request shape, prompts, the sample gate that drives extension blocks, and the attainment gate
and confidence the in-run decision judges by, with the class cutoffs of the schedule's
workload, for the open-loop rate points it applies to); the sweep rule passes it in its
params, so a changed timeout or target re-measures every point and a changed error-rate or
utilization threshold nothing. In a searching pack the params hold it less the attainment
gate (:meth:`SweepInputs.without_gate`), which the job reads from the invocation's config
instead (the pack's ``acceptance``): a changed attainment gate or confidence
re-analyzes and re-decides, and the search measures only what the new decisions ask for; in a
fixed grid it re-measures the open-loop rate points. A
sharded point's shard processes and a failure drill read the same inputs: :func:`load_settings`
turns them into one run's :class:`~capacity_pack.measure.settings.LoadSettings`,
:func:`sequential_settings` into its in-run decision (open-loop rate points on one client
process), :func:`token_counter` picks the tokenizer that sizes the prompts exactly.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from capacity_pack.binomial import MIN_BATCHES, min_samples_to_pass
from capacity_pack.engines import verify_setting
from capacity_pack.engines.tokenize import EndpointCounter
from capacity_pack.io import canonical_json
from capacity_pack.measure.sequential import MIN_LOOK_SAMPLES, SequentialSettings
from capacity_pack.measure.settings import LoadSettings
from capacity_pack.plan.client import Client
from capacity_pack.plan.manifest import Pack
from capacity_pack.plan.prompts import FileTokenizerCounter
from capacity_pack.plan.schedule import Point, ScheduleInputs
from capacity_pack.plan.sweep import judged_by_engine_model
from capacity_pack.plan.system import Engine, Model, OpenAITarget, SimTarget
from capacity_pack.plan.workload import Acceptance, Prompts, RequestShape
from capacity_pack.vocab.slo import class_cutoffs


class AttainmentGate(BaseModel):
    """The attainment gate the in-run decision judges each class by."""

    model_config = ConfigDict(extra="forbid")

    class_slo_attainment_min: float = Field(gt=0, le=1)
    attainment_confidence: float = Field(ge=0.5, le=0.999)

    @classmethod
    def of(cls, pack: Pack) -> AttainmentGate:
        return cls.of_acceptance(pack.acceptance)

    @classmethod
    def of_acceptance(cls, acceptance: Acceptance) -> AttainmentGate:
        return cls(
            class_slo_attainment_min=acceptance.class_slo_attainment_min,
            attainment_confidence=acceptance.attainment_confidence,
        )


class SweepInputs(BaseModel):
    """The manifest content one measurement depends on (beyond its schedule)."""

    model_config = ConfigDict(extra="forbid")

    schedule: ScheduleInputs = Field(description="To rebuild extension blocks and prewarm rows.")
    target: SimTarget | OpenAITarget = Field(discriminator="kind")
    model: Model
    client: Client
    request: RequestShape
    prompts: Prompts
    min_successful_samples_per_class: int = Field(description="Sample gate for extensions.")
    engine: Engine | None = Field(
        default=None, description="What a real target must identify as (None: a simulated one)."
    )
    attainment: AttainmentGate | None = Field(
        default=None, description="The in-run decision's gate (None: no in-run decision)."
    )

    @model_serializer(mode="wrap")
    def _omit_unset_gate(self, handler: Any) -> Any:
        # Without an in-run decision (a drill's inputs) the inputs read as before the field.
        data = handler(self)
        if isinstance(data, dict) and data.get("attainment") is None:
            data.pop("attainment", None)
        return data

    @classmethod
    def for_point(cls, pack: Pack, point: Point) -> SweepInputs:
        return cls(
            schedule=ScheduleInputs.for_point(pack, point),
            engine=pack.engine if isinstance(pack.target, OpenAITarget) else None,
            target=pack.target,
            model=pack.model,
            client=pack.client,
            request=pack.request,
            prompts=pack.prompts,
            min_successful_samples_per_class=pack.acceptance.min_successful_samples_per_class,
            attainment=cls.decided_in_run(pack, point),
        )

    @staticmethod
    def decided_in_run(pack: Pack, point: Point) -> AttainmentGate | None:
        """The in-run decision's gate: open-loop rate points on one client process only (a
        closed-loop level or an experiment runs its schedule, and a sharded point would need
        every shard's counts at once), so only their measurements follow a changed gate."""
        if point.mode != "open" or pack.client.shards > 1 or pack.client.replays_verbatim:
            return None
        return AttainmentGate.of(pack)

    def without_gate(self) -> SweepInputs:
        """These inputs less the in-run decision's gate: what a searching pack's sweep rule
        params hold. The pipeline hands the gate over apart (:meth:`with_gate`, from the
        invocation's config), so a changed gate re-measures no point: the confidence
        sequence is valid at any stopping time, so a point measured under one gate is
        evidence at another, and a changed gate re-analyzes (capacity_pack.evidence.analysis:
        ``superseded``)."""
        return self.model_copy(update={"attainment": None})

    def with_gate(self, gate: AttainmentGate | None) -> SweepInputs:
        return self.model_copy(update={"attainment": gate})

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json")
        if data["engine"] is None:
            del data["engine"]  # a simulated target's inputs read as before the field existed
        if not data["client"].get("realtime_dispatch"):
            del data["client"]["realtime_dispatch"]  # off (the default): as before it existed
        if data["client"].get("pin_threads", True):
            # On (the default): the inputs read as before it existed; the code's hash reruns.
            data["client"].pop("pin_threads", None)
        return canonical_json(data)


def load_settings(
    inputs: SweepInputs, point: Point, base_url: str, *, progress: bool
) -> LoadSettings:
    c, r = inputs.client, inputs.request
    sampling: dict[str, Any] = {"temperature": r.sampling.temperature, "top_p": r.sampling.top_p}
    if r.sampling.top_k != -1:
        sampling["top_k"] = r.sampling.top_k
    if r.sampling.seed is not None:
        sampling["seed"] = r.sampling.seed
    prefix = inputs.prompts.prefix
    return LoadSettings(
        base_url=base_url,
        model=inputs.model.served_name or inputs.model.id,
        endpoint=c.endpoint,
        api_key_env=getattr(inputs.target, "api_key_env", None),
        mode=point.mode,
        concurrency=point.concurrency,
        request_timeout_s=c.request_timeout_seconds,
        max_in_flight=c.max_in_flight,
        lateness_bound_ms=c.lateness_bound_ms,
        metrics_interval_s=c.metrics_interval_seconds,
        sampling=sampling,
        ignore_eos=r.stop.ignore_eos,
        stop_sequences=r.stop.stop_sequences,
        include_usage=r.include_usage,
        prefix_revision=prefix.revision if prefix else None,
        tls_verify=getattr(inputs.target, "tls_verify", True),
        keep_alive=getattr(inputs.target, "keep_alive", True),
        ca_bundle=getattr(inputs.target, "ca_bundle", None),
        corpus_revision=inputs.prompts.corpus_revision,
        cold_unique_prefix_tokens=inputs.prompts.cold_unique_prefix_tokens,
        prefix_block_tokens=c.trace.block_tokens if c.trace is not None else 512,
        min_successful_per_class=inputs.min_successful_samples_per_class,
        maximum_duration_s=c.warmup_seconds + c.maximum_duration_seconds,
        realtime_dispatch=c.realtime_dispatch,
        pin_threads=c.pin_threads,
        progress=progress,
    )


def sequential_settings(inputs: SweepInputs) -> SequentialSettings | None:
    """The in-run decision of a point measured with these inputs (None without a gate).

    Where the engine model judges the rate as control variate
    (:func:`capacity_pack.plan.manifest.judged_by_engine_model`), no look stops the point
    before its maximum duration: a look judges the repeat's live attainment, which there is not
    the statistic that decides the rate (mu + mean(live - model) over its repeats is), and a
    repeat stopped on a lucky or unlucky window leaves that estimate a few hundred requests of
    one burst (the default pack's warm 45 RPS on seed 20261213: a pass at 12 s and a futility at
    11 s, 489 requests, live 8 requests ahead of the model in one burst, decided 45 RPS as
    passing where the model's long run gives 0.940). The looks still run and are recorded."""
    gate = inputs.attainment
    if gate is None:
        return None
    c = inputs.client
    minimum_s = c.warmup_seconds + c.minimum_duration_seconds
    if judged_by_engine_model(inputs.target, c, inputs.schedule.workload):
        minimum_s = c.warmup_seconds + c.maximum_duration_seconds
    return SequentialSettings(
        cutoffs=class_cutoffs(inputs.schedule.workload),
        attainment_min=gate.class_slo_attainment_min,
        confidence=gate.attainment_confidence,
        minimum_duration_s=minimum_s,
        # The arrivals' cut, from the clock's start (as LoadSettings.maximum_duration_s).
        maximum_duration_s=c.warmup_seconds + c.maximum_duration_seconds,
        warmup_s=c.warmup_seconds,
        min_samples=look_floor(gate.class_slo_attainment_min, gate.attainment_confidence),
    )


def look_floor(attainment_min: float, confidence: float) -> int:
    """The least successful requests before a look judges a class: MIN_LOOK_SAMPLES, or
    fewer where the gate can pass on fewer (a 0.6 gate at 95 %: 15), never under five batches
    for the design effect."""
    least = min_samples_to_pass(attainment_min, confidence) or MIN_LOOK_SAMPLES
    return max(MIN_BATCHES, min(MIN_LOOK_SAMPLES, least))


def token_counter(inputs: SweepInputs, base_url: str):
    """The target's tokenizer for exact prompt lengths: a tokenizer.json, /tokenize, or None
    (the project tokenizer, exact for the simulated engine)."""
    target = inputs.target
    if not isinstance(target, OpenAITarget):
        return None
    if target.tokenizer_path is not None:
        return FileTokenizerCounter(target.tokenizer_path)
    if target.tokenize_endpoint:
        key = os.environ.get(target.api_key_env, "") if target.api_key_env else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        verify = verify_setting(target.tls_verify, target.ca_bundle)
        return EndpointCounter(
            base_url,
            inputs.model.served_name or inputs.model.id,
            headers,
            verify=verify,
            keep_alive=target.keep_alive,
        )
    return None
