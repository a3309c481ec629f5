"""The per-class SLO report of a set of requests and the capacity gate over it.

Per class c over a window of T seconds: attainment_c = passing_c / successful_c (the joint
TTFT-and-TPOT predicate of :mod:`capacity_pack.evidence.gates`), nearest-rank percentiles (P99
withheld below ``p99_min_samples``), output tokens, ``sample_adequate`` and ``class_slo_pass``.
Overall: error_rate = failed / attempted, attainment among successful and over all attempts,
observed_goodput_rps = passing / T (DistServe's goodput over one window), throughputs per T,
``all_class_slos_pass`` and ``capacity_gate_pass`` (every class, the error rate, a flat queue).

Definitions: docs/metrics.md, "Point statistics".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from capacity_pack.errors import StatedError
from capacity_pack.evidence.gates import (
    CLASS_ATTAINMENT,
    CLASS_GATES,
    POINT_GATES,
    Gates,
)
from capacity_pack.vocab.percentile import nearest_ranks
from capacity_pack.vocab.slo import meets_slo

STATUSES = ("ok", "error", "timeout", "rejected", "cancelled")
# The classes of the tutorial request log, analysed when no manifest is given.
TUTORIAL_CUTOFFS = {
    "interactive": {"ttft_ms": 500, "tpot_ms": 40},
    "long_context": {"ttft_ms": 2500, "tpot_ms": 50},
    "generation_heavy": {"ttft_ms": 800, "tpot_ms": 45},
}
TUTORIAL_OUTPUTS = {"interactive": 128, "long_context": 256, "generation_heavy": 1024}
# The gates every report carries; optional ones are added by the per-point analysis.
CORE_CLASS_GATES = tuple(g for g in CLASS_GATES if not g.optional)
CORE_POINT_GATES = tuple(g for g in POINT_GATES if not g.optional)


class AnalysisError(StatedError, ValueError):
    """Input the analyzer refuses; the message names the file, row and rule."""


@dataclass(frozen=True)
class ClassSpec:
    name: str
    ttft_cutoff_ms: float
    tpot_cutoff_ms: float
    expected_output_tokens: int | None  # None: not a fixed-length class


def tutorial_classes() -> list[ClassSpec]:
    """The tutorial request log's classes (fixed output lengths)."""
    return [
        ClassSpec(n, c["ttft_ms"], c["tpot_ms"], TUTORIAL_OUTPUTS[n])
        for n, c in TUTORIAL_CUTOFFS.items()
    ]


def pack_classes(pack) -> list[ClassSpec]:
    """Class specs from a :class:`~capacity_pack.plan.manifest.Pack` (fixed lengths if fixed)."""
    return [
        ClassSpec(
            c.name,
            c.request_ttft_cutoff_ms,
            c.request_tpot_cutoff_ms,
            c.output_tokens if isinstance(c.output_tokens, int) else None,
        )
        for c in pack.workload
    ]


@dataclass
class ClassSample:
    """The successful requests of one class: latencies in no particular order, how many meet
    the class SLO, and their output tokens."""

    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    passed: int
    tokens: int


@dataclass
class Summary:
    """What the report is computed from; ``samples`` follows the order of the classes."""

    attempted: int
    successful: int
    samples: list[ClassSample]


def check_arguments(duration_s: float, queue_trend: str) -> None:
    if not math.isfinite(duration_s) or duration_s <= 0:
        raise AnalysisError("duration must be positive")
    if queue_trend not in {"flat", "growing"}:
        raise AnalysisError("queue trend must be flat or growing")


def class_report(
    cols: dict[str, np.ndarray],
    duration_s: float,
    queue_trend: str,
    classes: list[ClassSpec],
    gates: Gates,
) -> dict[str, Any]:
    """The report of parsed request columns.

    ``cols`` holds ttft, tpot, e2e and out per row, and either ``code`` (the row's index in
    ``classes``, -1 for none) and ``ok`` (a boolean mask), or the text columns class and status.
    """
    check_arguments(duration_s, queue_trend)
    if "code" in cols:
        code, ok = cols["code"], cols["ok"]
    else:
        import pandas as pd

        names = [c.name for c in classes]
        code = pd.Categorical(np.asarray(cols["class"], dtype=object), categories=names).codes
        ok = np.asarray(cols["status"], dtype=object) == "ok"
    samples = []
    for i, c in enumerate(classes):
        mine = ok & (code == i)
        ttft, tpot = cols["ttft"][mine], cols["tpot"][mine]
        passed = int(np.count_nonzero(meets_slo(ttft, tpot, c.ttft_cutoff_ms, c.tpot_cutoff_ms)))
        tokens = int(cols["out"][mine].sum())
        samples.append(ClassSample(ttft, tpot, cols["e2e"][mine], passed, tokens))
    summary = Summary(int(code.size), int(np.count_nonzero(ok)), samples)
    return summary_report(summary, duration_s, queue_trend, classes, gates)


def summary_report(
    summary: Summary,
    duration_s: float,
    queue_trend: str,
    classes: list[ClassSpec],
    gates: Gates,
) -> dict[str, Any]:
    """The report from a summary (its latency arrays are reordered in place)."""
    from concurrent.futures import ThreadPoolExecutor

    attempted, successful = summary.attempted, summary.successful
    # Per class, (p50, p95, p99) of TTFT and TPOT and p95 of E2E; on two threads, as numpy's
    # partition releases the GIL.
    ps = [(0.50, 0.95, 0.99), (0.50, 0.95, 0.99), (0.95,)] * len(classes)
    arrays = [a for s in summary.samples for a in (s.ttft, s.tpot, s.e2e)]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(nearest_ranks, arrays, ps))
    ranks = [done[3 * i : 3 * i + 3] for i in range(len(classes))]
    failed = attempted - successful
    passed_total = 0
    out_tokens_total = 0
    report_classes: dict[str, Any] = {}
    for i in sorted(range(len(classes)), key=lambda i: classes[i].name):
        c, s = classes[i], summary.samples[i]
        count, passed = int(s.ttft.size), s.passed
        passed_total += passed
        out_tokens_total += s.tokens
        p99_ok = count >= gates["p99_min_samples"]
        (t50, t95, t99), (s50, s95, s99), (e95,) = ranks[i]
        entry = {
            "successful_count": count,
            "passing_count": passed,
            "request_ttft_cutoff_ms": c.ttft_cutoff_ms,
            "request_tpot_cutoff_ms": c.tpot_cutoff_ms,
            "attainment": passed / count if count else None,
            "p99_sample_adequate": p99_ok,
            "p50_ttft_ms": t50,
            "p95_ttft_ms": t95,
            "p99_ttft_ms": t99 if p99_ok else None,
            "p50_tpot_ms": s50,
            "p95_tpot_ms": s95,
            "p99_tpot_ms": s99 if p99_ok else None,
            "p95_e2e_ms": e95,
            "output_tokens": s.tokens,
        }
        for gate in CORE_CLASS_GATES:
            entry[gate.passes_key] = gate.passed(entry, gates)
        report_classes[c.name] = entry
    report = {
        "attempted": attempted,
        "successful": successful,
        "failed": failed,
        "error_rate": failed / attempted if attempted else None,
        "overall_attainment": passed_total / successful if successful else None,
        "overall_all_attempt_attainment": passed_total / attempted if attempted else None,
        "observed_goodput_rps": passed_total / duration_s,
        "request_throughput_rps": successful / duration_s,
        "output_throughput_tps": out_tokens_total / duration_s,
        "queue_trend": queue_trend,
        "all_class_slos_pass": all(v[CLASS_ATTAINMENT.passes_key] for v in report_classes.values()),
        "classes": report_classes,
    }
    report["capacity_gate_pass"] = bool(
        all(v[g.passes_key] for v in report_classes.values() for g in CORE_CLASS_GATES)
        and all(g.passed(report, gates) for g in CORE_POINT_GATES)
    )
    return report
