"""Capacity selection: from per-point SLO reports to the capacity a pack can defend.

Open-loop sweep, per cache state:

- a rate *passes* when every repeat's report has verdict ``pass`` (all gates, attainment CIs
  above the threshold, enough samples, a flat queue, a valid client); a rate that passes only in
  some repeats is ``inconsistent``, one that passes only on point estimates ``marginal``, one with
  an under-sampled class, an undecided queue trend or a client-bound repeat ``inconclusive``;
- the SLO-compliant capacity is the highest tested rate that passes with every lower tested rate
  passing too (a pass above a failure is reported as non-monotonic and not selected);
- the next rate up and the gates that stopped it are named;
- run-to-run variation across repeats: mean, min, max and a Student-t confidence interval of
  goodput, every class's attainment and P95 TTFT/TPOT; never only the best run;
- per-replica capacity = capacity / replicas under test (valid only for the same workload, cache
  state, placement and engine configuration), and goodput per GPU = capacity / GPUs under test,
  in DistServe's sense (Zhong et al., OSDI 2024: the highest request rate per provisioned GPU
  that meets the SLO attainment goal), not the per-window observed goodput of a report.

Closed-loop sweep: the latency-throughput curve (output tokens/s against P95 TTFT/TPOT per
concurrency) and the operating point = the highest throughput whose point still passes the
latency gates; concurrency 1 (the single-user regime) is reported on its own.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

from capacity_pack.evidence.gates import CLASS_ATTAINMENT


def t_interval(values: list[float], confidence: float = 0.95) -> dict[str, float | None]:
    """Mean, min, max and a Student-t interval of the mean over repeats."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return {"n": 0, "mean": None, "min": None, "max": None, "ci_low": None, "ci_high": None}
    out: dict[str, float | None] = {
        "n": int(x.size),
        "mean": float(x.mean()),
        "min": float(x.min()),
        "max": float(x.max()),
        "ci_low": None,
        "ci_high": None,
    }
    if x.size >= 2:
        from scipy.stats import t

        half = float(t.ppf(0.5 + confidence / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
        out["ci_low"], out["ci_high"] = out["mean"] - half, out["mean"] + half
    return out


def rate_status(reports: list[dict[str, Any]]) -> str:
    verdicts = [r["verdict"] for r in reports]
    if all(v == "pass" for v in verdicts):
        return "pass"
    if any(v == "inconclusive" for v in verdicts):
        return "inconclusive"
    if any(v == "pass" for v in verdicts) or (
        any(v == "marginal" for v in verdicts) and any(v == "fail" for v in verdicts)
    ):
        return "inconsistent"
    if all(v == "marginal" for v in verdicts):
        return "marginal"
    return "fail"


def variation(reports: list[dict[str, Any]], classes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "observed_goodput_rps": t_interval([r["observed_goodput_rps"] for r in reports]),
        "request_throughput_rps": t_interval([r["request_throughput_rps"] for r in reports]),
        "output_throughput_tps": t_interval([r["output_throughput_tps"] for r in reports]),
        "error_rate": t_interval([r["error_rate"] for r in reports]),
        "classes": {},
    }
    for c in classes:
        rows = [r["classes"][c] for r in reports]
        out["classes"][c] = {
            key: t_interval([row[key] for row in rows])
            for key in ("attainment", "p95_ttft_ms", "p95_tpot_ms", "p95_e2e_ms")
        }
    return out


def select_open_loop(
    reports: list[dict[str, Any]], classes: list[str], replicas: int, gpus: int
) -> dict[str, Any]:
    """Capacity per cache state from the open-loop reports (see the module docstring)."""
    by_state: dict[str, dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in reports:
        if r.get("mode") == "open":
            by_state[r["cache_state"]][float(r["offered_rps"])].append(r)
    result: dict[str, Any] = {}
    for state, rates in sorted(by_state.items()):
        rows = []
        for rate in sorted(rates):
            reps = sorted(rates[rate], key=lambda r: r["repeat"])
            rows.append(
                {
                    "offered_rps": rate,
                    "status": rate_status(reps),
                    "repeats": len(reps),
                    "verdicts": [r["verdict"] for r in reps],
                    "reasons": sorted({reason for r in reps for reason in r["verdict_reasons"]}),
                    "variation": variation(reps, classes),
                }
            )
        capacity = None
        for row in rows:
            if row["status"] != "pass":
                break
            capacity = row["offered_rps"]
        passing_above = [
            row["offered_rps"]
            for row in rows
            if row["status"] == "pass" and (capacity is None or row["offered_rps"] > capacity)
        ]
        next_up = next(
            (row for row in rows if capacity is None or row["offered_rps"] > capacity), None
        )
        result[state] = {
            "rates": rows,
            "capacity_rps": capacity,
            "capacity_per_replica_rps": capacity / replicas if capacity is not None else None,
            "goodput_per_gpu_rps": capacity / gpus if capacity is not None else None,
            "non_monotonic_passes_rps": passing_above,
            "next_rate_up": (
                {
                    "offered_rps": next_up["offered_rps"],
                    "status": next_up["status"],
                    "limited_by": next_up["reasons"],
                }
                if next_up is not None
                else None
            ),  # fmt: skip
            "decision": _decision(capacity, rows, next_up, state),
        }
    return result


def _decision(capacity, rows, next_up, state) -> str:
    if not rows:
        return f"{state}: no open-loop points"
    if capacity is None:
        first = rows[0]
        return (
            f"{state}: no tested rate passes; the lowest ({first['offered_rps']:g} RPS) is "
            f"{first['status']}: {'; '.join(first['reasons']) or 'see its reports'}"
        )
    text = (
        f"{state}: {capacity:g} RPS is the highest tested rate passing every gate in every repeat"
    )
    if next_up is not None:
        text += (
            f"; the next rate up ({next_up['offered_rps']:g} RPS) is {next_up['status']}: "
            f"{'; '.join(next_up['reasons']) or 'see its reports'}"
        )
    else:
        text += "; it is the highest rate tested, so the true capacity may be higher"
    return text


def closed_loop_curve(
    reports: list[dict[str, Any]], classes: list[str], attainment_min: float
) -> dict[str, Any]:
    """Latency-throughput curve per cache state and its operating point."""
    by_state: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in reports:
        if r.get("mode") == "closed":
            by_state[r["cache_state"]][int(r["concurrency"])].append(r)
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
                        np.mean([r["request_throughput_rps"] for r in reps])
                    ),
                    "p95_ttft_ms": {c: var["classes"][c]["p95_ttft_ms"]["mean"] for c in classes},
                    "p95_tpot_ms": {c: var["classes"][c]["p95_tpot_ms"]["mean"] for c in classes},
                    "attainment": {c: var["classes"][c]["attainment"]["mean"] for c in classes},
                    "meets_latency_gates": all(_latency_pass(r, attainment_min) for r in reps),
                }
            )
        inside = [p for p in curve if p["meets_latency_gates"]]
        best = max(inside, key=lambda p: p["output_throughput_tps"] or 0.0, default=None)
        single = next((p for p in curve if p["concurrency"] == 1), None)
        out[state] = {
            "curve": curve,
            "operating_point": best,
            "single_user": single,
            "saturation_tps": max((p["output_throughput_tps"] or 0.0 for p in curve), default=None),
        }
    return out


def _latency_pass(report: dict[str, Any], attainment_min: float) -> bool:
    """The latency constraint of the curve: every class's attainment (the closed-loop sweep is
    for the frontier; its sample sizes are not a capacity decision)."""
    return all(
        CLASS_ATTAINMENT.holds(c["attainment"], attainment_min) for c in report["classes"].values()
    )


# ---------------------------------------------------------------------------------------------
# From reports to the decision and the plan
# ---------------------------------------------------------------------------------------------


def primary_cache_state(states: list[str]) -> str:
    """The state the headline decision uses: cold when measured (it is the conservative one)."""
    return "cold" if "cold" in states else states[0]


def build_capacity(reports: list[dict[str, Any]], pack) -> dict[str, Any]:
    classes = pack.class_names
    placement = pack.engine.placement
    open_loop = select_open_loop(reports, classes, placement.replicas, placement.gpus)
    closed = closed_loop_curve(reports, classes, pack.acceptance.class_slo_attainment_min)
    states = sorted({r["cache_state"] for r in reports}) or list(pack.sweep.cache_states)
    primary = primary_cache_state([s for s in pack.sweep.cache_states if s in states] or states)
    return {
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
        "experiments": sorted(
            {r["point"]: r["verdict"] for r in reports if r.get("mode") == "exp"}.items()
        ),
    }


def mix_p95_context(pack) -> float:
    """P95 of prompt + output tokens over the class mix (per-class P95 for distributions)."""
    from capacity_pack.plan.manifest import length_stats

    rows = sorted(
        (length_stats(c.input_tokens).p95 + length_stats(c.output_tokens).p95, c.mix)
        for c in pack.workload
    )
    cum = 0.0
    for context, mix in rows:
        cum += mix
        if cum >= 0.95 - 1e-12:
            return float(context)
    return float(rows[-1][0])


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


def build_plan(capacity: dict[str, Any], reports: list[dict[str, Any]], pack) -> dict[str, Any]:
    """Replicas and GPUs for the pack's peak, from throughput and from memory; cost."""
    from capacity_pack.decide import sizing

    state = capacity["primary_cache_state"]
    sel = capacity["open_loop"].get(state, {})
    per_replica = sel.get("capacity_per_replica_rps")
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
    mem_plan = None
    mem = memory_inputs(pack)
    at_capacity = [
        r for r in reports
        if r.get("mode") == "open" and r["cache_state"] == state
        and float(r["offered_rps"]) == float(sel["capacity_rps"])
    ]  # fmt: skip
    p95_e2e_s = max(
        (c["p95_e2e_ms"] or 0.0) for r in at_capacity for c in r["classes"].values()
    ) / 1e3 if at_capacity else None  # fmt: skip
    if mem is not None and p95_e2e_s:
        try:
            mem_plan = sizing.plan_memory(
                pack.plan.peak_rps,
                p95_e2e_s,
                mem["kv_bytes_per_token"],
                mix_p95_context(pack),
                mem["accelerator_memory_gb"],
                mem["weights_gb"],
                mem["overhead_gb"],
                mem["memory_utilization"],
            )
        except ValueError as err:
            mem_plan = None
            memory_error = str(err)
        else:
            memory_error = None
    else:
        memory_error = "no memory inputs (plan.memory) for a non-simulated target"
    plan = sizing.combine(thr, mem_plan)
    plan["capacity_cache_state"] = state
    plan["p95_e2e_s_at_capacity"] = p95_e2e_s
    plan["p95_context_tokens"] = mix_p95_context(pack)
    if memory_error:
        plan["memory_note"] = memory_error
    if mem is not None:
        kv_gb = mem["kv_bytes_per_token"] * mix_p95_context(pack) / 1e9
        plan["fit_probe_one_request_at_p95_context"] = sizing.fit_probe(
            mem["accelerator_memory_gb"], mem["margin_gb"], mem["weights_gb"], kv_gb,
            mem["overhead_gb"],
        ).model_dump()  # fmt: skip
    if pack.plan.price_per_gpu_hour is not None:
        # Only successes divide the bill: failures at the capacity point raise the unit cost.
        error_rate = max((r["error_rate"] or 0.0) for r in at_capacity) if at_capacity else 0.0
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


def effective_bandwidth(capacity: dict[str, Any], pack) -> dict[str, Any] | None:
    """Decode-bound effective bandwidth from the measured single-user TPOT (the formula in
    :mod:`capacity_pack.decide.sizing`): tokens/s = 1000 / the lowest class P95 TPOT at
    concurrency 1 (a conservative decode rate),
    bytes moved per token = the replica's weights, effective bandwidth = tokens/s x bytes per
    token, MBU = effective / spec bandwidth."""
    from capacity_pack.decide import sizing

    mem = memory_inputs(pack)
    single = None
    for cur in capacity["closed_loop"].values():
        single = single or cur.get("single_user")
    if mem is None or single is None:
        return None
    tpots = [v for v in single["p95_tpot_ms"].values() if v]
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


def decision_metrics(capacity: dict[str, Any], plan: dict[str, Any]) -> dict[str, float | None]:
    """The decision and its run-to-run variation as flat metrics for the MLflow parent run."""
    out: dict[str, float | None] = {
        "required_replicas": plan.get("required_replicas"),
        "required_gpus": plan.get("required_gpus"),
    }
    for state, sel in capacity["open_loop"].items():
        out[f"{state}.capacity_rps"] = sel["capacity_rps"]
        out[f"{state}.capacity_per_replica_rps"] = sel["capacity_per_replica_rps"]
        out[f"{state}.goodput_per_gpu_rps"] = sel["goodput_per_gpu_rps"]
        at = next((r for r in sel["rates"] if r["offered_rps"] == sel["capacity_rps"]), None)
        if at is None:
            continue
        g = at["variation"]["observed_goodput_rps"]
        out[f"{state}.goodput_rps_mean"] = g["mean"]
        out[f"{state}.goodput_rps_min"] = g["min"]
        out[f"{state}.goodput_rps_max"] = g["max"]
        for name, c in at["variation"]["classes"].items():
            out[f"{state}.{name}.attainment_min"] = c["attainment"]["min"]
            out[f"{state}.{name}.p95_ttft_ms_mean"] = c["p95_ttft_ms"]["mean"]
            out[f"{state}.{name}.p95_tpot_ms_mean"] = c["p95_tpot_ms"]["mean"]
    for state, cur in capacity["closed_loop"].items():
        op = cur["operating_point"]
        out[f"{state}.operating_point_concurrency"] = op["concurrency"] if op else None
        out[f"{state}.operating_point_output_tps"] = op["output_throughput_tps"] if op else None
        out[f"{state}.saturation_output_tps"] = cur["saturation_tps"]
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
                "reason": "no model shape or accelerator declared (plan.memory)"}  # fmt: skip
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
