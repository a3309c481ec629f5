"""Where the test suite's wall time goes, read from a pytest report log.

    pip install pytest-reportlog
    CI=true pytest -p tests.bench.cpu_per_test --report-log=suite.jsonl
    python tests/bench/suite_timeline.py suite.jsonl

Prints the suite's span; per parallel worker its busy time (setup + call + teardown of its
tests) and its idle time (gaps between one test's end and the next one's start: waiting for an
exclusive test's turn, or for the other worker to finish before one begins); the exclusive
tests' block (marked ``exclusive`` or ``real_engine``: they run alone, tests/exclusive.py); and
the modules by busy time, with the CPU time each used where the log holds it
(tests/bench/cpu_per_test.py: the worker's own and its waited-for children's). The report log
holds each phase's start and stop in wall-clock seconds and the worker that ran it
(pytest-xdist's ``worker_id``).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def read(path: Path) -> list[dict]:
    phases = []
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        if doc.get("$report_type") == "TestReport":
            phases.append(doc)
    return phases


def cpu_s(phase: dict) -> float:
    """The phase's CPU seconds (tests/bench/cpu_per_test.py's user property; 0 without it)."""
    return dict(map(tuple, phase.get("user_properties", []))).get("cpu_s", 0.0)


def exclusive(phase: dict) -> bool:
    return bool({"exclusive", "real_engine"} & set(phase.get("keywords", {})))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path, help="a pytest --report-log file")
    ap.add_argument("--modules", type=int, default=15, help="how many modules to list")
    args = ap.parse_args()
    phases = read(args.log)
    if not phases:
        raise SystemExit(f"{args.log}: no test reports (expected a pytest --report-log file)")
    t0 = min(p["start"] for p in phases)
    t1 = max(p["stop"] for p in phases)
    print(f"suite span {t1 - t0:7.0f} s ({len({p['nodeid'] for p in phases})} tests)")

    by_worker: dict[str, list[dict]] = defaultdict(list)
    for p in phases:
        by_worker[p.get("worker_id") or "main"].append(p)
    for worker, ps in sorted(by_worker.items()):
        ps.sort(key=lambda p: p["start"])
        busy = sum(p["stop"] - p["start"] for p in ps)
        idle = sum(max(0.0, b["start"] - a["stop"]) for a, b in zip(ps, ps[1:], strict=False))
        tail = t1 - ps[-1]["stop"]
        print(f"{worker:>5}: busy {busy:6.0f} s, idle between tests {idle:6.0f} s, "
              f"done {tail:5.0f} s before the suite")  # fmt: skip

    ex = [p for p in phases if exclusive(p)]
    if ex:
        start, stop = min(p["start"] for p in ex), max(p["stop"] for p in ex)
        busy = sum(p["stop"] - p["start"] for p in ex)
        print(f"exclusive tests: {busy:6.0f} s of tests, from {start - t0:5.0f} s to "
              f"{stop - t0:5.0f} s of the span")  # fmt: skip

    modules: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    for p in phases:
        module = p["nodeid"].split("::")[0]
        modules[module] += p["stop"] - p["start"]
        cpu[module] += cpu_s(p)
    if any(cpu.values()):
        shared = sum(cpu_s(p) for p in phases if not exclusive(p))
        print(f"CPU of the tests: {sum(cpu.values()):6.0f} s, the shared part's {shared:6.0f} s")
    print("modules by busy time (and CPU time):")
    for module, seconds in sorted(modules.items(), key=lambda kv: -kv[1])[: args.modules]:
        print(f"  {seconds:6.0f} s  {cpu[module]:6.0f} CPU-s  {module}")


if __name__ == "__main__":
    main()
