"""The per-point SLO analysis: the SLO report of a point's measured requests, and its verdict.

Over the ``measure`` and ``extension`` phases (T: first measured send to last measured terminal
event), :func:`analyze_point` writes the report of :mod:`.slo_report` and adds, with the methods
of :mod:`.statistics`, per-class confidence sequences at the effective sample k / deff of
n / deff (:func:`capacity_pack.binomial.design_effect`, blocks kept in ``attainment_blocks``)
intersected with the deciding look's (:func:`intersect_with_look`), early stopping for P99, the
queue trend, Little's Law, ``offered_rate_rps`` = (n - 1) / (last - first measured scheduled
arrival), the optional gates (:mod:`.gates`) and per-turn session figures (:mod:`.sessions`),
then the verdict. A point decided in run under another gate whose verdict at the new gate is
neither ``pass`` nor ``fail`` is ``superseded`` (``in_run_gate``): it is measured again.

Method: docs/metrics.md, "Point statistics" and "In-run decisions".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from capacity_pack.binomial import (
    block_counts,
    cluster_design_effect,
    confidence_sequence,
    effective_counts,
)
from capacity_pack.evidence import sessions
from capacity_pack.evidence.gates import Gates, pack_gates
from capacity_pack.evidence.slo_report import (
    STATUSES,
    AnalysisError,
    ClassSpec,
    class_report,
    pack_classes,
)
from capacity_pack.evidence.statistics import (
    early_stopping_min_samples,
    littles_law,
    trend_of,
)
from capacity_pack.evidence.trace_replay import under_sampled_reasons
from capacity_pack.plan.manifest import Acceptance, WorkloadClass
from capacity_pack.vocab.percentile import nearest_rank, percentiles
from capacity_pack.vocab.phases import MEASURED_PHASES
from capacity_pack.vocab.slo import cutoff_checks


def measured_window(requests: pd.DataFrame) -> tuple[int, int]:
    """[first measured send, last measured terminal event] in ns offsets from the run start."""
    m = requests[requests["phase"].isin(MEASURED_PHASES)]
    # Per row: a sharded point's shards each keep their own t0 (offsets share one axis).
    t0 = m["sent_ns"] - m["sent_offset_ns"]
    return int(m["sent_offset_ns"].min()), int((m["end_ns"] - t0).max())


def steady_window(measured: pd.DataFrame) -> tuple[int, int]:
    """[first, last] measured scheduled arrival, in ns offsets (the send where none is due)."""
    due = measured["due_offset_ns"].where(measured["due_offset_ns"] > 0, measured["sent_offset_ns"])
    return int(due.min()), int(due.max())


def queue_trend(metrics: pd.DataFrame, start_ns: int, end_ns: int) -> tuple[str, dict[str, Any]]:
    """The point's queue trend over the steady window, and the evidence of each series."""
    server_q = metrics[(metrics["source"] == "server") & (metrics["metric"] == "queue_depth")]
    backlog = metrics[(metrics["source"] == "client") & (metrics["metric"] == "due_unsent")]
    trends = {
        "server_queue_depth": trend_of(server_q, start_ns, end_ns),
        "client_backlog": trend_of(backlog, start_ns, end_ns),
    }
    decided = [t["trend"] for t in trends.values() if t["samples"] > 0]
    if "growing" in decided:
        return "growing", trends
    if decided and all(d == "flat" for d in decided):
        return "flat", trends
    return "inconclusive", trends


def analyze_point(
    requests: pd.DataFrame,
    chunks: pd.DataFrame,
    metrics: pd.DataFrame,
    sweep_summary: dict[str, Any],
    classes: list[ClassSpec],
    gates: Gates,
    *,
    confidence: float | None = None,
) -> dict[str, Any]:
    """The SLO report of the point's measured requests, with the extensions and the verdict."""
    if confidence is None:
        confidence = gates["attainment_confidence"]
    m = requests[requests["phase"].isin(MEASURED_PHASES)].reset_index(drop=True)
    if m.empty:
        raise AnalysisError("the point has no measured requests")
    window, steady = measured_window(requests), steady_window(m)
    trend, trends = queue_trend(metrics, *steady)
    cols = {
        "class": m["class"].to_numpy(dtype=object),
        "status": m["status"].to_numpy(dtype=object),
        "ttft": m["ttft_ms"].to_numpy(dtype=float),
        "tpot": m["tpot_ms"].to_numpy(dtype=float),
        "e2e": m["e2e_ms"].to_numpy(dtype=float),
        "out": m["output_tokens"].to_numpy(dtype=float),
    }
    # The report's gate takes flat/growing; an undecided trend cannot pass, so it reads as
    # growing there, and the verdict says inconclusive.
    duration_s = (window[1] - window[0]) / 1e9
    report = class_report(
        cols, duration_s, "flat" if trend == "flat" else "growing", classes, gates
    )
    report["queue_trend"] = trend
    report["queue_trend_evidence"] = trends
    ck = chunks.merge(m[["request_id", "class"]], on="request_id")
    in_run = sweep_summary.get("sequential") or {}
    looked = in_run_bounds(in_run, gates["class_slo_attainment_min"], confidence)
    for c in classes:
        _extend_class(report["classes"][c.name], c, m, ck, gates, confidence)
        intersect_with_look(report["classes"][c.name], looked.get(c.name))
    report.update(
        _point_fields(m, requests, ck, window, steady, sweep_summary),
        under_sampled_classes=[
            c.name for c in classes if not report["classes"][c.name]["sample_adequate"]
        ],
        percentile_method="nearest_rank",
    )
    if sessions.has_sessions(m):
        report["sessions"] = sessions.per_turn(m, classes, sweep_summary)
    _judge(report, classes, gates, bool(sweep_summary.get("shards")))
    report["trace_replay"] = sweep_summary.get("trace_replay")
    report["verdict_reasons"] += under_sampled_reasons(
        report, report["trace_replay"], gates["min_successful_samples_per_class"]
    )
    report["verdict_pass"] = report["verdict"] == "pass"
    report["in_run_decision"] = in_run.get("decision")
    report["in_run_gate"] = in_run_gate(in_run, gates["class_slo_attainment_min"], confidence)
    if in_run.get("decision") == "futile":
        # Not shown to pass, whatever the data's own verdict: say the sweep gave up on it.
        report["verdict_reasons"].append(f"stopped in run: {in_run.get('reason')}")
    report["superseded"] = bool(
        report["in_run_gate"]
        and not report["in_run_gate"]["current"]
        and report["verdict"] not in ("pass", "fail")
    )
    if report["superseded"]:
        g = report["in_run_gate"]
        report["verdict_reasons"].append(
            f"stopped in run under another gate ({g['attainment_min']:g} at "
            f"{g['confidence']:.0%}): undecided at this one ({gates['class_slo_attainment_min']:g}"
            f" at {confidence:.0%}), so its rate is measured again"
        )
    return report


def _point_fields(
    m: pd.DataFrame,
    requests: pd.DataFrame,
    ck: pd.DataFrame,
    window: tuple[int, int],
    steady: tuple[int, int],
    sweep_summary: dict[str, Any],
) -> dict[str, Any]:
    """The report's fields of the point as a whole: its windows and offered rate, errors, client
    delays, chunks, Little's Law, and what the sweep saw of its conditions."""
    (start_ns, end_ns), (steady_start, steady_end) = window, steady
    multi_token = bool((ck["tokens"] > 1).any())
    status_counts = m["status"].value_counts().to_dict()
    scheduled_s = (steady_end - steady_start) / 1e9
    return dict(
        measured_window_s=(end_ns - start_ns) / 1e9,
        # The schedule's own rate, as it arrived: (n - 1) gaps between the first and the last
        # measured scheduled arrival (no drain, unlike T).
        scheduled_window_s=scheduled_s,
        offered_rate_rps=(len(m) - 1) / scheduled_s if steady_end > steady_start else None,
        window_start_offset_ns=start_ns,
        window_end_offset_ns=end_ns,
        # The same window on the wall clock (first measured send, last measured end): where
        # a reader (the MLflow run's start and end) places the point in time.
        window_start_unix_ns=int(m["sent_realtime_ns"].min()),
        window_end_unix_ns=int(m["end_realtime_ns"].max()),
        errors_by_status={s: int(status_counts.get(s, 0)) for s in STATUSES},
        client_scheduling_delay_ms=percentiles(m["client_delay_ms"].to_numpy(float), False),
        chunks_carry_several_tokens=multi_token,
        itl_note=(
            "ITL are gaps between observed chunks; some chunks carried several tokens, so chunk "
            "gaps and per-token TPOT use different denominators"
            if multi_token
            else "one token per chunk: ITL gaps are per-token gaps"
        ),
        littles_law=littles_law(
            requests["sent_offset_ns"].to_numpy(np.int64),
            (requests["end_ns"] - requests["sent_ns"] + requests["sent_offset_ns"]).to_numpy(
                np.int64
            ),
            steady_start,
            steady_end,
        ),
        prefix_cache_hit_rate=sweep_summary.get("server_prefix_hit_rate"),
        client_cached_token_fraction=sweep_summary.get("client_cached_token_fraction"),
        prefix_cache_sources=sweep_summary.get("prefix_cache_sources"),
        client_bound=bool(sweep_summary.get("client_bound", False)),
        # Other work on the host beyond the pack's bounds (capacity_pack.measure.host): the
        # point measured the host, not the target. Absent from summaries before 2026-12-05.
        disturbed=bool(sweep_summary.get("disturbed", False)),
        disturbance_reasons=list(sweep_summary.get("disturbance_reasons") or []),
        host=sweep_summary.get("host"),
        engine_step_lateness=sweep_summary.get("engine_step_lateness"),
        # None: one client process, or shards on hosts whose skew could not be measured.
        shard_clock_valid=sweep_summary.get("shard_clock_valid"),
        dispatch_lateness_ms=sweep_summary.get("dispatch_lateness_ms"),
    )


def in_run_gate(
    sequential: dict[str, Any], attainment_min: float, confidence: float
) -> dict[str, Any] | None:
    """The gate the point's in-run decision stopped or extended it by, and whether it is the
    one the point is analyzed at (None: no in-run decision)."""
    if not sequential or sequential.get("gate") is None:
        return None
    gate, conf = float(sequential["gate"]), float(sequential["confidence"])
    return {
        "attainment_min": gate,
        "confidence": conf,
        "current": abs(gate - attainment_min) < 1e-12 and abs(conf - confidence) < 1e-12,
    }


def in_run_bounds(
    sequential: dict[str, Any], attainment_min: float, confidence: float
) -> dict[str, tuple[float, float]]:
    """Each class's confidence-sequence interval at the in-run look that decided the point
    (empty without an in-run decision, or when it ran under another gate or confidence)."""
    gate = in_run_gate(sequential, attainment_min, confidence)
    if gate is None or not gate["current"]:
        return {}
    return {
        name: (float(c["low"]), float(c["high"]))
        for name, c in (sequential.get("per_class") or {}).items()
        if c.get("low") is not None and c.get("high") is not None
    }


def intersect_with_look(entry: dict[str, Any], look: tuple[float, float] | None) -> None:
    """The running intersection of the class's confidence sequence: the final interval cut by
    the one at the deciding look. A confidence sequence covers the attainment at every sample
    size at once, so the intersection of its intervals at two sizes covers it with the same
    probability (Howard et al., Ann. Statist. 2021, the running intersection). Without it, a
    point stopped on a proven pass could read marginal once the requests still in flight at
    the stop were added, because the batch-means design effect is re-estimated at the final
    n: a verdict that contradicted the decision that ended the point."""
    ci = entry.get("attainment_ci")
    if look is None or not ci:
        return
    low, high = max(ci[0], look[0]), min(ci[1], look[1])
    if low <= high:  # disjoint only when the two design-effect estimates disagree: keep the final
        entry["attainment_ci"] = [low, high]
        if [low, high] != list(ci):
            entry["attainment_ci_method"] += ", intersected with the deciding in-run look's"


def _extend_class(
    entry: dict[str, Any],
    c: ClassSpec,
    m: pd.DataFrame,
    ck: pd.DataFrame,
    gates: Gates,
    confidence: float,
) -> None:
    """A class's interval, per-class rates, ITL and from-schedule latencies, P99 early stopping
    and optional gates, into its report ``entry``."""
    in_class = m["class"] == c.name
    okc = m[(m["status"] == "ok") & in_class]
    n_ok, passed = entry["successful_count"], entry["passing_count"]
    within = cutoff_checks(okc["ttft_ms"], okc["tpot_ms"], c.ttft_cutoff_ms, c.tpot_cutoff_ms)
    # The time-uniform bound (the sweep may have stopped or extended this point on it), at the
    # effective sample of the outcomes over blocks of send time: requests sharing a queue miss
    # together. The blocks are kept, so a rate's repeats pool into one interval
    # (capacity_pack.decide.capacity.pooled_attainment).
    block_s, n_j, k_j = block_counts(within.met, okc["sent_ns"].to_numpy(np.int64))
    deff = cluster_design_effect(n_j, k_j)
    k_eff, n_eff = effective_counts(passed, n_ok, deff)
    ci = confidence_sequence(k_eff, n_eff, confidence, gates["class_slo_attainment_min"])
    entry["attainment_ci"] = list(ci) if ci else None
    entry["attainment_ci_confidence"] = confidence
    entry["attainment_design_effect"] = deff
    entry["attainment_blocks"] = {
        "block_s": block_s,
        "successful": n_j.tolist(),
        "passing": k_j.tolist(),
    }
    entry["attainment_ci_method"] = (
        "confidence sequence (beta-binomial mixture, time-uniform) at the effective sample of "
        "time-block batch means"
    )
    attempted_c = int(in_class.sum())
    entry["attempted"] = attempted_c
    entry["error_rate"] = (attempted_c - n_ok) / attempted_c if attempted_c else None
    entry["all_attempt_attainment"] = passed / attempted_c if attempted_c else None
    withhold = n_ok < gates["p99_min_samples"]
    entry["itl_ms"] = percentiles(ck.loc[ck["class"] == c.name, "gap_ms"].to_numpy(float), withhold)
    for column in ("ttft_from_scheduled_ms", "e2e_from_scheduled_ms"):
        entry[column] = percentiles(okc[column].to_numpy(float), withhold)
    entry["p50_e2e_ms"] = nearest_rank(np.sort(okc["e2e_ms"].to_numpy(float)), 0.5)
    for metric, inside in (("ttft", within.ttft), ("tpot", within.tpot)):
        over = int(np.count_nonzero(~inside))
        need = early_stopping_min_samples(over) if n_ok else None
        entry[f"p99_{metric}_early_stopping"] = {
            "over_cutoff": over,
            "min_samples_to_prove": need,
            "proven": bool(need is not None and n_ok >= need),
        }
    for gate in gates.active("class"):
        if gate.optional:
            entry[gate.passes_key] = gate.passed(entry, gates)


def _judge(report: dict[str, Any], classes: list[ClassSpec], gates: Gates, sharded: bool) -> None:
    """The optional gates' result, point_estimate_gates_pass, the verdict, ``verdict_pass``, its
    reasons and the notes."""
    entries = [report["classes"][c.name] for c in classes]
    optional = [g for g in gates.active("class") if g.optional]
    report["optional_gates_pass"] = (
        all(e[g.passes_key] for g in optional for e in entries) if optional else None
    )
    gate = report["capacity_gate_pass"] and (report["optional_gates_pass"] is not False)
    # Every gate on its point estimate (the seed analyzer's capacity_gate_pass, plus the
    # optional gates): necessary for a pass, not sufficient; the verdict also asks the
    # confidence sequence and the evidence (docs/metrics.md, "Point statistics").
    report["point_estimate_gates_pass"] = bool(gate)
    marginal = [
        msg
        for c, e in zip(classes, entries, strict=True)
        for g in gates.active("class")
        if (msg := g.marginal(e, gates, c.name))
    ]
    labels: list[str] = []
    if report["client_bound"]:
        labels.append("client-bound: dispatch lateness above its bound, not a server result")
    if report["disturbed"]:
        labels.append(
            "disturbed: " + "; ".join(report["disturbance_reasons"]) + ", not the target's result"
        )
    if report["shard_clock_valid"] is False:
        labels.append("shard clocks: skew between the client shards beyond its tolerance")
    not_a_server_result = bool(labels)
    if report["under_sampled_classes"]:
        labels.append(f"under-sampled: {report['under_sampled_classes']}")
    if report["queue_trend"] == "inconclusive":
        labels.append("queue trend inconclusive")
    report["attainment_gate"] = {
        "min": gates["class_slo_attainment_min"],
        "min_successful": gates["min_successful_samples_per_class"],
    }
    report["besides_attainment"] = besides_attainment(report, gates, labels)
    certain = certain_failures(report, classes, gates)
    if certain and not not_a_server_result:
        # Certain at the stated confidence whatever the sample size (the sweep stops such a
        # point early): a failure, not a want of evidence.
        report["verdict"] = "fail"
        report["verdict_reasons"] = certain + labels
        report["notes"] = []
        return
    if labels:
        verdict = "inconclusive"
    elif not gate:
        verdict = "fail"
    elif marginal:
        verdict = "marginal"
    else:
        verdict = "pass"
    report["verdict"] = verdict
    report["verdict_reasons"] = (
        labels + (marginal if gate else []) + (failing_gates(report, gates) if not gate else [])
    )
    # P99 is reported, not gated: say where its sample cannot prove it yet.
    report["notes"] = [
        f"{c.name}: P99 {metric.upper()} not proven by early stopping"
        for c, e in zip(classes, entries, strict=True)
        for metric in ("ttft", "tpot")
        if e["sample_adequate"] and not e[f"p99_{metric}_early_stopping"]["proven"]
    ]
    if sharded and report["shard_clock_valid"] is None:
        report["notes"].append(
            "shard clocks unverified: the shards ran on hosts whose realtime skew was not "
            "measured (no NTP state); see the sweep summary's shards.clock_check"
        )


def besides_attainment(report: dict[str, Any], gates: Gates, labels: list[str]) -> dict[str, Any]:
    """The point's outcome on everything but the per-class attainment and sample-size gates,
    which a rate pools over its repeats (:func:`capacity_pack.decide.capacity.rate_status`):
    ``inconclusive`` (no server result: client-bound, shard clocks; or an undecided queue
    trend), else ``fail`` (the error rate, a growing queue, an optional per-class gate), else
    ``pass``; with the reasons in the gates' words."""
    undecided = [r for r in labels if not r.startswith("under-sampled")]
    failures = [msg for g in gates.active("point") if (msg := g.failure(report, gates))]
    failures += [
        msg
        for name, c in report["classes"].items()
        for g in gates.active("class")
        if g.optional and (msg := g.failure(c, gates, name))
    ]
    outcome = "inconclusive" if undecided else "fail" if failures else "pass"
    return {"outcome": outcome, "reasons": list(dict.fromkeys(undecided + failures))}


def certain_failures(report: dict[str, Any], classes: list[ClassSpec], gates: Gates) -> list[str]:
    """The classes whose attainment is below the gate with certainty: the upper end of its
    confidence sequence (valid at any sample size, :mod:`capacity_pack.binomial`) under it."""
    gate, out = gates["class_slo_attainment_min"], []
    for c in classes:
        e = report["classes"][c.name]
        ci = e.get("attainment_ci")
        if ci and ci[1] < gate:
            out.append(
                f"{c.name}: attainment at most {ci[1]:.4f} < {gate} at "
                f"{e['attainment_ci_confidence']:.0%} confidence ({e['passing_count']} of "
                f"{e['successful_count']} met the SLO)"
            )
    return out


def failing_gates(report: dict[str, Any], gates: Gates) -> list[str]:
    """Which gates a point failed, in the gates' words (each class's, then the point's)."""
    out = [
        msg
        for name, c in report["classes"].items()
        for g in gates.active("class")
        if (msg := g.failure(c, gates, name))
    ]
    out += [msg for g in gates.active("point") if (msg := g.failure(report, gates))]
    return out


class AnalysisSpec(BaseModel):
    """Exactly the manifest content the analysis reads: classes, cutoffs, fixed lengths, gates."""

    model_config = ConfigDict(extra="forbid")

    workload: list[WorkloadClass]
    acceptance: Acceptance
    pack_label: str

    @classmethod
    def of(cls, pack) -> AnalysisSpec:
        return cls(workload=pack.workload, acceptance=pack.acceptance, pack_label=pack.pack.label)

    def classes(self) -> list[ClassSpec]:
        return pack_classes(self)

    def gates(self) -> Gates:
        return pack_gates(self)

    def canonical_json(self) -> str:
        from capacity_pack.io import canonical_json

        return canonical_json(self.model_dump(mode="json"))
