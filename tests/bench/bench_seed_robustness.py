"""Benchmark: is the default pack's capacity the target's, or the luck of a schedule seed?

Run (from the repository root, in the project's virtualenv, nothing else on the host):

    python tests/bench/bench_seed_robustness.py [--seeds 20261129 20261207 20261213]
        [--workdir /tmp/seed-robustness] [--model-seeds 8] [--model-duration 300]
        [--skip-model] [--only-model]

Method. The default pack (``config/config.yaml``, all of it: searches, drills, report) is run
once per schedule seed (``client.request_schedule_seed``), each in a fresh working directory
with ``snakemake --cores 2``, one after the other, timed by the wall clock. Per run it prints
the cold and warm brackets [pass_rps, fail_rps) from ``pack/capacity.json``, the highest rate
shown to pass, the statuses of the bracket's ends, the pack's wall time and what shared the
host with its points (the points marked disturbed, the largest share of the host's CPUs other
processes used over a point, the simulated engine's largest step-lateness p99); then per cache
state the spread of the brackets' passing ends across the seeds.

The reference is the engine model's own long-run boundary, computed independently of the
search, the client and any server (:func:`capacity_pack.twin.boundary.model_boundary`: the
worst class's mean attainment over ``--model-seeds`` runs of ``--model-duration`` seconds of
Poisson arrivals in virtual time, bisected to 0.25 RPS). Its own noise: two sets of 8 x 300 s
(seeds 0-7 and 1000-1007) put the default pack's cold interactive attainment at 35 RPS at
0.9603 and 0.9495 (the attainment of long runs is itself correlated), so the model's boundary
is known to about half an RPS.

At each end of every bracket it also prints, per class, the pooled attainment the search
decided on, its interval and design effect, beside the engine model's attainment at that rate
(2 x 120 s in virtual time): whether the measured interval holds the model's truth. This was a
CI test (tests/e2e/test_default_pack_boundary.py) until it failed in CI on 2026-12-05: a 30-s
cold point at 35 RPS read interactive attainment with an interval from 0.980, where the model's
long-run attainment is 0.963 (a short window with fewer congestion bursts than the long run
reads high, and its blocks then show little of the correlation). One run's coverage of a
95 % interval is a statistic, not an invariant: it is measured here, over seeds.

Targets (issue 40): the runs' brackets within one resolution step (2 RPS) of each other, each
bracket containing or touching the model's boundary, each pack under 11 minutes on 2 cores.
The results are printed as a Markdown table for docs/performance.md and written as JSON to
``<workdir>/seed-robustness.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml
from pack_runs import bracket_row, read_capacity, run_snakemake

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "workflow"))

DEFAULT_SEEDS = (20261129, 20261207, 20261213)


def run_pack(seed: int, workdir: Path) -> dict:
    """The default pack with ``seed`` in ``workdir``; its brackets and wall time."""
    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    data["client"]["request_schedule_seed"] = seed
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "pack.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    rc, wall = run_snakemake(workdir, workdir / "pack.yaml", 2)
    out = {"seed": seed, "rc": rc, "wall_s": wall, "states": {}}
    results = workdir / "results" / data["pack"]["name"]
    out["host"] = host_facts(results)
    capacity = read_capacity(results)
    if rc != 0 or capacity is None:
        return out
    for state, sel in capacity["open_loop"].items():
        b = sel["bracket"]
        out["states"][state] = {
            **bracket_row(sel),
            "ends": bracket_evidence(results, state, (b["pass_rps"], b["fail_rps"])),
        }
    return out


def bracket_evidence(results: Path, state: str, rates) -> dict[str, dict]:
    """Per end of the bracket: its status and, per class, the pooled attainment, its interval
    and design effect (capacity_pack.decide.capacity.pooled_attainment: what the search
    decided on)."""
    from capacity_pack.artifacts.slo_report import SloReport
    from capacity_pack.decide.capacity import (
        deciding_reports,
        pooled_attainment,
        rate_status,
        void,
    )
    from capacity_pack.plan.schedule import Point

    out = {}
    for rate in rates:
        if rate is None:
            continue
        point = Point(mode="open", rate_rps=rate, cache_state=state, repeat=0).point_id
        reports = [
            SloReport.read(path)
            for path in sorted((results / "reports" / point / state).glob("rep*/slo-report.json"))
        ]
        deciding = deciding_reports(reports)
        entry = {"status": rate_status(deciding), "classes": {}}
        if deciding and not all(void(r) for r in deciding):
            for name, e in pooled_attainment(deciding).items():
                entry["classes"][name] = {
                    k: e[k] for k in ("attainment", "ci", "design_effect", "blocks", "successful")
                }
        out[f"{rate:g}"] = entry
    return out


def host_facts(results: Path) -> dict:
    """What shared the host with the run's points (capacity_pack.measure.host): the points
    marked disturbed, the largest share of the host's CPUs other processes used over a point,
    the largest simulated-engine step-lateness p99, and the placement."""
    docs = [json.loads(p.read_text()) for p in results.glob("raw/*/*/rep*/summary.json")]
    docs = [d for d in docs if d.get("host")]
    shares = [
        d["host"]["other_cpu_share"] for d in docs if d["host"].get("other_cpu_share") is not None
    ]
    steps = [(d.get("engine_step_lateness") or {}).get("p99_ms") for d in docs]
    return {
        "points": len(docs),
        "disturbed": sorted(d["key"] for d in docs if d.get("disturbed")),
        "other_cpu_share_max": max(shares, default=None),
        "step_lateness_p99_ms_max": max((s for s in steps if s is not None), default=None),
        "placement": sorted({d["host"]["placement"]["detail"] for d in docs}),
    }


def model(states: list[str], seeds: int, duration: float) -> dict[str, dict]:
    from capacity_pack.plan.manifest import validate_pack
    from capacity_pack.twin.boundary import model_boundary

    pack = validate_pack(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()), "pack")
    out = {}
    for state in states:
        t = time.process_time()
        b = model_boundary(pack, state, duration_s=duration, seeds=tuple(range(seeds)))
        out[state] = b.to_dict() | {"cpu_s": time.process_time() - t}
        print(f"model {state}: [{b.meets_rps:g}, {b.misses_rps:g}) RPS", flush=True)
    return out


#: The engine model's attainment at a bracket end: 2 x 120 s in virtual time (its own noise
#: about a point of attainment, :data:`MODEL_NOISE`), as the retired CI check did.
MODEL_S, MODEL_SEEDS, MODEL_NOISE = 120.0, (0, 1), 0.01


def interval_coverage(runs: list[dict]) -> list[dict]:
    """Whether each bracket end's measured interval (widened by :data:`MODEL_NOISE`) holds the
    engine model's long-run attainment at that rate, per class: a 95 % interval that respects
    the outcomes' correlation should miss about one time in twenty (more often at a short
    point whose window saw fewer congestion bursts than the long run)."""
    from capacity_pack.plan.manifest import validate_pack
    from capacity_pack.sim.profile import load_profile
    from capacity_pack.sim.virtual import attainment_at
    from capacity_pack.twin.boundary import shared_prefixes, virtual_classes

    pack = validate_pack(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()), "pack")
    profile = load_profile(pack.target.profile)
    truth: dict[tuple[str, str], dict] = {}
    rows = []
    for run in runs:
        for state, sel in run["states"].items():
            for rate, end in sel.get("ends", {}).items():
                key = (state, rate)
                if key not in truth:
                    truth[key] = attainment_at(
                        profile, virtual_classes(pack), float(rate), MODEL_S, MODEL_SEEDS,
                        prefixes=shared_prefixes(pack, state),
                    )  # fmt: skip
                for name, e in end["classes"].items():
                    low, high = e["ci"]
                    model = truth[key][name]
                    rows.append({
                        "seed": run["seed"], "state": state, "rate": rate,
                        "status": end["status"], "class": name, "measured": e["attainment"],
                        "ci": e["ci"], "design_effect": e["design_effect"], "model": model,
                        "covered": low - MODEL_NOISE <= model <= high + MODEL_NOISE,
                    })  # fmt: skip
    return rows


def touches(state: dict, boundary: dict) -> bool | None:
    """Whether [pass_rps, fail_rps] meets the model's [meets_rps, misses_rps]."""
    if state.get("pass_rps") is None or state.get("fail_rps") is None:
        return None
    return (
        state["pass_rps"] <= boundary["misses_rps"] and boundary["meets_rps"] <= state["fail_rps"]
    )


def bracket_cell(run: dict, state: str, boundaries: dict) -> str:
    e = run["states"].get(state) or {}
    if e.get("pass_rps") is None:
        return "none"
    ok = touches(e, boundaries[state]) if state in boundaries else None
    mark = "" if ok is None else (" (touches the model)" if ok else " (misses the model)")
    return f"[{e['pass_rps']:g}, {e['fail_rps']:g}){mark}"


def shown_cell(run: dict, state: str) -> str:
    v = (run["states"].get(state) or {}).get("shown_to_pass_rps")
    return "-" if v is None else f"{v:g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS))
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/seed-robustness"))
    ap.add_argument("--model-seeds", type=int, default=8)
    ap.add_argument("--model-duration", type=float, default=300.0)
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--only-model", action="store_true")
    args = ap.parse_args()
    runs = []
    if not args.only_model:
        for seed in args.seeds:
            print(f"seed {seed}: running the default pack", flush=True)
            run = run_pack(seed, args.workdir / f"seed-{seed}")
            runs.append(run)
            print(json.dumps(run), flush=True)
    boundaries = {} if args.skip_model else model(["cold", "warm"], args.model_seeds,
                                                   args.model_duration)  # fmt: skip
    print(
        "\n| seed | wall | cold bracket | warm bracket | cold shown to pass | warm shown "
        "| disturbed points | other CPU, max share | step lateness p99, max |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for r in runs:
        wall = f"{int(r['wall_s'] // 60)} min {int(r['wall_s'] % 60)} s"
        cells = [bracket_cell(r, s, boundaries) for s in ("cold", "warm")]
        cells += [shown_cell(r, s) for s in ("cold", "warm")]
        h = r.get("host") or {}
        share, late = h.get("other_cpu_share_max"), h.get("step_lateness_p99_ms_max")
        cells += [
            f"{len(h['disturbed'])} of {h['points']}" if h.get("points") else "-",
            "-" if share is None else f"{share:.1%}",
            "-" if late is None else f"<= {late:g} ms",
        ]
        print(f"| {r['seed']} | {wall} | " + " | ".join(cells) + " |")
    for state in ("cold", "warm"):
        ends = [r["states"][state]["pass_rps"] for r in runs if state in r["states"]]
        ends = [e for e in ends if e is not None]
        if ends:
            print(f"{state}: passing ends {ends}, spread {max(ends) - min(ends):g} RPS")
        if state in boundaries:
            b = boundaries[state]
            runs_s = f"{args.model_seeds} x {args.model_duration:g} s"
            print(f"{state}: model boundary [{b['meets_rps']:g}, {b['misses_rps']:g}) RPS "
                  f"({runs_s}, {b['cpu_s']:.0f} s CPU)")  # fmt: skip
    coverage = [] if args.skip_model else interval_coverage(runs)
    if coverage:
        print("\n| seed | state | rate | status | class | measured | interval | deff | model |")
        print("|---:|---|---:|---|---|---:|---|---:|---:|")
        for c in coverage:
            mark = "" if c["covered"] else " (outside)"
            print(
                f"| {c['seed']} | {c['state']} | {c['rate']} | {c['status']} | {c['class']} | "
                f"{c['measured']:.3f} | [{c['ci'][0]:.3f}, {c['ci'][1]:.3f}] | "
                f"{c['design_effect']:.1f} | {c['model']:.3f}{mark} |"
            )
        missed = sum(not c["covered"] for c in coverage)
        held = len(coverage) - missed
        print(f"intervals holding the model's attainment: {held} of {len(coverage)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    (args.workdir / "seed-robustness.json").write_text(
        json.dumps({"runs": runs, "model": boundaries, "coverage": coverage}, indent=1)
    )


if __name__ == "__main__":
    main()
