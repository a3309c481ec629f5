"""Each load shape's answer and its plot, registered by test type in
:data:`capacity_pack.decide.shapes_common.SHAPES`: smoke, average-load, stress, spike, soak and
breakpoint (their methods: docs/metrics.md, "Load shapes").
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.decide.shapes_common import (
    MIN_CLASS_ATTEMPTS,
    PLATEAU_SHARE,
    RAMP_WINDOWS,
    SOAK_ALPHA,
    SOAK_MATERIAL,
    SOAK_WINDOWS,
    SPIKE_STEP,
    SPIKE_WINDOW_S,
    Context,
    fmt,
    fmt_rps,
    grouped_p95,
    held_rate,
    shape,
    under_gate,
    window_table,
)
from capacity_pack.evidence.statistics import mann_kendall
from capacity_pack.vocab.percentile import nearest_rank

# --- smoke -------------------------------------------------------------------------------------


def plot_smoke(ax, doc: dict[str, Any], inputs: dict[str, Any]) -> None:
    classes = list(doc["classes"])
    y = np.arange(len(classes))
    ok = [doc["classes"][c]["ok"] for c in classes]
    bad = [doc["classes"][c]["failed"] for c in classes]
    passing = [doc["classes"][c]["passing"] for c in classes]
    ax.barh(y, ok, color="tab:green", label="succeeded")
    ax.barh(y, bad, left=ok, color="tab:red", label="failed")
    ax.barh(y, passing, color="none", edgecolor="black", hatch="//", label="within SLO")
    ax.set_yticks(y, classes)
    ax.set_xlabel("measured requests")
    ax.legend(fontsize=8)


@shape("smoke", "Does every class work at all?", plot_smoke)
def smoke(ctx: Context) -> dict[str, Any]:
    r = ctx.requests
    classes: dict[str, Any] = {}
    for c in ctx.classes:
        here = r[r["class"] == c]
        failed = here[~here["ok"]]
        why = (
            failed.assign(why=_failure_words(failed))
            .groupby("why")
            .size()
            .sort_values(ascending=False)
            if len(failed)
            else pd.Series(dtype=int)
        )
        classes[c] = {
            "attempted": int(len(here)),
            "ok": int(here["ok"].sum()),
            "failed": int(len(failed)),
            "passing": int(here["passing"].sum()),
            "failures": {str(k): int(v) for k, v in why.head(3).items()},
        }
    broken = {c: v for c, v in classes.items() if v["ok"] == 0 or v["failed"]}
    if not broken:
        parts = [f"{c} {v['ok']}/{v['attempted']} ok" for c, v in classes.items()]
        text = f"Yes: every class works ({', '.join(parts)}; no errors)."
    else:
        parts = []
        for c, v in broken.items():
            if v["attempted"] == 0:
                parts.append(f"{c} sent no request")
                continue
            why = "; ".join(f"{k} x{n}" for k, n in v["failures"].items())
            parts.append(
                f"{c} failed {v['failed']} of {v['attempted']}" + (f" ({why})" if why else "")
            )
        text = f"No: {'; '.join(parts)}."
    return {"works": not broken, "answer": text, "classes": classes}


def _failure_words(failed: pd.DataFrame) -> list[str]:
    words = []
    for status, http, err in zip(
        failed["status"], failed["http_status"], failed["error"], strict=True
    ):
        w = str(status)
        if http is not None and not pd.isna(http):
            w += f" HTTP {int(http)}"
        if isinstance(err, str) and err:
            w += f": {err.strip()[:80]}"
        words.append(w)
    return words


# --- average-load ------------------------------------------------------------------------------


def plot_average(ax, doc: dict[str, Any], inputs: dict[str, Any]) -> None:
    classes = list(doc["classes"])
    x = np.arange(len(classes))
    att = [doc["classes"][c]["attainment"] or 0.0 for c in classes]
    ci = [doc["classes"][c]["attainment_ci"] or [a, a] for c, a in zip(classes, att, strict=True)]
    err = [[max(a - lo, 0) for a, (lo, _) in zip(att, ci, strict=True)],
           [max(hi - a, 0) for a, (_, hi) in zip(att, ci, strict=True)]]  # fmt: skip
    ax.bar(x, att, yerr=err, capsize=4, color="tab:blue", alpha=0.8, label="attainment (CI)")
    ax.axhline(inputs["gate"], color="red", ls="--", lw=1, label=f"gate {inputs['gate']:g}")
    ax.set_xticks(x, classes)
    ax.set_ylim(min([*att, inputs["gate"]]) * 0.9, 1.02)
    ax.set_ylabel("joint TTFT+TPOT attainment")
    ax.legend(fontsize=8, loc="lower right")


@shape("average-load", "What is the SLO verdict at the expected load?", plot_average)
def average_load(ctx: Context) -> dict[str, Any]:
    rep = ctx.report
    rate = held_rate(ctx.experiment)
    verdict = rep["verdict"]
    classes = {
        c: {
            "attainment": v.get("attainment"),
            "attainment_ci": v.get("attainment_ci"),
            "p95_ttft_ms": v.get("p95_ttft_ms"),
            "p95_tpot_ms": v.get("p95_tpot_ms"),
        }
        for c, v in rep["classes"].items()
    }
    reasons = "; ".join(rep.get("verdict_reasons") or [])
    att = ", ".join(f"{c} {fmt(v['attainment'])}" for c, v in classes.items())
    text = (
        f"At the expected load ({rate:g} RPS held) the SLO verdict is **{verdict}**"
        + (f": {reasons}" if reasons else "")
        + f" (attainment {att}; gate {ctx.gate:g})."
    )
    return {
        "expected_load_rps": rate,
        "verdict": verdict,
        "verdict_reasons": rep.get("verdict_reasons") or [],
        "answer": text,
        "classes": classes,
    }


# --- stress ------------------------------------------------------------------------------------


def plot_stress(axes, doc: dict[str, Any], inputs: dict[str, Any]) -> None:
    rows = doc["windows"]
    x = [w["offered_rps"] for w in rows]
    panels = (
        ("attainment", "all-attempt attainment", inputs["gate"]),
        ("p95_ttft_ms", "P95 TTFT / cutoff", 1.0),
        ("p95_tpot_ms", "P95 TPOT / cutoff", 1.0),
    )
    for ax, (key, label, line) in zip(axes, panels, strict=True):
        for j, c in enumerate(inputs["classes"]):
            cut = {"p95_ttft_ms": inputs["cutoffs"][c][0], "p95_tpot_ms": inputs["cutoffs"][c][1]}
            y = [
                (w["classes"][c][key] / cut[key] if key in cut else w["classes"][c][key])
                if w["classes"][c][key] is not None else np.nan
                for w in rows
            ]  # fmt: skip
            # Markers only: along a plateau the windows' offered rates scatter around one rate.
            ax.plot(x, y, marker="o", ms=4, ls="none", label=c, color=f"C{j}")
        ax.axhline(line, color="red", ls="--", lw=1)
        ax.set_xlabel("offered RPS in the window (one marker per window)")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)


@shape("stress", "How does the service degrade past the expected load?", plot_stress)
def stress(ctx: Context) -> dict[str, Any]:
    edges = np.linspace(0.0, ctx.profile.duration_s, RAMP_WINDOWS + 1)
    rows = window_table(ctx, edges)
    peak = max(w["nominal_rps"] for w in rows)
    expected = ctx.inputs.expected_load_rps
    base_limit = expected if expected is not None else peak / 2
    plateau = [i for i, w in enumerate(rows) if w["nominal_rps"] >= PLATEAU_SHARE * peak]
    base = [i for i, w in enumerate(rows) if w["nominal_rps"] <= base_limit and w["attempted"]]
    first_bad = next((i for i, w in enumerate(rows) if under_gate(w, ctx.gate)), None)
    summary = {c: {"base": _pool(ctx, edges, base, c), "plateau": _pool(ctx, edges, plateau, c)}
               for c in ctx.classes}  # fmt: skip

    # The class whose latency rose most towards its cutoff at the plateau.
    def worst_share(c: str) -> float:
        p, (tc, pc) = summary[c]["plateau"], ctx.inputs.cutoffs[c]
        return max((p["p95_ttft_ms"] or 0) / tc, (p["p95_tpot_ms"] or 0) / pc)

    worst = max(ctx.classes, key=worst_share)
    att = ", ".join(f"{c} {fmt(summary[c]['plateau']['attainment'])}" for c in ctx.classes)
    wb, wp = summary[worst]["base"], summary[worst]["plateau"]
    where = "the expected load" if expected is not None else "half the peak"
    text = (
        f"At the {fmt_rps(peak)} RPS plateau all-attempt attainment is {att} (gate {ctx.gate:g}); "
        f"{worst}'s P95 TTFT goes from {fmt(wb['p95_ttft_ms'])} ms at or under {where} "
        f"({fmt_rps(base_limit)} RPS) to {fmt(wp['p95_ttft_ms'])} ms, P95 TPOT from "
        f"{fmt(wb['p95_tpot_ms'])} to {fmt(wp['p95_tpot_ms'])} ms"
    )
    if first_bad is None:
        text += "; no window falls under the gate: no SLO degradation up to the peak."
    else:
        w = rows[first_bad]
        lo, hi = w["rate_span_rps"]
        text += (
            f"; attainment first falls under the gate at {fmt_rps(w['offered_rps'])} RPS offered "
            f"(t = {w['start_s']:.3g}-{w['end_s']:.3g} s, nominal {fmt_rps(lo)}-{fmt_rps(hi)} RPS: "
            f"{', '.join(under_gate(w, ctx.gate))})."
        )
    return {
        "peak_rps": peak,
        "expected_load_rps": expected,
        "first_window_under_gate": first_bad,
        "summary": summary,
        "windows": rows,
        "answer": text,
    }


def _pool(ctx: Context, edges: np.ndarray, idx: list[int], c: str) -> dict[str, Any]:
    """A class's all-attempt attainment and nearest-rank P95s over the windows ``idx``."""
    r = ctx.requests
    w = np.searchsorted(edges, r["t_s"].to_numpy(), side="right") - 1
    here = r[np.isin(w, idx) & (r["class"] == c).to_numpy()]
    return {
        "attempted": int(len(here)),
        "attainment": float(here["passing"].mean()) if len(here) else None,
        "p95_ttft_ms": nearest_rank(np.sort(here["ttft_ms"].dropna().to_numpy()), 0.95),
        "p95_tpot_ms": nearest_rank(np.sort(here["tpot_ms"].dropna().to_numpy()), 0.95),
    }


# --- spike -------------------------------------------------------------------------------------


def plot_spike(axes, doc: dict[str, Any], inputs: dict[str, Any]) -> None:
    top, bottom = axes
    s0, s1 = doc["spike_start_s"], doc["spike_end_s"]
    q = doc["queue"]
    if q["t_s"]:
        top.plot(q["t_s"], q["value"], color="tab:purple", lw=1.3, label="server queue depth")
        top.axhline(doc["pre_spike_queue"], color="gray", ls=":", lw=1, label="pre-spike level")
    top.set_ylabel("queue depth")
    rate = top.twinx()
    rate.plot(doc["profile"]["t_s"], doc["profile"]["rps"], color="gray", lw=0.8, ls="--")
    rate.set_ylabel("nominal RPS", color="gray", fontsize=8)
    top.legend(fontsize=7, loc="upper right")
    sl = doc["sliding"]
    y = [np.nan if v is None else v for v in sl["attainment"]]
    label = "all-attempt attainment (window starting at t)"
    bottom.plot(sl["t_s"], y, marker=".", color="tab:blue", lw=1, label=label)
    bottom.axhline(inputs["gate"], color="red", ls="--", lw=1, label=f"gate {inputs['gate']:g}")
    bottom.set_ylabel("attainment")
    bottom.set_xlabel("time on the profile (s)")
    for ax in axes:
        ax.axvspan(s0, s1, color="orange", alpha=0.15)
        ax.grid(alpha=0.3)
    if doc["attainment_recovery_s"] is not None:
        bottom.axvline(s1 + doc["attainment_recovery_s"], color="tab:green", lw=1.2,
                       label="attainment recovered")  # fmt: skip
    if doc["queue_recovery_s"] is not None:
        top.axvline(s1 + doc["queue_recovery_s"], color="tab:green", lw=1.2)
    bottom.legend(fontsize=7, loc="lower right")


@shape(
    "spike",
    "How high does the queue go in the burst, and how long until attainment recovers?",
    plot_spike,
)
def spike(ctx: Context) -> dict[str, Any]:
    sp = ctx.experiment.spike
    assert sp is not None
    s0, s1 = sp.at_s, min(sp.at_s + sp.duration_s, ctx.profile.duration_s)
    end = ctx.profile.duration_s
    width = min(max(sp.duration_s, SPIKE_WINDOW_S[0]), SPIKE_WINDOW_S[1])
    step = width * SPIKE_STEP
    starts = np.arange(0.0, max(end - width, 0.0) + 1e-9, step)
    t = np.sort(ctx.requests["t_s"].to_numpy())
    passing = ctx.requests["passing"].to_numpy()  # in send order, as t
    cum = np.concatenate([[0], np.cumsum(passing)])
    lo, hi = np.searchsorted(t, starts, side="left"), np.searchsorted(t, starts + width, "left")
    att: list[float | None] = [
        float((cum[h] - cum[k]) / (h - k)) if h - k >= MIN_CLASS_ATTEMPTS else None
        for k, h in zip(lo, hi, strict=True)
    ]
    # From the burst on: windows starting at or after its start.
    bad = [i for i, v in enumerate(att) if v is not None and v < ctx.gate and starts[i] >= s0]
    if not bad:
        att_rec: float | None = 0.0
    else:
        later = [i for i in range(bad[-1] + 1, len(att)) if att[i] is not None]
        att_rec = max(0.0, float(starts[later[0]]) - s1) if later else None
    q = ctx.signal("queue_depth")
    qt, qv = q["t_s"].to_numpy(), q["value"].to_numpy()
    pre = qv[(qt >= 0) & (qt < s0)]
    pre_level = nearest_rank(np.sort(pre), 0.95) if pre.size else 0.0
    after = (qt >= s0) & (qt <= end)
    peak_q = float(qv[after].max()) if after.any() else None
    peak_t = float(qt[after][np.argmax(qv[after])]) if after.any() else None
    q_rec: float | None = None
    if peak_t is not None:
        back = (qt >= peak_t) & (qv <= pre_level)
        q_rec = max(0.0, float(qt[back][0]) - s1) if back.any() else None
    # The dip: the least attainment of the windows overlapping the burst or after it.
    dip = [v for a, v in zip(starts, att, strict=True) if v is not None and a + width > s0]
    lowest = min(dip) if dip else None
    late = "did not recover within the run"
    if not bad:
        att_words = f"attainment never fell under the gate (lowest {fmt(lowest)})"
    elif att_rec is None:
        att_words = f"attainment fell to {fmt(lowest)} and {late}"
    else:
        again = f"back at the gate {att_rec:.3g} s after the burst"
        att_words = f"attainment fell to {fmt(lowest)}, {again}"
    q_words = late if q_rec is None else f"{q_rec:.3g} s after the burst"
    text = (
        f"The {sp.rate_rps:g} RPS burst (t = {s0:g}-{s1:g} s) peaks the server queue at "
        + (f"a depth of {peak_q:g} (t = {peak_t:.3g} s)" if peak_q is not None
           else "an unknown depth (no queue-depth scrape)")
        + f"; in sliding {width:g} s windows (gate {ctx.gate:g}) {att_words}"
        + f"; the queue is back at its pre-spike level ({fmt(pre_level)}): {q_words}."
    )  # fmt: skip
    grid = np.linspace(0, end, 200)
    return {
        "spike_start_s": s0,
        "spike_end_s": s1,
        "window_s": width,
        "peak_queue_depth": peak_q,
        "peak_queue_t_s": peak_t,
        "pre_spike_queue": pre_level,
        "lowest_attainment": lowest,
        "attainment_recovery_s": att_rec,
        "attainment_recovered": att_rec is not None,
        "queue_recovery_s": q_rec,
        "queue_recovered": q_rec is not None,
        "sliding": {"t_s": starts.round(3).tolist(), "attainment": att},
        "queue": {"t_s": qt.round(3).tolist(), "value": qv.tolist()},
        "profile": {"t_s": grid.round(3).tolist(), "rps": ctx.profile.rate_at(grid).tolist()},
        "answer": text,
    }


# --- soak --------------------------------------------------------------------------------------

#: The soak's signals: key, label, unit words.
SOAK_SIGNALS = (
    ("p95_ttft_share", "P95 TTFT / class cutoff"),
    ("p95_tpot_share", "P95 TPOT / class cutoff"),
    ("kv_usage", "mean KV-cache usage"),
    ("error_rate", "error rate"),
)


def plot_soak(axes, doc: dict[str, Any], inputs: dict[str, Any]) -> None:
    mid = doc["window_mid_s"]
    for ax, (key, label) in zip(axes.flat, SOAK_SIGNALS, strict=True):
        s = doc["signals"][key]
        if s["values"] is None:
            ax.set_title(f"{label}: not exposed by this engine", fontsize=9)
            ax.set_yticks([])
            continue
        y = [np.nan if v is None else v for v in s["values"]]
        ax.plot(mid, y, marker="o", ms=4, lw=1, color="tab:blue")
        if s["slope_per_s"] is not None and s["intercept"] is not None:
            t = np.asarray(mid)
            ax.plot(t, s["intercept"] + s["slope_per_s"] * t, color="tab:red", lw=1, ls="--")
        p = s["p_two_sided"]
        ax.set_title(f"{label}: {s['verdict']}" + (f" (p={p:.2g})" if p is not None else ""),
                     fontsize=9)  # fmt: skip
        ax.grid(alpha=0.3)
        ax.set_xlabel("time on the profile (s)")


@shape("soak", "Do latency, KV usage or the error rate drift over time?", plot_soak)
def soak(ctx: Context) -> dict[str, Any]:
    end = ctx.profile.duration_s
    edges = np.linspace(0.0, end, SOAK_WINDOWS + 1)
    width = float(edges[1] - edges[0])
    r = ctx.requests
    w = np.searchsorted(edges, r["t_s"].to_numpy(), side="right") - 1
    r = r.assign(w=w)[(w >= 0) & (w < SOAK_WINDOWS)]
    idx = pd.RangeIndex(SOAK_WINDOWS)
    values = {
        "p95_ttft_share": grouped_p95(r, ["w"], "ttft_share").reindex(idx),
        "p95_tpot_share": grouped_p95(r, ["w"], "tpot_share").reindex(idx),
        "error_rate": (1 - r.groupby("w")["ok"].mean()).reindex(idx),
    }
    kv = ctx.signal("kv_usage")
    kw = np.searchsorted(edges, kv["t_s"].to_numpy(), side="right") - 1
    kv = kv.assign(w=kw)[(kw >= 0) & (kw < SOAK_WINDOWS)]
    values["kv_usage"] = kv.groupby("w")["value"].mean().reindex(idx) if len(kv) else None
    alpha = SOAK_ALPHA / len(SOAK_SIGNALS)
    material = {**SOAK_MATERIAL, "error_rate": ctx.inputs.error_rate_max}
    signals: dict[str, Any] = {}
    for key, _ in SOAK_SIGNALS:
        v = values[key]
        signals[key] = drift_test(
            None if v is None else v.to_numpy(float), width, end, alpha, material[key]
        )
    drifting = [k for k, s in signals.items() if s["verdict"] == "drift"]
    small = [k for k, s in signals.items() if s["verdict"] == "immaterial"]
    labels = dict(SOAK_SIGNALS)

    def over(k: str) -> str:
        s = signals[k]
        return f"{labels[k]} {s['change_over_soak']:+.3g} over the run (p={s['p_two_sided']:.2g})"

    test = (
        f"Mann-Kendall two-sided at alpha {alpha:.3g} per signal (Bonferroni, family "
        f"{SOAK_ALPHA:g}) on {SOAK_WINDOWS} windows of {width:.3g} s, Theil-Sen slope"
    )
    if drifting:
        text = f"Drift over the {end:g} s soak: {'; '.join(over(k) for k in drifting)} ({test})."
    else:
        untested = [labels[k] for k, s in signals.items() if s["verdict"] == "not tested"]
        text = f"No drift over the {end:g} s soak ({test})" + (
            f"; significant but below materiality: {'; '.join(over(k) for k in small)}"
            if small else ""
        ) + (f"; not tested: {', '.join(untested)}" if untested else "") + "."  # fmt: skip
    return {
        "window_s": width,
        "window_mid_s": ((edges[:-1] + edges[1:]) / 2).round(3).tolist(),
        "alpha_per_signal": alpha,
        "family_alpha": SOAK_ALPHA,
        "drift": drifting,
        "signals": signals,
        "answer": text,
    }


def drift_test(
    values: np.ndarray | None, width_s: float, span_s: float, alpha: float, material: float
) -> dict[str, Any]:
    """Theil-Sen slope and two-sided Mann-Kendall over one windowed signal (windows without a
    value dropped); ``drift`` when p < alpha and |slope| x span >= material."""
    out: dict[str, Any] = {
        "values": None if values is None else [None if np.isnan(v) else float(v) for v in values],
        "slope_per_s": None,
        "intercept": None,
        "change_over_soak": None,
        "p_two_sided": None,
        "material_change": material,
        "verdict": "not tested",
    }
    if values is None:
        return out
    keep = ~np.isnan(values)
    x = values[keep]
    if x.size < 4:
        return out
    mk = mann_kendall(x)
    # Per window index -> per second; windows dropped leave the index spacing slightly off,
    # so the slope is taken on the kept windows' own times.
    t = (np.flatnonzero(keep) + 0.5) * width_s
    i, j = np.triu_indices(x.size, 1)
    slope = float(np.median((x[j] - x[i]) / (t[j] - t[i])))
    intercept = float(np.median(x - slope * t))
    p = 2 * (1 - NormalDist().cdf(abs(mk["z"] or 0.0)))
    change = slope * span_s
    significant = p < alpha
    out.update(
        slope_per_s=slope,
        intercept=intercept,
        change_over_soak=change,
        p_two_sided=p,
        mann_kendall_s=mk["s"],
        verdict=(
            "drift" if significant and abs(change) >= material
            else "immaterial" if significant else "no drift"
        ),
    )  # fmt: skip
    return out


# --- breakpoint --------------------------------------------------------------------------------


def plot_breakpoint(ax, doc: dict[str, Any], inputs: dict[str, Any]) -> None:
    rows = doc["windows"]
    x = [w["nominal_rps"] for w in rows]
    for j, c in enumerate(inputs["classes"]):
        y = [np.nan if w["classes"][c]["attainment"] is None else w["classes"][c]["attainment"]
             for w in rows]  # fmt: skip
        ax.plot(x, y, marker="o", ms=4, lw=1, label=c, color=f"C{j}")
    ax.axhline(inputs["gate"], color="red", ls="--", lw=1, label=f"gate {inputs['gate']:g}")
    b = doc["break"]
    if b is not None:
        ax.axvspan(*b["rate_span_rps"], color="red", alpha=0.15, label="first window under gate")
    ax.set_xlabel("nominal RPS of the ramp window")
    ax.set_ylabel("all-attempt attainment")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


@shape("breakpoint", "At what rate does the service first break its SLO?", plot_breakpoint)
def breakpoint_(ctx: Context) -> dict[str, Any]:
    ramp_start = float(ctx.profile.duration_s - ctx.experiment.segments[-1].duration_s)
    edges = np.linspace(ramp_start, ctx.profile.duration_s, RAMP_WINDOWS + 1)
    rows = window_table(ctx, edges)
    first = next((i for i, w in enumerate(rows) if under_gate(w, ctx.gate)), None)
    judged = sorted(
        {c for w in rows for c, v in w["classes"].items() if v["attainment"] is not None}
    )
    top = float(ctx.experiment.segments[-1].to_rps or 0)
    brk = None
    if first is None:
        text = (
            f"The service did not break its SLO on the ramp: every window up to {top:g} RPS "
            f"(the ramp's end) is at or over the gate {ctx.gate:g}."
        )
    else:
        w = rows[first]
        lo, hi = w["rate_span_rps"]
        last_ok = next((rows[i] for i in range(first - 1, -1, -1) if rows[i]["attempted"]), None)
        sustained = all(under_gate(v, ctx.gate) for v in rows[first:] if v["attempted"])
        brk = {
            "window": first,
            "start_s": w["start_s"],
            "end_s": w["end_s"],
            "rate_span_rps": [lo, hi],
            "nominal_rps": w["nominal_rps"],
            "offered_rps": w["offered_rps"],
            "classes": under_gate(w, ctx.gate),
            "last_window_at_gate_rps": None if last_ok is None else last_ok["rate_span_rps"],
            "sustained": sustained,
        }
        worst = min(brk["classes"], key=lambda c: w["classes"][c]["attainment"])
        text = (
            f"The service first breaks its SLO at about {fmt_rps(w['nominal_rps'])} RPS "
            f"(the window {w['start_s']:.3g}-{w['end_s']:.3g} s spans "
            f"{fmt_rps(lo)}-{fmt_rps(hi)} RPS "
            f"nominal, {fmt_rps(w['offered_rps'])} RPS offered): {worst} all-attempt attainment "
            f"{fmt(w['classes'][worst]['attainment'])} < gate {ctx.gate:g}"
            + (
                f"; the window below it ({fmt_rps(last_ok['rate_span_rps'][0])}-"
                f"{fmt_rps(last_ok['rate_span_rps'][1])} RPS) was at or over the gate"
                if last_ok is not None else "; it is the ramp's first window"
            )
            + ("; every later window stays under the gate." if sustained
               else "; some later windows are back at the gate (not a sustained break).")
        )  # fmt: skip
    return {
        "ramp_start_s": ramp_start,
        "ramp_top_rps": top,
        "judged_classes": judged,
        "break": brk,
        "windows": rows,
        "answer": text,
    }
