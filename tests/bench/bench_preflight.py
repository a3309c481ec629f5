"""Benchmark: CPU, wall time and memory of the preflight prediction, per point and per pack.

Run (from the repository root, in the project's virtualenv):

    python tests/bench/bench_preflight.py [--rates 0.2,0.5,2,16] [--cap 1000] [--packs ...]

Method. For each rate of ``--rates``, one cold open-loop point of the tutorial pack
(``config/packs/tutorial-70b.yaml``: profile ``llama-3.1-70b-tp2-h100``, 4 replicas, the
pack's 22,000-request schedule capped at its first ``--cap`` measured requests) is predicted by
:func:`capacity_pack.twin.virtual_point.predict_point`: printed are its status, the simulated
measured requests, the virtual seconds it covers and the process CPU seconds
(``time.process_time``: this process only; a prediction starts no process). Then, for each
pack of ``--packs``, the lint's prediction (:func:`capacity_pack.twin.preflight.lint_warnings`:
every planned point, the search only where a finding needs it) is timed: wall and CPU seconds.
The peak resident set size of the whole run (``resource.getrusage``) and the other load on the
machine (the 1-minute load average minus this process's share, sampled before and after) are
printed last: the machine may be shared, so compare runs taken under similar other load.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "workflow"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="0.2,0.5,2,16", help="tutorial-pack rates, comma-separated")
    ap.add_argument("--cap", type=int, default=1000, help="measured requests per point")
    ap.add_argument(
        "--packs",
        default="config/config.yaml,config/packs/tutorial-70b.yaml",
        help="packs whose lint prediction is timed, comma-separated ('' for none)",
    )
    args = ap.parse_args()
    from capacity_pack.plan.manifest import load_pack
    from capacity_pack.sim.profile import load_profile
    from capacity_pack.twin.preflight import lint_warnings
    from capacity_pack.twin.virtual_point import predict_point

    load0 = os.getloadavg()[0]
    tutorial = load_pack(ROOT / "config" / "packs" / "tutorial-70b.yaml")
    profile = load_profile(tutorial.target.profile)
    print("rate_rps  status        simulated  virtual_s  cpu_s")
    for rate in (float(r) for r in args.rates.split(",") if r):
        p = predict_point(tutorial, rate, "cold", profile, max_requests=args.cap)
        print(
            f"{rate:8g}  {p.status:12s}  {p.simulated_requests:9d}  {p.virtual_s:9.0f}  "
            f"{p.cpu_s:5.1f}"
        )
    for pack in (x for x in args.packs.split(",") if x):
        w0, c0 = time.perf_counter(), time.process_time()
        lines = lint_warnings(load_pack(ROOT / pack))
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        print(f"lint prediction of {pack}: {wall:.1f} s wall, {cpu:.1f} s CPU")
        for line in lines:
            print(f"    {line}")
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    load1 = os.getloadavg()[0]
    print(f"peak RSS {rss_gb:.2f} GB; 1-min load average {load0:.2f} before, {load1:.2f} after")
    print("other load: the load average less this process's ~1 core while it ran")


if __name__ == "__main__":
    main()
