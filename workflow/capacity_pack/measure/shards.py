"""Sharded load generation: one open-loop point run by K client processes.

Assignment (:func:`assign_shards`, :func:`assignment_seed`): consecutive windows of K arrivals,
each permuted by ``numpy.random.default_rng([seed, w])``; prewarm rows go to shard 0; an
in-flight ceiling is shared out as ceil(ceiling / K). Shared start: ``ready-<i>.json`` in a
rendezvous folder, start = max(ready realtime) + lead, mapped onto each shard's monotonic clock
``t0 = monotonic_now + (start - realtime_now)``. Clock check: offset = rt - (m1 + m2) / 2, drift
within a shard, skew on one host (one boot id) and across hosts (chrony bound
``|sys_a - sys_b| + (delay_a / 2 + dispersion_a) + (delay_b / 2 + dispersion_b)``); beyond
``client.shard_clock_tolerance_ms`` the point is invalid. Merge and its checks:
:func:`check_merge`.

Method: docs/scaling.md, 'Sharded load generation'.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.io import finite_or_none, write_json_atomic
from capacity_pack.measure.clock import clock_sample
from capacity_pack.measure.collector import merge_summaries as merge_gc
from capacity_pack.measure.commands import copy_redacted
from capacity_pack.measure.inputs import SweepInputs, load_settings, token_counter
from capacity_pack.measure.interrupt import Interrupted, forward_signals, merge_interruptions
from capacity_pack.measure.lifeline import dies_with_parent
from capacity_pack.measure.run import run_point
from capacity_pack.plan.schedule import Point

NS = 1_000_000_000
READY_POLL_S = 0.002
CLOCK_READS = 7


class ShardError(RuntimeError):
    """A shard could not run, or the shards' results do not merge."""


# ---------------------------------------------------------------------------------------------
# Assignment
# ---------------------------------------------------------------------------------------------


def assignment_seed(schedule_seed: int, point_key: str) -> int:
    """The seed of a point's shard assignment (stable across runs and machines)."""
    digest = hashlib.sha256(f"{schedule_seed}/{point_key}/shards".encode()).hexdigest()
    return int(digest[:16], 16)


def assign_shards(schedule: pd.DataFrame, k: int, seed: int) -> np.ndarray:
    """Shard index of every row of ``schedule`` (in the frame's row order)."""
    n = len(schedule)
    if k <= 1 or n == 0:
        return np.zeros(n, dtype=np.int64)
    order = np.lexsort(
        (schedule["seq"].to_numpy(dtype=np.int64), schedule["scheduled_offset_ns"].to_numpy())
    )
    windows = (n + k - 1) // k
    perms = np.empty((windows, k), dtype=np.int64)
    for w in range(windows):  # one small permutation per window (n / k draws, not n)
        perms[w] = np.random.default_rng([seed, w]).permutation(k)
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    return perms[position // k, position % k]


def shard_rows(schedule: pd.DataFrame, k: int, seed: int, index: int) -> pd.DataFrame:
    """The rows shard ``index`` of ``k`` sends, in the schedule's order."""
    return schedule[assign_shards(schedule, k, seed) == index].reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# Clocks
# ---------------------------------------------------------------------------------------------


def boot_id() -> str:
    """Identifies one boot of one host: shards with the same id share CLOCK_MONOTONIC."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return f"unknown:{socket.gethostname()}"


def ntp_state() -> dict[str, Any] | None:
    """This host's NTP offset estimate from chrony, or None where chronyc is absent/unsynced.

    ``chronyc -c tracking`` fields (seconds): 4 system time offset, 10 root delay,
    11 root dispersion.
    """
    exe = shutil.which("chronyc")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "-c", "tracking"], capture_output=True, text=True, timeout=2, check=True
        ).stdout
        f = out.strip().split(",")
        return {
            "source": "chronyc -c tracking",
            "system_offset_s": float(f[4]),
            "root_delay_s": float(f[10]),
            "root_dispersion_s": float(f[11]),
        }
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def clock_check(shards: list[dict[str, Any]], tolerance_ms: float) -> dict[str, Any]:
    """Drift within each shard and skew between shards, against ``tolerance_ms``.

    ``shards``: each shard's ``clock`` block (``host``, ``boot_id``, ``start``, ``end`` samples
    from :func:`clock_sample`, ``ntp`` from :func:`ntp_state` or None). Returns the measured
    figures, ``valid`` (True, False, or None when a cross-host skew could not be measured and
    nothing measured exceeded the tolerance) and the reasons.
    """
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(shards):
        groups.setdefault(c["boot_id"], []).append(i)
    drift, reasons = _drift(shards, tolerance_ms)
    same_host, why = _same_host_skew(shards, groups, tolerance_ms)
    cross, why_cross, missing = _cross_host_skew(shards, groups, tolerance_ms)
    reasons += why + why_cross
    valid: bool | None = not reasons
    if valid and missing:
        valid = None
    return {
        "tolerance_ms": tolerance_ms,
        "hosts": len(groups),
        "drift": drift,
        "same_host_skew": same_host,
        "cross_host_skew": cross,
        "valid": valid,
        "reasons": reasons,
        "missing_evidence": missing,
    }


def _drift(shards: list[dict[str, Any]], tolerance_ms: float) -> tuple[list[dict], list[str]]:
    """Each shard's realtime-monotonic offset change over the run."""
    drift, reasons = [], []
    for i, c in enumerate(shards):
        d = c["end"]["offset_ns"] - c["start"]["offset_ns"]
        u = c["end"]["uncertainty_ns"] + c["start"]["uncertainty_ns"]
        drift.append({"shard": i, "drift_ms": d / 1e6, "uncertainty_ms": u / 1e6})
        if abs(d) > tolerance_ms * 1e6 + u:
            reasons.append(
                f"shard {i}: realtime moved {d / 1e6:+.3f} ms against the monotonic clock "
                f"during the run (tolerance {tolerance_ms} ms)"
            )
    return drift, reasons


def _same_host_skew(
    shards: list[dict[str, Any]], groups: dict[str, list[int]], tolerance_ms: float
) -> tuple[list[dict], list[str]]:
    """The spread of the offsets of the shards on one boot, at the run's start and end."""
    rows, reasons = [], []
    for bid, members in groups.items():
        if len(members) < 2:
            continue
        for edge in ("start", "end"):
            offs = [shards[i][edge]["offset_ns"] for i in members]
            unc = max(shards[i][edge]["uncertainty_ns"] for i in members)
            spread = max(offs) - min(offs)
            host = shards[members[0]]["host"]
            rows.append(
                {
                    "host": host,
                    "boot_id": bid,
                    "shards": members,
                    "at": edge,
                    "spread_ms": spread / 1e6,
                    "uncertainty_ms": 2 * unc / 1e6,
                }
            )
            if spread > tolerance_ms * 1e6 + 2 * unc:
                reasons.append(
                    f"shards {members} on {host}: realtime-monotonic offsets spread "
                    f"{spread / 1e6:.3f} ms at the {edge} (tolerance {tolerance_ms} ms)"
                )
    return rows, reasons


def _cross_host_skew(
    shards: list[dict[str, Any]], groups: dict[str, list[int]], tolerance_ms: float
) -> tuple[list[dict], list[str], list[str]]:
    """Per pair of hosts, the NTP bound on their realtime skew: |offset_a - offset_b| plus each
    side's root delay / 2 + root dispersion; missing where either has no NTP state."""
    cross, reasons, missing = [], [], []
    hosts = list(groups)
    for a in range(len(hosts)):
        for b in range(a + 1, len(hosts)):
            ca, cb = shards[groups[hosts[a]][0]], shards[groups[hosts[b]][0]]
            na, nb = ca.get("ntp"), cb.get("ntp")
            pair = [ca["host"], cb["host"]]
            if not na or not nb:
                missing.append(
                    f"skew between {ca['host']} and {cb['host']}: no NTP state (chronyc) on "
                    f"{'both' if not na and not nb else (ca if not na else cb)['host']}"
                )
                cross.append({"hosts": pair, "bound_ms": None})
                continue
            bound_s = abs(na["system_offset_s"] - nb["system_offset_s"]) + sum(
                n["root_delay_s"] / 2 + n["root_dispersion_s"] for n in (na, nb)
            )
            cross.append({"hosts": pair, "bound_ms": bound_s * 1e3})
            if bound_s * 1e3 > tolerance_ms:
                reasons.append(
                    f"{ca['host']} vs {cb['host']}: NTP bounds their realtime skew only to "
                    f"{bound_s * 1e3:.3f} ms (tolerance {tolerance_ms} ms)"
                )
    return cross, reasons, missing


# ---------------------------------------------------------------------------------------------
# Rendezvous
# ---------------------------------------------------------------------------------------------


class Rendezvous:
    """K shards agree on one start time through a directory they all see."""

    def __init__(self, directory: str | Path, k: int, index: int, lead_s: float, timeout_s: float):
        self.dir = Path(directory)
        self.k, self.index, self.lead_ns, self.timeout_s = k, index, int(lead_s * NS), timeout_s
        self.ready: list[dict[str, Any]] = []

    def __call__(self) -> int:
        """Report ready, wait for the others; the shared start (realtime ns)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        stamp = clock_sample(CLOCK_READS)
        write_json_atomic(
            self.dir / f"ready-{self.index}.json",
            {
                "index": self.index,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "boot_id": boot_id(),
                **stamp,
            },
        )
        deadline = time.monotonic() + self.timeout_s
        while True:
            files = sorted(self.dir.glob("ready-*.json"))
            if len(files) >= self.k:
                break
            if time.monotonic() > deadline:
                raise ShardError(
                    f"shard {self.index}: only {len(files)} of {self.k} shards ready in "
                    f"{self.dir} after {self.timeout_s:g} s"
                )
            time.sleep(READY_POLL_S)
        self.ready = [json.loads(f.read_text()) for f in files]
        return max(r["realtime_ns"] for r in self.ready) + self.lead_ns


# ---------------------------------------------------------------------------------------------
# One shard (the process `capacity-pack shard SPEC` runs)
# ---------------------------------------------------------------------------------------------


class ShardSpec(BaseModel):
    """What one shard process needs; written by the measurement job as JSON."""

    model_config = ConfigDict(extra="forbid")

    inputs_json: str = Field(description="The point's SweepInputs (canonical JSON).")
    point: str = Field(description="Point id, e.g. open-r16.")
    cache_state: str = Field(description="cold or warm.")
    repeat: int = Field(ge=0, description="Repeat index.")
    base_url: str = Field(description="The target's endpoint root.")
    shards: int = Field(ge=2, description="K.")
    index: int = Field(ge=0, description="This shard.")
    seed: int = Field(description="Assignment seed (assignment_seed).")
    schedule_path: str = Field(description="The point's full schedule (parquet).")
    prewarm_path: str | None = Field(default=None, description="Prewarm rows (shard 0 only).")
    prompts_path: str | None = Field(
        default=None, description="This shard's rows' prepared prompts (parquet), if any."
    )
    rendezvous_dir: str = Field(description="Directory the shards meet in.")
    out_dir: str = Field(description="This shard's output directory.")
    lead_s: float = Field(gt=0, description="Start lead after the last ready report.")
    ready_timeout_s: float = Field(gt=0, description="Rendezvous timeout.")
    share_cpus: bool = Field(
        default=False,
        description="Started without a launcher: the K shards share this host's CPU set, and "
        "each pins its threads within its own part of it (client.pin_threads).",
    )


def write_shard_prompts(path: str | Path, prompts: dict[str, str]) -> None:
    """One shard's prepared prompts by request id (uncompressed: read back at once)."""
    table = pa.table(
        {
            "request_id": pa.array(list(prompts), pa.string()),
            "prompt": pa.array(list(prompts.values()), pa.large_string()),
        }
    )
    pq.write_table(table, path, compression="none")


def read_shard_prompts(path: str | Path) -> dict[str, str]:
    table = pq.read_table(path)
    ids, texts = table.column("request_id").to_pylist(), table.column("prompt").to_pylist()
    return dict(zip(ids, texts, strict=True))


def run_shard(spec: ShardSpec) -> dict[str, Any]:
    """Run one shard: its rows, its records, its summary (with clock samples)."""
    inputs = SweepInputs.model_validate_json(spec.inputs_json)
    point = Point.parse(spec.point, spec.cache_state, spec.repeat)
    schedule = pd.read_parquet(spec.schedule_path)
    rows = shard_rows(schedule, spec.shards, spec.seed, spec.index)
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = out / "records.jsonl"
    if records.exists():
        records.unlink()
    settings = load_settings(inputs, point, spec.base_url, progress=False)
    settings.token_counter = token_counter(inputs, spec.base_url)
    if spec.prompts_path is not None:
        settings.prepared_prompts = read_shard_prompts(spec.prompts_path)
    # Extension blocks need every shard's success counts at once; a sharded point runs its
    # planned schedule and the analysis's sample gate judges it.
    settings.min_successful_per_class = None
    settings.scrape_metrics = spec.index == 0
    settings.shard = spec.index
    if spec.share_cpus:
        settings.cpu_part = (spec.index, spec.shards)
    if settings.max_in_flight is not None:
        # The point's client-side ceiling, shared out: each shard sends every K-th arrival.
        settings.max_in_flight = max(1, -(-settings.max_in_flight // spec.shards))
    rendezvous = Rendezvous(
        spec.rendezvous_dir, spec.shards, spec.index, spec.lead_s, spec.ready_timeout_s
    )
    clock: dict[str, Any] = {"host": socket.gethostname(), "boot_id": boot_id(), "ntp": None}

    def start() -> int:
        start_rt = rendezvous()
        clock["start"] = clock_sample(CLOCK_READS)
        return start_rt

    settings.start_at = start
    prewarm = pd.read_parquet(spec.prewarm_path) if spec.prewarm_path else None
    stop: Interrupted | None = None
    try:
        summary = run_point(
            rows,
            settings,
            records,
            metrics_path=out / "metrics.parquet",
            prewarm=prewarm if prewarm is not None and len(prewarm) else None,
        )
    except Interrupted as exc:  # its records are written: complete the summary, then exit
        stop, summary = exc, exc.summary
    clock["end"] = clock_sample(CLOCK_READS)
    clock["ntp"] = ntp_state()
    summary.update(
        shard=spec.index,
        shards=spec.shards,
        scheduled=int(len(rows)),
        max_in_flight=settings.max_in_flight,
        # Where the launcher let this shard run (taskset, srun --cpu-bind, a cgroup).
        cpu_affinity=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        prewarm_requests=int(len(prewarm)) if prewarm is not None else 0,
        pid=os.getpid(),
        clock=clock,
        rendezvous=rendezvous.ready,
    )
    write_json_atomic(out / "summary.json", finite_or_none(summary))
    if stop is not None:
        raise stop
    return summary


# ---------------------------------------------------------------------------------------------
# The measurement job's side: launch K shards, wait, merge
# ---------------------------------------------------------------------------------------------


def merge_placement(summaries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A sharded point's ``thread_placement``: pinned only if every shard was (per_shard has
    each shard's CPUs)."""
    each = [(s["shard"], s.get("thread_placement")) for s in summaries]
    if not all(p for _, p in each):
        return None
    pinned = all(p["pinned"] for _, p in each)
    detail = "; ".join(f"shard {i}: {p['detail']}" for i, p in each)
    return {"requested": each[0][1]["requested"], "pinned": pinned, "detail": detail}


def launch_argv(launcher: list[str], index: int, k: int, spec_path: Path) -> list[str]:
    prefix = [a.replace("{shard}", str(index)).replace("{shards}", str(k)) for a in launcher]
    return [*prefix, sys.executable, "-m", "capacity_pack", "shard", str(spec_path)]


def run_shards(
    specs: list[ShardSpec], launcher: list[str], log_dir: Path, *, timeout_s: float
) -> list[dict[str, Any]]:
    """Start every shard at once, wait for all; their summaries (ShardError if one failed).

    Each shard (and its launcher) writes to a file in a private temporary directory; its
    ``shard-<i>.log`` in ``log_dir`` is the redacted copy, written when it has ended.
    """
    # The shards import this very package, also from a plain checkout (no pip install -e .).
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory(prefix="capacity-pack-shards-") as private:
        procs = []
        for spec in specs:
            spec_path = Path(spec.out_dir) / "spec.json"
            Path(spec.out_dir).mkdir(parents=True, exist_ok=True)
            write_json_atomic(spec_path, json.loads(spec.model_dump_json()))
            log = (Path(private) / f"shard-{spec.index}.log").open("wb")
            argv = launch_argv(launcher, spec.index, spec.shards, spec_path)
            # A shard dies with this job (SIGTERM: a launcher such as srun then stops its
            # remote shard; capacity_pack.measure.lifeline), so a killed job leaves no load.
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=dies_with_parent(signal.SIGTERM),
            )
            procs.append((spec, proc, log))
        failed, received = _wait_for_shards(procs, log_dir, timeout_s)
    if received:
        raise Interrupted(received[0])  # the shards wrote what they have: the caller merges it
    if failed:
        for _, proc, _ in procs:
            with contextlib.suppress(OSError):
                proc.kill()
        raise ShardError("sharded point failed:\n" + "\n".join(failed))
    return [json.loads((Path(s.out_dir) / "summary.json").read_text()) for s in specs]


def _wait_for_shards(
    procs: list[tuple[ShardSpec, subprocess.Popen[bytes], Any]], log_dir: Path, timeout_s: float
) -> tuple[list[str], list[str]]:
    """Wait for every shard until the deadline, keep each one's log redacted in ``log_dir``;
    (what failed, the signals received and handed on)."""
    deadline = time.monotonic() + timeout_s
    failed = []
    # SIGINT or SIGTERM goes on to the shards, which record their requests in flight and exit.
    with forward_signals([proc for _, proc, _ in procs]) as received:
        for spec, proc, log in procs:
            try:
                rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
                failed.append(f"shard {spec.index}: still running after {timeout_s:g} s (killed)")
            log.close()
            kept = log_dir / f"shard-{spec.index}.log"
            copy_redacted(log.name, kept)
            if rc != 0 and not any(f.startswith(f"shard {spec.index}:") for f in failed):
                tail = kept.read_text(errors="replace")[-800:]
                failed.append(f"shard {spec.index}: exit status {rc}; its log ends:\n{tail}")
    return failed, list(received)


def merge_series(frames: list[pd.DataFrame], interval_s: float) -> pd.DataFrame:
    """Server series from shard 0; client series summed per sample of the shared grid."""
    if not frames:
        return pd.DataFrame(columns=["t_offset_ns", "realtime_ns", "source", "metric", "value"])
    first = frames[0]
    server = first[first["source"] == "server"]
    client = pd.concat([f[f["source"] == "client"] for f in frames], ignore_index=True)
    failed = client[client["metric"] == "scrape_failed"]
    client = client[client["metric"] != "scrape_failed"]
    step = int(interval_s * NS)
    client = client.assign(sample=np.rint(client["t_offset_ns"] / step).astype(np.int64))
    summed = (
        client.groupby(["sample", "metric"], as_index=False)
        .agg(
            t_offset_ns=("t_offset_ns", "min"),
            realtime_ns=("realtime_ns", "min"),
            value=("value", "sum"),
        )  # fmt: skip
        .assign(source="client")
    )
    cols = ["t_offset_ns", "realtime_ns", "source", "metric", "value"]
    out = pd.concat([server[cols], failed[cols], summed[cols]], ignore_index=True)
    return out.sort_values(["t_offset_ns", "source", "metric"], kind="stable").reset_index(
        drop=True
    )


def _lateness(frame: pd.DataFrame) -> dict[str, float | None]:
    """Dispatch lateness (sent - due, ms) of the requests with a due time: p50, p99, max."""
    due = frame["due_ns"].to_numpy(dtype=np.int64) if len(frame) else np.zeros(0, np.int64)
    sent = frame["sent_ns"].to_numpy(dtype=np.int64) if len(frame) else due
    late = (sent[due > 0] - due[due > 0]) / 1e6

    def pct(q: float) -> float | None:
        return float(np.percentile(late, q)) if late.size else None

    return {"p50": pct(50), "p99": pct(99), "max": pct(100)}


def _shard_row(s: dict[str, Any], records: pd.DataFrame) -> dict[str, Any]:
    """One shard's line of the merged summary's ``per_shard``."""
    i = s["shard"]
    mine = records[records["shard"] == i] if len(records) else records
    return {
        "shard": i,
        "host": s["clock"]["host"],
        "pid": s["pid"],
        "scheduled": s["scheduled"],
        "max_in_flight": s.get("max_in_flight"),
        "cpu_affinity": s.get("cpu_affinity"),
        "requests_recorded": s["requests_recorded"],
        "failed": s["failed"],
        "client_cpu_s": s["client_cpu_s"],
        "dispatch_lateness_ms": _lateness(mine),
        "event_loop_lag_ms": s["event_loop_lag_ms"],
        "dispatcher_scheduling": s["dispatcher_scheduling"],
        "thread_placement": s.get("thread_placement"),
        "gc_pause_max_ms": s.get("gc_pause_max_ms"),
        "client_bound": s["client_bound"],
    }


def merge_summaries(
    summaries: list[dict[str, Any]],
    records: pd.DataFrame,
    lateness_bound_ms: float,
    tol_ms: float,
    seed: int,
) -> dict[str, Any]:
    """One point's summary from its shards' (counts summed, lateness over every request)."""
    first = summaries[0]
    total = {
        key: sum(s[key] for s in summaries)
        for key in ("requests_recorded", "sent", "finished", "failed", "streamed_tokens")
    }
    ok_by_class: dict[str, int] = {}
    terminal_by_class: dict[str, int] = {}
    for s in summaries:
        for k, v in s["ok_by_class"].items():
            ok_by_class[k] = ok_by_class.get(k, 0) + v
        for k, v in s["terminal_by_class"].items():
            terminal_by_class[k] = terminal_by_class.get(k, 0) + v
    cpu = sum(s["client_cpu_s"] for s in summaries)
    late = _lateness(records)
    per_shard = [_shard_row(s, records) for s in summaries]
    clocks = clock_check([s["clock"] for s in summaries], tol_ms)
    # The same criterion as one process's: the point's lateness p99, over every request. A
    # shard that lags alone shows in per_shard (its own p99 and client_bound).
    bound = late["p99"] is not None and late["p99"] > lateness_bound_ms
    lag_p99 = [s["event_loop_lag_ms"]["p99"] for s in summaries if s["event_loop_lag_ms"]["p99"]]
    lag_max = [s["event_loop_lag_ms"]["max"] for s in summaries if s["event_loop_lag_ms"]["max"]]
    return {
        "mode": first["mode"],
        "concurrency": first["concurrency"],
        **total,
        "ok_by_class": ok_by_class,
        "terminal_by_class": terminal_by_class,
        "wall_s": max(s["wall_s"] for s in summaries),
        "client_cpu_s": cpu,
        "client_cpu_ms_per_1k_tokens": (
            1e6 * cpu / total["streamed_tokens"] if total["streamed_tokens"] else None
        ),
        "dispatch_lateness_ms": late,
        "event_loop_lag_ms": {
            "p50": None,
            "p99": max(lag_p99) if lag_p99 else None,
            "max": max(lag_max) if lag_max else None,
        },
        "lateness_bound_ms": lateness_bound_ms,
        "client_transport": first["client_transport"],
        "dispatcher_scheduling": first["dispatcher_scheduling"],
        "realtime_dispatch": first.get("realtime_dispatch"),
        "thread_placement": merge_placement(summaries),
        **merge_gc(summaries),
        "client_bound": bool(bound),
        "extension_blocks": 0,
        "extension_blocks_built": None,
        "cut_at_max_duration": 0,
        # Decided offline only: stopping early needs every shard's counts at once.
        "stopped_early": False,
        "unsent_requests": 0,
        "sequential": None,
        "under_sampled_classes": sorted(
            {c for s in summaries for c in s.get("under_sampled_classes", [])}
        ),
        "shards": {
            "count": len(summaries),
            "seed": seed,
            "per_shard": per_shard,
            "clock_check": clocks,
        },
        "shard_clock_valid": clocks["valid"],
        "interrupted": merge_interruptions([s.get("interrupted") for s in summaries]),
    }


# ---------------------------------------------------------------------------------------------
# Normalization's merge check
# ---------------------------------------------------------------------------------------------


def check_merge(
    records: pd.DataFrame,
    schedule: pd.DataFrame,
    prewarm: pd.DataFrame | None,
    shards: dict[str, Any],
    source: str,
) -> dict[str, Any]:
    """Every record on its assigned shard, each shard's count as it reported; lateness per shard.

    The exactly-once check over all shards is :func:`capacity_pack.evidence.normalize.reconcile`'s.
    """
    k, seed = int(shards["count"]), int(shards["seed"])
    if "shard" not in records.columns:
        raise ShardError(f"{source}: a {k}-shard point's records carry no 'shard' field")
    got = records["shard"]
    if got.isna().any():
        bad = records.loc[got.isna(), "request_id"].iloc[0]
        raise ShardError(f"{source}: record {bad!r} has no shard index")
    got = got.astype(np.int64)
    outside = records[(got < 0) | (got >= k)]
    if len(outside):
        raise ShardError(
            f"{source}: record {outside['request_id'].iloc[0]!r} names shard "
            f"{int(outside['shard'].iloc[0])}, outside 0..{k - 1}"
        )
    assigned = pd.Series(assign_shards(schedule, k, seed), index=schedule["request_id"].to_numpy())
    if prewarm is not None and len(prewarm):
        assigned = pd.concat(
            [assigned, pd.Series(0, index=prewarm["request_id"].to_numpy(), dtype=np.int64)]
        )
    want = records["request_id"].map(assigned)
    known = want.notna()
    wrong = records[known & (want != got)]
    if len(wrong):
        r = wrong.iloc[0]
        raise ShardError(
            f"{source}: {len(wrong)} record(s) on the wrong shard, e.g. {r['request_id']!r} "
            f"recorded by shard {int(r['shard'])}, assigned to shard "
            f"{int(assigned[r['request_id']])}"
        )
    counts = got.value_counts().to_dict()
    per_shard = []
    for p in shards["per_shard"]:
        i = int(p["shard"])
        n = int(counts.get(i, 0))
        if n != int(p["requests_recorded"]):
            raise ShardError(
                f"{source}: shard {i} reported {p['requests_recorded']} records, the merged "
                f"file holds {n} of them"
            )
        mine = records[got == i]
        due = mine["due_ns"].to_numpy(dtype=np.int64)
        late = (mine["sent_ns"].to_numpy(dtype=np.int64)[due > 0] - due[due > 0]) / 1e6
        per_shard.append(
            {
                "shard": i,
                "records": n,
                "assigned": int((assigned == i).sum()),
                "dispatch_lateness_p50_ms": float(np.percentile(late, 50)) if late.size else None,
                "dispatch_lateness_p99_ms": float(np.percentile(late, 99)) if late.size else None,
                "dispatch_lateness_max_ms": float(late.max()) if late.size else None,
            }
        )
    return {"count": k, "seed": seed, "per_shard": per_shard}
