"""Benchmark: one client process against two shards of the same point.

Run (from the repository root, in the project's virtualenv; part 2 needs Debian's nginx:
``apt-get install nginx-light``):

    python tests/bench/bench_shards.py --json bench-shards.json

Not collected by pytest (``tests/bench`` is excluded). Results and conditions are recorded in
docs/scaling.md ("Sharded load generation").

Part 1, consistency at a rate one process holds. The default pack (config/config.yaml, the
embedded ``small-fast`` simulator, a fresh one per run, cold) at ``--hold-rps`` (default 30, the
pack's capacity point) for ``--hold-s`` seconds after a 1 s warm-up, through
:func:`capacity_pack.measure.sweep.measure_point` exactly as the sweep runs it, once with
``client.shards: 1`` and once with 2; both normalized (``normalize_point``, which checks the
2-shard merge). Reported: whether both sent the same request population (same IDs), per class
the TTFT/TPOT/E2E medians and p90s of each and the two-sample Kolmogorov-Smirnov p-value
(scipy) of 1 vs 2 shards, and each run's |client - server| TTFT error against the simulator's
ground truth.

Part 2, a rate one process cannot hold. The target is nginx answering every completion with
the same 16-token event stream from memory (``return 200``): its cost per request is a few
microseconds of C, so the client, not the server, is what runs out of CPU on a 2-core machine.
Every request of the pack's Poisson schedule asks for 16 tokens. For each rate of ``--rates``
and for 1 and 2 shards: dispatch lateness p50/p99/max over all requests, per shard lateness
p99 and client CPU (cores), failures and the client-bound label (lateness p99 above the pack's
``client.lateness_bound_ms``, 5 ms).

Before each run the script waits (up to ``--quiet-wait-s``) for the machine to be idle and
reports the other load it saw.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from tests.paths import ROOT

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loadgen import machine_busy_cpu_s, wait_for_quiet  # noqa: E402

STATIC_TOKENS = 16


LAUNCHER: list[str] = []


def pack_for(measure_s: float, shards: int):
    from capacity_pack.plan.manifest import validate_pack

    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    data["client"].update(
        initial_scheduled_requests=1,
        warmup_seconds=1.0,
        minimum_duration_seconds=measure_s,
        shards=shards,
        shard_launcher=LAUNCHER,
    )
    data["client"].pop("class_schedule_counts", None)
    return validate_pack(data)


# -- part 1 -------------------------------------------------------------------------------------


def consistency(rate: float, measure_s: float, work: Path) -> dict:
    from scipy.stats import ks_2samp

    from capacity_pack.evidence.normalize import normalize_point
    from capacity_pack.measure.sweep import measure_point, measurement_error
    from capacity_pack.plan import schedule as S

    runs = {}
    for k in (1, 2):
        pack = pack_for(measure_s, k)
        point = S.Point(mode="open", rate_rps=rate, cache_state="cold", repeat=0)
        out = work / f"hold-k{k}"
        out.mkdir()
        sched = S.build_schedule(pack, point)
        sched.to_parquet(out / "schedule.parquet", index=False)
        busy = wait_for_quiet(QUIET_WAIT_S)
        summary = measure_point(pack, point, sched, out)
        time.sleep(0.3)
        tables = normalize_point(
            out / "records.jsonl",
            out / "schedule.parquet",
            out / "metrics.parquet",
            summary,
            S.ScheduleInputs.for_point(pack, point),
            point,
        )
        req = tables["requests"]
        runs[k] = {
            "requests": req[req["phase"].isin(["measure", "extension"])],
            "summary": summary,
            "other_load_before_cores": busy,
            "error": measurement_error(out / "records.jsonl", out / "ground_truth.jsonl"),
            "merge": tables["reconciliation"].get("shards"),
        }
    a, b = runs[1]["requests"], runs[2]["requests"]
    classes = {}
    for klass in sorted(a["class"].unique()):
        x = a[(a["class"] == klass) & (a["status"] == "ok")]
        y = b[(b["class"] == klass) & (b["status"] == "ok")]
        entry = {"n": [len(x), len(y)]}
        for col in ("ttft_ms", "tpot_ms", "e2e_ms"):
            entry[col] = {
                "median": [float(x[col].median()), float(y[col].median())],
                "p90": [float(x[col].quantile(0.9)), float(y[col].quantile(0.9))],
                "ks_pvalue": float(ks_2samp(x[col], y[col]).pvalue),
            }
        classes[klass] = entry
    return {
        "rate_rps": rate,
        "measure_s": measure_s,
        "same_population": set(a["request_id"]) == set(b["request_id"]),
        "requests": [len(a), len(b)],
        "failed": [int((a["status"] != "ok").sum()), int((b["status"] != "ok").sum())],
        "lateness_ms": [runs[k]["summary"]["dispatch_lateness_ms"] for k in (1, 2)],
        "shard_clock_valid": runs[2]["summary"]["shard_clock_valid"],
        "merge": runs[2]["merge"],
        "ttft_abs_error_ms": [runs[k]["error"].get("ttft_abs_error_ms") for k in (1, 2)],
        "other_load_before_cores": [runs[k]["other_load_before_cores"] for k in (1, 2)],
        "classes": classes,
    }


# -- part 2 -------------------------------------------------------------------------------------


def static_body() -> str:
    events = []
    for i in range(STATIC_TOKENS):
        chunk = {
            "id": "cmpl-static",
            "object": "text_completion",
            "created": 0,
            "model": "static",
            "choices": [
                {
                    "index": 0,
                    "text": " tok",
                    "finish_reason": "length" if i == STATIC_TOKENS - 1 else None,
                }
            ],
        }
        events.append("data: " + json.dumps(chunk, separators=(",", ":")) + "\n\n")
    return "".join(events) + "data: [DONE]\n\n"


def start_nginx(work: Path, port: int) -> subprocess.Popen:
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(exe).exists():
        raise SystemExit("part 2 needs nginx: apt-get install nginx-light (or pass --no-static)")
    d = work / "nginx"
    d.mkdir()
    user = "user root;" if os.geteuid() == 0 else ""
    (d / "nginx.conf").write_text(
        f"""worker_processes 1;
daemon off;
{user}
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  keepalive_requests 100000000;
  keepalive_timeout 60s;
  server {{
    listen 127.0.0.1:{port};
    location /v1/completions {{ default_type text/event-stream; return 200 '{static_body()}'; }}
    location /metrics {{ default_type text/plain; return 200 ''; }}
  }}
}}
"""
    )
    proc = subprocess.Popen([exe, "-c", str(d / "nginx.conf")])
    import httpx

    for _ in range(100):
        try:
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=0.5)
            return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"nginx did not answer on 127.0.0.1:{port}; see {d}/error.log")


def static_run(rate: float, k: int, measure_s: float, base_url: str, work: Path) -> dict:
    from capacity_pack.measure.inputs import SweepInputs, load_settings
    from capacity_pack.measure.records import read_records
    from capacity_pack.measure.run import run_point
    from capacity_pack.measure.sweep import run_sharded
    from capacity_pack.plan import schedule as S

    pack = pack_for(measure_s, k)
    point = S.Point(mode="open", rate_rps=rate, cache_state="cold", repeat=0)
    sched = S.build_schedule(pack, point)
    sched["output_tokens"] = STATIC_TOKENS
    inputs = SweepInputs.for_point(pack, point)
    out = work / f"static-r{rate:g}-k{k}"
    out.mkdir()
    busy = wait_for_quiet(QUIET_WAIT_S)
    b0, t0 = machine_busy_cpu_s(), time.monotonic()
    if k == 1:
        settings = load_settings(inputs, point, base_url, progress=False)
        summary = run_point(sched, settings, out / "records.jsonl")
        per_shard = [
            {
                "dispatch_lateness_ms": summary["dispatch_lateness_ms"],
                "client_cpu_s": summary["client_cpu_s"],
            }
        ]
    else:
        summary = run_sharded(inputs, point, sched, sched.iloc[0:0], base_url, out)
        per_shard = summary["shards"]["per_shard"]
    wall = time.monotonic() - t0
    machine = (machine_busy_cpu_s() - b0) / wall
    recs = pd.DataFrame(read_records(out / "records.jsonl"))
    return {
        "rate_rps": rate,
        "shards": k,
        "requests": int(len(recs)),
        "scheduled": int(len(sched)),
        "failed": int((recs["status"] != "ok").sum()),
        "lateness_ms": summary["dispatch_lateness_ms"],
        "client_bound": summary["client_bound"],
        "per_shard_lateness_p99_ms": [p["dispatch_lateness_ms"]["p99"] for p in per_shard],
        "per_shard_client_cpu_cores": [p["client_cpu_s"] / summary["wall_s"] for p in per_shard],
        "machine_busy_cores": machine,
        "other_load_before_cores": busy,
        "clock_valid": summary.get("shard_clock_valid"),
    }


QUIET_WAIT_S = 20.0


def main() -> None:
    global QUIET_WAIT_S
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hold-rps", type=float, default=30.0)
    ap.add_argument("--hold-s", type=float, default=20.0)
    ap.add_argument("--rates", default="1000,2000,3000,4000,5000")
    ap.add_argument("--static-s", type=float, default=6.0)
    ap.add_argument("--port", type=int, default=18080)
    ap.add_argument("--no-hold", action="store_true", help="Skip part 1.")
    ap.add_argument("--no-static", action="store_true", help="Skip part 2.")
    ap.add_argument("--quiet-wait-s", type=float, default=20.0)
    ap.add_argument(
        "--launcher",
        default="",
        help="client.shard_launcher for the 2-shard runs, space-separated, e.g. "
        "'taskset -c {shard}' (one CPU per shard)",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    QUIET_WAIT_S = args.quiet_wait_s
    LAUNCHER[:] = args.launcher.split()
    result: dict = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
        work = Path(tmp)
        if not args.no_hold:
            c = consistency(args.hold_rps, args.hold_s, work)
            result["consistency"] = c
            print(
                f"hold {c['rate_rps']:g} RPS: same population {c['same_population']}, "
                f"requests {c['requests']}, failed {c['failed']}, clock valid "
                f"{c['shard_clock_valid']}"
            )
            for klass, e in c["classes"].items():
                print(
                    f"  {klass:18s} n={e['n']}  "
                    + "  ".join(
                        f"{m} med {e[m]['median'][0]:.1f}/{e[m]['median'][1]:.1f} "
                        f"p90 {e[m]['p90'][0]:.1f}/{e[m]['p90'][1]:.1f} "
                        f"KS p={e[m]['ks_pvalue']:.2f}"
                        for m in ("ttft_ms", "tpot_ms", "e2e_ms")
                    )
                )
        if not args.no_static:
            nginx = start_nginx(work, args.port)
            rows = []
            try:
                for rate in [float(r) for r in args.rates.split(",")]:
                    for k in (1, 2):
                        r = static_run(
                            rate, k, args.static_s, f"http://127.0.0.1:{args.port}", work
                        )
                        rows.append(r)
                        late = r["lateness_ms"]
                        print(
                            f"static {rate:6g} RPS  shards {k}: lateness p50/p99/max "
                            f"{late['p50']:.3f}/{late['p99']:.3f}/{late['max']:.1f} ms, per "
                            f"shard p99 {np.round(r['per_shard_lateness_p99_ms'], 3).tolist()}"
                            f", client cores "
                            f"{np.round(r['per_shard_client_cpu_cores'], 2).tolist()}, "
                            f"failed {r['failed']}/{r['requests']}, client-bound "
                            f"{r['client_bound']}, machine {r['machine_busy_cores']:.2f} cores"
                        )
            finally:
                nginx.terminate()
                nginx.wait(timeout=10)
            result["static"] = rows
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=float))


if __name__ == "__main__":
    main()
