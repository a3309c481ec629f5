"""The sources a pack run leaves behind, read as they are: no source is trusted alone.

- Snakemake's main log ``.snakemake/log/<start>.snakemake.log``: the invocation's start (file
  name, microseconds; header ``Date:``, 1 s), per job the timestamp line before ``rule X:``
  (``log_start``) and before ``Finished jobid: N`` / ``Error in rule X:`` (``log_end``); 1 s
  resolution (asctime truncates), local time without a zone (read in this host's zone).
- The job's benchmark TSV: Snakemake's ``s`` (the job's run time, sub-second) and its mtime.
- The job's log file mtime (its last write: a derived end).
- Measurement records (``records.jsonl`` of ``sweep`` and ``failure_drill``): every request's
  CLOCK_MONOTONIC and CLOCK_REALTIME stamps as exact integers; the sweep's ``summary.json``
  (the drill's ``drill.json`` ``load``) ``wall_s`` = t0 to the run's end on the monotonic clock.
- The MLflow store: every run's start/end and tags. Child runs are logged by ``track`` jobs
  after the fact, so they are tracking times, never job times.
- Git: commit times (1 s resolution, set by the committer).

Paths in the log are relative to Snakemake's working directory (``resolve_path``).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.measure.records import records_frame

NS = 1_000_000_000
# Snakemake's main log stamps are truncated to the second.
LOG_RESOLUTION_S = 1.0
MEASUREMENT_RULES = frozenset({"sweep", "failure_drill"})
# Jobs that do not make an invocation worth an autopsy on their own.
NOT_A_RUN = frozenset({"autopsy", "all"})
BENCH_FIELDS = ("s", "cpu_time", "mean_load", "max_rss")
RECORD_INT_COLUMNS = (
    "due_ns",
    "sent_ns",
    "end_ns",
    "sent_realtime_ns",
    "end_realtime_ns",
    "t0_ns",
    "t0_realtime_ns",
)

JobStatus = Literal["finished", "error", "incomplete"]


class StrictModel(BaseModel):
    """The autopsy's document parts: no field outside the declared ones."""

    model_config = ConfigDict(extra="forbid")


class LogJob(StrictModel):
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


class Invocation(StrictModel):
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


class _LogReader:
    """The main log's state, fed line by line: header, job stats, job blocks and completions."""

    def __init__(self) -> None:
        self.header: dict[str, str] = {}
        self.stats: dict[str, int] = {}
        self.jobs: list[dict[str, Any]] = []
        self.by_id: dict[int, list[int]] = {}
        self.stamp: float | None = None
        self.block: dict[str, Any] | None = None
        self.seen_stamp = self.in_stats = self.complete = False
        self.elapsed: float | None = None

    def feed(self, lineno: int, line: str) -> None:
        if self.block is not None:
            if m := _FIELD.match(line):
                self.block["fields"][m["key"]] = m["value"] or ""
                return
            self.close()
        if m := _STAMP.match(line):
            self.stamp = _local_epoch(m["ts"], "%a %b %d %H:%M:%S %Y")
            self.seen_stamp = True
            return
        if not self.seen_stamp and (m := _HEADER.match(line)):
            self.header.setdefault(m["key"].strip(), m["value"].strip())
            return
        if self._stats_line(line):
            return
        self._event(lineno, line)

    def _stats_line(self, line: str) -> bool:
        """Consumes a line of the ``Job stats:`` table (True) or ends the table (False)."""
        if line.startswith("Job stats:"):
            self.in_stats = True
            return True
        if not self.in_stats:
            return False
        if m := _STATS_ROW.match(line):
            if m["rule"] != "total":
                self.stats[m["rule"]] = int(m["count"])
            return True
        # The table's own header and rule lines; anything else ends it.
        if line.strip() and (line.startswith("job") or set(line.strip()) <= {"-", " "}):
            return True
        self.in_stats = False
        return False

    def _block(self, kind: str, rule: str, lineno: int, **extra: Any) -> None:
        self.block = {
            "kind": kind,
            "rule": rule,
            **extra,
            "stamp": self.stamp,
            "line": lineno,
            "fields": {},
        }

    def _event(self, lineno: int, line: str) -> None:
        if m := _RULE.match(line):
            self._block("job", m["rule"], lineno, local=bool(m["local"]))
        elif m := _FINISHED.match(line):
            open_ = [i for i in self.by_id.get(int(m["jobid"]), []) if self._open(i)]
            if open_:
                self._complete(open_[-1], "finished", lineno)
        elif m := _ERROR.match(line):
            self._block("error", m["rule"], lineno)
        elif "(100%) done" in line or line.startswith("Nothing to be done"):
            self.complete = True
        elif m := _ELAPSED.match(line):
            self.elapsed = (
                int(m["d"] or 0) * 86400 + int(m["h"]) * 3600 + int(m["m"]) * 60
            ) + float(m["s"])

    def _open(self, index: int) -> bool:
        return self.jobs[index].get("status", "incomplete") == "incomplete"

    def _complete(self, index: int, status: str, line: int) -> None:
        self.jobs[index].update(status=status, log_end=self.stamp, end_line=line)

    def close(self) -> None:
        """Ends the open block: a job block adds an attempt, an error block fails one."""
        b, self.block = self.block, None
        if b is None:
            return
        fields = b["fields"]
        try:
            jobid = int(fields.get("jobid", "-1").split()[0])
        except ValueError:
            jobid = -1
        if b["kind"] == "job":
            attempts = self.by_id.setdefault(jobid, [])
            attempts.append(len(self.jobs))
            self.jobs.append(
                {
                    "jobid": jobid,
                    "attempt": len(attempts) - 1,
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
            )
            return
        # An error block names its job by id; without one, the rule's open attempt failed.
        pool = self.by_id.get(jobid, []) if jobid >= 0 else range(len(self.jobs))
        open_ = [
            i for i in pool if self._open(i) and (jobid >= 0 or self.jobs[i]["rule"] == b["rule"])
        ]
        if open_:
            self._complete(open_[-1], "error", b["line"])


def _header_date(header: dict[str, str]) -> float | None:
    try:
        return _local_epoch(header["Date"], "%Y-%m-%d %H:%M:%S") if "Date" in header else None
    except ValueError:
        return None


def _started(
    path: Path, header_date: float | None, jobs: list[dict[str, Any]]
) -> tuple[float, str]:
    """The invocation's start and its source: the file name, else the header, else job one."""
    try:
        return (
            _local_epoch(path.name.split(".snakemake")[0], _FILE_STAMP),
            "measured: the log file's name (microseconds)",
        )
    except ValueError:
        if header_date is not None:
            return header_date, "measured: the header's Date (1 s)"
        starts = [j["log_start"] for j in jobs if j["log_start"] is not None]
        return (min(starts) if starts else 0.0), "measured: the first job's timestamp (1 s)"


def parse_snakemake_log(path: str | os.PathLike[str]) -> Invocation:
    """One main log: header, job blocks, completions and errors; a truncated tail is tolerated.

    A job's start is the timestamp line before its ``rule X:`` block, its end the timestamp line
    before its ``Finished jobid: N`` (or ``Error in rule X:`` block). A job with no completion
    line (still running when the log was read, e.g. the autopsy job itself) is ``incomplete``.
    """
    path = Path(path)
    reader = _LogReader()
    with path.open(encoding="utf-8", errors="replace") as fh:
        for lineno, raw in enumerate(fh, start=1):
            reader.feed(lineno, raw.rstrip("\n"))
    reader.close()
    header_date = _header_date(reader.header)
    started, source = _started(path, header_date, reader.jobs)
    return Invocation(
        path=str(path),
        started=started,
        started_source=source,
        header_date=header_date,
        command=reader.header.get("Command", ""),
        workflow_id=reader.header.get("Workflow ID"),
        snakemake_version=reader.header.get("Snakemake version"),
        job_stats=reader.stats,
        jobs=[LogJob(**j) for j in reader.jobs],
        complete=reader.complete,
        elapsed_s=reader.elapsed,
        last_stamp=reader.stamp,
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
# Files the jobs wrote: benchmarks, records, summaries
# ---------------------------------------------------------------------------------------------


def resolve_path(root: Path, path: Any) -> Path | None:
    """A logged path under Snakemake's working directory ``root`` (None for no path)."""
    # pandas holds a missing path as NaN, not None.
    if not isinstance(path, str) or not path:
        return None
    p = Path(path)
    return p if p.is_absolute() else root / p


def file_mtime(path: Path | None) -> float:
    """A file's mtime (epoch s), NaN when it is missing."""
    try:
        return path.stat().st_mtime if path is not None else math.nan
    except OSError:
        return math.nan


def read_benchmark(path: Path | None) -> dict[str, float]:
    """Snakemake's benchmark TSV (first row): s, cpu_time, mean_load, max_rss, and its mtime."""
    out = {f"bench_{k}": math.nan for k in BENCH_FIELDS} | {"bench_mtime": file_mtime(path)}
    if path is None or math.isnan(out["bench_mtime"]):
        return out
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if len(lines) < 2:
        return out
    row = dict(zip(lines[0].split("\t"), lines[1].split("\t"), strict=False))
    for k in BENCH_FIELDS:
        try:
            out[f"bench_{k}"] = float(row.get(k, "nan"))
        except ValueError:
            out[f"bench_{k}"] = math.nan
    return out


def record_clocks(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A records.jsonl's clock columns as exact Int64, with request_id, phase and status."""
    return records_frame(
        path, columns=(*RECORD_INT_COLUMNS, "request_id", "phase", "status"), exact_ints=True
    )


def summary_wall_s(outputs: Iterable[str], root: Path) -> float:
    """``wall_s`` of a measurement job's ``summary.json`` (or ``drill.json`` ``load``), else NaN."""
    for o in outputs:
        p = resolve_path(root, o)
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
