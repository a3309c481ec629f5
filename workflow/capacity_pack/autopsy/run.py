"""Performance autopsy of one Snakemake invocation of a pack: where its wall clock went.

The procedure, over the sources a pack run leaves behind, one module per step:

1. sources (``capacity_pack.autopsy.sources``): Snakemake's main log, benchmark TSVs, job logs,
   measurement records, the MLflow store and git, each read with its resolution;
2. timeline and critical path (``timeline``): every job's start and end, the dependency graph,
   and the chain of gating jobs from the invocation's start to its last end;
3. cost buckets (``buckets``): the critical path's seconds split into a fixed set of buckets that
   add up to the wall clock exactly;
4. clock cross-check (``clocks``): each measurement's realtime and monotonic stamps against each
   other, which decides whether its load window may split its job's work;
5. counterfactuals (``buckets``): four interventions priced on the measured path;
6. finding or waste (``buckets``): three questions on every dominant bucket;
7. disagreements and missing evidence (``checks``): sources laid against each other, and what
   the run did not record.

Every figure is labelled by how it is known: ``measured`` (a source recorded it), ``derived``
(arithmetic on measured figures) or ``estimated`` (a model of what would have happened).
``run_autopsy`` assembles the JSON-able document; ``capacity_pack.autopsy.markdown`` renders it.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from capacity_pack.autopsy.buckets import (
    BUCKETS,
    RULE_BUCKET,
    UNKNOWN_RULE_BUCKET,
    attribute_buckets,
    bucket_contributors,
    bucket_totals,
    counterfactuals,
    finding_or_waste,
)
from capacity_pack.autopsy.checks import disagreements, missing_evidence, mlflow_section
from capacity_pack.autopsy.clocks import (
    CLOCK_DRIFT_TOL_FRAC,
    CLOCK_DRIFT_TOL_MS,
    measurement_windows,
)
from capacity_pack.autopsy.sources import (
    Invocation,
    git_commits,
    latest_invocation,
    mlflow_runs,
    parse_snakemake_log,
)
from capacity_pack.autopsy.timeline import (
    BENCH_TOLERANCE_S,
    critical_path,
    job_dependencies,
    job_timeline,
    reused_inputs,
    shadow_jobs,
)
from capacity_pack.plan.words import TargetWords

SCHEMA = "capacity_pack.autopsy.run/1"
TIMELINE_FIELDS = """job jobid attempt rule label status log_start log_end bench_s bench_cpu_time
bench_mtime logfile_mtime start_s end_s t_start t_end duration_s timing bench_this_run
bench_consistent target_slot target_resource bucket""".split()
PATH_FIELDS = """job jobid rule label status gate gated_by seg_start seg_end gap_s overlap_s work_s
split""".split()
CLOCK_FIELDS = """job label mode n_records clock_n_stamps clock_span_mono_s clock_span_realtime_s
clock_span_diff_ms clock_drift_ms clock_drift_ppm clock_tolerance_ms clock_outliers
clock_max_outlier_ms clock_valid clock_verdict""".split()
PROVENANCE_LEGEND = {
    "measured": "a source recorded it (log stamp, benchmark s, request stamps)",
    "derived": "arithmetic on measured figures",
    "estimated": "a model of what would have happened",
}


def _iso(t: float | None) -> str | None:
    if t is None or not math.isfinite(t):
        return None
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="milliseconds")


def _records(df: pd.DataFrame, cols: list[str]) -> list[dict[str, Any]]:
    present = [c for c in cols if c in df.columns]
    return json.loads(df[present].to_json(orient="records", double_precision=6))


def _pack_dir(results_dir: Path, pack_name: str) -> Path:
    return results_dir if results_dir.name == pack_name else results_dir / pack_name


def _read_mlflow(mlflow_db: Path | None) -> pd.DataFrame | None:
    if mlflow_db is None or not Path(mlflow_db).exists():
        return None
    try:
        return mlflow_runs(mlflow_db)
    except Exception:  # a broken store is missing evidence, not a crashed autopsy
        return None


def _invalid_figures(tl: pd.DataFrame, clock_rows: pd.DataFrame) -> list[str]:
    """Figures the clock check or the benchmarks' provenance rule out, in words."""
    invalid = [
        f"{r['label']}: load window, drain tail and task-intrinsic split ({r['clock_verdict']})"
        for _, r in clock_rows.iterrows()
        if not bool(r["clock_valid"])
    ]
    invalid += [
        f"{r['label']}: load window, drain tail and task-intrinsic split (its records.jsonl was "
        "rewritten by another invocation)"
        for _, r in clock_rows.iterrows()
        if not bool(r["records_this_run"])
    ]
    bench_bad = tl[tl["bench_s"].notna() & ~tl["bench_ok"] & tl["end_s"].notna()]
    invalid += [
        f"{r['label']}: sub-second start (benchmark "
        + ("from another invocation" if not r["bench_this_run"] else "disagrees with the log")
        + "; the log's 1 s stamps are used)"
        for _, r in bench_bad.iterrows()
    ]
    return invalid


def _run_commit(
    inv: Invocation, runs: pd.DataFrame | None, commits: pd.DataFrame
) -> dict[str, Any] | None:
    """The commit the run's MLflow runs recorded, and when git says it was committed."""
    if runs is None or not len(runs):
        return None
    window = runs[(runs["start"] >= inv.started) & (runs["start"] <= (inv.last_stamp or 0) + 60)]
    if not (len(window) and window["git_commit"].notna().any()):
        return None
    commit = window["git_commit"].mode().iloc[0]
    row = commits[commits["commit"] == commit]
    return {
        "commit": commit,
        "dirty": str(window["git_dirty"].mode().iloc[0]),
        "committed_t": float(row["time"].iloc[0] - inv.started) if len(row) else None,
        "source": "MLflow tag capacity_pack.git_commit (measured) vs git log (measured)",
    }


def _invocation_section(inv: Invocation, tl: pd.DataFrame, deps: pd.DataFrame) -> dict[str, Any]:
    return {
        "log": inv.path,
        "started": inv.started,
        "started_iso": _iso(inv.started),
        "started_source": inv.started_source,
        "command": inv.command,
        "workflow_id": inv.workflow_id,
        "snakemake_version": inv.snakemake_version,
        "complete": inv.complete,
        "elapsed_s": inv.elapsed_s,
        "job_stats": inv.job_stats,
        "jobs_executed": len(tl),
        "jobs_by_status": tl["status"].value_counts().to_dict(),
        "dependencies": len(deps),
    }


def _critical_path_section(
    inv: Invocation, tl: pd.DataFrame, att: pd.DataFrame, wall: float
) -> dict[str, Any]:
    off, shadow = shadow_jobs(tl, set(att["job"]))
    return {
        "wall_clock_s": wall,
        "provenance": "derived (log stamps + benchmark s)",
        "start_iso": _iso(inv.started),
        "end_iso": _iso(inv.started + wall),
        "n_jobs": len(att),
        "gates": att["gate"].value_counts().to_dict() if len(att) else {},
        "before_first_job_s": float(att["gap_s"].iloc[0]) if len(att) else 0.0,
        "first_start_stamp_t": (float(tl["log_start"].min() - inv.started) if len(tl) else None),
        "gaps": _records(att.iloc[1:][att["gap_s"].iloc[1:] > 0], ["label", "seg_start", "gap_s"]),
        "jobs": _records(att, [*PATH_FIELDS, *BUCKETS]),
        "shadow": {
            "jobs": int(len(off)),
            "job_seconds": float(off["duration_s"].sum()),
            "by_rule": {
                str(rule): {"jobs": int(r["count"]), "seconds": float(r["sum"])}
                for rule, r in shadow.iterrows()
            },
            "meaning": "ran inside the critical path's window: core time, not wall time",
        },
    }


def _buckets_section(
    tl: pd.DataFrame, att: pd.DataFrame, totals: dict[str, float], wall: float
) -> dict[str, Any]:
    return {
        "rows": [
            {
                "bucket": b,
                "seconds": totals[b],
                "share": totals[b] / wall if wall > 0 else 0.0,
                "provenance": "derived",
                "contributors": bucket_contributors(att, b) if len(att) else "",
            }
            for b in BUCKETS
        ],
        "total_s": math.fsum(totals.values()),
        "wall_clock_s": wall,
        "rule_map": RULE_BUCKET,
        "unknown_rules": sorted(set(tl.loc[~tl["known_rule"], "rule"])),
        "unknown_rule_bucket": UNKNOWN_RULE_BUCKET,
    }


def _clock_section(tl: pd.DataFrame, win: pd.DataFrame) -> dict[str, Any]:
    clock_rows = win[win["available"].eq(True)] if len(win) else win
    invalid = _invalid_figures(tl, clock_rows)
    return {
        "rule": (
            f"drift of realtime - monotonic (per-bin medians) <= {CLOCK_DRIFT_TOL_MS:g} ms + "
            f"{CLOCK_DRIFT_TOL_FRAC:g} x span; benchmark s vs log span <= "
            f"{BENCH_TOLERANCE_S:g} s"
        ),
        "jobs": _records(
            clock_rows.reset_index() if len(clock_rows) else pd.DataFrame(), CLOCK_FIELDS
        ),
        "valid": bool(not invalid),
        "invalid_figures": invalid,
    }


def _git_section(
    inv: Invocation, runs: pd.DataFrame | None, commits: pd.DataFrame
) -> dict[str, Any]:
    return {
        "commits": len(commits),
        "first_commit_iso": _iso(float(commits["time"].min())) if len(commits) else None,
        "last_commit_iso": _iso(float(commits["time"].max())) if len(commits) else None,
        "run_commit": _run_commit(inv, runs, commits),
    }


class NoRunLog(FileNotFoundError):
    """No Snakemake log of the pack's jobs to autopsy (the requests' autopsy still stands)."""


def run_autopsy(
    results_dir: Path,
    log_dir: Path,
    repo_dir: Path,
    pack_name: str,
    mlflow_db: Path | None,
    *,
    log_path: Path | None = None,
    speedup: float = 2.0,
    budget_fraction: float = 0.5,
    targets: int = 2,
    words: TargetWords | None = None,
) -> dict[str, Any]:
    """The JSON-able autopsy of the latest invocation of ``pack_name`` (or of ``log_path``).

    ``results_dir`` is the results root (holding ``<pack_name>/``) or the pack folder itself;
    ``repo_dir`` is Snakemake's working directory (the log's paths are relative to it);
    ``words`` name the target (:func:`capacity_pack.plan.words.target_words`; default: a
    simulated GPU's).
    """
    results_dir, repo_dir = Path(results_dir), Path(repo_dir)
    inv = parse_snakemake_log(log_path) if log_path else latest_invocation(log_dir, pack_name)
    if inv is None:
        raise NoRunLog(
            f"{log_dir} holds no job records of pack {pack_name!r} (`snakemake --quiet`/`-q` "
            "leaves them out of its log): run without -q for the run's timeline"
        )
    tl = job_timeline(inv, repo_dir)
    deps = job_dependencies(tl)
    win = measurement_windows(tl, repo_dir)
    att = attribute_buckets(critical_path(tl, deps), inv.started, win)
    totals = bucket_totals(att)
    wall = float(att["seg_end"].iloc[-1]) if len(att) else 0.0
    cfs = counterfactuals(
        att,
        win,
        inv.started,
        speedup=speedup,
        budget_fraction=budget_fraction,
        targets=targets,
        words=words,
    )
    runs = _read_mlflow(mlflow_db)
    mlflow_stages = mlflow_section(runs, tl, inv.started) if runs is not None else []
    commits = git_commits(repo_dir)
    return {
        "schema": SCHEMA,
        "pack": pack_name,
        "pack_dir": str(_pack_dir(results_dir, pack_name)),
        "provenance_legend": dict(PROVENANCE_LEGEND),
        "invocation": _invocation_section(inv, tl, deps),
        "timeline": _records(tl.reset_index(), TIMELINE_FIELDS),
        "critical_path": _critical_path_section(inv, tl, att, wall),
        "buckets": _buckets_section(tl, att, totals, wall),
        "clock_check": _clock_section(tl, win),
        "counterfactuals": [c.model_dump() for c in cfs],
        "finding_or_waste": [f.model_dump() for f in finding_or_waste(att, totals, cfs)],
        "disagreements": [
            d.model_dump() for d in disagreements(inv, tl, win, runs, mlflow_stages, commits)
        ],
        "mlflow": {
            "db": str(mlflow_db) if mlflow_db else None,
            "runs": len(runs) if runs is not None else None,
            "stages": mlflow_stages,
            "note": "child runs are logged by `track` jobs after the fact: tracking time",
        },
        "git": _git_section(inv, runs, commits),
        "missing_evidence": [
            m.model_dump()
            for m in missing_evidence(
                tl, win, reused_inputs(tl, pack_name), runs, commits, words=words
            )
        ],
    }
