"""Benchmark: does the real-engine pack give the same answer with one job at a time and with two?

Run (from the repository root, in the project's virtualenv with the real-engine tier installed:
``bash scripts/install-real-engine.sh``; nothing else on the host):

    python tests/bench/bench_real_engine_cores.py [--cores 1 2] [--workdir /tmp/real-cores]

Method. The shipped real-engine pack (``config/packs/llamacpp-smollm2.yaml``, all of it:
closed loop, searches, twin, drills, report) is run once per ``--cores`` value, each in a fresh
working directory with ``snakemake --cores N``, one after the other, timed by the wall clock.
Both runs use the pack's one schedule seed, so what differs between them is the pipeline's
parallelism (with ``--cores 2`` the analysis jobs run two at a time; a measuring job takes the
host's target lock whole either way) and the host's own noise, not the schedules.

Per run and cache state it prints the bracket [pass_rps, fail_rps), its resolution and its
ends' statuses, the capacity's ratio warm / cold (passing ends) and the range the two brackets
allow (warm pass / cold fail to warm fail / cold pass), the measurement faults the pack flagged
and its notes (a warm floor the brackets cannot settle), the
smallest open-loop point (requests measured and seconds of measured window: the pack asks for at
least 100 requests over at least 60 s), the points marked disturbed, and the twin's capacity
error against the measured bracket (docs/twin.md). Then per cache state whether the two runs
agree within max(one resolution step, 15 %) of the larger passing rate.

Targets (issue 40, point 6): every capacity point >= 100 requests over >= 60 s; the runs'
brackets within max(one resolution step, 15 %); warm no lower than 0.8 x cold in each run. The
results are printed as a Markdown table for docs/performance.md and written as JSON to
``<workdir>/real-engine-cores.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from pack_runs import bracket_row, read_capacity, run_snakemake

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "config" / "packs" / "llamacpp-smollm2.yaml"


def run_pack(cores: int, workdir: Path) -> dict:
    """The shipped real-engine pack with ``--cores cores`` in ``workdir``: what it decided."""
    name = yaml.safe_load(PACK.read_text())["pack"]["name"]
    rc, wall = run_snakemake(workdir, PACK, cores)
    out: dict = {"cores": cores, "rc": rc, "wall_s": wall, "states": {}}
    results = workdir / "results" / name
    capacity = read_capacity(results)
    if rc != 0 or capacity is None:
        return out
    for state, sel in capacity["open_loop"].items():
        out["states"][state] = bracket_row(sel)
    out["faults"] = [f["message"] for f in capacity.get("measurement_faults") or []]
    out["notes"] = [n["message"] for n in capacity.get("measurement_notes") or []]
    out["points"] = point_sizes(results)
    validation = results / "pack" / "twin-validation.json"
    if validation.exists():
        out["twin_error_rel"] = {
            s["cache_state"]: s.get("capacity_error_rel")
            for s in json.loads(validation.read_text())["states"]
        }
    return out


def point_sizes(results: Path) -> dict:
    """The open-loop points' smallest measured sample and window, and the disturbed ones."""
    docs = [json.loads(p.read_text()) for p in results.glob("raw/open-*/*/rep*/summary.json")]
    sizes = [(d.get("requests_recorded") or 0, d.get("wall_s") or 0.0) for d in docs]
    return {
        "n": len(docs),
        "min_requests": min((n for n, _ in sizes), default=None),
        "min_wall_s": min((w for _, w in sizes), default=None),
        "disturbed": sorted(f"{d['point']}/{d['cache_state']}" for d in docs if d.get("disturbed")),
    }


def agree(a: dict, b: dict) -> dict:
    """Per cache state: the passing ends' gap, the allowance max(step, 15 %), and the verdict."""
    out = {}
    for state in sorted(set(a["states"]) & set(b["states"])):
        x, y = a["states"][state], b["states"][state]
        if x["pass_rps"] is None or y["pass_rps"] is None:
            out[state] = {"agree": False, "why": "no passing rate"}
            continue
        step = max(x.get("resolution_rps") or 0.0, y.get("resolution_rps") or 0.0)
        allowance = max(step, 0.15 * max(x["pass_rps"], y["pass_rps"]))
        gap = abs(x["pass_rps"] - y["pass_rps"])
        out[state] = {"gap_rps": gap, "allowance_rps": allowance, "agree": gap <= allowance + 1e-9}
    return out


def markdown(runs: list[dict]) -> str:
    lines = [
        "| --cores | wall | cold | warm | warm / cold (brackets allow) | smallest point "
        "| disturbed | faults / notes | twin error cold / warm |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def bracket(s: dict, state: str) -> str:
        return f"[{s[state]['pass_rps']}, {s[state]['fail_rps']})" if state in s else "-"

    for r in runs:
        s = r["states"]
        ratio = "-"
        if s.get("cold", {}).get("pass_rps") and s.get("warm", {}).get("pass_rps") is not None:
            ratio = f"{s['warm']['pass_rps'] / s['cold']['pass_rps']:.2f}"
            if s["cold"].get("fail_rps") and s["warm"].get("fail_rps"):
                lo = s["warm"]["pass_rps"] / s["cold"]["fail_rps"]
                ratio += f" ({lo:.2f}-{s['warm']['fail_rps'] / s['cold']['pass_rps']:.2f})"
        p = r.get("points", {})
        tw = r.get("twin_error_rel", {})
        lines.append(
            f"| {r['cores']} | {r['wall_s'] / 60:.0f} min {r['wall_s'] % 60:.0f} s "
            f"| {bracket(s, 'cold')} | {bracket(s, 'warm')} | {ratio} "
            f"| {p.get('min_requests')} req, {p.get('min_wall_s') or 0:.0f} s "
            f"| {len(p.get('disturbed', []))} "
            f"| {len(r.get('faults', []))} / {len(r.get('notes', []))} "
            f"| {tw.get('cold')} / {tw.get('warm')} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/real-engine-cores"))
    args = ap.parse_args()
    runs = []
    for cores in args.cores:
        run = run_pack(cores, args.workdir / f"cores{cores}")
        print(json.dumps(run), flush=True)
        runs.append(run)
    result = {"runs": runs}
    if len(runs) == 2:
        result["agreement"] = agree(runs[0], runs[1])
    (args.workdir / "real-engine-cores.json").write_text(json.dumps(result, indent=1))
    print(markdown(runs))
    print(json.dumps(result.get("agreement"), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
