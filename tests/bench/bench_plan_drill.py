"""Benchmark: CPU of a plan drill in virtual time, by fleet size.

Run (from the repository root, in the project's virtualenv):

    python tests/bench/bench_plan_drill.py [--sizes 4:60,16:100,32:200]

Method. For each ``replicas:rate`` the default pack's plan drill is planned from a hand-made
capacity decision (30 RPS per replica) and a plan of exactly that many replicas at that peak,
run in virtual time (:mod:`capacity_pack.drills.virtual`: the schedule, the fleet, the records,
scrapes and events written) and analysed (:func:`capacity_pack.drills.analyze.analyze_drill`,
the alert rules evaluated by ``promtool test rules``). Printed per size: requests, engine
steps, the simulated seconds, and the CPU seconds of the run and of the analysis (this
process's and its finished children's, ``os.times``: the analysis runs promtool as a child; a
virtual drill starts none). The goal: a 16-replica, 100 RPS plan under a minute of CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "workflow"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4:60,16:100,32:200", help="replicas:rps, comma-separated")
    ap.add_argument("--config", default=str(ROOT / "config" / "config.yaml"))
    args = ap.parse_args()
    from capacity_pack.drills.alerts import write_alert_rules
    from capacity_pack.drills.analyze import DrillAnalysisSpec, analyze_drill
    from capacity_pack.drills.plan import DrillInputs, DrillNumbers, plan_drill
    from capacity_pack.drills.run import run_drill
    from capacity_pack.plan.manifest import PLAN_DRILL, load_pack

    base = load_pack(args.config)
    print("replicas  rps  requests  steps  simulated_s  run_cpu_s  analysis_cpu_s  verdict")
    for size in args.sizes.split(","):
        n, rate = (float(x) for x in size.split(":"))
        failure = base.failure.model_copy(
            update={"plan_drill": base.failure.plan_drill.model_copy(update={"mode": "virtual"})}
        )
        pack = base.model_copy(
            update={
                "plan": base.plan.model_copy(update={"peak_rps": rate}),
                "failure": failure.model_copy(update={"admission_max_outstanding": 51}),
            }
        )
        inputs = DrillInputs.for_drill(pack, PLAN_DRILL)
        sel = {"capacity_per_replica_rps": 30.0, "capacity_rps": 30.0}
        cap = {"primary_cache_state": "cold", "open_loop": {"cold": sel}}
        plan = plan_drill(inputs, DrillNumbers.of(inputs, cap, {}, {"required_replicas": int(n)}))
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            c0 = cpu_s()
            facts = run_drill(inputs, plan, out)
            c1 = cpu_s()
            write_alert_rules(pack, out / "rules.yaml")
            report = analyze_drill(out, out / "rules.yaml", DrillAnalysisSpec.of(pack))
            c2 = cpu_s()
        load = facts["load"]
        print(
            f"{int(n):8d} {rate:4g} {load['requests']:9d} {load['engine_steps']:6d} "
            f"{load['virtual_s']:12.1f} {c1 - c0:10.2f} {c2 - c1:15.2f}  "
            f"{report['n_plus_one']['verdict']}"
        )
        json.dumps(report, default=str)  # the report serialises as the stage writes it


def cpu_s() -> float:
    """CPU seconds of this process and of its children that have finished."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


if __name__ == "__main__":
    main()
