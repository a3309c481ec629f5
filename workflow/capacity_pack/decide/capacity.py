"""Capacity selection: from per-point SLO reports to the capacity a pack can defend.

Open loop, per cache state: each rate's repeats pooled into a status
(:mod:`capacity_pack.decide.pooled`), the capacity bracket [pass_rps, fail_rps)
(:func:`capacity_bracket` over :func:`capacity_pack.decide.bracket.bracket`: the estimate
decides, the interval says how sure), what stopped each failing rate
(:mod:`capacity_pack.decide.failures`), offered vs achieved per repeat, variation across
repeats (:mod:`capacity_pack.decide.repeats`), per-replica capacity = pass_rps / replicas and
goodput per GPU = least goodput over the repeats at pass_rps / GPUs, and the decision sentence.
Closed loop: the latency-throughput curve and its operating point. Physical sanity checks:
:mod:`capacity_pack.decide.faults`.

Method: docs/metrics.md, "Capacity and repeats".
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from capacity_pack.artifacts import Capacity, Plan, SloReport
from capacity_pack.decide.bracket import bracket, meets_gates, resolution_of, within
from capacity_pack.decide.contexts import sent_contexts
from capacity_pack.decide.failures import failure_summary, repeat_failures
from capacity_pack.decide.faults import measurement_faults, measurement_notes
from capacity_pack.decide.pooled import (
    deciding_reports,
    poolable,
    pooled_attainment,
    rate_evidence,
    rate_status,
    void,
)
from capacity_pack.decide.repeats import variation
from capacity_pack.evidence.gates import CLASS_ATTAINMENT
from capacity_pack.vocab.words import decision_sentence, rate_status_words

# --- One repeat of a rate: offered and achieved ---


def repeat_rates(r: SloReport) -> dict[str, Any]:
    """The nominal, offered and achieved rates of one repeat (docs/metrics.md, "Capacity and
    repeats")."""
    window = r.measured_window_s
    return {
        "repeat": r.repeat,
        "verdict": r.verdict,
        "nominal_rps": float(r.offered_rps),
        # The analysis's own figure when it has one (no drain in it), else attempted / T.
        "offered_measured_rps": r.offered_rate_rps or (r.attempted / window if window else None),
        "achieved_rps": r.request_throughput_rps,
        "goodput_rps": r.observed_goodput_rps,
        "measured_window_s": window,
        "attempted": r.attempted,
        "successful": r.successful,
        # The cache state made visible: the server's prefix-cache hit rate and the client's
        # cached share of prompt tokens, with where each came from.
        "prefix_cache_hit_rate": r.prefix_cache_hit_rate,
        "client_cached_token_fraction": r.client_cached_token_fraction,
        "prefix_cache_sources": r.prefix_cache_sources,
    }


# --- The open loop: rates, the bracket and the decision ---


def _rate_row(rate: float, every: list[SloReport], classes: list[str], confidence: float):
    reps = deciding_reports(every)
    status = rate_status(reps)
    failures = (
        [repeat_failures(r, classes) for r in reps if r.verdict != "pass"]
        if not meets_gates(status)
        else []
    )
    pooled = pooled_attainment(reps) if all(poolable(r) for r in reps) else None
    return {
        "offered_rps": rate,
        "status": status,
        # The rate's evidence: every deciding repeat's requests pooled per class.
        "pooled": pooled,
        "evidence": rate_evidence(status, pooled),
        "repeats": len(reps),
        "verdicts": [r.verdict for r in reps],
        # Repeats that decide nothing, set aside: another repeat of the rate decides.
        "set_aside_repeats": [r.repeat for r in every if r not in reps],
        "set_aside_why": {str(r.repeat): void(r) for r in every if r not in reps},
        "reasons": sorted({reason for r in reps for reason in r.verdict_reasons}),
        "per_repeat": [repeat_rates(r) for r in reps],
        "failures": failures,
        "failure_summary": failure_summary(failures) if failures else None,
        "variation": variation(reps, classes, confidence),
    }


def capacity_bracket(
    rows: list[dict[str, Any]], search: Any, confidence: float, cache_state: str
) -> dict[str, Any]:
    """A cache state's ``bracket`` as ``capacity.json`` states it, from its open-loop ``rows``:
    both ends with their status and evidence, the width, the resolution of ``search`` (None
    without one) and whether it is reached, the confidence, and the decision sentence (``note``)."""
    low, high = bracket(rows, "offered_rps")
    at = next((r for r in rows if r["offered_rps"] == low), None) if low is not None else None
    fail = next((r for r in rows if r["offered_rps"] == high), None)
    width = high - low if low is not None and high is not None else None
    resolution = resolution_of(search, low)
    reached = within(width, resolution)
    return {
        "pass_rps": low,
        "fail_rps": high,
        "pass_status": at["status"] if at is not None else None,
        "pass_evidence": at.get("evidence") if at is not None else None,
        "fail_status": fail["status"] if fail is not None else None,
        "fail_summary": fail["failure_summary"] if fail is not None else None,
        "fail_evidence": fail.get("evidence") if fail is not None else None,
        "width_rps": width,
        "resolution_rps": resolution,
        "reached": reached,
        "confidence": confidence,
        "note": decision_sentence(cache_state, low, high, reached),
    }


def select_open_loop(
    reports: list[SloReport], classes: list[str], replicas: int, gpus: int,
    search: Any = None, confidence: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Capacity per cache state from the open-loop reports (module docstring);
    ``search`` is the pack's ``sweep.search`` (its resolution), None without one;
    ``confidence`` the pack's attainment confidence (None: the one the reports state)."""
    by_state: dict[str, dict[float, list[SloReport]]] = defaultdict(lambda: defaultdict(list))
    for r in reports:
        if r.mode == "open":
            by_state[r.cache_state][float(r.offered_rps)].append(r)
    if confidence is None:  # the one the reports' attainment bounds state (0.95 if none)
        stated = (c.attainment_ci_confidence for r in reports for c in r.classes.values())
        confidence = float(next((x for x in stated if x is not None), 0.95))
    result: dict[str, Any] = {}
    for state, rates in sorted(by_state.items()):
        rows = [
            _rate_row(rate, sorted(rates[rate], key=lambda r: r.repeat), classes, confidence)
            for rate in sorted(rates)
        ]
        b = capacity_bracket(rows, search, confidence, state)
        capacity, above = b["pass_rps"], b["fail_rps"]
        # The highest rate shown to pass at the confidence, every lower one meeting the gates:
        # at or under the capacity, which is the pooled estimate's.
        shown = max(
            (r["offered_rps"] for r in rows
             if r["status"] == "pass" and capacity is not None and r["offered_rps"] <= capacity),
            default=None,
        )  # fmt: skip
        passing_above = [
            row["offered_rps"]
            for row in rows
            if meets_gates(row["status"]) and (capacity is None or row["offered_rps"] > capacity)
        ]
        next_up = next((row for row in rows if row["offered_rps"] == above), None)
        at = next((row for row in rows if row["offered_rps"] == capacity), None)
        goodputs = [p["goodput_rps"] for p in (at["per_repeat"] if at else [])
                    if p["goodput_rps"] is not None]  # fmt: skip
        # The least goodput over the repeats: the capacity must hold in every one of them.
        goodput = min(goodputs) if goodputs else None
        result[state] = {
            "rates": rows,
            "capacity_rps": capacity,
            "bracket": b,
            "shown_to_pass_rps": shown,
            "capacity_per_replica_rps": capacity / replicas if capacity is not None else None,
            "capacity_per_gpu_nominal_rps": capacity / gpus if capacity is not None else None,
            "goodput_at_capacity_rps": goodput,
            "goodput_per_gpu_rps": goodput / gpus if goodput is not None else None,
            "non_monotonic_passes_rps": passing_above,
            "next_rate_up": (
                {
                    "offered_rps": next_up["offered_rps"],
                    "status": next_up["status"],
                    "limited_by": next_up["reasons"],
                    "failure_summary": next_up["failure_summary"],
                }
                if next_up is not None
                else None
            ),  # fmt: skip
            "decision": _decision(b, rows, next_up),
        }
    return result


def _why(row: dict[str, Any]) -> str:
    if row.get("evidence") and row["status"] in ("misses", "marginal"):
        return row["evidence"]
    return row["failure_summary"] or "; ".join(row["reasons"]) or "see its reports"


def _decision(b: dict[str, Any], rows: list[dict[str, Any]], next_up) -> str:
    """The decision sentence (the bracket's ``note``), then why: the evidence at the capacity
    and the status of the rate above it (of the lowest rate, when none meets the gates)."""
    capacity = b["pass_rps"]
    if not rows:
        return b["note"]
    if capacity is None:
        first = rows[0]
        return f"{b['note']}; " + rate_status_words(
            first["offered_rps"], first["status"], _why(first)
        )
    at = next(r for r in rows if r["offered_rps"] == capacity)
    text = (
        f"{b['note']}; {capacity:g} RPS is the highest tested rate meeting every gate on the "
        "pooled evidence of its repeats" + (f" ({at['evidence']})" if at.get("evidence") else "")
    )
    if next_up is not None:
        text += "; above it, " + rate_status_words(
            next_up["offered_rps"], next_up["status"], _why(next_up)
        )
    return text


def closed_loop_curve(
    reports: list[SloReport], classes: list[str], attainment_min: float
) -> dict[str, Any]:
    """Latency-throughput curve per cache state and its operating point."""
    by_state: dict[str, dict[int, list[SloReport]]] = defaultdict(lambda: defaultdict(list))
    for r in reports:
        if r.mode == "closed":
            by_state[r.cache_state][int(r.concurrency)].append(r)
    out: dict[str, Any] = {}
    for state, levels in sorted(by_state.items()):
        curve = []
        for n in sorted(levels):
            reps = levels[n]
            var = variation(reps, classes)
            curve.append(
                {
                    "concurrency": n,
                    "status": rate_status(reps),
                    "output_throughput_tps": var["output_throughput_tps"]["mean"],
                    "request_throughput_rps": float(
                        np.mean([r.request_throughput_rps for r in reps])
                    ),
                    "p95_ttft_ms": {c: var["classes"][c]["p95_ttft_ms"]["mean"] for c in classes},
                    "p95_tpot_ms": {c: var["classes"][c]["p95_tpot_ms"]["mean"] for c in classes},
                    "attainment": {c: var["classes"][c]["attainment"]["mean"] for c in classes},
                    "meets_latency_gates": all(
                        meets_latency_gates(r, attainment_min) for r in reps
                    ),
                    "reasons": sorted({x for r in reps for x in r.verdict_reasons}),
                }
            )
        inside = [p for p in curve if p["meets_latency_gates"]]
        best = max(inside, key=lambda p: p["output_throughput_tps"] or 0.0, default=None)
        single = next((p for p in curve if p["concurrency"] == 1), None)
        out[state] = {
            "curve": curve,
            "operating_point": best,
            "operating_point_status": best["status"] if best else None,
            "operating_point_is_largest_tested": (
                best is not None and best["concurrency"] == max(levels)
            ),
            "operating_point_note": _operating_note(best, max(levels)),
            "single_user": single,
            "saturation_tps": max((p["output_throughput_tps"] or 0.0 for p in curve), default=None),
        }
    return out


def _operating_note(best: dict[str, Any] | None, largest: int) -> str:
    """The operating point's status in words: passed, or met only the latency gates."""
    if best is None:
        return "no concurrency level met the latency gates"
    if best["status"] == "pass":
        text = "it passes every gate in every repeat"
    else:
        why = "; ".join(best["reasons"][:3]) or "see its reports"
        text = f"it meets the latency gates but its status is {best['status']} ({why})"
    if best["concurrency"] == largest:
        text += "; it is the largest concurrency tested, so the frontier may lie beyond it"
    return text


def meets_latency_gates(report: SloReport, attainment_min: float) -> bool:
    """The latency constraint of the curve: every class's attainment (the closed-loop sweep is
    for the frontier; its sample sizes are not a capacity decision)."""
    return all(
        CLASS_ATTAINMENT.holds(c.attainment, attainment_min) for c in report.classes.values()
    )


# --- From reports to the decision and the plan ---


def primary_cache_state(states: list[str]) -> str:
    """The state the headline decision uses: cold when measured (it is the conservative one)."""
    return "cold" if "cold" in states else states[0]


def build_capacity(reports: list[SloReport], pack) -> Capacity:
    classes = pack.class_names
    placement = pack.engine.placement
    open_loop = select_open_loop(
        reports, classes, placement.replicas, placement.gpus,
        search=getattr(pack.sweep, "search", None),
        confidence=pack.acceptance.attainment_confidence,
    )  # fmt: skip
    closed = closed_loop_curve(reports, classes, pack.acceptance.class_slo_attainment_min)
    states = sorted({r.cache_state for r in reports}) or list(pack.sweep.cache_states)
    primary = primary_cache_state([s for s in pack.sweep.cache_states if s in states] or states)
    doc = {
        "pack": pack.pack.name,
        "pack_label": pack.pack.label,
        "primary_cache_state": primary,
        "holds_for": {
            "workload": [c.name for c in pack.workload],
            "placement": placement.model_dump(),
            "engine": {"name": pack.engine.name, "version": pack.engine.version},
            "model": {"id": pack.model.id, "revision": pack.model.revision},
        },
        "open_loop": open_loop,
        "closed_loop": closed,
        # Physical sanity: results that contradict how a server works (measurement_faults);
        # a check the brackets are too wide to settle is a note, not a fault.
        "measurement_faults": measurement_faults(open_loop, closed),
        "measurement_notes": measurement_notes(open_loop),
        "experiments": sorted({r.point: r.verdict for r in reports if r.mode == "exp"}.items()),
    }
    return Capacity.parse(doc, "capacity.json")


def mix_p95_context(pack) -> float:
    """P95 of prompt + output tokens over the manifest's class mix: the nearest-rank P95 of
    contexts drawn from its distributions (:func:`capacity_pack.decide.contexts.
    manifest_contexts`), the mix's own P95, not a mix of the classes' P95s."""
    from capacity_pack.decide.contexts import manifest_contexts
    from capacity_pack.decide.sizing import context_tail

    return float(context_tail(manifest_contexts(pack), 1.0).p95_tokens)


def memory_inputs(pack) -> dict[str, float] | None:
    """Memory sizing inputs: the plan's ``memory`` block, or the simulator profile's shape."""
    if pack.plan.memory is not None:
        return pack.plan.memory.model_dump()
    if pack.target.kind != "sim":
        return None
    from capacity_pack.sim.profile import load_profile

    prof = load_profile(pack.target.profile)
    gib = 1024**3 / 1e9
    tp = prof.engine.tensor_parallel
    return {
        "accelerator_memory_gb": prof.hardware.hbm_gib * gib * tp,
        "weights_gb": prof.model.weight_bytes / 1e9,
        "overhead_gb": prof.engine.non_kv_memory_gib * gib * tp,
        "kv_bytes_per_token": prof.model.kv_bytes_per_token,
        "memory_utilization": prof.engine.gpu_memory_utilization,
        "margin_gb": 0.0,
    }


def build_plan(
    capacity: Capacity, reports: list[SloReport], pack, tables: list[str] | None = None
) -> dict[str, Any]:
    """Replicas and GPUs for the pack's peak, from throughput and from memory; cost; the fit
    at the planned concurrency. ``tables``: the points' requests tables (the contexts sent at
    the capacity point are read from them; without them, drawn from the manifest)."""
    from capacity_pack.decide import sizing

    state, sel = capacity.primary_cache_state, capacity.primary()
    per_replica = sel.capacity_per_replica_rps if sel is not None else None
    if per_replica is None:
        return {
            "required_replicas": None,
            "required_gpus": None,
            "reason": f"no SLO-compliant capacity was found ({state} cache): no plan can be "
            "derived from this pack; see the decision and the failing gates",
        }
    thr = sizing.plan_replicas(
        pack.plan.peak_rps,
        per_replica,
        pack.effective_target_utilization,
        pack.plan.gpus_per_replica,
        redundancy_replicas=pack.plan.redundancy_replicas,
        warm_pool_replicas=pack.plan.warm_pool_replicas,
    )
    mem = memory_inputs(pack)
    at_capacity = [
        r for r in reports
        if r.mode == "open" and r.cache_state == state and r.offered_rps == sel.capacity_rps
    ]  # fmt: skip
    p95_e2e_s = max(
        (c.p95_e2e_ms or 0.0) for r in at_capacity for c in r.classes.values()
    ) / 1e3 if at_capacity else None  # fmt: skip
    sent = sent_contexts(at_capacity, tables, pack)
    tail = sizing.context_tail(sent.contexts, mem["kv_bytes_per_token"] if mem else 0.0)
    mem_plan, memory_error = _memory_plan(pack, mem, p95_e2e_s, tail.p95_tokens)
    plan = sizing.combine(thr, mem_plan)
    plan["capacity_cache_state"] = state
    plan["p95_e2e_s_at_capacity"] = p95_e2e_s
    plan["p95_context_tokens"] = tail.p95_tokens
    plan["max_context_tokens"] = tail.max_tokens
    plan["contexts"] = {**sent.describe(), **tail.model_dump()}
    if memory_error:
        plan["memory_note"] = memory_error
    if mem is not None:
        plan.update(tail_fit(plan, mem, sent, tail, p95_e2e_s))
    if pack.plan.price_per_gpu_hour is not None:
        # Only successes divide the bill: failures at the capacity point raise the unit cost.
        error_rate = max((r.error_rate or 0.0) for r in at_capacity) if at_capacity else 0.0
        plan["cost"] = sizing.cost(
            plan["required_gpus"],
            pack.plan.price_per_gpu_hour,
            pack.plan.peak_rps * (1 - error_rate),
            pack.plan.requests_per_task,
        )
        plan["cost"]["error_rate_at_capacity"] = error_rate
    bw = effective_bandwidth(capacity, pack)
    if bw is not None:
        plan["effective_bandwidth"] = bw
    return plan


def _memory_plan(
    pack, mem: dict[str, float] | None, p95_e2e_s: float | None, p95_context_tokens: int
) -> tuple[dict[str, Any] | None, str | None]:
    """(the KV-memory plan, why there is none): Little's law at the peak over the P95 context
    (:func:`capacity_pack.decide.sizing.plan_memory`)."""
    from capacity_pack.decide import sizing

    if mem is None or not p95_e2e_s:
        return None, (
            "no memory inputs (plan.memory): declare the model shape and the device memory to "
            "size by KV memory"
        )
    try:
        return sizing.plan_memory(
            pack.plan.peak_rps,
            p95_e2e_s,
            mem["kv_bytes_per_token"],
            p95_context_tokens,
            mem["accelerator_memory_gb"],
            mem["weights_gb"],
            mem["overhead_gb"],
            mem["memory_utilization"],
        ), None
    except ValueError as err:
        return None, str(err)


def tail_fit(
    plan: dict[str, Any], mem: dict[str, float], sent, tail, p95_e2e_s: float | None
) -> dict[str, Any]:
    """The two fit probes of a plan against one replica's budget: one request at the maximum
    context sent, and the requests in flight at the planned load over the replicas carrying it
    (:func:`capacity_pack.decide.sizing.kv_at_concurrency`; docs/metrics.md, "Sizing from the
    tail")."""
    from capacity_pack.decide import sizing

    budget = mem["accelerator_memory_gb"] * mem["memory_utilization"]

    def probe(kv_gb: float) -> dict[str, Any]:
        result = sizing.fit_probe(
            budget, mem["margin_gb"], mem["weights_gb"], kv_gb, mem["overhead_gb"]
        ).model_dump()
        return {"weights_gb": mem["weights_gb"], "kv_gb": kv_gb,
                "overhead_gb": mem["overhead_gb"], **result}  # fmt: skip

    out: dict[str, Any] = {
        "fit_probe_one_request_at_max_context": {
            "context_tokens": tail.max_tokens,
            **probe(tail.kv_bytes_per_request_max / 1e9),
        }
    }
    load_replicas = (
        plan["required_replicas"] - plan["throughput"]["redundancy_replicas"]
        - plan["throughput"]["warm_pool_replicas"]
    )  # fmt: skip
    rate = plan["throughput"]["peak_rps"] / load_replicas
    if sent.durations_s is None and not p95_e2e_s:
        out["fit_probe_at_planned_concurrency"] = {
            "verdict": None,
            "reason": "no time in system measured at the capacity point",
        }
        return out
    held = sizing.kv_at_concurrency(
        rate, sent.contexts, mem["kv_bytes_per_token"], durations_s=sent.durations_s,
        # Without per-request times, the largest class P95 E2E stands in for E[S]: a P95 lies
        # above the mean unless the top 5 % dominate it, so the in-flight count errs high.
        mean_time_in_system_s=None if sent.durations_s is not None else p95_e2e_s,
    )  # fmt: skip
    out["fit_probe_at_planned_concurrency"] = {
        "load_replicas": load_replicas,
        "time_in_system_source": (
            "the sent requests' send-to-last-event times at the capacity point"
            if sent.durations_s is not None
            else "the largest class P95 E2E at the capacity point, no requests table"
        ),
        "contexts_source": sent.source,
        **held.model_dump(),
        **probe(held.kv_gb),
    }
    return out


def tail_fit_sentences(plan: dict[str, Any]) -> list[str]:
    """The plan's contexts and fit probes in words (README and pack page), paragraph by
    paragraph; empty for a plan without them."""
    ctx = plan.get("contexts")
    if not ctx:
        return []

    def g(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3g}" if abs(v) < 1e3 else f"{v:,.0f}"

    def fit(f: dict[str, Any]) -> str:
        return (f"weights {g(f['weights_gb'])} + KV {g(f['kv_gb'])} + overhead "
                f"{g(f['overhead_gb'])} = {g(f['need_gb'])} GB against a budget of "
                f"{g(f['budget_gb'])} GB (memory x utilization - margin): **{f['verdict']}** "
                f"(headroom {g(f['headroom_gb'])} GB)")  # fmt: skip

    out = [
        f"Contexts (prompt + output tokens) {ctx['label']}: P50 {ctx['p50_tokens']}, "
        f"**P95 {ctx['p95_tokens']}**, P99 {ctx['p99_tokens']}, **max {ctx['max_tokens']}** "
        f"(mean {g(ctx['mean_tokens'])}); KV per request "
        f"{g(ctx['kv_bytes_per_request_p95'] / 1e9)} GB at the P95 (what the memory plan sizes "
        f"with), {g(ctx['kv_bytes_per_request_max'] / 1e9)} GB at the max.",
        "",
    ]
    one = plan.get("fit_probe_one_request_at_max_context")
    if one:
        out += [f"One request at the max context ({one['context_tokens']} tokens, "
                f"{g(one['kv_gb'])} GB of KV) next to the weights and overhead: {fit(one)}.",
                ""]  # fmt: skip
    conc = plan.get("fit_probe_at_planned_concurrency")
    if conc and conc.get("verdict"):
        out += [
            f"Fit probe at the planned concurrency: {g(conc['rate_per_replica_rps'])} RPS per "
            f"replica ({conc['load_replicas']} replicas carry the peak) x "
            f"{g(conc['mean_time_in_system_s'])} s time in system ("
            f"{'mean of ' if conc['duration_weighted'] else ''}"
            f"{conc['time_in_system_source']}) = "
            f"{g(conc['in_flight_mean'])} requests in flight (Little's law; P95 "
            f"{conc['in_flight_p95']} as a Poisson count), holding {g(conc['kv_mean_gb'])} GB "
            f"of KV on average and **{g(conc['kv_gb'])} GB at P95** (the sum over a Poisson "
            "count of contexts drawn "
            + (
                "in proportion to their time in system"
                if conc["duration_weighted"]
                else "uniformly"
            )
            + f", {conc['resamples']} resamples, seed {conc['seed']}); weights + that KV + "
            f"overhead: {fit(conc)}."
            + (
                " The requests in flight at the planned load would not fit on a replica: the "
                "plan needs more replicas, or more memory per replica, than its replica count "
                "says."
                if conc["verdict"] == "does-not-fit"
                else ""
            ),
            "",
        ]
    elif conc:
        out += [f"Fit probe at the planned concurrency: not run ({conc['reason']}).", ""]
    return out


def effective_bandwidth(capacity: Capacity, pack) -> dict[str, Any] | None:
    """Decode-bound effective bandwidth from the measured single-user TPOT (the formula in
    :mod:`capacity_pack.decide.sizing`): tokens/s = 1000 / the lowest class P95 TPOT at
    concurrency 1 (a conservative decode rate),
    bytes moved per token = the replica's weights, effective bandwidth = tokens/s x bytes per
    token, MBU = effective / spec bandwidth."""
    from capacity_pack.decide import sizing

    mem = memory_inputs(pack)
    single = next((c.single_user for c in capacity.closed_loop.values() if c.single_user), None)
    if mem is None or single is None:
        return None
    tpots = [v for v in single.p95_tpot_ms.values() if v]
    if not tpots:
        return None
    tokens_per_s = 1000.0 / min(tpots)
    bytes_gb = mem["weights_gb"]
    spec = None
    if pack.target.kind == "sim":
        from capacity_pack.sim.profile import load_profile

        prof = load_profile(pack.target.profile)
        spec = prof.hardware.bandwidth_tb_s * 1000 * prof.engine.tensor_parallel
    result = sizing.bandwidth(bytes_gb, tokens_per_s * bytes_gb, spec).model_dump()
    result["measured_from"] = "single-user P95 TPOT (closed loop, concurrency 1)"
    return result


def decision_metrics(capacity: Capacity, plan: Plan) -> dict[str, float | None]:
    """The decision and its run-to-run variation as flat metrics for the MLflow parent run."""
    out: dict[str, float | None] = {
        "required_replicas": plan.required_replicas,
        "required_gpus": plan.required_gpus,
    }
    for state, sel in capacity.open_loop.items():
        for key in ("capacity_rps", "capacity_per_replica_rps", "goodput_per_gpu_rps",
                    "capacity_per_gpu_nominal_rps"):  # fmt: skip
            out[f"{state}.{key}"] = getattr(sel, key)
        b = sel.bracket
        for key in ("pass_rps", "fail_rps", "width_rps", "resolution_rps"):
            out[f"{state}.bracket_{key}"] = getattr(b, key)
        out[f"{state}.bracket_reached"] = None if b.reached is None else float(b.reached)
        at = sel.at_capacity
        if at is None:
            continue
        g = at.variation.observed_goodput_rps
        out |= {f"{state}.goodput_rps_{k}": getattr(g, k) for k in ("mean", "min", "max")}
        for name, c in at.variation.classes.items():
            out[f"{state}.{name}.attainment_min"] = c.attainment.min
            out[f"{state}.{name}.p95_ttft_ms_mean"] = c.p95_ttft_ms.mean
            out[f"{state}.{name}.p95_tpot_ms_mean"] = c.p95_tpot_ms.mean
    for state, cur in capacity.closed_loop.items():
        op = cur.operating_point
        out[f"{state}.operating_point_concurrency"] = op.concurrency if op else None
        out[f"{state}.operating_point_output_tps"] = op.output_throughput_tps if op else None
        out[f"{state}.saturation_output_tps"] = cur.saturation_tps
    return out


def max_context_tokens(pack) -> int:
    """The longest request the pack can send: max prompt + max output over its classes."""
    from capacity_pack.plan.manifest import length_stats

    return max(length_stats(c.input_tokens).max + length_stats(c.output_tokens).max
               for c in pack.workload)  # fmt: skip


def preflight_fit(pack) -> dict[str, Any]:
    """Fit probe before any measurement: does one request at the pack's longest context fit
    next to the weights and overhead (``does-not-fit`` stops the pack), and is the context
    within the simulated model's limit?"""
    from capacity_pack.decide import sizing

    mem = memory_inputs(pack)
    context = max_context_tokens(pack)
    if mem is None:
        return {"checked": False, "context_tokens": context,
                "reason": "no model shape or device memory declared (plan.memory)"}  # fmt: skip
    kv_gb = mem["kv_bytes_per_token"] * context / 1e9
    result = sizing.fit_probe(
        mem["accelerator_memory_gb"] * mem["memory_utilization"],
        mem["margin_gb"],
        mem["weights_gb"],
        kv_gb,
        mem["overhead_gb"],
    ).model_dump()
    out: dict[str, Any] = {"checked": True, "context_tokens": context, "kv_gb": kv_gb, **result}
    if pack.target.kind == "sim":
        from capacity_pack.sim.profile import load_profile

        limit = load_profile(pack.target.profile).model.max_model_len
        out["max_model_len"] = limit
        if context > limit:
            reason = f"context {context} exceeds the model's max_model_len {limit}"
            out.update(fits=False, verdict="does-not-fit", reason=reason)
    return out
