"""Benchmark: does a point's attainment interval hold the engine's long-run attainment?

Run (from the repository root, in the project's virtualenv):

    python tests/bench/bench_interval_coverage.py [--rates 34 35 36 37] [--state cold]
        [--windows 200] [--point-s 30] [--truth-runs 8] [--truth-s 300] [--out FILE]

Method. Everything in virtual time on the default pack's engine model (``config/config.yaml``:
its profile, classes, length distributions, SLO cutoffs, gate and confidence), no server and
no client. Per rate:

- the truth: each class's attainment over ``--truth-runs`` runs of ``--truth-s`` seconds of
  Poisson arrivals (:func:`capacity_pack.sim.virtual.attainment_at`'s predicate: TTFT and TPOT
  within the class's cutoffs, the first ``client.warmup_seconds`` left out), and the design
  effect of those long runs' outcomes in the pack's time blocks (the "oracle" design effect:
  what a point would use if it knew the engine's correlation);
- ``--windows`` points: independent runs (their own seeds) of the warm-up plus ``--point-s``
  seconds from an idle engine, as a live point starts; per class the outcomes in send order,
  cut into the pack's time blocks (:func:`capacity_pack.binomial.block_counts`), and the
  interval the point states (:func:`capacity_pack.binomial.confidence_sequence` at the
  effective sample k / deff of n / deff) under three design effects: the point's own estimate
  (what the pack does), the oracle's, and the point's own raised to its upper 95 % confidence
  limit (the block variance's chi-square with m - 1 degrees of freedom).

Per rate, method and class it prints the points' mean attainment beside the truth (a point
starts from an idle engine: a difference is the start's bias, not noise), the share of points
whose interval holds the truth (a 95 % interval should hold it in 95 % of points), and the
share of points shown to pass and shown to fail against the gate: at a rate whose truth is
under the gate, "shown to pass" is a false pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "workflow"))

METHODS = ("point", "oracle", "point-upper")


def outcomes(run, classes, start_s: float, end_s: float) -> dict[str, tuple[list, list]]:
    """Per class: (met flags, send times in ns) of the requests sent in [start_s, end_s)."""
    from capacity_pack.sim.virtual import meets_slo

    out: dict[str, tuple[list, list]] = {c.label: ([], []) for c in classes}
    cut = {c.label: c for c in classes}
    for r in sorted(run.results, key=lambda r: r.arrival_s):
        if not start_s <= r.arrival_s < end_s:
            continue
        met, sent = out[r.label]
        met.append(meets_slo(r, cut[r.label]))
        sent.append(round(r.arrival_s * 1e9))
    return out


def upper_deff(n_j, k_j, confidence: float = 0.95) -> float:
    """The point's design effect at the upper limit of its chi-square interval."""
    from scipy.stats import chi2

    from capacity_pack.binomial import MIN_BATCHES, cluster_design_effect

    m = sum(1 for n in n_j if n > 0)
    deff = cluster_design_effect(n_j, k_j)
    if m < MIN_BATCHES:
        return deff
    return max(1.0, deff * (m - 1) / chi2.ppf(1 - confidence, m - 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[34.0, 35.0, 36.0, 37.0])
    ap.add_argument("--state", default="cold", choices=["cold", "warm"])
    ap.add_argument("--windows", type=int, default=200)
    ap.add_argument("--point-s", type=float, default=30.0)
    ap.add_argument("--truth-runs", type=int, default=8)
    ap.add_argument("--truth-s", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/interval-coverage.json"))
    args = ap.parse_args()

    from capacity_pack.binomial import (
        block_counts,
        block_seconds,
        cluster_design_effect,
        confidence_sequence,
    )
    from capacity_pack.plan.manifest import validate_pack
    from capacity_pack.sim.profile import load_profile
    from capacity_pack.sim.virtual import poisson_runs
    from capacity_pack.twin.boundary import shared_prefixes, virtual_classes

    pack = validate_pack(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()), "pack")
    profile = load_profile(pack.target.profile)
    classes = virtual_classes(pack)
    prefixes = shared_prefixes(pack, args.state)
    gate = pack.acceptance.class_slo_attainment_min
    confidence = pack.acceptance.attainment_confidence
    warmup = pack.client.warmup_seconds
    results = []
    for rate in args.rates:
        t0 = time.process_time()
        # The truth and the oracle design effect, from long runs.
        k_all = {c.label: 0 for c in classes}
        n_all = {c.label: 0 for c in classes}
        blocks = {c.label: ([], []) for c in classes}
        seeds = range(args.truth_runs)
        for run in poisson_runs(profile, classes, rate, args.truth_s, seeds, prefixes):
            for name, (met, sent) in outcomes(run, classes, warmup, args.truth_s).items():
                k_all[name] += sum(met)
                n_all[name] += len(met)
                _, n_j, k_j = block_counts(met, sent, block_seconds(args.point_s))
                blocks[name][0].extend(n_j)
                blocks[name][1].extend(k_j)
        truth = {name: k_all[name] / n_all[name] for name in k_all}
        oracle = {name: cluster_design_effect(*blocks[name]) for name in blocks}
        tally = {
            (m, c.label): {"held": 0, "shown_pass": 0, "shown_fail": 0, "points": 0, "sum": 0.0}
            for m in METHODS
            for c in classes
        }
        seeds = range(10_000, 10_000 + args.windows)
        end = warmup + args.point_s
        for run in poisson_runs(profile, classes, rate, end, seeds, prefixes):
            for name, (met, sent) in outcomes(run, classes, warmup, end).items():
                if not met:
                    continue
                k, n = sum(met), len(met)
                _, n_j, k_j = block_counts(met, sent)
                deffs = {
                    "point": cluster_design_effect(n_j, k_j),
                    "oracle": oracle[name],
                    "point-upper": upper_deff(n_j, k_j),
                }
                for m, deff in deffs.items():
                    low, high = confidence_sequence(k / deff, n / deff, confidence, gate)
                    t = tally[(m, name)]
                    t["points"] += 1
                    t["sum"] += k / n
                    # (the bounds' root search stops within 1e-9 of an end at 0 or 1)
                    t["held"] += low - 1e-9 <= truth[name] <= high + 1e-9
                    t["shown_pass"] += low >= gate
                    t["shown_fail"] += high < gate
        cpu = time.process_time() - t0
        for (m, name), t in tally.items():
            row = {"rate": rate, "state": args.state, "method": m, "class": name,
                   "truth": truth[name], "oracle_deff": oracle[name], **t}  # fmt: skip
            results.append(row)
        print(f"rate {rate:g} ({cpu:.0f} s CPU): truth "
              + ", ".join(f"{k} {v:.4f} (deff {oracle[k]:.1f})" for k, v in truth.items()),
              flush=True)  # fmt: skip
    print(
        "\n| rate | class | truth | points' mean | method | holds the truth | shown to pass "
        "| shown to fail |"
    )
    print("|---:|---|---:|---:|---|---:|---:|---:|")
    for r in results:
        p = r["points"] or 1
        print(
            f"| {r['rate']:g} | {r['class']} | {r['truth']:.3f} | {r['sum'] / p:.3f} | "
            f"{r['method']} | {r['held'] / p:.0%} | {r['shown_pass'] / p:.0%} | "
            f"{r['shown_fail'] / p:.0%} |"
        )
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
