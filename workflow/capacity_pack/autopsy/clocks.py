"""Measurement jobs on the timeline: their load windows and the clock cross-check.

Load window (per measurement job, from its ``records.jsonl``): first send to last end on both
clocks; ``load_start``/``load_end`` are epoch seconds from the CLOCK_REALTIME stamps, which
place the window on the log's timeline. An open-loop run (due times set) has a drain tail =
last end - last due (monotonic); ``t0_to_last_end_s`` is the run's clock start (t0) to its last
end, laid against the summary's ``wall_s``.

Clock cross-check (per measurement job): the offsets ``realtime - monotonic`` of every send and
end stamp. Their two reads are not atomic, so one stamp can be off by a thread switch (jitter,
counted apart as an outlier); the systematic drift is the spread of the per-bin medians over
``CLOCK_BINS`` equal monotonic-time bins, and its rate (ppm) the slope of a line through them.
Tolerance: ``1 ms + 1e-4 x span``. Beyond it, the job's realtime-placed figures (load window,
drain tail, its task-intrinsic split) are invalid, and the report says so; so are they when its
records.jsonl was rewritten outside the job's window (another invocation). The monotonic and
realtime spans (last end - first send) are compared too.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import Field

from capacity_pack.autopsy.sources import (
    LOG_RESOLUTION_S,
    NS,
    StrictModel,
    file_mtime,
    record_clocks,
    resolve_path,
    summary_wall_s,
)

CLOCK_DRIFT_TOL_MS = 1.0
CLOCK_DRIFT_TOL_FRAC = 1e-4
CLOCK_BINS = 10


class ClockCheck(StrictModel):
    """Monotonic against realtime over one measurement run's dual-stamped requests."""

    n_stamps: int = Field(description="send and end stamps with both clocks")
    span_mono_s: float = Field(description="measured: last end_ns - first sent_ns")
    span_realtime_s: float = Field(description="measured: last end_realtime - first sent_realtime")
    span_diff_ms: float = Field(description="derived: realtime span - monotonic span")
    offset_spread_ms: float = Field(description="derived: max - min of realtime - monotonic")
    drift_ms: float = Field(description="derived: spread of the per-bin median offsets")
    drift_ppm: float = Field(description="derived: slope of the bin medians over time")
    tolerance_ms: float = Field(description="1 ms + 1e-4 x span (defaults)")
    outliers: int = Field(description="stamps off their bin's median by more than the tolerance")
    max_outlier_ms: float = Field(description="the largest such deviation")
    span_agrees: bool = Field(description="|span_diff_ms| <= tolerance")
    valid: bool = Field(description="drift within tolerance: the two clocks agree")
    verdict: str = Field(description="the check's result in words")


def _dual_stamps(records: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    pairs = []
    for mono, real in (("sent_ns", "sent_realtime_ns"), ("end_ns", "end_realtime_ns")):
        if mono in records and real in records:
            sub = records[[mono, real]].dropna()
            arr = sub.to_numpy(dtype=np.int64)
            pairs.append(arr[(arr[:, 0] > 0) & (arr[:, 1] > 0)])
    both = np.concatenate(pairs) if pairs else np.empty((0, 2), dtype=np.int64)
    return both[:, 0], both[:, 1]


def _uncheckable(n_stamps: int, tolerance_ms: float) -> ClockCheck:
    return ClockCheck(
        n_stamps=n_stamps,
        span_mono_s=0.0,
        span_realtime_s=0.0,
        span_diff_ms=0.0,
        offset_spread_ms=0.0,
        drift_ms=0.0,
        drift_ppm=0.0,
        tolerance_ms=tolerance_ms,
        outliers=0,
        max_outlier_ms=0.0,
        span_agrees=False,
        valid=False,
        verdict="fewer than two dual-clock stamps: the clocks cannot be cross-checked",
    )


def _verdict(
    valid: bool, drift: float, ppm: float, tol: float, span: float, resid: np.ndarray
) -> str:
    outliers = int((resid > tol).sum())
    if not valid:
        return (
            f"CLOCK SKEW: realtime drifted {drift:.3f} ms ({ppm:+.0f} ppm) against monotonic over "
            f"{span:.1f} s (> {tol:.3f} ms): every figure computed from these stamps is "
            "invalid until corrected"
        )
    verdict = f"clocks agree: drift {drift:.3f} ms <= {tol:.3f} ms"
    if outliers:
        verdict += (
            f"; {outliers} single stamps off by up to {float(resid.max()):.1f} ms "
            "(a thread switch between the two clock reads: those requests' times are "
            "uncertain by that much)"
        )
    return verdict


def clock_check(
    records: pd.DataFrame,
    *,
    drift_tol_ms: float = CLOCK_DRIFT_TOL_MS,
    drift_tol_frac: float = CLOCK_DRIFT_TOL_FRAC,
    bins: int = CLOCK_BINS,
) -> ClockCheck:
    """Monotonic (``*_ns``) against realtime (``*_realtime_ns``) over one run's records.

    ``records`` needs ``sent_ns``, ``end_ns``, ``sent_realtime_ns``, ``end_realtime_ns``
    (integers; missing values allowed). See the module doc for the rule.
    """
    mono, real = _dual_stamps(records)
    if len(mono) < 2:
        return _uncheckable(len(mono), drift_tol_ms)
    span_mono = _span(records, "sent_ns", "end_ns")
    span_real = _span(records, "sent_realtime_ns", "end_realtime_ns")
    tol = drift_tol_ms + drift_tol_frac * span_mono * 1e3
    # Integer subtraction first: the offsets are ~1.8e18 ns, far beyond float64's exact range.
    off = real - mono
    off_ms = (off - off.min()).astype(float) / 1e6
    t = (mono - mono.min()).astype(float) / NS
    n_bins = max(1, min(bins, len(t) // 2))
    b = np.minimum((t / max(float(t.max()), 1e-12) * n_bins).astype(int), n_bins - 1)
    med = pd.Series(off_ms).groupby(b).median()
    centers = pd.Series(t).groupby(b).median()
    drift = float(med.max() - med.min())
    ppm = float(np.polyfit(centers.to_numpy(), med.to_numpy(), 1)[0] * 1e3) if len(med) > 1 else 0.0
    resid = np.abs(off_ms - med.reindex(b).to_numpy())
    span_diff = (span_real - span_mono) * 1e3
    valid = drift <= tol
    return ClockCheck(
        n_stamps=len(mono),
        span_mono_s=span_mono,
        span_realtime_s=span_real,
        span_diff_ms=span_diff,
        offset_spread_ms=float(off_ms.max()),
        drift_ms=drift,
        drift_ppm=ppm,
        tolerance_ms=tol,
        outliers=int((resid > tol).sum()),
        max_outlier_ms=float(resid.max()),
        span_agrees=abs(span_diff) <= tol,
        valid=valid,
        verdict=_verdict(valid, drift, ppm, tol, span_mono, resid),
    )


def _span(records: pd.DataFrame, first_col: str, last_col: str) -> float:
    first, last = records[first_col].dropna(), records[last_col].dropna()
    first, last = first[first > 0], last[last > 0]
    if first.empty or last.empty:
        return 0.0
    return int(last.max() - first.min()) / NS


def load_window(records: pd.DataFrame) -> dict[str, Any]:
    """A run's load window: first send to last end, on both clocks; open or closed loop.

    ``load_start``/``load_end`` are epoch seconds (realtime stamps); ``drain_tail_s`` is last end
    - last due (monotonic) for an open-loop run (due times set), else NaN.
    """
    sent_rt = records["sent_realtime_ns"].dropna()
    end_rt = records["end_realtime_ns"].dropna()
    due = records["due_ns"].dropna()
    open_loop = bool((due > 0).any())
    last_end = records["end_ns"].dropna()
    # Prewarm requests (warm cache state) are sent before the run's clock starts: t0 = 0.
    t0 = records["t0_ns"].dropna()
    t0 = t0[t0 > 0]
    return {
        "n_records": len(records),
        "mode": "open" if open_loop else "closed",
        "load_start": int(sent_rt.min()) / NS if len(sent_rt) else math.nan,
        "load_end": int(end_rt.max()) / NS if len(end_rt) else math.nan,
        "span_mono_s": _span(records, "sent_ns", "end_ns"),
        "drain_tail_s": (
            int(last_end.max() - due[due > 0].max()) / NS
            if open_loop and len(last_end)
            else math.nan
        ),
        "t0_to_last_end_s": (
            int(last_end.max() - t0.min()) / NS if len(last_end) and len(t0) else math.nan
        ),
    }


def measurement_windows(
    timeline: pd.DataFrame, repo_dir: str | os.PathLike[str], **clock_kw: Any
) -> pd.DataFrame:
    """Per measurement job: its load window, clock check and summary ``wall_s`` (by job)."""
    root = Path(repo_dir)
    rows = []
    for job, r in timeline[timeline["is_measurement"]].iterrows():
        rec = next((o for o in r["outputs"] if o.endswith("records.jsonl")), None)
        path = resolve_path(root, rec)
        row: dict[str, Any] = {"job": job, "label": r["label"], "records": rec}
        if path is None or not path.exists():
            rows.append(row | {"available": False})
            continue
        frame = record_clocks(path)
        check = clock_check(frame, **clock_kw)
        mtime = file_mtime(path)
        # Records rewritten after this job (a later invocation re-measured) are not its own.
        this_run = r["log_start"] - LOG_RESOLUTION_S <= mtime <= r["log_end"] + 2 * LOG_RESOLUTION_S
        row |= {"available": True, "records_mtime": mtime, "records_this_run": this_run}
        row |= load_window(frame)
        row |= {f"clock_{k}": v for k, v in check.model_dump().items()}
        row["summary_wall_s"] = summary_wall_s(r["outputs"], root)
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return pd.DataFrame(columns=["label", "available"]).rename_axis("job")
    out = out.set_index("job")
    if "clock_valid" in out:
        # Realtime-placed figures of a skewed run, or of another invocation's records, are not
        # used: the job's work stays unsplit.
        bad = out["clock_valid"].eq(False) | out["records_this_run"].eq(False)
        for c in ("load_start", "load_end", "drain_tail_s"):
            out.loc[bad, c] = math.nan
    return out
