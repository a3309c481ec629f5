"""``slo-report.json``: one measured point's SLO report, written by the ``analyze`` stage
(:func:`capacity_pack.evidence.analysis.analyze_point`) under ``reports/<point>/<cache>/rep<N>/``.

Only the point's identity, verdict, counts and classes are required: the rest is written by the
full analysis and absent from reports made by other tools (the request-log analyzer, imports).
"""

from __future__ import annotations

from typing import Any

from capacity_pack.artifacts.base import Artifact, Num, Part


class Blocks(Part):
    """A class's requests per time block of send time (successful, passing), which a rate's
    repeats pool over."""

    block_s: Num
    successful: list[int]
    passing: list[int]


class EarlyStopping(Part):
    over_cutoff: int
    min_samples_to_prove: int | None = None
    proven: bool | None = None


class ControlVariate(Part):
    """The engine model on the same requests (:mod:`capacity_pack.twin.control`)."""

    model_passing: int
    diff_blocks: list[Num]
    disagreements: int
    long_run: Num
    long_run_var: Num
    long_run_requests: int | None = None
    model: str | None = None
    method: str | None = None


class ClassReport(Part):
    """One class's entry in ``classes``: counts, attainment and its interval, percentiles (ms),
    the gates' booleans, and what the analysis stage adds (lengths, attribution, control)."""

    successful_count: int
    passing_count: int
    request_ttft_cutoff_ms: Num | None = None
    request_tpot_cutoff_ms: Num | None = None
    attainment: Num | None = None
    p99_sample_adequate: bool | None = None
    p50_ttft_ms: Num | None = None
    p95_ttft_ms: Num | None = None
    p99_ttft_ms: Num | None = None
    p50_tpot_ms: Num | None = None
    p95_tpot_ms: Num | None = None
    p99_tpot_ms: Num | None = None
    p50_e2e_ms: Num | None = None
    p95_e2e_ms: Num | None = None
    output_tokens: int | None = None
    class_slo_pass: bool | None = None
    sample_adequate: bool | None = None
    per_class_error_gate_pass: bool | None = None
    all_attempt_attainment_gate_pass: bool | None = None
    attainment_ci: list[Num] | None = None
    attainment_ci_confidence: Num | None = None
    attainment_ci_method: str | None = None
    attainment_design_effect: Num | None = None
    attainment_blocks: Blocks | None = None
    attempted: int | None = None
    error_rate: Num | None = None
    all_attempt_attainment: Num | None = None
    itl_ms: dict[str, Num | None] | None = None
    ttft_from_scheduled_ms: dict[str, Num | None] | None = None
    e2e_from_scheduled_ms: dict[str, Num | None] | None = None
    p99_ttft_early_stopping: EarlyStopping | None = None
    p99_tpot_early_stopping: EarlyStopping | None = None
    control_variate: ControlVariate | None = None
    attribution: dict[str, Any] | None = None
    lengths: dict[str, Any] | None = None
    lengths_match_manifest: bool | None = None
    lengths_match_why: Any = None


class AttainmentGate(Part):
    min: Num
    min_successful: Num | None = None


class Besides(Part):
    """The point's outcome on every gate but the per-class attainment and sample size."""

    outcome: str
    reasons: list[str] = []


class SloReport(Artifact):
    """The point's report: identity, counts and rates over its measured window, the queue trend,
    each class's :class:`ClassReport`, the gates, the verdict and why."""

    point: str
    key: str
    cache_state: str
    repeat: int
    mode: str
    verdict: str
    attempted: int
    successful: int
    classes: dict[str, ClassReport]
    offered_rps: Num | None = None
    concurrency: int | None = None
    pack_label: str | None = None
    failed: int | None = None
    error_rate: Num | None = None
    overall_attainment: Num | None = None
    overall_all_attempt_attainment: Num | None = None
    observed_goodput_rps: Num | None = None
    request_throughput_rps: Num | None = None
    output_throughput_tps: Num | None = None
    queue_trend: str | None = None
    queue_trend_evidence: dict[str, Any] | None = None
    all_class_slos_pass: bool | None = None
    capacity_gate_pass: bool | None = None
    optional_gates_pass: bool | None = None
    point_estimate_gates_pass: bool | None = None
    measured_window_s: Num | None = None
    scheduled_window_s: Num | None = None
    offered_rate_rps: Num | None = None
    window_start_offset_ns: int | None = None
    window_end_offset_ns: int | None = None
    window_start_unix_ns: int | None = None
    window_end_unix_ns: int | None = None
    errors_by_status: dict[str, int] | None = None
    client_scheduling_delay_ms: dict[str, Num | None] | None = None
    chunks_carry_several_tokens: bool | None = None
    itl_note: str | None = None
    littles_law: dict[str, Any] | None = None
    prefix_cache_hit_rate: Num | None = None
    client_cached_token_fraction: Num | None = None
    prefix_cache_sources: Any = None
    client_bound: bool | None = None
    disturbed: bool | None = None
    disturbance_reasons: list[str] | None = None
    host: dict[str, Any] | None = None
    engine_step_lateness: dict[str, Any] | None = None
    shard_clock_valid: bool | None = None
    dispatch_lateness_ms: dict[str, Any] | None = None
    under_sampled_classes: list[str] | None = None
    percentile_method: str | None = None
    sessions: dict[str, Any] | None = None
    attainment_gate: AttainmentGate | None = None
    besides_attainment: Besides | None = None
    verdict_reasons: list[str] = []
    notes: list[str] | None = None
    verdict_pass: bool | None = None
    trace_replay: dict[str, Any] | None = None
    in_run_decision: str | None = None
    in_run_gate: dict[str, Any] | None = None
    superseded: bool | None = None
    lengths_match_manifest: bool | None = None
    lengths_check: dict[str, Any] | None = None
    throughput: dict[str, Any] | None = None
