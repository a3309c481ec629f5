"""The invocation's job timeline, its dependency graph and its critical path.

Job times (derived), from the main log's 1 s stamps and the benchmark's sub-second ``s``:
``end_s = log_end``; ``start_s = end_s - bench_s`` clamped to ``[max(log_start - 1 s,
invocation start), end_s]`` when the benchmark file was written inside the job's logged window
(``[log_start - 1 s, log_end + 2 s]``; otherwise a later invocation overwrote it) and agrees
with the log (``|bench_s - (log_end - log_start)| <= 1 s + 1 s resolution``); otherwise
``start_s = log_start`` (measured, 1 s).

Dependencies: job B depends on job A when an output of A is an input of B (as logged); a file's
producer is its latest finished attempt.

Critical path: start at the job that finished last (the last completion line) and walk back.
A job's gate is, among its dependencies and every job that ended within ``GATE_TOLERANCE_S`` of
its start stamp (a freed core, or the target's slot: the per-target resource ``target_<slug>``
of ``capacity_pack.measure.cluster``, ``target_slot`` in logs from before it, that lets one
measurement at a time load the target: contention), the one that finished last before it
started. "Before" is the log's line order (completion line before the job's ``rule X:`` line),
exact where the stamps are 1 s. The gate is recorded as ``dependency``, ``target_slot`` (both
jobs hold the same target's resource), ``core`` or ``retry`` (the job's own failed attempt);
the first job's gate is ``first`` (Snakemake's own start-up). Jobs off the path ran in its
shadow: they cost core time, not wall time.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from capacity_pack.autopsy.buckets import RULE_BUCKET, UNKNOWN_RULE_BUCKET
from capacity_pack.autopsy.sources import (
    BENCH_FIELDS,
    LOG_RESOLUTION_S,
    MEASUREMENT_RULES,
    Invocation,
    LogJob,
    file_mtime,
    read_benchmark,
    resolve_path,
)
from capacity_pack.measure.cluster import held_target_resources

# A job that started within this of another's end may have waited for it (1 s log stamps).
GATE_TOLERANCE_S = 1.0
BENCH_TOLERANCE_S = 1.0 + LOG_RESOLUTION_S
PATH_COLUMNS = ["job", "jobid", "rule", "label", "status", "start_s", "end_s", "gate", "gated_by"]


def job_timeline(inv: Invocation, repo_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per executed job attempt, with measured and derived times (see module doc).

    Paths in the log are relative to Snakemake's working directory, ``repo_dir``. Times are
    epoch seconds; ``t_start``/``t_end`` are seconds since the invocation started.
    """
    root = Path(repo_dir)
    df = pd.DataFrame([j.model_dump() for j in inv.jobs], columns=list(LogJob.model_fields))
    for c in ("log_start", "log_end", "end_line"):
        df[c] = pd.to_numeric(df[c]).astype(float)
    bench = pd.DataFrame(
        [read_benchmark(resolve_path(root, b)) for b in df["benchmark"]],
        index=df.index,
        columns=[*(f"bench_{k}" for k in BENCH_FIELDS), "bench_mtime"],
    )
    df = df.join(bench)
    df["logfile_mtime"] = [
        max((file_mtime(resolve_path(root, p)) for p in logs), default=math.nan)
        for logs in df["log"]
    ]
    df["log_span_s"] = df["log_end"] - df["log_start"]
    # A benchmark or log file outside the job's window was (re)written by another invocation.
    lo, hi = df["log_start"] - LOG_RESOLUTION_S, df["log_end"] + 2 * LOG_RESOLUTION_S
    df["bench_this_run"] = (df["bench_mtime"] >= lo) & (df["bench_mtime"] <= hi)
    df["logfile_this_run"] = (df["logfile_mtime"] >= lo) & (df["logfile_mtime"] <= hi)
    df["bench_log_diff_s"] = df["bench_s"] - df["log_span_s"]
    df["bench_consistent"] = df["bench_log_diff_s"].abs() <= BENCH_TOLERANCE_S
    df["bench_ok"] = df["bench_this_run"] & df["bench_consistent"]
    upper = df["log_end"]
    lower = np.minimum(np.maximum(df["log_start"] - LOG_RESOLUTION_S, inv.started), upper)
    derived = (df["log_end"] - df["bench_s"]).clip(lower=lower, upper=upper)
    df["start_s"] = derived.where(df["bench_ok"], df["log_start"])
    df["end_s"] = df["log_end"]
    df["duration_s"] = df["end_s"] - df["start_s"]
    df["timing"] = np.where(df["bench_ok"], "derived", "measured")
    df["t_start"] = df["start_s"] - inv.started
    df["t_end"] = df["end_s"] - inv.started
    df["logfile_vs_end_s"] = df["logfile_mtime"] - df["log_end"]
    # The target's resource the job held ("" for none): target_<slug>, or target_slot in logs
    # written before the resource was named after the target.
    df["target_resource"] = [
        next(iter(held_target_resources(r)), "") for r in df["resources"].fillna("")
    ]
    df["target_slot"] = df["target_resource"].ne("")
    df["is_measurement"] = df["rule"].isin(MEASUREMENT_RULES)
    df["bucket"] = df["rule"].map(RULE_BUCKET).fillna(UNKNOWN_RULE_BUCKET)
    df["known_rule"] = df["rule"].isin(list(RULE_BUCKET))
    values = df["wildcards"].str.replace(r"[\w-]+=", "", regex=True).str.replace(", ", "/")
    df["label"] = df["rule"].where(values == "", df["rule"] + ":" + values)
    df.index.name = "job"
    return df


def job_dependencies(timeline: pd.DataFrame) -> pd.DataFrame:
    """Edges ``job -> dep``: an output of ``dep`` is an input of ``job`` (``path``)."""
    prod = timeline[["outputs", "status", "attempt"]].explode("outputs").dropna(subset=["outputs"])
    # A file's producer is its latest finished attempt (a failed one produced nothing usable).
    prod = (
        prod.assign(dep=prod.index, ok=prod["status"].eq("finished"))
        .sort_values(["ok", "attempt"], kind="stable")
        .drop_duplicates("outputs", keep="last")
    )
    cons = timeline[["inputs"]].explode("inputs").dropna(subset=["inputs"])
    cons = cons.assign(job=cons.index)
    edges = cons.merge(prod[["outputs", "dep"]], left_on="inputs", right_on="outputs")
    edges = edges.rename(columns={"inputs": "path"})[["job", "dep", "path"]]
    return edges[edges["job"] != edges["dep"]].reset_index(drop=True)


def critical_path(
    timeline: pd.DataFrame, deps: pd.DataFrame, *, tolerance_s: float = GATE_TOLERANCE_S
) -> pd.DataFrame:
    """The chain of gating jobs from the first to the job that finished last, in time order.

    The log's line order is exact where its stamps are 1 s: a job can only have waited for a
    job whose completion line precedes its ``rule X:`` line. Among those that are its
    dependencies or ended within ``tolerance_s`` of its start stamp (contention for a core or
    the target's slot), the gate is the one whose completion came last. ``gate`` says which:
    ``first`` (nothing gated it: Snakemake's own start-up did), ``dependency``, ``target_slot``
    (both jobs hold the same target's resource), ``core`` or ``retry`` (its own failed
    attempt); ``gated_by`` is the previous row's job.
    """
    done = timeline[timeline["status"].isin(["finished", "error"]) & timeline["end_s"].notna()]
    if done.empty:
        return pd.DataFrame(columns=PATH_COLUMNS)
    idx = done.index.to_numpy()
    log_start = done["log_start"].to_numpy(float)
    log_end = done["log_end"].to_numpy(float)
    start_line = done["start_line"].to_numpy(float)
    end_line = done["end_line"].to_numpy(float)
    held = done["target_resource"].to_numpy(object)
    jobid = done["jobid"].to_numpy()
    dep_of = deps.groupby("job")["dep"].agg(set).to_dict() if len(deps) else {}
    cur = int(np.argmax(end_line))
    chain: list[tuple[int, str, int | None]] = []
    while True:
        is_dep = np.isin(idx, list(dep_of.get(idx[cur], ())))
        near = log_end >= log_start[cur] - tolerance_s
        # Completed before this job was launched: also what keeps the walk from looping.
        cand = (is_dep | near) & (end_line < start_line[cur])
        if not cand.any():
            chain.append((cur, "first", None))
            break
        best = int(np.argmax(np.where(cand, end_line, -np.inf)))
        if is_dep[best]:
            gate = "dependency"
        elif jobid[best] == jobid[cur]:
            gate = "retry"
        else:
            # Jobs holding two different targets' resources never wait for each other.
            gate = "target_slot" if held[cur] and held[cur] == held[best] else "core"
        chain.append((cur, gate, int(idx[best])))
        cur = best
    chain.reverse()
    rows = done.iloc[[c for c, _, _ in chain]]
    return pd.DataFrame(
        {
            "job": rows.index.to_numpy(),
            "jobid": rows["jobid"].to_numpy(),
            "rule": rows["rule"].to_numpy(),
            "label": rows["label"].to_numpy(),
            "status": rows["status"].to_numpy(),
            "start_s": rows["start_s"].to_numpy(float),
            "end_s": rows["end_s"].to_numpy(float),
            "gate": [g for _, g, _ in chain],
            "gated_by": pd.array([b for _, _, b in chain], dtype="Int64"),
        }
    )


def reused_inputs(timeline: pd.DataFrame, pack_name: str) -> list[str]:
    """The pack's inputs this invocation read but no job of it produced (earlier runs' work)."""
    produced = set(timeline["outputs"].explode().dropna())
    inputs = timeline["inputs"].explode().dropna()
    return sorted({p for p in inputs if p not in produced and f"/{pack_name}/" in f"/{p}"})


def shadow_jobs(timeline: pd.DataFrame, on_path: set) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Jobs that ended off the critical path, and their count and seconds by rule."""
    off = timeline[timeline["end_s"].notna() & ~timeline.index.isin(on_path)]
    by_rule = (
        off.groupby("rule")["duration_s"].agg(["count", "sum"]).sort_values("sum", ascending=False)
    )
    return off, by_rule
