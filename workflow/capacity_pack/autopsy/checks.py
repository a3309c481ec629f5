"""Sources laid against each other, and the evidence the run does not hold.

Disagreements between sources are results, not noise; each is a count of pairs compared and of
pairs beyond a stated tolerance, with the median and largest difference:

- benchmark ``s`` vs the main log's span (``|diff| <= 1 s + 1 s resolution``);
- benchmark and job-log mtimes vs the job's window (``[log_start - 1 s, log_end + 2 s]``);
- the summary's ``wall_s`` vs the records' t0 to last end (``0 <= diff <= 1 s``);
- the records' realtime end vs the completion stamp (load end ``<=`` stamp + 1 s);
- CLOCK_REALTIME vs CLOCK_MONOTONIC per measurement (``capacity_pack.autopsy.clocks``);
- the header ``Date:`` vs the log file's name (``|diff| <= 1 s``);
- Snakemake's ``Elapsed time`` vs last stamp - start (``0 <= diff <= 2 s``);
- MLflow child runs vs the jobs they record (tracking times lag the jobs);
- commits inside the invocation's window (the code that ran may not be the recorded commit).

Missing evidence: every figure the sources cannot give (sub-second job times, start-up steps,
target CPU, accelerator telemetry, job times in MLflow, development time) and every gap this
run left (reused inputs, overwritten benchmarks, jobs without an end, missing records, no
MLflow store, no git history), each with the telemetry that would close it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
from pydantic import Field

from capacity_pack.autopsy.clocks import CLOCK_DRIFT_TOL_FRAC, CLOCK_DRIFT_TOL_MS
from capacity_pack.autopsy.sources import LOG_RESOLUTION_S, Invocation, StrictModel
from capacity_pack.autopsy.timeline import BENCH_TOLERANCE_S
from capacity_pack.plan.words import TargetWords

# The MLflow stage a `track` job logs, by the rule whose jobs it tracks.
STAGE_RULES = {
    "schedule": ("schedule",),
    "sweep": ("sweep",),
    "analysis": ("analyze",),
    "failure": ("failure_drill", "failure_analyze"),
}


class Disagreement(StrictModel):
    sources: str = Field(description="the two sources laid against each other")
    figure: str = Field(description="what is compared")
    checked: int = Field(description="how many pairs were compared")
    disagreeing: int = Field(description="how many differ beyond the tolerance")
    tolerance: str = Field(description="the tolerance")
    median_diff_s: float | None = Field(None, description="median difference (s)")
    max_abs_diff_s: float | None = Field(None, description="largest |difference| (s)")
    detail: str = Field(description="what the disagreement means")


class MissingEvidence(StrictModel):
    gap: str = Field(description="what could not be reconstructed")
    why: str = Field(description="why not")
    telemetry: str = Field(description="what to record next run to close it")


def mlflow_section(runs: pd.DataFrame, tl: pd.DataFrame, started: float) -> list[dict[str, Any]]:
    """Per stage: its child runs' tracking window against this invocation's track job(s)."""
    out = []
    track = tl[tl["rule"].eq("track") & tl["end_s"].notna()]
    for stage, grp in runs.dropna(subset=["stage"]).groupby("stage"):
        jobs = track[track["wildcards"].str.contains(rf"\bstage={re.escape(stage)}\b")]
        inside = np.zeros(len(grp), bool)
        for _, j in jobs.iterrows():
            lo, hi = j["log_start"] - LOG_RESOLUTION_S, j["end_s"] + 2 * LOG_RESOLUTION_S
            inside |= ((grp["start"] >= lo) & (grp["start"] <= hi)).to_numpy()
        rules = STAGE_RULES.get(str(stage), ())
        measured = tl[tl["rule"].isin(rules) & tl["end_s"].notna()]
        mine = grp[inside]
        out.append(
            {
                "stage": stage,
                "runs": len(grp),
                "in_this_invocation": int(inside.sum()),
                "first_start_t": float(mine["start"].min() - started) if len(mine) else None,
                "last_end_t": float(mine["end"].max() - started) if len(mine) else None,
                "track_job_t": [
                    [float(a), float(b)]
                    for a, b in zip(jobs["t_start"], jobs["t_end"], strict=True)
                ],
                "tracked_jobs_last_end_t": (
                    float(measured["t_end"].max()) if len(measured) else None
                ),
                "lag_after_jobs_s": (
                    float(mine["start"].min() - measured["end_s"].max())
                    if len(mine) and len(measured)
                    else None
                ),
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# Disagreements
# ---------------------------------------------------------------------------------------------


def _diff(
    sources: str,
    figure: str,
    diffs: pd.Series,
    bad: pd.Series,
    tolerance: str,
    detail: str,
) -> Disagreement:
    d = diffs.dropna()
    return Disagreement(
        sources=sources,
        figure=figure,
        checked=len(d),
        disagreeing=int(bad.sum()),
        tolerance=tolerance,
        median_diff_s=float(d.median()) if len(d) else None,
        max_abs_diff_s=float(d.abs().max()) if len(d) else None,
        detail=detail,
    )


def _job_file_checks(tl: pd.DataFrame) -> list[Disagreement]:
    """Each job's benchmark and log file against its main-log stamps."""
    ran = tl[tl["end_s"].notna()]
    with_bench = ran[ran["bench_s"].notna()]
    with_log = ran[ran["logfile_mtime"].notna()]
    return [
        _diff(
            "benchmark s vs main-log start/end stamps",
            "job run time",
            with_bench["bench_log_diff_s"],
            ~with_bench["bench_consistent"],
            f"|diff| <= {BENCH_TOLERANCE_S:g} s (1 s + 1 s resolution)",
            "beyond it the benchmark is not used for that job's start (falls back to the log)",
        ),
        _diff(
            "benchmark file mtime vs main-log window",
            "which invocation wrote the benchmark",
            with_bench["bench_mtime"] - with_bench["log_end"],
            ~with_bench["bench_this_run"],
            "mtime in [log_start - 1 s, log_end + 2 s]",
            "outside it a later invocation overwrote the file: that job's own sub-second run "
            "time is lost (Snakemake keeps one benchmark per path)",
        ),
        _diff(
            "job log file mtime vs main-log end stamp",
            "job end",
            with_log["logfile_vs_end_s"],
            ~with_log["logfile_this_run"],
            "mtime in [log_start - 1 s, log_end + 2 s]",
            "the job log's last write is a derived end; outside the window it was rewritten by "
            "another invocation (median shows how long before its completion stamp a job stops "
            "logging)",
        ),
    ]


def _measurement_checks(tl: pd.DataFrame, win: pd.DataFrame) -> list[Disagreement]:
    """Each measurement's records against its summary and its completion stamp, and its
    two clocks against each other."""
    if not (len(win) and "available" in win and win["available"].any()):
        return []
    w = win[win["available"].eq(True)]
    d = w["summary_wall_s"] - w["t0_to_last_end_s"]
    out = [
        _diff(
            "sweep/drill summary wall_s vs records (t0 to last end, monotonic)",
            "load-generator wall time",
            d,
            (d < -1e-3) | (d > LOG_RESOLUTION_S),
            "0 <= diff <= 1 s (wall_s is read after the last request ends)",
            "wall_s includes the generator's own wind-down after the last request",
        )
    ]
    d = w["load_end"] - tl.loc[w.index, "log_end"]
    out.append(
        _diff(
            "records' last end (realtime) vs main-log completion stamp",
            "measurement job end",
            d,
            (d > LOG_RESOLUTION_S) | (d < -1e3),
            f"load end <= stamp + {LOG_RESOLUTION_S:g} s",
            "a load that ends after the job's completion stamp (up to 1 s) shows the stamp "
            "is truncated to the second; a job's end is known to ~1 s only",
        )
    )
    if "clock_valid" in w:
        out.append(
            _diff(
                "CLOCK_REALTIME vs CLOCK_MONOTONIC per request",
                "clock drift within each measurement run",
                w["clock_drift_ms"] / 1e3,
                w["clock_valid"].eq(False),
                f"{CLOCK_DRIFT_TOL_MS:g} ms + {CLOCK_DRIFT_TOL_FRAC:g} x span",
                f"{int(w['clock_outliers'].sum())} single stamps deviated by up to "
                f"{float(w['clock_max_outlier_ms'].max()):.1f} ms (non-atomic dual reads)",
            )
        )
    return out


def _invocation_checks(inv: Invocation) -> list[Disagreement]:
    """The main log's header and footer against its own stamps."""
    out = []
    if inv.header_date is not None:
        d = pd.Series([inv.header_date - inv.started])
        out.append(
            _diff(
                "header Date vs log file name",
                "invocation start",
                d,
                d.abs() > LOG_RESOLUTION_S,
                "|diff| <= 1 s",
                "the header's Date is truncated to the second",
            )
        )
    if inv.elapsed_s is not None and inv.last_stamp is not None:
        d = pd.Series([inv.elapsed_s - (inv.last_stamp - inv.started)])
        out.append(
            _diff(
                "Snakemake Elapsed time vs last stamp - start",
                "invocation wall clock",
                d,
                (d < -1e-3) | (d > 2 * LOG_RESOLUTION_S),
                "0 <= diff <= 2 s",
                "Snakemake's shutdown after the last stamp, plus the stamp's truncation",
            )
        )
    return out


def _tracking_checks(
    inv: Invocation,
    runs: pd.DataFrame | None,
    mlflow_stages: list[dict[str, Any]],
    commits: pd.DataFrame,
) -> list[Disagreement]:
    """MLflow's run times against the jobs, git's commit times against the invocation."""
    out = []
    if runs is not None and len(runs):
        lags = pd.Series([s["lag_after_jobs_s"] for s in mlflow_stages], dtype=float)
        others = sum(s["runs"] - s["in_this_invocation"] for s in mlflow_stages)
        out.append(
            _diff(
                "MLflow child run times vs the jobs they record",
                "job time",
                lags,
                lags > 0,
                "none: MLflow times are tracking times",
                "child runs start when a `track` job logs them, after the jobs ended (median "
                f"lag shown); {others} child runs of these stages belong to other invocations",
            )
        )
    if len(commits):
        during = commits[
            (commits["time"] >= inv.started) & (commits["time"] <= (inv.last_stamp or 0))
        ]
        out.append(
            _diff(
                "git commit times vs the invocation window",
                "code changes during the run",
                during["time"] - inv.started,
                pd.Series([True] * len(during)),
                "no commit while the invocation ran",
                "a commit inside the run's window means the code that ran may not be the "
                "commit recorded by the run",
            )
        )
    return out


def disagreements(
    inv: Invocation,
    tl: pd.DataFrame,
    win: pd.DataFrame,
    runs: pd.DataFrame | None,
    mlflow_stages: list[dict[str, Any]],
    commits: pd.DataFrame,
) -> list[Disagreement]:
    """Every pair of sources laid against each other (module doc), in a fixed order."""
    return [
        *_job_file_checks(tl),
        *_measurement_checks(tl, win),
        *_invocation_checks(inv),
        *_tracking_checks(inv, runs, mlflow_stages, commits),
    ]


# ---------------------------------------------------------------------------------------------
# Missing evidence
# ---------------------------------------------------------------------------------------------

# What no pack run's sources record, whatever happened in it.
ALWAYS_MISSING = (
    MissingEvidence(
        gap="sub-second job start and end",
        why=(
            "Snakemake's main log stamps are 1 s (truncated, local time without a zone, "
            "read in this host's zone); a start is derived from the benchmark's s, an end is "
            "the 1 s stamp, so every gap and critical-path edge is uncertain by ~1 s"
        ),
        telemetry=(
            "a per-job start/end event at ns resolution on both clocks (a Snakemake logger "
            "plugin or a job wrapper writing JSON lines, append-only)"
        ),
    ),
    MissingEvidence(
        gap="what Snakemake did before the first job",
        why=(
            "DAG building, pack validation, lint and the fit probe are one orchestration "
            "figure (invocation start to first job)"
        ),
        telemetry="stamps around each top-level Snakefile step",
    ),
    MissingEvidence(
        gap="job times in MLflow",
        why=(
            "MLflow child runs are logged by `track` jobs after the fact: their start/end is "
            "tracking time, not job time"
        ),
        telemetry="log each job's measured start/end (both clocks) as MLflow params/metrics",
    ),
    MissingEvidence(
        gap="development time",
        why=(
            "implementation and debugging happen before a run and live in the git history "
            "(commit times, 1 s, committer-set), not in the run; only failed attempts on the "
            "path are counted here"
        ),
        telemetry="a run id in commit trailers or a dev log with start/stop stamps",
    ),
)


def _job_gaps(tl: pd.DataFrame, reused: list[str]) -> list[MissingEvidence]:
    """Jobs whose cost or times this invocation cannot show."""
    out = []
    if reused:
        out.append(
            MissingEvidence(
                gap=f"{len(reused)} inputs reused from earlier invocations",
                why=(
                    "their producing jobs ran in another invocation, so their cost is not on "
                    f"this run's path (e.g. {', '.join(reused[:3])})"
                ),
                telemetry="an append-only per-invocation job ledger (run id, job, both clocks)",
            )
        )
    overwritten = tl[tl["bench_s"].notna() & ~tl["bench_this_run"]]
    if len(overwritten):
        out.append(
            MissingEvidence(
                gap=f"sub-second run time of {len(overwritten)} jobs",
                why=(
                    "their benchmark files were rewritten by a later invocation (Snakemake keeps "
                    "one per path): "
                    + ", ".join(overwritten["label"].head(4))
                    + ("..." if len(overwritten) > 4 else "")
                ),
                telemetry="benchmark paths keyed by invocation (append, never overwrite)",
            )
        )
    incomplete = tl[tl["status"].eq("incomplete")]
    if len(incomplete):
        out.append(
            MissingEvidence(
                gap=f"{len(incomplete)} jobs without an end",
                why=(
                    "no completion line (still running when the log was read, e.g. the autopsy "
                    "itself, or the invocation was killed): "
                    + ", ".join(incomplete["label"].head(4))
                ),
                telemetry="a completion event written by the job itself",
            )
        )
    return out


def _source_gaps(
    win: pd.DataFrame, runs: pd.DataFrame | None, commits: pd.DataFrame
) -> list[MissingEvidence]:
    """Sources this run did not leave: records, an MLflow store, a git history."""
    out = []
    if len(win) and "available" in win and (~win["available"].astype(bool)).any():
        n = int((~win["available"].astype(bool)).sum())
        out.append(
            MissingEvidence(
                gap=f"load spans of {n} measurement jobs",
                why="their records.jsonl is missing: their work is counted as task-intrinsic whole",
                telemetry="keep every measurement's records with the pack",
            )
        )
    if runs is None:
        out.append(
            MissingEvidence(
                gap="MLflow cross-check",
                why="no MLflow store was given or it could not be read",
                telemetry="the pack's results/mlflow.db",
            )
        )
    if not len(commits):
        out.append(
            MissingEvidence(
                gap="git history",
                why="git log gave nothing (no repository or no git)",
                telemetry="run from a git checkout",
            )
        )
    return out


def _target_gaps(words: TargetWords) -> list[MissingEvidence]:
    """What no run records about the target itself, in the target's own words."""
    processes = "the simulator's child processes" if words.simulated else "the server's processes"
    telemetry = (
        MissingEvidence(
            gap="accelerator telemetry",
            why=(
                "no GPU utilization or memory-bandwidth series: for a simulated target there is "
                "no accelerator, so counterfactual (a) is priced on the simulator's service times"
            ),
            telemetry="DCGM/nvidia-smi utilization and memory bandwidth at 1 s on a real target",
        )
        if words.simulated
        else MissingEvidence(
            gap=f"{words.processor} telemetry of the target",
            why=(
                f"no {words.processor} utilization or memory-bandwidth series of the serving "
                f"{words.unit}: counterfactual (a) is priced on the measured service times alone"
            ),
            telemetry=(
                "per-core utilization and memory bandwidth of the server host at 1 s (e.g. "
                "node_exporter, perf stat)"
                if words.processor == "CPU"
                else "DCGM/nvidia-smi utilization and memory bandwidth at 1 s"
            ),
        )
    )
    return [
        MissingEvidence(
            gap=f"CPU of {words.target}'s processes",
            why=(
                "the benchmark gives one cpu_time/mean_load per job and the sweep's client_cpu_s "
                f"covers the load generator only; {processes} are not attributed, so "
                "client-bound and target-bound time cannot be told apart by CPU"
            ),
            telemetry="per-process CPU (client, router, engine replicas) over the load span",
        ),
        telemetry,
    ]


def missing_evidence(
    tl: pd.DataFrame,
    win: pd.DataFrame,
    reused: list[str],
    runs: pd.DataFrame | None,
    commits: pd.DataFrame,
    words: TargetWords | None = None,
) -> list[MissingEvidence]:
    """What the autopsy could not reconstruct, and what to record next run to close it;
    ``words`` name the target (default: a simulated GPU)."""
    words = words or TargetWords(simulated=True, processor="accelerator", unit="GPU")
    return [
        *ALWAYS_MISSING,
        *_target_gaps(words),
        *_job_gaps(tl, reused),
        *_source_gaps(win, runs, commits),
    ]
