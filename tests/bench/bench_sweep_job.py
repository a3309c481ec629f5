"""Benchmark: where one sweep job's time goes besides its load.

Run (from the repository root, in the project's virtualenv, on a quiet machine):

    python tests/bench/bench_sweep_job.py --point open-r50 --cache-state cold
    python tests/bench/bench_sweep_job.py --point open-r30 --max-duration 40 --sample-gate 5000

Method. One point of the default pack (``config/config.yaml``; ``--max-duration`` and
``--sample-gate`` override ``client.maximum_duration_seconds`` and
``acceptance.min_successful_samples_per_class``, so a point can be made to run to its maximum
duration and append every extension block) goes through the sweep stage's own entry
(:func:`capacity_pack.stages.sweep.run`, what the Snakemake job runs) in this process,
against the simulated engine it starts. Printed: the imports of the stage (s), the stage's
run (s), the load's wall time from the summary (``wall_s``: the clock's start to the last
request's end), their difference (what the job spends around its load: engine start and stop,
requests and extension blocks built before the clock, records and summary written), the
extension blocks appended and built (before the clock / by the worker thread during the run),
dispatch lateness p50 / p99 / max and event-loop lag p99 (ms). ``--profile FILE`` also writes
a cProfile of the whole run. A Snakemake job adds its interpreter's start and Snakemake's
preamble (about 0.2 s) to these figures.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--point", default="open-r50")
    ap.add_argument("--cache-state", default="cold", choices=["cold", "warm"])
    ap.add_argument("--max-duration", type=float, default=None)
    ap.add_argument("--sample-gate", type=int, default=None)
    ap.add_argument("--profile", default=None, help="write a cProfile of the run here")
    ap.add_argument("--json", default=None, help="write the figures here too")
    args = ap.parse_args()

    t0 = time.perf_counter()
    from capacity_pack.stages.sweep import run

    imports_s = time.perf_counter() - t0
    import yaml

    from capacity_pack.measure.inputs import SweepInputs
    from capacity_pack.plan.manifest import validate_pack
    from capacity_pack.plan.schedule import Point, ScheduleInputs, build_schedule

    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    if args.max_duration is not None:
        data["client"]["maximum_duration_seconds"] = args.max_duration
    if args.sample_gate is not None:
        data["acceptance"]["min_successful_samples_per_class"] = args.sample_gate
    pack = validate_pack(data, "config/config.yaml")
    point = Point.parse(args.point, args.cache_state, 0)
    inputs = SweepInputs.for_point(pack, point)
    schedule = build_schedule(ScheduleInputs.for_point(pack, point), point)
    with tempfile.TemporaryDirectory() as tmp:
        profiler = cProfile.Profile() if args.profile else None
        t1 = time.perf_counter()
        if profiler:
            profiler.enable()
        doc = run(
            inputs=inputs.canonical_json(), point=point.point_id, cache_state=point.cache_state,
            repeat=0, schedule=schedule, records=f"{tmp}/records.jsonl",
            summary=f"{tmp}/summary.json", log=logging.getLogger("bench"),
        )  # fmt: skip
        if profiler:
            profiler.disable()
            profiler.dump_stats(args.profile)
        run_s = time.perf_counter() - t1
    late, lag = doc["dispatch_lateness_ms"], doc["event_loop_lag_ms"]
    out = {
        "point": point.key,
        "imports_s": round(imports_s, 3),
        "run_s": round(run_s, 3),
        "load_wall_s": round(doc["wall_s"], 3),
        "around_load_s": round(run_s - doc["wall_s"], 3),
        "sent": doc["sent"],
        "extension_blocks": doc["extension_blocks"],
        "extension_blocks_built": doc.get("extension_blocks_built"),
        "decision": (doc.get("sequential") or {}).get("decision"),
        "lateness_ms": {k: round(v, 3) for k, v in late.items() if v is not None},
        "loop_lag_p99_ms": round(lag["p99"], 3) if lag["p99"] is not None else None,
        "client_bound": doc["client_bound"],
    }
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
