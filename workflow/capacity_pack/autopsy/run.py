"""Performance autopsy of one Snakemake invocation of a pack: where its wall clock went.

The seed's §5.3 procedure (timeline, critical path, buckets, counterfactuals, clock cross-check,
finding-vs-waste, missing evidence) over the sources a pack run leaves behind. Every figure is
labelled by how it is known: ``measured`` (a source recorded it), ``derived`` (arithmetic on
measured figures) or ``estimated`` (a model of what would have happened).

Sources, laid against each other (no single one trusted alone):

- Snakemake's main log ``.snakemake/log/<start>.snakemake.log``: the invocation's start (file
  name, microseconds; header ``Date:``, 1 s), per job the timestamp line before ``rule X:``
  (``log_start``) and before ``Finished jobid: N`` / ``Error in rule X:`` (``log_end``); 1 s
  resolution (asctime truncates), local time without a zone (read in this host's zone).
- The job's benchmark TSV: Snakemake's ``s`` (the job's run time, sub-second) and its mtime.
- The job's log file mtime (its last write: a derived end).
- Measurement records (``records.jsonl`` of ``sweep`` and ``failure_drill``): every request's
  CLOCK_MONOTONIC and CLOCK_REALTIME stamps; the sweep's ``summary.json`` (the drill's
  ``drill.json`` ``load``) ``wall_s`` = t0 to the run's end on the monotonic clock.
- The MLflow store: child runs' start/end. They are logged by ``track`` jobs after the fact, so
  they are tracking times, never job times.
- Git: commit times (1 s resolution, set by the committer).

Job times (derived): ``end_s = log_end``; ``start_s = end_s - bench_s`` clamped to
``[max(log_start - 1 s, invocation start), end_s]`` when the benchmark file was written inside
the job's logged window (``[log_start - 1 s, log_end + 2 s]``; otherwise a later invocation
overwrote it) and agrees with the log (``|bench_s - (log_end - log_start)| <= 1 s + 1 s
resolution``); otherwise ``start_s = log_start`` (measured, 1 s).

Dependencies: job B depends on job A when an output of A is an input of B (as logged).

Critical path: start at the job that finished last (the last completion line) and walk back.
A job's gate is, among its dependencies and every job that ended within ``GATE_TOLERANCE_S`` of
its start stamp (a freed core, or the target's slot: the per-target resource ``target_<slug>``
of ``capacity_pack.measure.cluster``, ``target_slot`` in logs from before it, that lets one
measurement
at a time load the target: contention), the one that finished last before it started. "Before"
is the log's line order (completion line before the job's ``rule X:`` line), exact where the
stamps are 1 s. The gate is recorded as ``dependency``, ``target_slot`` (both jobs hold the
same target's resource), ``core`` or ``retry`` (the job's own failed attempt). Along the path,
in time order, with ``prev_end`` the previous job's end (the invocation start for the first)
and ends made non-decreasing: ``gap = max(0, start - prev_end)`` is orchestration and ``work =
end - max(start, prev_end)`` is the job's, so gaps + work = last end - invocation start exactly
(checked in code). Jobs off the path ran in its shadow: they cost core time, not wall time.

Buckets (the seed's standard set, the same every run), mapped by rule with ``RULE_BUCKET``:

- ``task_intrinsic``: the measured load span of a measurement job (first send to last end, placed
  on the realtime clock from its records) and the analysis rules;
- ``infrastructure``: a measurement job's work outside its load span (process start-up, target
  launch, drain, writing) and the plumbing rules; a rule not in the table lands here and the
  autopsy says so;
- ``implementation_debugging``: failed attempts on the critical path (development time lives in
  the git history, not in the run);
- ``orchestration``: Snakemake before the first job (DAG build, pack validation, fit probe),
  gaps between critical jobs and the aggregate ``all`` target;
- ``documentation``: ``report``, ``failure_test``, ``autopsy``.

Clock cross-check (per measurement job): the offsets ``realtime - monotonic`` of every send and
end stamp. Their two reads are not atomic, so one stamp can be off by a thread switch (jitter,
counted apart as an outlier); the systematic drift is the spread of the per-bin medians over
``CLOCK_BINS`` equal monotonic-time bins. Tolerance: ``1 ms + 1e-4 x span``. Beyond it, the job's
realtime-placed figures (load window, drain tail, its task-intrinsic split) are invalid, and
the report says so; so are they when its records.jsonl was rewritten outside the job's window
(another invocation). The monotonic and realtime spans (last end - first send) are compared too.
A measurement job without a valid load window counts whole as task-intrinsic (``split`` says so).

Disagreements between sources are results, not noise: benchmark ``s`` vs the log span, benchmark
and job-log mtimes vs the job's window, ``wall_s`` vs the records, the records' realtime end vs
the completion stamp, the header ``Date:`` vs the file name, ``Elapsed time`` vs the stamps,
MLflow child runs vs the jobs they record, commits inside the invocation's window.

Counterfactuals, priced against the measured critical path (never spec sheets), each with its
arithmetic: (a) an accelerator ``speedup`` x faster: an open-loop point's duration is fixed by
its arrival schedule, so only its drain tail (last end - last due) shrinks, and a closed-loop
point's whole load span: saved = (1 - 1/speedup) x (tails + closed spans) on the path;
(b) ``budget_fraction`` of the measurement budget: saved = (1 - fraction) x measurement load
spans on the path (a decision cost: weaker sample gates); (c) ``targets`` independent targets:
saved = (1 - 1/K) x the measurement jobs' work on the path (estimated: assumes they were
serialized by the slot, not by dependencies or cores); (d) no MLflow tracking: saved = the
``track`` jobs' work on the path. New wall clock = wall clock - saved.

Finding vs waste: §9's three questions answered in words on every bucket holding at least
``DOMINANT_SHARE`` of the critical path; a finding is routed to an analysis-plan line, waste to a
priced backlog line (seconds per run).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.measure.cluster import held_target_resources
from capacity_pack.measure.loadgen import read_records

SCHEMA = "capacity_pack.autopsy.run/1"
NS = 1_000_000_000
LOG_RESOLUTION_S = 1.0
# A job that started within this of another's end may have waited for it (1 s log stamps).
GATE_TOLERANCE_S = 1.0
BENCH_TOLERANCE_S = 1.0 + LOG_RESOLUTION_S
CLOCK_DRIFT_TOL_MS = 1.0
CLOCK_DRIFT_TOL_FRAC = 1e-4
CLOCK_BINS = 10
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
MEASUREMENT_RULES = frozenset({"sweep", "failure_drill"})
# Jobs that do not make an invocation worth an autopsy on their own.
NOT_A_RUN = frozenset({"autopsy", "all"})
# The MLflow stage a `track` job logs, by the rule whose jobs it tracks.
STAGE_RULES = {
    "schedule": ("schedule",),
    "sweep": ("sweep",),
    "analysis": ("analyze",),
    "failure": ("failure_drill", "failure_analyze"),
}

Provenance = Literal["measured", "derived", "estimated"]
JobStatus = Literal["finished", "error", "incomplete"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LogJob(_Model):
    """One execution (attempt) of one job, as Snakemake's main log tells it."""

    jobid: int = Field(description="Snakemake's job id within the invocation")
    attempt: int = Field(0, description="0 for the first execution of this jobid, 1 for a retry")
    rule: str = Field(description="rule name")
    local: bool = Field(description="logged as `localrule` (ran in Snakemake's own host)")
    wildcards: str = Field("", description="the logged `wildcards:` text")
    inputs: list[str] = Field(default_factory=list, description="logged input paths")
    outputs: list[str] = Field(default_factory=list, description="logged output paths")
    log: list[str] = Field(default_factory=list, description="the job's log file paths")
    benchmark: str | None = Field(None, description="the job's benchmark TSV path")
    resources: str = Field("", description="the logged `resources:` text")
    reason: str = Field("", description="why Snakemake ran it")
    log_start: float | None = Field(
        description="measured: epoch s of the timestamp line before `rule X:` (1 s resolution)"
    )
    log_end: float | None = Field(
        None, description="measured: epoch s of the timestamp line before its completion line"
    )
    status: JobStatus = Field("incomplete", description="finished, error or incomplete")
    start_line: int = Field(0, description="line number of its `rule X:` line in the log")
    end_line: int | None = Field(None, description="line number of its completion line")


class Invocation(_Model):
    """One Snakemake invocation: its header and every job it executed."""

    path: str = Field(description="the main log file")
    started: float = Field(description="epoch s the invocation started")
    started_source: str = Field(description="which source gave `started` and its resolution")
    header_date: float | None = Field(description="measured: the header's `Date:` (1 s)")
    command: str = Field("", description="the header's `Command:`")
    workflow_id: str | None = Field(None, description="the header's `Workflow ID:`")
    snakemake_version: str | None = Field(None, description="the header's `Snakemake version:`")
    job_stats: dict[str, int] = Field(default_factory=dict, description="the `Job stats:` table")
    jobs: list[LogJob] = Field(default_factory=list, description="every job attempt, log order")
    complete: bool = Field(False, description="the log reached `(100%) done`")
    elapsed_s: float | None = Field(None, description="measured: Snakemake's `Elapsed time:`")
    last_stamp: float | None = Field(None, description="the log's last timestamp line (epoch s)")


class ClockCheck(_Model):
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


class Counterfactual(_Model):
    name: str = Field(description="the intervention")
    assumption: str = Field(description="what it changes, from the measured bottleneck")
    arithmetic: str = Field(description="the computation, written out")
    saved_s: float = Field(description="seconds of critical path it would save")
    new_wall_s: float = Field(description="the wall clock it would leave")
    provenance: Provenance = Field(description="derived (from measured spans) or estimated")
    caveat: str = Field(description="what the figure does not cover")


class FindingOrWaste(_Model):
    bucket: str = Field(description="a dominant bucket")
    seconds: float = Field(description="its seconds of critical path")
    share: float = Field(description="its share of the critical path")
    changes_comparison: str = Field(description="Q1: does it change the measured comparison?")
    changes_decision: str = Field(description="Q2: would removing it change the decision?")
    recurs_at_target: str = Field(description="Q3: does it recur at the deployment target?")
    verdict: str = Field(description="finding or waste")
    routed_to: str = Field(description="analysis plan or engineering backlog")
    line: str = Field(description="the analysis-plan line or the priced backlog line")


class Disagreement(_Model):
    sources: str = Field(description="the two sources laid against each other")
    figure: str = Field(description="what is compared")
    checked: int = Field(description="how many pairs were compared")
    disagreeing: int = Field(description="how many differ beyond the tolerance")
    tolerance: str = Field(description="the tolerance")
    median_diff_s: float | None = Field(None, description="median difference (s)")
    max_abs_diff_s: float | None = Field(None, description="largest |difference| (s)")
    detail: str = Field(description="what the disagreement means")


class MissingEvidence(_Model):
    gap: str = Field(description="what could not be reconstructed")
    why: str = Field(description="why not")
    telemetry: str = Field(description="what to record next run to close it")


# ---------------------------------------------------------------------------------------------
# Snakemake's main log
# ---------------------------------------------------------------------------------------------

_STAMP = re.compile(r"^\[(?P<ts>\w{3} \w{3} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\]\s*$")
_RULE = re.compile(r"^(?P<local>local)?(?:rule|checkpoint) (?P<rule>[\w.]+):\s*$")
_FIELD = re.compile(r"^ {4}(?P<key>[\w-]+):(?: (?P<value>.*))?$")
_HEADER = re.compile(r"^ {2}(?P<key>[A-Z][\w ()]*?): (?P<value>.*)$")
_FINISHED = re.compile(r"^Finished job(?:id:)? (?P<jobid>\d+)")
_ERROR = re.compile(r"^Error in rule (?P<rule>[\w.]+):")
_STATS_ROW = re.compile(r"^(?P<rule>[\w.]+)\s+(?P<count>\d+)\s*$")
_ELAPSED = re.compile(
    r"^Elapsed time: (?:(?P<d>\d+) days?, )?(?P<h>\d+):(?P<m>\d{2}):(?P<s>\d{2}(?:\.\d+)?)"
)
_FILE_STAMP = "%Y-%m-%dT%H%M%S.%f"


def _local_epoch(text: str, fmt: str) -> float:
    # Snakemake writes naive local time; this host's zone is the only one known.
    return datetime.strptime(text, fmt).timestamp()


def _paths(value: str) -> list[str]:
    return [p for p in value.split(", ") if p]


def parse_snakemake_log(path: str | os.PathLike[str]) -> Invocation:
    """One main log: header, job blocks, completions and errors; a truncated tail is tolerated.

    A job's start is the timestamp line before its ``rule X:`` block, its end the timestamp line
    before its ``Finished jobid: N`` (or ``Error in rule X:`` block). A job with no completion
    line (still running when the log was read, e.g. the autopsy job itself) is ``incomplete``.
    """
    path = Path(path)
    header: dict[str, str] = {}
    stats: dict[str, int] = {}
    jobs: list[dict[str, Any]] = []
    by_id: dict[int, list[int]] = {}
    stamp: float | None = None
    block: dict[str, Any] | None = None
    seen_stamp = in_stats = complete = False
    elapsed: float | None = None

    def complete_job(index: int, status: str, line: int) -> None:
        jobs[index].update(status=status, log_end=stamp, end_line=line)

    def close(b: dict[str, Any]) -> None:
        fields = b["fields"]
        try:
            jobid = int(fields.get("jobid", "-1").split()[0])
        except ValueError:
            jobid = -1
        if b["kind"] == "job":
            attempts = by_id.setdefault(jobid, [])
            job = {
                "jobid": jobid,
                "attempt": len(attempts),
                "rule": b["rule"],
                "local": b["local"],
                "wildcards": fields.get("wildcards", ""),
                "inputs": _paths(fields.get("input", "")),
                "outputs": _paths(fields.get("output", "")),
                "log": _paths(fields.get("log", "")),
                "benchmark": fields.get("benchmark") or None,
                "resources": fields.get("resources", ""),
                "reason": fields.get("reason", ""),
                "log_start": b["stamp"],
                "start_line": b["line"],
            }
            attempts.append(len(jobs))
            jobs.append(job)
            return
        # An error block names its job by id; without one, the rule's open attempt failed.
        pool = by_id.get(jobid, []) if jobid >= 0 else range(len(jobs))
        open_ = [
            i
            for i in pool
            if jobs[i].get("status", "incomplete") == "incomplete"
            and (jobid >= 0 or jobs[i]["rule"] == b["rule"])
        ]
        if open_:
            complete_job(open_[-1], "error", b["line"])

    with path.open(encoding="utf-8", errors="replace") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.rstrip("\n")
            if block is not None:
                if m := _FIELD.match(line):
                    block["fields"][m["key"]] = m["value"] or ""
                    continue
                close(block)
                block = None
            if m := _STAMP.match(line):
                stamp = _local_epoch(m["ts"], "%a %b %d %H:%M:%S %Y")
                seen_stamp = True
                continue
            if not seen_stamp and (m := _HEADER.match(line)):
                header.setdefault(m["key"].strip(), m["value"].strip())
                continue
            if line.startswith("Job stats:"):
                in_stats = True
                continue
            if in_stats:
                if m := _STATS_ROW.match(line):
                    if m["rule"] != "total":
                        stats[m["rule"]] = int(m["count"])
                    continue
                # The table's own header and rule lines; anything else ends it.
                if line.strip() and (line.startswith("job") or set(line.strip()) <= {"-", " "}):
                    continue
                in_stats = False
            if m := _RULE.match(line):
                block = {
                    "kind": "job",
                    "rule": m["rule"],
                    "local": bool(m["local"]),
                    "stamp": stamp,
                    "line": lineno,
                    "fields": {},
                }
            elif m := _FINISHED.match(line):
                open_ = [
                    i
                    for i in by_id.get(int(m["jobid"]), [])
                    if jobs[i].get("status", "incomplete") == "incomplete"
                ]
                if open_:
                    complete_job(open_[-1], "finished", lineno)
            elif m := _ERROR.match(line):
                block = {
                    "kind": "error",
                    "rule": m["rule"],
                    "stamp": stamp,
                    "line": lineno,
                    "fields": {},
                }
            elif "(100%) done" in line or line.startswith("Nothing to be done"):
                complete = True
            elif m := _ELAPSED.match(line):
                elapsed = (
                    int(m["d"] or 0) * 86400 + int(m["h"]) * 3600 + int(m["m"]) * 60
                ) + float(m["s"])
    if block is not None:
        close(block)

    header_date = None
    if "Date" in header:
        try:
            header_date = _local_epoch(header["Date"], "%Y-%m-%d %H:%M:%S")
        except ValueError:
            header_date = None
    try:
        started = _local_epoch(path.name.split(".snakemake")[0], _FILE_STAMP)
        source = "measured: the log file's name (microseconds)"
    except ValueError:
        if header_date is not None:
            started, source = header_date, "measured: the header's Date (1 s)"
        else:
            starts = [j["log_start"] for j in jobs if j["log_start"] is not None]
            started = min(starts) if starts else 0.0
            source = "measured: the first job's timestamp (1 s)"
    return Invocation(
        path=str(path),
        started=started,
        started_source=source,
        header_date=header_date,
        command=header.get("Command", ""),
        workflow_id=header.get("Workflow ID"),
        snakemake_version=header.get("Snakemake version"),
        job_stats=stats,
        jobs=[LogJob(**j) for j in jobs],
        complete=complete,
        elapsed_s=elapsed,
        last_stamp=stamp,
    )


def _in_pack(job: LogJob, pack_name: str) -> bool:
    paths = [*job.outputs, *job.log, *([job.benchmark] if job.benchmark else [])]
    return any(f"/{pack_name}/" in f"/{p}" for p in paths)


def latest_invocation(
    log_dir: str | os.PathLike[str], pack_name: str | None = None
) -> Invocation | None:
    """The newest main log that ran a measurement job of the pack (else the newest that ran
    any job other than ``autopsy``/``all``).

    Log names start with their start time, so name order is time order. The autopsy job runs
    while its own invocation's log is still being written: that log counts only if it executed
    something else, and its open last job is read as ``incomplete``.
    """
    newest = None
    for path in sorted(Path(log_dir).glob("*.snakemake.log"), key=lambda p: p.name, reverse=True):
        try:
            inv = parse_snakemake_log(path)
        except (OSError, ValueError):
            continue
        ran = [
            j for j in inv.jobs
            if j.rule not in NOT_A_RUN and (pack_name is None or _in_pack(j, pack_name))
        ]  # fmt: skip
        # The expensive run is the one to account for: a later invocation that only re-analyzed
        # or re-tracked is not where the pack's wall clock went.
        if any(j.rule in MEASUREMENT_RULES for j in ran):
            return inv
        if ran and newest is None:
            newest = inv
    return newest


# ---------------------------------------------------------------------------------------------
# Job timeline
# ---------------------------------------------------------------------------------------------

_BENCH_FIELDS = ("s", "cpu_time", "mean_load", "max_rss")


def _resolve(root: Path, path: Any) -> Path | None:
    # pandas holds a missing path as NaN, not None.
    if not isinstance(path, str) or not path:
        return None
    p = Path(path)
    return p if p.is_absolute() else root / p


def _mtime(path: Path | None) -> float:
    try:
        return path.stat().st_mtime if path is not None else math.nan
    except OSError:
        return math.nan


def read_benchmark(path: Path | None) -> dict[str, float]:
    """Snakemake's benchmark TSV (first row): s, cpu_time, mean_load, max_rss, and its mtime."""
    out = {f"bench_{k}": math.nan for k in _BENCH_FIELDS} | {"bench_mtime": _mtime(path)}
    if path is None or math.isnan(out["bench_mtime"]):
        return out
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if len(lines) < 2:
        return out
    row = dict(zip(lines[0].split("\t"), lines[1].split("\t"), strict=False))
    for k in _BENCH_FIELDS:
        try:
            out[f"bench_{k}"] = float(row.get(k, "nan"))
        except ValueError:
            out[f"bench_{k}"] = math.nan
    return out


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
        [read_benchmark(_resolve(root, b)) for b in df["benchmark"]],
        index=df.index,
        columns=[*(f"bench_{k}" for k in _BENCH_FIELDS), "bench_mtime"],
    )
    df = df.join(bench)
    df["logfile_mtime"] = [
        max((_mtime(_resolve(root, p)) for p in logs), default=math.nan) for logs in df["log"]
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


# ---------------------------------------------------------------------------------------------
# Critical path and buckets
# ---------------------------------------------------------------------------------------------

PATH_COLUMNS = ["job", "jobid", "rule", "label", "status", "start_s", "end_s", "gate", "gated_by"]


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


# ---------------------------------------------------------------------------------------------
# Measurement records and the clock cross-check
# ---------------------------------------------------------------------------------------------

RECORD_INT_COLUMNS = (
    "due_ns",
    "sent_ns",
    "end_ns",
    "sent_realtime_ns",
    "end_realtime_ns",
    "t0_ns",
    "t0_realtime_ns",
)


def records_frame(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A records.jsonl's clock columns as exact Int64 (epoch ns exceed float64's 53 bits)."""
    recs = read_records(path)
    data: dict[str, Any] = {
        c: pd.array([r.get(c) for r in recs], dtype="Int64") for c in RECORD_INT_COLUMNS
    }
    for c in ("request_id", "phase", "status"):
        data[c] = [r.get(c) for r in recs]
    return pd.DataFrame(data)


def _dual_stamps(records: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    pairs = []
    for mono, real in (("sent_ns", "sent_realtime_ns"), ("end_ns", "end_realtime_ns")):
        if mono in records and real in records:
            sub = records[[mono, real]].dropna()
            arr = sub.to_numpy(dtype=np.int64)
            pairs.append(arr[(arr[:, 0] > 0) & (arr[:, 1] > 0)])
    both = np.concatenate(pairs) if pairs else np.empty((0, 2), dtype=np.int64)
    return both[:, 0], both[:, 1]


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
        return ClockCheck(
            n_stamps=len(mono),
            span_mono_s=0.0,
            span_realtime_s=0.0,
            span_diff_ms=0.0,
            offset_spread_ms=0.0,
            drift_ms=0.0,
            drift_ppm=0.0,
            tolerance_ms=drift_tol_ms,
            outliers=0,
            max_outlier_ms=0.0,
            span_agrees=False,
            valid=False,
            verdict="fewer than two dual-clock stamps: the clocks cannot be cross-checked",
        )
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
    outliers = int((resid > tol).sum())
    span_diff = (span_real - span_mono) * 1e3
    valid = drift <= tol
    if valid:
        verdict = f"clocks agree: drift {drift:.3f} ms <= {tol:.3f} ms"
        if outliers:
            verdict += (
                f"; {outliers} single stamps off by up to {float(resid.max()):.1f} ms "
                "(a thread switch between the two clock reads: those requests' times are "
                "uncertain by that much)"
            )
    else:
        verdict = (
            f"CLOCK SKEW: realtime drifted {drift:.3f} ms ({ppm:+.0f} ppm) against monotonic over "
            f"{span_mono:.1f} s (> {tol:.3f} ms): every figure computed from these stamps is "
            "invalid until corrected"
        )
    return ClockCheck(
        n_stamps=len(mono),
        span_mono_s=span_mono,
        span_realtime_s=span_real,
        span_diff_ms=span_diff,
        offset_spread_ms=float(off_ms.max()),
        drift_ms=drift,
        drift_ppm=ppm,
        tolerance_ms=tol,
        outliers=outliers,
        max_outlier_ms=float(resid.max()),
        span_agrees=abs(span_diff) <= tol,
        valid=valid,
        verdict=verdict,
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


def _summary_wall_s(outputs: Iterable[str], root: Path) -> float:
    for o in outputs:
        p = _resolve(root, o)
        if p is None or p.name not in ("summary.json", "drill.json"):
            continue
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        wall = doc.get("wall_s", (doc.get("load") or {}).get("wall_s"))
        if isinstance(wall, int | float):
            return float(wall)
    return math.nan


def measurement_windows(
    timeline: pd.DataFrame, repo_dir: str | os.PathLike[str], **clock_kw: Any
) -> pd.DataFrame:
    """Per measurement job: its load window, clock check and summary ``wall_s`` (by job)."""
    root = Path(repo_dir)
    rows = []
    for job, r in timeline[timeline["is_measurement"]].iterrows():
        rec = next((o for o in r["outputs"] if o.endswith("records.jsonl")), None)
        path = _resolve(root, rec)
        row: dict[str, Any] = {"job": job, "label": r["label"], "records": rec}
        if path is None or not path.exists():
            rows.append(row | {"available": False})
            continue
        frame = records_frame(path)
        check = clock_check(frame, **clock_kw)
        mtime = _mtime(path)
        # Records rewritten after this job (a later invocation re-measured) are not its own.
        this_run = r["log_start"] - LOG_RESOLUTION_S <= mtime <= r["log_end"] + 2 * LOG_RESOLUTION_S
        row |= {"available": True, "records_mtime": mtime, "records_this_run": this_run}
        row |= load_window(frame)
        row |= {f"clock_{k}": v for k, v in check.model_dump().items()}
        row["summary_wall_s"] = _summary_wall_s(r["outputs"], root)
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


# ---------------------------------------------------------------------------------------------
# Counterfactuals, finding vs waste
# ---------------------------------------------------------------------------------------------


def _sum_text(values: Iterable[float], limit: int = 6) -> str:
    vals = [v for v in values if v > 0]
    if not vals:
        return "0"
    shown = " + ".join(f"{v:.2f}" for v in vals[:limit])
    return shown + (f" + ... ({len(vals)} terms)" if len(vals) > limit else "")


def counterfactuals(
    attributed: pd.DataFrame,
    windows: pd.DataFrame,
    started: float,
    *,
    speedup: float = 2.0,
    budget_fraction: float = 0.5,
    targets: int = 2,
) -> list[Counterfactual]:
    """The four standard interventions, priced on the critical path's measured spans."""
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
    is_open, is_closed = mode == "open", mode == "closed"
    unknown = ~(is_open | is_closed)
    tails, closed = tail_on_path[is_open], intrinsic[is_closed]
    keep = 1.0 - 1.0 / speedup
    saved_a = keep * (math.fsum(tails) + math.fsum(closed))
    out = [
        Counterfactual(
            name=f"a {speedup:g}x faster accelerator",
            assumption=(
                "an open-loop point's duration is fixed by its arrival schedule, so only its drain "
                "tail (last end - last due) shrinks; a closed-loop point's whole load span "
                f"shrinks; both by 1 - 1/{speedup:g}; analysis, start-up and plumbing do not "
                "run on the accelerator"
            ),
            arithmetic=(
                f"open loop: {int(is_open.sum())} jobs on the path, drain tails on the path "
                f"{_sum_text(tails)} = {math.fsum(tails):.2f} s; closed loop: "
                f"{int(is_closed.sum())} jobs, load spans on the path {_sum_text(closed)} = "
                f"{math.fsum(closed):.2f} s; saved = (1 - 1/{speedup:g}) x "
                f"({math.fsum(tails):.2f} + {math.fsum(closed):.2f}) = {saved_a:.2f} s; new wall "
                f"= {wall:.2f} - {saved_a:.2f} = {wall - saved_a:.2f} s"
            ),
            saved_s=saved_a,
            new_wall_s=wall - saved_a,
            provenance="derived",
            caveat=(
                "priced against the measured service times of the target that ran; for a "
                "simulated target they are the simulator's model, not an accelerator's"
                + (
                    f"; {int(unknown.sum())} measurement jobs without records not priced"
                    if unknown.any()
                    else ""
                )
            ),
        )
    ]
    spans = intrinsic
    saved_b = (1.0 - budget_fraction) * math.fsum(spans)
    out.append(
        Counterfactual(
            name=f"b {budget_fraction:g} x the measurement budget",
            assumption=(
                f"{budget_fraction:g} x the repeats / requests per point: each measurement load "
                f"span on the path scales by {budget_fraction:g}"
            ),
            arithmetic=(
                f"measurement load spans on the path {_sum_text(spans)} = {math.fsum(spans):.2f} s;"
                f" saved = (1 - {budget_fraction:g}) x {math.fsum(spans):.2f} = {saved_b:.2f} s; "
                f"new wall = {wall:.2f} - {saved_b:.2f} = {wall - saved_b:.2f} s"
            ),
            saved_s=saved_b,
            new_wall_s=wall - saved_b,
            provenance="derived",
            caveat=(
                "a decision cost, not free time: fewer samples per class widen the attainment "
                "confidence intervals and can fail the sample gates"
            ),
        )
    )
    job_work = meas["work_s"].to_numpy(float)
    saved_c = (1.0 - 1.0 / targets) * math.fsum(job_work)
    slot_gated = int(attributed["gate"].eq("target_slot").sum())
    out.append(
        Counterfactual(
            name=f"c {targets} independent targets in parallel",
            assumption=(
                f"measurement jobs on the path ({len(meas)}, {slot_gated} of the path's gates were "
                f"the target_slot) split over {targets} targets: their work on the path / {targets}"
            ),
            arithmetic=(
                f"measurement jobs' work on the path {_sum_text(job_work)} = "
                f"{math.fsum(job_work):.2f} s; saved = (1 - 1/{targets}) x "
                f"{math.fsum(job_work):.2f} = {saved_c:.2f} s; new wall = {wall:.2f} - "
                f"{saved_c:.2f} = {wall - saved_c:.2f} s"
            ),
            saved_s=saved_c,
            new_wall_s=wall - saved_c,
            provenance="estimated",
            caveat=(
                "assumes the measurement jobs were serialized by the target's slot, not by "
                "dependencies or by cores: with the cores Snakemake was given, the jobs that ran "
                "beside them (normalize, analyze) may then gate instead"
            ),
        )
    )
    track = attributed[attributed["rule"].eq("track")]
    track_work = track["work_s"].to_numpy(float)
    saved_d = math.fsum(track_work)
    out.append(
        Counterfactual(
            name="d no MLflow tracking",
            assumption="the `track` jobs do not run; the ones off the path cost core time only",
            arithmetic=(
                f"track jobs on the path: {len(track)}, work {_sum_text(track_work)} = "
                f"{saved_d:.2f} s; new wall = {wall:.2f} - {saved_d:.2f} = {wall - saved_d:.2f} s"
            ),
            saved_s=saved_d,
            new_wall_s=wall - saved_d,
            provenance="derived",
            caveat="loses the run's MLflow lineage (parent/child runs, tags) the pack cites",
        )
    )
    return out


def _contributors(attributed: pd.DataFrame, bucket: str, top: int = 3) -> str:
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


def finding_or_waste(
    attributed: pd.DataFrame,
    totals: dict[str, float],
    cfs: list[Counterfactual] | None = None,
    *,
    threshold: float = DOMINANT_SHARE,
) -> list[FindingOrWaste]:
    """§9's three questions, answered on every bucket with at least ``threshold`` of the path."""
    wall = math.fsum(totals.values())
    budget = next((c for c in cfs or [] if c.name.startswith("b ")), None)
    out = []
    for bucket in BUCKETS:
        s = totals.get(bucket, 0.0)
        share = s / wall if wall > 0 else 0.0
        if share < threshold or s <= 0:
            continue
        top = _contributors(attributed, bucket)
        priced = f"{s:.1f} s per run ({share:.0%} of the {wall:.1f} s critical path)"
        if bucket == "task_intrinsic":
            item = FindingOrWaste(
                bucket=bucket,
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
        elif bucket == "documentation":
            item = FindingOrWaste(
                bucket=bucket,
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
        else:
            q3 = {
                "infrastructure": (
                    "partly: process start-up, target launch and drain are this harness's; a "
                    "real target's warm-up is measured on purpose (cold/warm cache states)"
                ),
                "orchestration": (
                    "no: DAG building, pack validation and scheduling gaps exist only in this "
                    "pipeline"
                ),
                "implementation_debugging": "no: a failed attempt is a defect, not the workload",
            }[bucket]
            item = FindingOrWaste(
                bucket=bucket,
                seconds=s,
                share=share,
                changes_comparison=(
                    "no: every point pays it alike; it does not move one point against another"
                ),
                changes_decision="only the bill: the capacity decision is the same without it",
                recurs_at_target=q3,
                verdict="waste",
                routed_to="engineering backlog",
                line=f"BACKLOG (priced): {bucket} costs {priced}; largest: {top}",
            )
        out.append(item)
    return out


# ---------------------------------------------------------------------------------------------
# Other sources: MLflow, git
# ---------------------------------------------------------------------------------------------


def mlflow_runs(db: str | os.PathLike[str]) -> pd.DataFrame:
    """Every MLflow run of the store: id, name, job and stage tags, start/end (epoch s)."""
    import mlflow  # slow to import; only when a store is given

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{Path(db).resolve()}")
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, max_results=50000) if ids else []
    rows = [
        {
            "run_id": r.info.run_id,
            "name": r.info.run_name,
            "job": r.data.tags.get("capacity_pack.job"),
            "stage": r.data.tags.get("capacity_pack.stage"),
            "git_commit": r.data.tags.get("capacity_pack.git_commit"),
            "git_dirty": r.data.tags.get("capacity_pack.git_dirty"),
            "start": r.info.start_time / 1e3 if r.info.start_time else math.nan,
            "end": r.info.end_time / 1e3 if r.info.end_time else math.nan,
        }
        for r in runs
    ]
    cols = ["run_id", "name", "job", "stage", "git_commit", "git_dirty", "start", "end"]
    return pd.DataFrame(rows, columns=cols)


def git_commits(repo_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """``git log``: commit, time (epoch s, committer's), subject; empty when git cannot tell."""
    try:
        res = subprocess.run(
            ["git", "log", "--format=%H%x09%ct%x09%s"],
            cwd=repo_dir,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return pd.DataFrame(columns=["commit", "time", "subject"])
    rows = [line.split("\t", 2) for line in res.stdout.splitlines() if line.count("\t") >= 2]
    df = pd.DataFrame(rows, columns=["commit", "time", "subject"])
    df["time"] = pd.to_numeric(df["time"]).astype(float)
    return df


def _mlflow_section(runs: pd.DataFrame, tl: pd.DataFrame, started: float) -> list[dict[str, Any]]:
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
# The autopsy
# ---------------------------------------------------------------------------------------------


TIMELINE_FIELDS = """job jobid attempt rule label status log_start log_end bench_s bench_cpu_time
bench_mtime logfile_mtime start_s end_s t_start t_end duration_s timing bench_this_run
bench_consistent target_slot target_resource bucket""".split()
PATH_FIELDS = """job jobid rule label status gate gated_by seg_start seg_end gap_s overlap_s work_s
split""".split()
CLOCK_FIELDS = """job label mode n_records clock_n_stamps clock_span_mono_s clock_span_realtime_s
clock_span_diff_ms clock_drift_ms clock_drift_ppm clock_tolerance_ms clock_outliers
clock_max_outlier_ms clock_valid clock_verdict""".split()


def _iso(t: float | None) -> str | None:
    if t is None or not math.isfinite(t):
        return None
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="milliseconds")


def _records(df: pd.DataFrame, cols: list[str]) -> list[dict[str, Any]]:
    present = [c for c in cols if c in df.columns]
    return json.loads(df[present].to_json(orient="records", double_precision=6))


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


def _disagreements(
    inv: Invocation,
    tl: pd.DataFrame,
    win: pd.DataFrame,
    runs: pd.DataFrame | None,
    mlflow_stages: list[dict[str, Any]],
    commits: pd.DataFrame,
) -> list[Disagreement]:
    ran = tl[tl["end_s"].notna()]
    with_bench = ran[ran["bench_s"].notna()]
    out = [
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
    ]
    with_log = ran[ran["logfile_mtime"].notna()]
    out.append(
        _diff(
            "job log file mtime vs main-log end stamp",
            "job end",
            with_log["logfile_vs_end_s"],
            ~with_log["logfile_this_run"],
            "mtime in [log_start - 1 s, log_end + 2 s]",
            "the job log's last write is a derived end; outside the window it was rewritten by "
            "another invocation (median shows how long before its completion stamp a job stops "
            "logging)",
        )
    )
    if len(win) and "available" in win and win["available"].any():
        w = win[win["available"].eq(True)]
        d = w["summary_wall_s"] - w["t0_to_last_end_s"]
        out.append(
            _diff(
                "sweep/drill summary wall_s vs records (t0 to last end, monotonic)",
                "load-generator wall time",
                d,
                (d < -1e-3) | (d > LOG_RESOLUTION_S),
                "0 <= diff <= 1 s (wall_s is read after the last request ends)",
                "wall_s includes the generator's own wind-down after the last request",
            )
        )
        end_stamp = tl.loc[w.index, "log_end"]
        d = w["load_end"] - end_stamp
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
            d = w["clock_drift_ms"] / 1e3
            out.append(
                _diff(
                    "CLOCK_REALTIME vs CLOCK_MONOTONIC per request",
                    "clock drift within each measurement run",
                    d,
                    w["clock_valid"].eq(False),
                    f"{CLOCK_DRIFT_TOL_MS:g} ms + {CLOCK_DRIFT_TOL_FRAC:g} x span",
                    f"{int(w['clock_outliers'].sum())} single stamps deviated by up to "
                    f"{float(w['clock_max_outlier_ms'].max()):.1f} ms (non-atomic dual reads)",
                )
            )
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


def _missing_evidence(
    inv: Invocation,
    tl: pd.DataFrame,
    win: pd.DataFrame,
    reused: list[str],
    runs: pd.DataFrame | None,
    commits: pd.DataFrame,
) -> list[MissingEvidence]:
    out = [
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
            gap="CPU of the simulated target's processes",
            why=(
                "the benchmark gives one cpu_time/mean_load per job and the sweep's client_cpu_s "
                "covers the load generator only; the simulator's child processes are not "
                "attributed, so client-bound and target-bound time cannot be told apart by CPU"
            ),
            telemetry="per-process CPU (client, router, engine replicas) over the load span",
        ),
        MissingEvidence(
            gap="accelerator telemetry",
            why=(
                "no GPU utilization or memory-bandwidth series: for a simulated target there is "
                "no accelerator, so counterfactual (a) is priced on the simulator's service times"
            ),
            telemetry="DCGM/nvidia-smi utilization and memory bandwidth at 1 s on a real target",
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
    ]
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


def _pack_dir(results_dir: Path, pack_name: str) -> Path:
    return results_dir if results_dir.name == pack_name else results_dir / pack_name


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
) -> dict[str, Any]:
    """The JSON-able autopsy of the latest invocation of ``pack_name`` (or of ``log_path``).

    ``results_dir`` is the results root (holding ``<pack_name>/``) or the pack folder itself;
    ``repo_dir`` is Snakemake's working directory (the log's paths are relative to it).
    """
    results_dir, repo_dir = Path(results_dir), Path(repo_dir)
    pack_dir = _pack_dir(results_dir, pack_name)
    inv = parse_snakemake_log(log_path) if log_path else latest_invocation(log_dir, pack_name)
    if inv is None:
        raise FileNotFoundError(f"{log_dir}: no Snakemake invocation of pack {pack_name!r}")
    tl = job_timeline(inv, repo_dir)
    deps = job_dependencies(tl)
    win = measurement_windows(tl, repo_dir)
    path = critical_path(tl, deps)
    att = attribute_buckets(path, inv.started, win)
    totals = bucket_totals(att)
    wall = float(att["seg_end"].iloc[-1]) if len(att) else 0.0
    cfs = counterfactuals(
        att, win, inv.started, speedup=speedup, budget_fraction=budget_fraction, targets=targets
    )
    fw = finding_or_waste(att, totals, cfs)

    produced = set(tl["outputs"].explode().dropna())
    inputs = tl["inputs"].explode().dropna()
    reused = sorted({p for p in inputs if p not in produced and f"/{pack_name}/" in f"/{p}"})

    runs: pd.DataFrame | None = None
    if mlflow_db is not None and Path(mlflow_db).exists():
        try:
            runs = mlflow_runs(mlflow_db)
        except Exception:  # a broken store is missing evidence, not a crashed autopsy
            runs = None
    mlflow_stages = _mlflow_section(runs, tl, inv.started) if runs is not None else []
    commits = git_commits(repo_dir)

    on_path = set(att["job"])
    off = tl[tl["end_s"].notna() & ~tl.index.isin(on_path)]
    shadow = (
        off.groupby("rule")["duration_s"].agg(["count", "sum"]).sort_values("sum", ascending=False)
    )
    clock_rows = win[win["available"].eq(True)] if len(win) else win
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
    unknown_rules = sorted(set(tl.loc[~tl["known_rule"], "rule"]))

    run_commit = None
    if runs is not None and len(runs):
        window = runs[
            (runs["start"] >= inv.started) & (runs["start"] <= (inv.last_stamp or 0) + 60)
        ]
        if len(window) and window["git_commit"].notna().any():
            commit = window["git_commit"].mode().iloc[0]
            row = commits[commits["commit"] == commit]
            run_commit = {
                "commit": commit,
                "dirty": str(window["git_dirty"].mode().iloc[0]),
                "committed_t": float(row["time"].iloc[0] - inv.started) if len(row) else None,
                "source": "MLflow tag capacity_pack.git_commit (measured) vs git log (measured)",
            }

    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "pack": pack_name,
        "pack_dir": str(pack_dir),
        "provenance_legend": {
            "measured": "a source recorded it (log stamp, benchmark s, request stamps)",
            "derived": "arithmetic on measured figures",
            "estimated": "a model of what would have happened",
        },
        "invocation": {
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
        },
        "timeline": _records(
            tl.reset_index(),
            TIMELINE_FIELDS,
        ),
        "critical_path": {
            "wall_clock_s": wall,
            "provenance": "derived (log stamps + benchmark s)",
            "start_iso": _iso(inv.started),
            "end_iso": _iso(inv.started + wall),
            "n_jobs": len(att),
            "gates": att["gate"].value_counts().to_dict() if len(att) else {},
            "before_first_job_s": float(att["gap_s"].iloc[0]) if len(att) else 0.0,
            "first_start_stamp_t": (
                float(tl["log_start"].min() - inv.started) if len(tl) else None
            ),
            "gaps": _records(
                att.iloc[1:][att["gap_s"].iloc[1:] > 0], ["label", "seg_start", "gap_s"]
            ),
            "jobs": _records(
                att,
                [*PATH_FIELDS, *BUCKETS],
            ),
            "shadow": {
                "jobs": int(len(off)),
                "job_seconds": float(off["duration_s"].sum()),
                "by_rule": {
                    str(rule): {"jobs": int(r["count"]), "seconds": float(r["sum"])}
                    for rule, r in shadow.iterrows()
                },
                "meaning": "ran inside the critical path's window: core time, not wall time",
            },
        },
        "buckets": {
            "rows": [
                {
                    "bucket": b,
                    "seconds": totals[b],
                    "share": totals[b] / wall if wall > 0 else 0.0,
                    "provenance": "derived",
                    "contributors": _contributors(att, b) if len(att) else "",
                }
                for b in BUCKETS
            ],
            "total_s": math.fsum(totals.values()),
            "wall_clock_s": wall,
            "rule_map": RULE_BUCKET,
            "unknown_rules": unknown_rules,
            "unknown_rule_bucket": UNKNOWN_RULE_BUCKET,
        },
        "clock_check": {
            "rule": (
                f"drift of realtime - monotonic (per-bin medians) <= {CLOCK_DRIFT_TOL_MS:g} ms + "
                f"{CLOCK_DRIFT_TOL_FRAC:g} x span; benchmark s vs log span <= "
                f"{BENCH_TOLERANCE_S:g} s"
            ),
            "jobs": _records(
                clock_rows.reset_index() if len(clock_rows) else pd.DataFrame(),
                CLOCK_FIELDS,
            ),
            "valid": bool(not invalid),
            "invalid_figures": invalid,
        },
        "counterfactuals": [c.model_dump() for c in cfs],
        "finding_or_waste": [f.model_dump() for f in fw],
        "disagreements": [
            d.model_dump() for d in _disagreements(inv, tl, win, runs, mlflow_stages, commits)
        ],
        "mlflow": {
            "db": str(mlflow_db) if mlflow_db else None,
            "runs": len(runs) if runs is not None else None,
            "stages": mlflow_stages,
            "note": "child runs are logged by `track` jobs after the fact: tracking time",
        },
        "git": {
            "commits": len(commits),
            "first_commit_iso": _iso(float(commits["time"].min())) if len(commits) else None,
            "last_commit_iso": _iso(float(commits["time"].max())) if len(commits) else None,
            "run_commit": run_commit,
        },
        "missing_evidence": [
            m.model_dump() for m in _missing_evidence(inv, tl, win, reused, runs, commits)
        ],
    }
    return doc


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------


def _f(x: Any, nd: int = 2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def run_autopsy_markdown(doc: dict[str, Any], *, top: int = 12) -> str:
    """The autopsy as markdown: one section per step, every figure with its provenance."""
    inv, cp, bk, cc = doc["invocation"], doc["critical_path"], doc["buckets"], doc["clock_check"]
    wall = cp["wall_clock_s"]
    lines = [
        f"# Performance autopsy: {doc['pack']}",
        "",
        f"Invocation `{inv['log']}` started {inv['started_iso']} ({inv['started_source']}), "
        f"`{inv['command']}`; {inv['jobs_executed']} jobs executed "
        f"({', '.join(f'{k} {v}' for k, v in inv['jobs_by_status'].items())}); Snakemake's "
        f"elapsed time {_f(inv['elapsed_s'])} s (measured). Provenance: measured = a source "
        "recorded it; derived = arithmetic on measured figures; estimated = a model.",
        "",
        "## Timeline",
        "",
        f"Top {top} jobs by duration. Times in s since the invocation start; `derived` = end "
        "from the log (1 s), start = end - benchmark s; `measured` = the log's 1 s stamps.",
        "",
        "| job | status | start | end | duration | benchmark s | provenance |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    rows = sorted(
        (r for r in doc["timeline"] if r["duration_s"] is not None),
        key=lambda r: -r["duration_s"],
    )
    for r in rows[:top]:
        lines.append(
            f"| {r['label']} | {r['status']} | {_f(r['t_start'])} | {_f(r['t_end'])} | "
            f"{_f(r['duration_s'])} | {_f(r['bench_s'])} | {r['timing']} |"
        )
    gates = ", ".join(f"{k} {v}" for k, v in cp["gates"].items())
    lines += [
        "",
        "## Critical path",
        "",
        f"Wall clock {wall:.3f} s ({cp['provenance']}): invocation start {cp['start_iso']} to the "
        f"last job's end {cp['end_iso']}. {cp['n_jobs']} jobs on the path; gates: {gates}. "
        f"Orchestration before the first job {cp['before_first_job_s']:.2f} s; "
        f"{len(cp['gaps'])} gaps between critical jobs "
        f"({sum(g['gap_s'] for g in cp['gaps']):.2f} s). Shadow: {cp['shadow']['jobs']} jobs, "
        f"{cp['shadow']['job_seconds']:.1f} job-seconds {cp['shadow']['meaning']}. "
        f"The first job's start stamp is {_f(cp['first_start_stamp_t'])} s after the invocation "
        "start (measured, truncated: a lower bound of Snakemake's start-up); a derived start can "
        "sit up to 1 s earlier because it inherits the end stamp's truncation.",
        "",
        "| # | job | gate | on path from | gap before | work | bucket split |",
        "|---:|---|---|---:|---:|---:|---|",
    ]
    for i, r in enumerate(cp["jobs"]):
        split = ", ".join(f"{b} {r[b]:.2f}" for b in BUCKETS if r[b] and r[b] > 0)
        lines.append(
            f"| {i} | {r['label']} | {r['gate']} | {r['seg_start']:.2f} | {r['gap_s']:.2f} | "
            f"{r['work_s']:.2f} | {split} |"
        )
    if cp["shadow"]["by_rule"]:
        lines += ["", "Shadow by rule: " + ", ".join(
            f"{k} {v['jobs']} jobs {v['seconds']:.1f} s" for k, v in cp["shadow"]["by_rule"].items()
        ) + "."]  # fmt: skip
    lines += [
        "",
        "## Buckets",
        "",
        "| bucket | seconds | share | provenance | largest |",
        "|---|---:|---:|---|---|",
    ]
    for r in bk["rows"]:
        lines.append(
            f"| {r['bucket']} | {r['seconds']:.3f} | {r['share']:.1%} | {r['provenance']} | "
            f"{r['contributors']} |"
        )
    lines += [
        f"| **total** | **{bk['total_s']:.3f}** | | | = wall clock {bk['wall_clock_s']:.3f} s |",
        "",
        "Rules map to buckets by name: "
        + ", ".join(f"{k} -> {v}" for k, v in bk["rule_map"].items())
        + "; a measurement job's work outside its load span is infrastructure."
        + (
            f" Rules not in the table ({', '.join(bk['unknown_rules'])}) were counted as "
            f"{bk['unknown_rule_bucket']}."
            if bk["unknown_rules"]
            else ""
        ),
        "",
        "implementation_debugging counts failed attempts on the critical path only: development "
        "time lives in the git history"
        + (
            f" ({doc['git']['commits']} commits, {doc['git']['first_commit_iso']} to "
            f"{doc['git']['last_commit_iso']})"
            if doc["git"]["commits"]
            else ""
        )
        + ", not in the run.",
        "",
        "## Clock cross-check",
        "",
        f"Rule: {cc['rule']}. "
        + (
            "All figures valid."
            if cc["valid"]
            else "INVALID figures: " + "; ".join(cc["invalid_figures"]) + "."
        ),
        "",
        "| measurement | mode | stamps | mono span s | realtime - mono span ms | drift ms | ppm "
        "| tolerance ms | outliers | valid |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in cc["jobs"]:
        lines.append(
            f"| {r['label']} | {r.get('mode')} | {r.get('clock_n_stamps')} | "
            f"{_f(r.get('clock_span_mono_s'))} | {_f(r.get('clock_span_diff_ms'), 3)} | "
            f"{_f(r.get('clock_drift_ms'), 3)} | {_f(r.get('clock_drift_ppm'), 1)} | "
            f"{_f(r.get('clock_tolerance_ms'), 3)} | {r.get('clock_outliers')} | "
            f"{r.get('clock_valid')} |"
        )
    if not cc["jobs"]:
        lines.append(
            "| no measurement job ran in this invocation (its records, if any, belong to "
            "earlier ones) | | | | | | | | | |"
        )
    lines += ["", "## Counterfactuals", ""]
    for c in doc["counterfactuals"]:
        lines += [
            f"- **{c['name']}** ({c['provenance']}): saves {c['saved_s']:.2f} s, wall clock "
            f"{c['new_wall_s']:.2f} s. Assumption: {c['assumption']}. Arithmetic: "
            f"{c['arithmetic']}. Caveat: {c['caveat']}."
        ]
    lines += ["", "## Finding or waste", ""]
    if not doc["finding_or_waste"]:
        lines.append(f"No bucket holds {DOMINANT_SHARE:.0%} of the critical path.")
    for f in doc["finding_or_waste"]:
        lines += [
            f"- **{f['bucket']}** ({f['seconds']:.1f} s, {f['share']:.0%}): **{f['verdict']}**, "
            f"routed to the {f['routed_to']}.",
            f"  1. Changes the measured comparison? {f['changes_comparison']}.",
            f"  2. Changes the decision or only the bill? {f['changes_decision']}.",
            f"  3. Recurs at the deployment target? {f['recurs_at_target']}.",
            f"  - {f['line']}",
        ]
    lines += [
        "",
        "## Disagreements between sources",
        "",
        "| sources | figure | checked | disagreeing | tolerance | median diff s | max abs diff s "
        "| meaning |",
        "|---|---|---:|---:|---|---:|---:|---|",
    ]
    for d in doc["disagreements"]:
        lines.append(
            f"| {d['sources']} | {d['figure']} | {d['checked']} | {d['disagreeing']} | "
            f"{d['tolerance']} | {_f(d['median_diff_s'], 3)} | {_f(d['max_abs_diff_s'], 3)} | "
            f"{d['detail']} |"
        )
    rc = doc["git"]["run_commit"]
    if rc:
        lines += [
            "",
            f"Git: the run's commit {rc['commit'][:12]} was committed "
            + (
                f"{abs(rc['committed_t']):.0f} s "
                + ("before" if rc["committed_t"] <= 0 else "after")
                + " the invocation start"
                if rc["committed_t"] is not None
                else "at an unknown time"
            )
            + f" ({rc['source']})"
            + (
                "; the checkout was dirty, so the code that ran is not exactly that commit."
                if rc["dirty"].lower() == "true"
                else "."
            ),
        ]
    if doc["mlflow"]["stages"]:
        lines += ["", "MLflow (tracking times, not job times):"]
        for s in doc["mlflow"]["stages"]:
            if not s["in_this_invocation"]:
                lines.append(f"- {s['stage']}: {s['runs']} child runs, none by this invocation")
                continue
            lines.append(
                f"- {s['stage']}: {s['runs']} child runs, {s['in_this_invocation']} logged by "
                f"this invocation's track jobs, from t={_f(s['first_start_t'])} s to "
                f"t={_f(s['last_end_t'])} s; the tracked jobs ended by "
                f"t={_f(s['tracked_jobs_last_end_t'])} s (lag {_f(s['lag_after_jobs_s'])} s)"
            )
    lines += ["", "## Missing evidence", ""]
    for m in doc["missing_evidence"]:
        lines.append(f"- **{m['gap']}**: {m['why']}. Next run: {m['telemetry']}.")
    return "\n".join(lines) + "\n"
