"""Benchmark: a drill's alert rules run by promtool (capacity_pack.drills.prometheus).

Run (from the repository root, promtool on PATH):

    python tests/bench/bench_alert_rules.py results/rehearsal-sim/failure/replica_kill \\
        --rules results/rehearsal-sim/pack/alerts/alert-rules.yaml [--stretch 4] [--repeat 5]

Method. Each drill directory's ``samples.parquet`` and ``scrapes.parquet`` (as the drill wrote
them) go through :func:`~capacity_pack.drills.prometheus.evaluate_alert_rules` with the rule
file, ``--repeat`` times; printed per drill: series, successful scrapes, samples, the drill's
length, the grid step, the median wall time of the whole call and of promtool alone (the
subprocess), and promtool's CPU (user + system of the children, ``resource.getrusage``).
``--stretch k`` lays k copies of the drill end to end on its clock (each shifted by the drill's
length plus one scrape interval) to time longer drills on real series.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "workflow"))


def stretched(samples, scrapes, k: int):
    """k copies of the drill end to end on its clock."""
    import pandas as pd

    t = scrapes["t_ns"]
    shift = int(t.max() - t.min() + t.diff().median())
    return (
        pd.concat([samples.assign(t_ns=samples["t_ns"] + i * shift) for i in range(k)]),
        pd.concat([scrapes.assign(t_ns=t + i * shift) for i in range(k)]),
    )


def main() -> None:
    import pandas as pd

    from capacity_pack.drills import prometheus

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drills", nargs="+", type=Path, help="drill directories")
    ap.add_argument("--rules", type=Path, required=True, help="the pack's alert-rules.yaml")
    ap.add_argument("--stretch", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    # promtool's share: its subprocess timed around the library's own call to it.
    promtool_s: list[float] = []
    run = prometheus.run_promtool

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return run(*a, **kw)
        finally:
            promtool_s.append(time.perf_counter() - t0)

    prometheus.run_promtool = timed
    print("drill  series  scrapes  samples  length_s  grid_s  wall_s  promtool_s  promtool_cpu_s")
    for d in args.drills:
        samples, scrapes = stretched(
            pd.read_parquet(d / "samples.parquet"),
            pd.read_parquet(d / "scrapes.parquet"),
            args.stretch,
        )
        ok = scrapes[scrapes["ok"]]
        walls, cpus = [], []
        promtool_s.clear()
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            ev = prometheus.evaluate_alert_rules(args.rules, samples, scrapes)
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        assert ev.evaluated, ev.note
        grid = prometheus.grid_step_ms(sorted(ok["t_ns"].unique())) / 1000
        print(
            f"{d.name}  {samples.groupby(['metric', 'labels']).ngroups}  {len(ok)}  "
            f"{len(samples)}  {(ok['t_ns'].max() - ok['t_ns'].min()) / 1e9:.1f}  {grid:g}  "
            f"{statistics.median(walls):.3f}  {statistics.median(promtool_s):.3f}  "
            f"{statistics.median(cpus):.3f}"
        )


if __name__ == "__main__":
    main()
