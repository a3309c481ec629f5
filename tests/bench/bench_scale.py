"""Benchmark: how records volume, normalization, analysis and the shard merge grow.

Run (from the repository root, in the project's virtualenv, on a quiet machine):

    python tests/bench/bench_scale.py --json bench-scale.json

Not collected by pytest (``tests/bench`` is excluded). Results and the scale model built on
them are in docs/scaling.md.

Method. For each size N of ``--sizes`` (10k, 100k and 300k requests by default) the default
pack's Poisson schedule is built at ``--rate`` (1,000 RPS) for N / rate seconds, and every
request gets the record a client that saw it succeed would write, through the load generator's
own serializer (:meth:`capacity_pack.measure.records.Attempt.to_json`): one chunk per token, TTFT
50 ms, inter-token gap 20 ms, the class's fixed output length (32 / 48 / 128 tokens, 56 on
average). The records are written as one file (1 shard) and, for ``--shards`` K, as the file a
K-shard point's measurement job writes (each record on its assigned shard, shard files
concatenated), with K client series to merge. Measured, each as wall time of the one call in
this process:

- records volume: bytes of records.jsonl per request and per streamed token;
- normalization: :func:`capacity_pack.evidence.normalize.normalize_point` (read, reconcile,
  build and
  validate the requests and chunks tables; for K > 1 also the merge check), and the parquet
  bytes of the tables it returns;
- analysis: :func:`capacity_pack.evidence.analysis.analyze_point` on those tables;
- the merge a K-shard measurement job does after its shards end: concatenating the shard
  files, :func:`capacity_pack.measure.shards.merge_series` and the lateness summary over all
  records.

A 1,000-request warm-up runs first and is not reported (imports, first calls). Each timed call
starts after a full garbage collection. Peak memory is this process's maximum RSS after each
size (``resource.getrusage``): the sizes run smallest first, so each figure is the peak up to
and including that size, and it includes the records text the benchmark itself builds.
Normalization's own memory is measured apart (``--memory-sizes``, 100k by default): the records
are written, then a fresh process normalizes them and reports its peak RSS before and after,
once with a chunk per token and once with every request's tokens in one chunk (peak RSS from
``/proc/self/status`` ``VmHWM``, which starts afresh at exec).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from tests.paths import ROOT

NS = 1_000_000_000
T0 = 10**12


def pack_for(rate: float, n: int):
    from capacity_pack.plan.manifest import validate_pack

    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    data["client"].update(
        initial_scheduled_requests=1,
        warmup_seconds=0.0,
        minimum_duration_seconds=n / rate,
        maximum_duration_seconds=max(n / rate, data["client"]["maximum_duration_seconds"]),
    )
    data["client"].pop("class_schedule_counts", None)
    return validate_pack(data)


def write_records(
    schedule: pd.DataFrame, path: Path, shard: np.ndarray | None, *, one_chunk: bool = False
) -> int:
    """``one_chunk``: every request's tokens arrive in one chunk (one SSE event)."""
    from capacity_pack.measure.records import Attempt

    ttft, itl = 50_000_000, 20_000_000
    lines = []
    for i, row in enumerate(schedule.to_dict("records")):
        n = int(row["output_tokens"])
        due = T0 + int(row["scheduled_offset_ns"])
        sent = due + 60_000
        chunks = (sent + ttft + itl * np.arange(1 if one_chunk else n)).tolist()
        a = Attempt(
            request_id=row["request_id"], seq=int(row["seq"]), klass=row["class"],
            phase=row["phase"], block=int(row["block"]), input_tokens=int(row["input_tokens"]),
            output_tokens_expected=n, scheduled_offset_ns=int(row["scheduled_offset_ns"]),
            due_ns=due, sent_ns=sent, sent_realtime_ns=sent + 5 * T0,
            first_token_ns=chunks[0], last_token_ns=chunks[-1], end_ns=chunks[-1] + 50_000,
            end_realtime_ns=chunks[-1] + 50_000 + 5 * T0, chunk_ns=chunks,
            chunk_tokens=[n] if one_chunk else [1] * n, http_status=200, status="ok",
            finish_reason="length",
            prompt_tokens=int(row["input_tokens"]), completion_tokens=n, cached_tokens=0,
        )  # fmt: skip
        line = a.to_json(T0, 5 * T0)
        if shard is not None:
            line = line[:-1] + f',"shard":{int(shard[i])}}}'
        lines.append(line)
    if shard is not None:
        order = np.argsort(shard, kind="stable")  # the job writes shard 0's file, then 1's, ...
        lines = [lines[i] for i in order]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return len(text.encode())


def client_series(duration_s: float, shards: int) -> list[pd.DataFrame]:
    frames = []
    for k in range(shards):
        t = np.arange(int(duration_s) + 1) * NS + 1000 * k
        rows = []
        for metric in ("in_flight", "due_unsent", "finished", "streamed_tokens"):
            rows.append(
                pd.DataFrame(
                    {
                        "t_offset_ns": t,
                        "realtime_ns": t + 5 * T0,
                        "source": "client",
                        "metric": metric,
                        "value": 1.0,
                    }  # fmt: skip
                )
            )
        frames.append(pd.concat(rows, ignore_index=True))
    return frames


def timed(fn):
    # A collection left over from the previous step would be charged to this one.
    gc.collect()
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def one_size(n: int, rate: float, shards: list[int], work: Path) -> list[dict]:
    from capacity_pack.evidence.analysis import analyze_point
    from capacity_pack.evidence.gates import pack_gates
    from capacity_pack.evidence.normalize import normalize_point
    from capacity_pack.evidence.slo_report import pack_classes
    from capacity_pack.measure.shards import assign_shards, merge_series, merge_summaries
    from capacity_pack.plan import schedule as S

    pack = pack_for(rate, n)
    point = S.Point(mode="open", rate_rps=rate, cache_state="cold", repeat=0)
    sched, t_sched = timed(lambda: S.build_schedule(pack, point))
    sched_path = work / "schedule.parquet"
    sched.to_parquet(sched_path, index=False)
    inputs = S.ScheduleInputs.for_point(pack, point)
    duration_s = float(sched["scheduled_offset_ns"].max()) / NS
    rows = []
    for k in [1, *shards]:
        path = work / f"records-k{k}.jsonl"
        seed = 12345
        assign = assign_shards(sched, k, seed) if k > 1 else None
        nbytes = write_records(sched, path, assign)
        frames = client_series(duration_s, k)
        summary = {"extension_blocks": 0}
        merge_s = None
        if k > 1:
            per = [
                {
                    "shard": i,
                    "requests_recorded": int((assign == i).sum()),
                    "failed": 0,
                    "ok_by_class": {},
                    "terminal_by_class": {},
                    "streamed_tokens": 0,
                    "wall_s": duration_s,
                    "client_cpu_s": 1.0,
                    "mode": "open",
                    "concurrency": None,
                    "sent": 0,
                    "finished": 0,
                    "pid": 0,
                    "scheduled": int((assign == i).sum()),
                    "event_loop_lag_ms": {"p99": 0.1, "max": 1.0},
                    "dispatcher_scheduling": "other",
                    "client_bound": False,
                    "client_transport": "capacity_pack",
                    "clock": {
                        "host": "h",
                        "boot_id": "b",
                        "start": {"offset_ns": 0, "uncertainty_ns": 50},
                        "end": {"offset_ns": 0, "uncertainty_ns": 50},
                        "ntp": None,
                    },
                }  # fmt: skip
                for i in range(k)
            ]

            def merge(per=per, frames=frames, path=path, seed=seed):
                from capacity_pack.measure.records import records_frame

                merge_series(frames, 1.0)
                return merge_summaries(per, records_frame(path), 5.0, 1.0, seed)

            merged, merge_s = timed(merge)
            summary = {**merged, "extension_blocks": 0}
        metrics_path = work / "metrics.parquet"
        merge_series(frames, 1.0).to_parquet(metrics_path, index=False)
        tables, norm_s = timed(
            lambda path=path, summary=summary, metrics_path=metrics_path: normalize_point(
                path, sched_path, metrics_path, summary, inputs, point
            )
        )
        sizes = {}
        for key in ("requests", "chunks"):
            out = work / f"{key}.parquet"
            tables[key].to_parquet(out, index=False)
            sizes[key] = out.stat().st_size
        _, analyze_s = timed(
            lambda tables=tables, summary=summary: analyze_point(
                tables["requests"],
                tables["chunks"],
                tables["metrics"],
                {**summary, "client_bound": False},
                pack_classes(pack),
                pack_gates(pack),
            )  # fmt: skip
        )
        tokens = int(sched["output_tokens"].sum())
        row = {
            "requests": int(len(sched)),
            "shards": k,
            "duration_s": duration_s,
            "streamed_tokens": tokens,
            "schedule_s": t_sched,
            "records_bytes": nbytes,
            "records_bytes_per_request": nbytes / len(sched),
            "records_bytes_per_token": nbytes / tokens,
            "requests_parquet_bytes": sizes["requests"],
            "chunks_parquet_bytes": sizes["chunks"],
            "normalize_s": norm_s,
            "analyze_s": analyze_s,
            "merge_s": merge_s,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        rows.append(row)
        print(
            f"N={row['requests']:>7} K={k}: records {nbytes / 1e6:8.1f} MB "
            f"({row['records_bytes_per_request']:.0f} B/request), normalize {norm_s:6.2f} s, "
            f"analyze {analyze_s:6.2f} s"
            + (f", merge {merge_s:5.2f} s" if merge_s is not None else "")
            + f", tables {(sizes['requests'] + sizes['chunks']) / 1e6:.1f} MB, "
            f"peak RSS {row['peak_rss_mb']:.0f} MB",
            flush=True,
        )
        path.unlink()
    return rows


def _status_mb(field: str) -> float:
    """A /proc/self/status figure in MB. VmHWM (peak RSS) starts afresh at exec, unlike
    getrusage's ru_maxrss, which a child inherits from the process that forked it."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def normalize_child(work: Path, n: int, rate: float) -> None:
    """In a fresh process: normalize work/records.jsonl; print time and peak RSS as JSON."""
    from capacity_pack.evidence.normalize import normalize_point
    from capacity_pack.plan import schedule as S

    pack = pack_for(rate, n)
    point = S.Point(mode="open", rate_rps=rate, cache_state="cold", repeat=0)
    inputs = S.ScheduleInputs.for_point(pack, point)
    before = _status_mb("VmHWM")
    out, seconds = timed(
        lambda: normalize_point(
            work / "records.jsonl",
            work / "schedule.parquet",
            work / "metrics.parquet",
            {"extension_blocks": 0},
            inputs,
            point,
        )  # fmt: skip
    )
    peak = _status_mb("VmHWM")
    print(json.dumps({"normalize_s": seconds, "rss_before_mb": before, "peak_rss_mb": peak,
                      "rows": len(out["requests"])}))  # fmt: skip


def memory(n: int, rate: float, one_chunk: bool, work: Path) -> dict:
    """Normalization's peak memory for n requests, measured in a fresh process."""
    import subprocess

    from capacity_pack.measure.shards import merge_series
    from capacity_pack.plan import schedule as S

    pack = pack_for(rate, n)
    point = S.Point(mode="open", rate_rps=rate, cache_state="cold", repeat=0)
    sched = S.build_schedule(pack, point)
    sched.to_parquet(work / "schedule.parquet", index=False)
    nbytes = write_records(sched, work / "records.jsonl", None, one_chunk=one_chunk)
    duration_s = float(sched["scheduled_offset_ns"].max()) / NS
    merge_series(client_series(duration_s, 1), 1.0).to_parquet(work / "metrics.parquet")
    res = subprocess.run(
        [sys.executable, __file__, "--normalize-child", str(work), "--sizes", str(n),
         "--rate", str(rate)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    row = json.loads(res.stdout.strip().splitlines()[-1])
    row.update(requests=int(len(sched)), one_chunk=one_chunk, records_bytes=nbytes)
    per = (row["peak_rss_mb"] - row["rss_before_mb"]) * 1024 / row["requests"]
    print(
        f"memory N={row['requests']} {'one chunk' if one_chunk else 'a chunk per token'}: "
        f"normalize {row['normalize_s']:.2f} s, peak RSS {row['peak_rss_mb']:.0f} MB "
        f"({row['rss_before_mb']:.0f} MB before it; {per:.1f} KB per request)",
        flush=True,
    )
    (work / "records.jsonl").unlink()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,300000")
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--shards", default="4")
    ap.add_argument(
        "--memory-sizes",
        default="100000",
        help="Sizes whose normalization memory is measured in a fresh process, once with a "
        "chunk per token and once with one chunk per request ('' to skip).",
    )
    ap.add_argument("--normalize-child", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "workflow"))
    if args.normalize_child is not None:
        normalize_child(args.normalize_child, int(args.sizes), args.rate)
        return
    shards = [int(k) for k in args.shards.split(",") if k]
    rows, mem = [], []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        print("warm-up (imports, first calls; not reported):")
        one_size(1000, args.rate, shards, Path(tmp))
        for n in [int(s) for s in args.sizes.split(",") if s]:
            rows += one_size(n, args.rate, shards, Path(tmp))
        for n in [int(s) for s in args.memory_sizes.split(",") if s]:
            for one_chunk in (False, True):
                mem.append(memory(n, args.rate, one_chunk, Path(tmp)))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"cpus": os.cpu_count(), "rate_rps": args.rate, "rows": rows, "memory": mem},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
