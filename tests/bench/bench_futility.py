"""Benchmark: when the in-run decision finds a point futile, and whether it ever stops a pass.

Run (from the repository root, in the project's virtualenv) on the results of a finished pack:

    python tests/bench/bench_futility.py results/rehearsal-sim [--config config/config.yaml]

Method. Each open-loop point's ``records.jsonl`` is replayed through the in-run decider
(:class:`capacity_pack.measure.sequential.Decider`, with the pack's own settings from
:func:`capacity_pack.measure.inputs.sequential_settings`): its measured requests in the order
they finished, a look every 0.25 s of the load generator's clock, as the live run looks. Two
rules are compared: futility judged from the end of the warm-up (the decider's rule) and
futility only once the minimum duration has passed (the rule before 2026-12-02). Printed per
point: the live decision and its time, the replayed decision and time under each rule; then
the seconds the earlier rule saves and every point the live run passed that either rule would
have stopped as futile (there should be none). A replay reads only what the run recorded, so a
point stopped early lacks the requests it never sent: a replay of it ends where the run did.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "workflow"))


def _attempts(path: Path):
    from capacity_pack.measure.records import Attempt

    recs = [json.loads(line) for line in path.open()]
    measured = [r for r in recs if r["phase"] in ("measure", "extension")]
    if not measured:
        return 0, []
    t0 = measured[0]["t0_ns"]
    out = [
        Attempt(
            request_id=r["request_id"],
            seq=r["seq"],
            klass=r["class"],
            phase=r["phase"],
            block=r["block"],
            input_tokens=r["input_tokens"],
            output_tokens_expected=r["output_tokens_expected"],
            scheduled_offset_ns=r["scheduled_offset_ns"],
            sent_ns=r["sent_ns"],
            first_token_ns=r["first_token_ns"],
            last_token_ns=r["last_token_ns"],
            end_ns=r["end_ns"],
            chunk_tokens=r["chunk_tokens"] or [],
            status=r["status"],
        )  # fmt: skip
        for r in measured
    ]
    return t0, sorted(out, key=lambda a: a.end_ns)


def replay(settings, sample_gate, t0: int, attempts, futility_after_minimum: bool):
    """(decision, seconds from the clock's start) of one point under one futility rule."""
    from capacity_pack.measure.sequential import NS, Decider

    d = Decider(settings, sample_gate=sample_gate)
    i, k = 0, 1
    while True:
        t = k * settings.look_interval_s
        off = int(t * NS)
        while i < len(attempts) and attempts[i].end_ns - t0 <= off:
            d.record(attempts[i])
            i += 1
        decision = d.look(off)
        if decision == "futile" and futility_after_minimum and t < settings.minimum_duration_s:
            decision = "undecided"
        if decision != "undecided":
            return decision, t
        if i >= len(attempts):
            return "end of records", t
        k += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="results/<pack name>")
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "config.yaml")
    args = ap.parse_args()
    import yaml

    from capacity_pack.measure.inputs import SweepInputs, sequential_settings
    from capacity_pack.plan.manifest import validate_pack
    from capacity_pack.plan.schedule import Point

    pack = validate_pack(yaml.safe_load(args.config.read_text()), str(args.config))
    saved, stopped_passes = 0.0, []
    for path in sorted((args.results / "raw").glob("open-r*/*/rep*/records.jsonl")):
        point_id, cache, rep = path.parts[-4:-1]
        point = Point.parse(point_id, cache, int(rep.removeprefix("rep")))
        inputs = SweepInputs.for_point(pack, point)
        settings = sequential_settings(inputs)
        summary = json.loads((path.parent / "summary.json").read_text())
        live = summary.get("sequential") or {}
        t0, attempts = _attempts(path)
        gate = inputs.min_successful_samples_per_class
        now = replay(settings, gate, t0, attempts, futility_after_minimum=False)
        before = replay(settings, gate, t0, attempts, futility_after_minimum=True)
        at = (live.get("at_offset_ns") or 0) / 1e9
        print(
            f"{point.key:24s} live {live.get('decision', '-'):7s} {at:5.2f} s | from warm-up "
            f"{now[0]:7s} {now[1]:5.2f} s | after the minimum {before[0]:7s} {before[1]:5.2f} s"
        )
        if now[0] == before[0] == "futile":
            saved += before[1] - now[1]
        if live.get("decision") == "pass" and "futile" in (now[0], before[0]):
            stopped_passes.append(point.key)
    print(f"futility from the warm-up saves {saved:.2f} s of load over the futile points")
    print(f"passing points a rule would have stopped as futile: {stopped_passes or 'none'}")


if __name__ == "__main__":
    main()
