"""The run autopsy document (``capacity_pack.autopsy.run``) as markdown: one section per step.

Sections, in order: the invocation; the timeline (top jobs by duration); the critical path
(gates, gaps, work and bucket split per job, shadow by rule); the buckets (seconds, share,
largest contributors, and the rule map); the clock cross-check; the counterfactuals with their
arithmetic; finding or waste with the three questions; the disagreements between sources, the
run's commit and MLflow's tracking times; the missing evidence. Every figure carries its
provenance as the document states it; nothing is computed here that the document does not hold.
"""

from __future__ import annotations

import math
from typing import Any

from capacity_pack.autopsy.buckets import BUCKETS, DOMINANT_SHARE


def _f(x: Any, nd: int = 2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _head_lines(doc: dict[str, Any], top: int) -> list[str]:
    inv = doc["invocation"]
    lines = [
        f"# Performance autopsy: {doc['pack']}",
        "",
        f"Invocation `{inv['log']}` started {inv['started_iso']} ({inv['started_source']}), "
        f"`{inv['command']}`; {inv['jobs_executed']} jobs executed "
        f"({', '.join(f'{k} {v}' for k, v in inv['jobs_by_status'].items())}); Snakemake's "
        f"elapsed time {_f(inv['elapsed_s'])} s (measured). Provenance: measured = a source "
        "recorded it; derived = arithmetic on measured figures; estimated = a model.",
        "",
        "## Timeline",
        "",
        f"Top {top} jobs by duration. Times in s since the invocation start; `derived` = end "
        "from the log (1 s), start = end - benchmark s; `measured` = the log's 1 s stamps.",
        "",
        "| job | status | start | end | duration | benchmark s | provenance |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    rows = sorted(
        (r for r in doc["timeline"] if r["duration_s"] is not None),
        key=lambda r: -r["duration_s"],
    )
    for r in rows[:top]:
        lines.append(
            f"| {r['label']} | {r['status']} | {_f(r['t_start'])} | {_f(r['t_end'])} | "
            f"{_f(r['duration_s'])} | {_f(r['bench_s'])} | {r['timing']} |"
        )
    return lines


def _critical_path_lines(cp: dict[str, Any]) -> list[str]:
    gates = ", ".join(f"{k} {v}" for k, v in cp["gates"].items())
    lines = [
        "",
        "## Critical path",
        "",
        f"Wall clock {cp['wall_clock_s']:.3f} s ({cp['provenance']}): invocation start "
        f"{cp['start_iso']} to the last job's end {cp['end_iso']}. {cp['n_jobs']} jobs on the "
        f"path; gates: {gates}. "
        f"Orchestration before the first job {cp['before_first_job_s']:.2f} s; "
        f"{len(cp['gaps'])} gaps between critical jobs "
        f"({sum(g['gap_s'] for g in cp['gaps']):.2f} s). Shadow: {cp['shadow']['jobs']} jobs, "
        f"{cp['shadow']['job_seconds']:.1f} job-seconds {cp['shadow']['meaning']}. "
        f"The first job's start stamp is {_f(cp['first_start_stamp_t'])} s after the invocation "
        "start (measured, truncated: a lower bound of Snakemake's start-up); a derived start can "
        "sit up to 1 s earlier because it inherits the end stamp's truncation.",
        "",
        "| # | job | gate | on path from | gap before | work | bucket split |",
        "|---:|---|---|---:|---:|---:|---|",
    ]
    for i, r in enumerate(cp["jobs"]):
        split = ", ".join(f"{b} {r[b]:.2f}" for b in BUCKETS if r[b] and r[b] > 0)
        lines.append(
            f"| {i} | {r['label']} | {r['gate']} | {r['seg_start']:.2f} | {r['gap_s']:.2f} | "
            f"{r['work_s']:.2f} | {split} |"
        )
    if cp["shadow"]["by_rule"]:
        lines += ["", "Shadow by rule: " + ", ".join(
            f"{k} {v['jobs']} jobs {v['seconds']:.1f} s" for k, v in cp["shadow"]["by_rule"].items()
        ) + "."]  # fmt: skip
    return lines


def _bucket_lines(bk: dict[str, Any], git: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Buckets",
        "",
        "| bucket | seconds | share | provenance | largest |",
        "|---|---:|---:|---|---|",
    ]
    for r in bk["rows"]:
        lines.append(
            f"| {r['bucket']} | {r['seconds']:.3f} | {r['share']:.1%} | {r['provenance']} | "
            f"{r['contributors']} |"
        )
    return lines + [
        f"| **total** | **{bk['total_s']:.3f}** | | | = wall clock {bk['wall_clock_s']:.3f} s |",
        "",
        "Rules map to buckets by name: "
        + ", ".join(f"{k} -> {v}" for k, v in bk["rule_map"].items())
        + "; a measurement job's work outside its load span is infrastructure."
        + (
            f" Rules not in the table ({', '.join(bk['unknown_rules'])}) were counted as "
            f"{bk['unknown_rule_bucket']}."
            if bk["unknown_rules"]
            else ""
        ),
        "",
        "implementation_debugging counts failed attempts on the critical path only: development "
        "time lives in the git history"
        + (
            f" ({git['commits']} commits, {git['first_commit_iso']} to {git['last_commit_iso']})"
            if git["commits"]
            else ""
        )
        + ", not in the run.",
    ]


def _clock_lines(cc: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Clock cross-check",
        "",
        f"Rule: {cc['rule']}. "
        + (
            "All figures valid."
            if cc["valid"]
            else "INVALID figures: " + "; ".join(cc["invalid_figures"]) + "."
        ),
        "",
        "| measurement | mode | stamps | mono span s | realtime - mono span ms | drift ms | ppm "
        "| tolerance ms | outliers | valid |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in cc["jobs"]:
        lines.append(
            f"| {r['label']} | {r.get('mode')} | {r.get('clock_n_stamps')} | "
            f"{_f(r.get('clock_span_mono_s'))} | {_f(r.get('clock_span_diff_ms'), 3)} | "
            f"{_f(r.get('clock_drift_ms'), 3)} | {_f(r.get('clock_drift_ppm'), 1)} | "
            f"{_f(r.get('clock_tolerance_ms'), 3)} | {r.get('clock_outliers')} | "
            f"{r.get('clock_valid')} |"
        )
    if not cc["jobs"]:
        lines.append(
            "| no measurement job ran in this invocation (its records, if any, belong to "
            "earlier ones) | | | | | | | | | |"
        )
    return lines


def _decision_lines(doc: dict[str, Any]) -> list[str]:
    """Counterfactuals, then finding or waste."""
    lines = ["", "## Counterfactuals", ""]
    for c in doc["counterfactuals"]:
        lines += [
            f"- **{c['name']}** ({c['provenance']}): saves {c['saved_s']:.2f} s, wall clock "
            f"{c['new_wall_s']:.2f} s. Assumption: {c['assumption']}. Arithmetic: "
            f"{c['arithmetic']}. Caveat: {c['caveat']}."
        ]
    lines += ["", "## Finding or waste", ""]
    if not doc["finding_or_waste"]:
        lines.append(f"No bucket holds {DOMINANT_SHARE:.0%} of the critical path.")
    for f in doc["finding_or_waste"]:
        lines += [
            f"- **{f['bucket']}** ({f['seconds']:.1f} s, {f['share']:.0%}): **{f['verdict']}**, "
            f"routed to the {f['routed_to']}.",
            f"  1. Changes the measured comparison? {f['changes_comparison']}.",
            f"  2. Changes the decision or only the bill? {f['changes_decision']}.",
            f"  3. Recurs at the deployment target? {f['recurs_at_target']}.",
            f"  - {f['line']}",
        ]
    return lines


def _run_commit_line(rc: dict[str, Any]) -> str:
    return (
        f"Git: the run's commit {rc['commit'][:12]} was committed "
        + (
            f"{abs(rc['committed_t']):.0f} s "
            + ("before" if rc["committed_t"] <= 0 else "after")
            + " the invocation start"
            if rc["committed_t"] is not None
            else "at an unknown time"
        )
        + f" ({rc['source']})"
        + (
            "; the checkout was dirty, so the code that ran is not exactly that commit."
            if rc["dirty"].lower() == "true"
            else "."
        )
    )


def _source_lines(doc: dict[str, Any]) -> list[str]:
    """Disagreements between sources, the run's commit, MLflow's tracking times."""
    lines = [
        "",
        "## Disagreements between sources",
        "",
        "| sources | figure | checked | disagreeing | tolerance | median diff s | max abs diff s "
        "| meaning |",
        "|---|---|---:|---:|---|---:|---:|---|",
    ]
    for d in doc["disagreements"]:
        lines.append(
            f"| {d['sources']} | {d['figure']} | {d['checked']} | {d['disagreeing']} | "
            f"{d['tolerance']} | {_f(d['median_diff_s'], 3)} | {_f(d['max_abs_diff_s'], 3)} | "
            f"{d['detail']} |"
        )
    if rc := doc["git"]["run_commit"]:
        lines += ["", _run_commit_line(rc)]
    if doc["mlflow"]["stages"]:
        lines += ["", "MLflow (tracking times, not job times):"]
        for s in doc["mlflow"]["stages"]:
            if not s["in_this_invocation"]:
                lines.append(f"- {s['stage']}: {s['runs']} child runs, none by this invocation")
                continue
            lines.append(
                f"- {s['stage']}: {s['runs']} child runs, {s['in_this_invocation']} logged by "
                f"this invocation's track jobs, from t={_f(s['first_start_t'])} s to "
                f"t={_f(s['last_end_t'])} s; the tracked jobs ended by "
                f"t={_f(s['tracked_jobs_last_end_t'])} s (lag {_f(s['lag_after_jobs_s'])} s)"
            )
    return lines


def run_autopsy_markdown(doc: dict[str, Any], *, top: int = 12) -> str:
    """The autopsy as markdown: one section per step, every figure with its provenance."""
    lines = [
        *_head_lines(doc, top),
        *_critical_path_lines(doc["critical_path"]),
        *_bucket_lines(doc["buckets"], doc["git"]),
        *_clock_lines(doc["clock_check"]),
        *_decision_lines(doc),
        *_source_lines(doc),
        "",
        "## Missing evidence",
        "",
    ]
    for m in doc["missing_evidence"]:
        lines.append(f"- **{m['gap']}**: {m['why']}. Next run: {m['telemetry']}.")
    return "\n".join(lines) + "\n"
