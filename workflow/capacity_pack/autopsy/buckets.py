"""Where the critical path's seconds went: cost buckets, counterfactuals, finding or waste.

Along the critical path ``gap = max(0, start - prev_end)`` is orchestration and
``work = end - max(start, prev_end)`` the job's, so gaps + work = last end - invocation start
(checked, ``SUM_TOLERANCE_S``); rules map to buckets by ``RULE_BUCKET``. Counterfactuals: new
wall clock = wall clock - saved, e.g. saved = (1 - 1/speedup) x (drain tails + closed-loop load
spans on the path). Buckets of at least ``DOMINANT_SHARE`` are judged finding or waste.
Method: docs/metrics.md, 'Run autopsy: cost buckets'.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field

from capacity_pack.autopsy.sources import MEASUREMENT_RULES, StrictModel
from capacity_pack.plan.words import TargetWords

DOMINANT_SHARE = 0.10
SUM_TOLERANCE_S = 1e-6

BUCKETS = (
    "task_intrinsic",
    "infrastructure",
    "implementation_debugging",
    "orchestration",
    "documentation",
)
RULE_BUCKET: dict[str, str] = {
    # Measurement jobs: the load span only; the rest of the job is infrastructure.
    "sweep": "task_intrinsic",
    "failure_drill": "task_intrinsic",
    "analyze": "task_intrinsic",
    "capacity": "task_intrinsic",
    "failure_analyze": "task_intrinsic",
    "freeze": "infrastructure",
    "schedule": "infrastructure",
    "normalize": "infrastructure",
    "track": "infrastructure",
    "dashboard": "infrastructure",
    "report": "documentation",
    "failure_test": "documentation",
    "autopsy": "documentation",
    # Snakemake's aggregate target does no work of its own.
    "all": "orchestration",
}
UNKNOWN_RULE_BUCKET = "infrastructure"

Provenance = Literal["measured", "derived", "estimated"]


class Counterfactual(StrictModel):
    name: str = Field(description="the intervention")
    assumption: str = Field(description="what it changes, from the measured bottleneck")
    arithmetic: str = Field(description="the computation, written out")
    saved_s: float = Field(description="seconds of critical path it would save")
    new_wall_s: float = Field(description="the wall clock it would leave")
    provenance: Provenance = Field(description="derived (from measured spans) or estimated")
    caveat: str = Field(description="what the figure does not cover")


class FindingOrWaste(StrictModel):
    bucket: str = Field(description="a dominant bucket")
    seconds: float = Field(description="its seconds of critical path")
    share: float = Field(description="its share of the critical path")
    changes_comparison: str = Field(description="Q1: does it change the measured comparison?")
    changes_decision: str = Field(description="Q2: would removing it change the decision?")
    recurs_at_target: str = Field(description="Q3: does it recur at the deployment target?")
    verdict: str = Field(description="finding or waste")
    routed_to: str = Field(description="analysis plan or engineering backlog")
    line: str = Field(description="the analysis-plan line or the priced backlog line")


# ---------------------------------------------------------------------------------------------
# Buckets
# ---------------------------------------------------------------------------------------------


def _overlap(a0: np.ndarray, a1: np.ndarray, b0: np.ndarray, b1: np.ndarray) -> np.ndarray:
    return np.nan_to_num(np.maximum(np.minimum(a1, b1) - np.maximum(a0, b0), 0.0))


def attribute_buckets(
    path: pd.DataFrame, started: float, windows: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The critical path split into gaps and work, and each row's seconds per bucket.

    ``windows`` (indexed by job) gives a measurement job's load window in epoch seconds
    (``load_start``, ``load_end``): the part of its work inside it is task-intrinsic, the rest
    infrastructure; without one its whole work counts as task-intrinsic (``split`` says so).
    The buckets add up to the wall clock (last end - ``started``) within ``SUM_TOLERANCE_S``:
    checked here.
    """
    out = path.copy().reset_index(drop=True)
    if out.empty:
        for c in ("seg_start", "seg_end", "gap_s", "overlap_s", "work_s", "split", *BUCKETS):
            out[c] = pd.Series(dtype=object if c == "split" else float)
        return out
    # Seconds since the start: epoch floats would lose ~1e-7 s per term in the sum.
    t_start = (out["start_s"].to_numpy(float)) - started
    t_end = np.maximum.accumulate(np.maximum(out["end_s"].to_numpy(float) - started, 0.0))
    prev = np.r_[0.0, t_end[:-1]]
    seg = np.clip(t_start, prev, t_end)
    out["seg_start"], out["seg_end"] = seg, t_end
    out["gap_s"] = seg - prev
    out["overlap_s"] = np.maximum(prev - t_start, 0.0)
    work = t_end - seg
    out["work_s"] = work
    load0 = np.full(len(out), np.nan)
    load1 = np.full(len(out), np.nan)
    if windows is not None and len(windows) and "load_start" in windows:
        w = windows.reindex(out["job"].to_numpy())
        load0 = w["load_start"].to_numpy(float) - started
        load1 = w["load_end"].to_numpy(float) - started
    err = (out["status"] == "error").to_numpy()
    bucket = out["rule"].map(RULE_BUCKET).fillna(UNKNOWN_RULE_BUCKET).to_numpy()
    meas = out["rule"].isin(MEASUREMENT_RULES).to_numpy() & ~err
    has_window = meas & ~np.isnan(load0)
    intrinsic = np.where(has_window, _overlap(seg, t_end, load0, load1), work)
    out["split"] = np.where(
        has_window, "records", np.where(meas, "none: no valid load window (records or clock)", "")
    )
    out["task_intrinsic"] = np.where(
        meas, intrinsic, np.where((bucket == "task_intrinsic") & ~err, work, 0.0)
    )
    out["infrastructure"] = np.where(
        meas, work - intrinsic, np.where((bucket == "infrastructure") & ~err, work, 0.0)
    )
    out["implementation_debugging"] = np.where(err, work, 0.0)
    out["orchestration"] = out["gap_s"] + np.where((bucket == "orchestration") & ~err, work, 0.0)
    out["documentation"] = np.where((bucket == "documentation") & ~err, work, 0.0)
    wall = float(t_end[-1]) if len(out) else 0.0
    total = math.fsum(out[list(BUCKETS)].to_numpy(float).ravel())
    if abs(total - wall) > SUM_TOLERANCE_S:
        raise AssertionError(f"critical-path buckets sum to {total!r} s, wall clock {wall!r} s")
    return out


def bucket_totals(attributed: pd.DataFrame) -> dict[str, float]:
    """Seconds per bucket over the critical path (every bucket, zeros included)."""
    return {
        b: math.fsum(attributed[b].to_numpy(float)) if len(attributed) else 0.0 for b in BUCKETS
    }


def bucket_contributors(attributed: pd.DataFrame, bucket: str, top: int = 3) -> str:
    """The rules holding most of a bucket, in words (orchestration: start-up and gaps)."""
    by_rule = attributed.groupby("rule")[bucket].agg(["sum", "count"])
    by_rule = by_rule[by_rule["sum"] > 0].sort_values("sum", ascending=False).head(top)
    parts = [f"{rule} {row['sum']:.1f} s" for rule, row in by_rule.iterrows()]
    if bucket == "orchestration":
        parts = [
            f"before the first job {float(attributed['gap_s'].iloc[0]):.1f} s",
            f"{int((attributed['gap_s'].iloc[1:] > 0).sum())} gaps "
            f"{float(attributed['gap_s'].iloc[1:].sum()):.1f} s",
        ]
    return ", ".join(parts) or "none"


# ---------------------------------------------------------------------------------------------
# Counterfactuals
# ---------------------------------------------------------------------------------------------


def _sum_text(values: Iterable[float], limit: int = 6) -> str:
    vals = [v for v in values if v > 0]
    if not vals:
        return "0"
    shown = " + ".join(f"{v:.2f}" for v in vals[:limit])
    return shown + (f" + ... ({len(vals)} terms)" if len(vals) > limit else "")


def _faster_processor(
    wall: float,
    mode: np.ndarray,
    tail_on_path: np.ndarray,
    intrinsic: np.ndarray,
    speedup: float,
    words: TargetWords,
) -> Counterfactual:
    is_open, is_closed = mode == "open", mode == "closed"
    unknown = ~(is_open | is_closed)
    tails, closed = tail_on_path[is_open], intrinsic[is_closed]
    saved = (1.0 - 1.0 / speedup) * (math.fsum(tails) + math.fsum(closed))
    return Counterfactual(
        name=f"a {speedup:g}x faster {words.processor}",
        assumption=(
            "an open-loop point's duration is fixed by its arrival schedule, so only its drain "
            "tail (last end - last due) shrinks; a closed-loop point's whole load span "
            f"shrinks; both by 1 - 1/{speedup:g}; analysis, start-up and plumbing do not "
            f"run on the target's {words.processor}"
        ),
        arithmetic=(
            f"open loop: {int(is_open.sum())} jobs on the path, drain tails on the path "
            f"{_sum_text(tails)} = {math.fsum(tails):.2f} s; closed loop: "
            f"{int(is_closed.sum())} jobs, load spans on the path {_sum_text(closed)} = "
            f"{math.fsum(closed):.2f} s; saved = (1 - 1/{speedup:g}) x "
            f"({math.fsum(tails):.2f} + {math.fsum(closed):.2f}) = {saved:.2f} s; new wall "
            f"= {wall:.2f} - {saved:.2f} = {wall - saved:.2f} s"
        ),
        saved_s=saved,
        new_wall_s=wall - saved,
        provenance="derived",
        caveat=(
            "priced against the measured service times of the target that ran"
            + (
                "; for a simulated target they are the simulator's model, not an accelerator's"
                if words.simulated
                else ""
            )
            + (
                f"; {int(unknown.sum())} measurement jobs without records not priced"
                if unknown.any()
                else ""
            )
        ),
    )


def _smaller_budget(wall: float, spans: np.ndarray, fraction: float) -> Counterfactual:
    saved = (1.0 - fraction) * math.fsum(spans)
    return Counterfactual(
        name=f"b {fraction:g} x the measurement budget",
        assumption=(
            f"{fraction:g} x the repeats / requests per point: each measurement load "
            f"span on the path scales by {fraction:g}"
        ),
        arithmetic=(
            f"measurement load spans on the path {_sum_text(spans)} = {math.fsum(spans):.2f} s;"
            f" saved = (1 - {fraction:g}) x {math.fsum(spans):.2f} = {saved:.2f} s; "
            f"new wall = {wall:.2f} - {saved:.2f} = {wall - saved:.2f} s"
        ),
        saved_s=saved,
        new_wall_s=wall - saved,
        provenance="derived",
        caveat=(
            "a decision cost, not free time: fewer samples per class widen the attainment "
            "confidence intervals and can fail the sample gates"
        ),
    )


def _more_targets(
    wall: float, job_work: np.ndarray, slot_gated: int, targets: int
) -> Counterfactual:
    saved = (1.0 - 1.0 / targets) * math.fsum(job_work)
    return Counterfactual(
        name=f"c {targets} independent targets in parallel",
        assumption=(
            f"measurement jobs on the path ({len(job_work)}, {slot_gated} of the path's gates "
            f"were the target_slot) split over {targets} targets: their work on the path / "
            f"{targets}"
        ),
        arithmetic=(
            f"measurement jobs' work on the path {_sum_text(job_work)} = "
            f"{math.fsum(job_work):.2f} s; saved = (1 - 1/{targets}) x "
            f"{math.fsum(job_work):.2f} = {saved:.2f} s; new wall = {wall:.2f} - "
            f"{saved:.2f} = {wall - saved:.2f} s"
        ),
        saved_s=saved,
        new_wall_s=wall - saved,
        provenance="estimated",
        caveat=(
            "assumes the measurement jobs were serialized by the target's slot, not by "
            "dependencies or by cores: with the cores Snakemake was given, the jobs that ran "
            "beside them (normalize, analyze) may then gate instead"
        ),
    )


def _no_tracking(wall: float, track_work: np.ndarray) -> Counterfactual:
    saved = math.fsum(track_work)
    return Counterfactual(
        name="d no MLflow tracking",
        assumption="the `track` jobs do not run; the ones off the path cost core time only",
        arithmetic=(
            f"track jobs on the path: {len(track_work)}, work {_sum_text(track_work)} = "
            f"{saved:.2f} s; new wall = {wall:.2f} - {saved:.2f} = {wall - saved:.2f} s"
        ),
        saved_s=saved,
        new_wall_s=wall - saved,
        provenance="derived",
        caveat="loses the run's MLflow lineage (parent/child runs, tags) the pack cites",
    )


def counterfactuals(
    attributed: pd.DataFrame,
    windows: pd.DataFrame,
    started: float,
    *,
    speedup: float = 2.0,
    budget_fraction: float = 0.5,
    targets: int = 2,
    words: TargetWords | None = None,
) -> list[Counterfactual]:
    """The four standard interventions, priced on the critical path's measured spans; ``words``
    name the target's processor (default: a simulated GPU's)."""
    words = words or TargetWords(simulated=True, processor="accelerator", unit="GPU")
    wall = float(attributed["seg_end"].iloc[-1]) if len(attributed) else 0.0
    meas = attributed[attributed["rule"].isin(MEASUREMENT_RULES) & attributed["status"].ne("error")]
    w = windows.reindex(meas["job"].to_numpy()) if len(windows) else pd.DataFrame(index=meas["job"])
    mode = w["mode"].to_numpy() if "mode" in w else np.full(len(meas), None)
    tail = w["drain_tail_s"].to_numpy(float) if "drain_tail_s" in w else np.full(len(meas), np.nan)
    load_end = w["load_end"].to_numpy(float) - started if "load_end" in w else tail
    seg0, seg1 = meas["seg_start"].to_numpy(float), meas["seg_end"].to_numpy(float)
    intrinsic = meas["task_intrinsic"].to_numpy(float)
    # The drain tail is the load window's last `tail` seconds; only its part on the path counts.
    tail_on_path = _overlap(seg0, seg1, load_end - tail, load_end)
    slot_gated = int(attributed["gate"].eq("target_slot").sum())
    track_work = attributed.loc[attributed["rule"].eq("track"), "work_s"].to_numpy(float)
    return [
        _faster_processor(wall, mode, tail_on_path, intrinsic, speedup, words),
        _smaller_budget(wall, intrinsic, budget_fraction),
        _more_targets(wall, meas["work_s"].to_numpy(float), slot_gated, targets),
        _no_tracking(wall, track_work),
    ]


# ---------------------------------------------------------------------------------------------
# Finding or waste
# ---------------------------------------------------------------------------------------------

# Q3 for the overhead buckets: does it recur at the deployment target?
_RECURS_AT_TARGET = {
    "infrastructure": (
        "partly: process start-up, target launch and drain are this harness's; a "
        "real target's warm-up is measured on purpose (cold/warm cache states)"
    ),
    "orchestration": (
        "no: DAG building, pack validation and scheduling gaps exist only in this pipeline"
    ),
    "implementation_debugging": "no: a failed attempt is a defect, not the workload",
}


def _task_intrinsic_item(
    s: float, share: float, priced: str, top: str, budget: Counterfactual | None
) -> FindingOrWaste:
    return FindingOrWaste(
        bucket="task_intrinsic",
        seconds=s,
        share=share,
        changes_comparison=(
            "yes: these are the load spans every point's latency and attainment are "
            "measured over, and the analyses of them; without them there is no "
            "comparison between points"
        ),
        changes_decision=(
            "the decision: the selected capacity and the sample gates are read from "
            "these spans; shortening them changes what the gates can conclude"
        ),
        recurs_at_target=(
            "yes: an open-loop point lasts as long as its arrival schedule on any target; "
            "the service times are the target's own"
        ),
        verdict="finding",
        routed_to="analysis plan",
        line=(
            f"ANALYSIS PLAN: the measurement budget is {priced} ({top}); size it by the "
            "sample gates, not the bill"
            + (
                f" (counterfactual {budget.name}: saves {budget.saved_s:.1f} s and "
                "weakens the gates)"
                if budget
                else ""
            )
        ),
    )


def _documentation_item(s: float, share: float, priced: str, top: str) -> FindingOrWaste:
    return FindingOrWaste(
        bucket="documentation",
        seconds=s,
        share=share,
        changes_comparison="no: it writes up results already measured",
        changes_decision=(
            "neither the decision nor the comparison, only the bill; but it is the "
            "pack's deliverable, so removing it removes the output, not overhead"
        ),
        recurs_at_target="yes: every run writes its pack",
        verdict="waste (of a required deliverable: make it cheaper, never remove it)",
        routed_to="engineering backlog",
        line=f"BACKLOG (priced): documentation costs {priced}; largest: {top}",
    )


def _overhead_item(bucket: str, s: float, share: float, priced: str, top: str) -> FindingOrWaste:
    return FindingOrWaste(
        bucket=bucket,
        seconds=s,
        share=share,
        changes_comparison=(
            "no: every point pays it alike; it does not move one point against another"
        ),
        changes_decision="only the bill: the capacity decision is the same without it",
        recurs_at_target=_RECURS_AT_TARGET[bucket],
        verdict="waste",
        routed_to="engineering backlog",
        line=f"BACKLOG (priced): {bucket} costs {priced}; largest: {top}",
    )


def finding_or_waste(
    attributed: pd.DataFrame,
    totals: dict[str, float],
    cfs: list[Counterfactual] | None = None,
    *,
    threshold: float = DOMINANT_SHARE,
) -> list[FindingOrWaste]:
    """The three questions (module doc), answered on every bucket with ``threshold`` of the
    path or more."""
    wall = math.fsum(totals.values())
    budget = next((c for c in cfs or [] if c.name.startswith("b ")), None)
    out = []
    for bucket in BUCKETS:
        s = totals.get(bucket, 0.0)
        share = s / wall if wall > 0 else 0.0
        if share < threshold or s <= 0:
            continue
        top = bucket_contributors(attributed, bucket)
        priced = f"{s:.1f} s per run ({share:.0%} of the {wall:.1f} s critical path)"
        if bucket == "task_intrinsic":
            out.append(_task_intrinsic_item(s, share, priced, top, budget))
        elif bucket == "documentation":
            out.append(_documentation_item(s, share, priced, top))
        else:
            out.append(_overhead_item(bucket, s, share, priced, top))
    return out
