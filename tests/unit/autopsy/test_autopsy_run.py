"""Run autopsy: a synthetic Snakemake log with known jobs, dependencies and benchmarks gives the
known critical path, buckets that add up to the wall clock, the orchestration gaps; injected clock
skew is caught; counterfactual arithmetic; a real run's log and results (the committed fixture).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

from capacity_pack.autopsy import buckets, clocks, markdown, run, sources, timeline

NS = 1_000_000_000
PACK = "synth"
RES = f"results/{PACK}"
# The per-target resource a sim pack named "synth" holds (capacity_pack.measure.cluster).
SLOT = "target_sim_synth"
# Snakemake writes naive local time; the parser reads it in this host's zone, and so does this.
T0 = datetime(2026, 11, 29, 10, 0, 0)
BASE = T0.timestamp()
HEADER = """Assuming unrestricted shared filesystem usage.

SNAKEMAKE
=========
  Date: {date}
  Workflow ID: 00000000-0000-0000-0000-000000000000
  Snakemake version: 9.27.1
  Command: /work/venv/bin/snakemake --cores 2
  Working directory: /tmp

Building DAG of jobs...
Using shell: /usr/bin/bash
Provided cores: 2
Provided resources: target_sim_synth=Resource("target_sim_synth", 1)
Job stats:
job          count
---------  -------
{stats}
total            {total}

Select jobs to execute...
"""


def stamp(t: float) -> str:
    return "[" + datetime.fromtimestamp(BASE + t).strftime("%a %b %d %H:%M:%S %Y") + "]"


class Log:
    """A main log in Snakemake 9's format, written event by event."""

    def __init__(self, root: Path, res: str = RES):
        self.root, self.res = root, res
        self.lines: list[str] = []
        self.rules: Counter[str] = Counter()

    def start(self, t, jobid, rule, *, inputs=(), outputs=(), wildcards="", slot=None):
        self.rules[rule] += 1
        lines = [stamp(t), f"localrule {rule}:"]
        if inputs:
            lines.append("    input: " + ", ".join(inputs))
        if outputs:
            lines.append("    output: " + ", ".join(outputs))
        if rule != "all":
            lines.append(f"    log: {self.res}/logs/{rule}/{jobid}.log")
        lines.append(f"    jobid: {jobid}")
        if rule != "all":
            lines.append(f"    benchmark: {self.res}/benchmarks/{rule}/{jobid}.tsv")
        lines.append("    reason: Missing output files")
        if wildcards:
            lines.append(f"    wildcards: {wildcards}")
        lines.append("    resources: tmpdir=/tmp" + (f", {slot}=1" if slot else ""))
        self.lines += lines

    def finish(self, t, jobid, rule, bench_s=None):
        self.lines += [stamp(t), f"Finished jobid: {jobid} (Rule: {rule})", "1 of 9 steps done"]
        if bench_s is not None:
            self.bench(jobid, rule, bench_s, BASE + t + 0.5)

    def error(self, t, jobid, rule, bench_s=None):
        self.lines += [
            stamp(t),
            f"Error in rule {rule}:",
            "    message: None",
            f"    jobid: {jobid}",
            f"    log: {self.res}/logs/{rule}/{jobid}.log (check log file(s) for error details)",
            "",
        ]
        if bench_s is not None:
            self.bench(jobid, rule, bench_s, BASE + t + 0.5)

    def bench(self, jobid, rule, s, mtime):
        path = self.root / self.res / "benchmarks" / rule / f"{jobid}.tsv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
            f"{s:.2f}\t0:00:01\t100.0\t200.0\t50.0\t60.0\t0.00\t0.10\t50.0\t{s / 2:.2f}\n"
        )
        os.utime(path, (mtime, mtime))

    def write(self, name="2026-11-29T100000.000000", complete=True) -> Path:
        stats = "\n".join(f"{r:<9}{n:>8}" for r, n in self.rules.items())
        text = HEADER.format(
            date=T0.strftime("%Y-%m-%d %H:%M:%S"), stats=stats, total=sum(self.rules.values())
        )
        text += "\n".join(self.lines) + "\n"
        if complete:
            text += "9 of 9 steps (100%) done\nComplete log(s): x\nElapsed time: 0:00:26.500000\n"
        log_dir = self.root / ".snakemake" / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / f"{name}.snakemake.log"
        path.write_text(text)
        return path


def write_records(path: Path, t_first: float, t_last: float, *, open_loop: bool, n=200, skew=0.0):
    """Requests spread over [t_first, t_last] (s after BASE); realtime = monotonic + offset."""
    mono0 = 5_000 * NS
    rt0 = int(BASE * NS)
    rows = []
    span = t_last - t_first
    for i in range(n):
        sent = t_first + span * i / n * 0.9
        end = sent + span * 0.1 if i < n - 1 else t_last
        due = sent - 0.0001 if open_loop else None

        def mono(t):
            return mono0 + round(t * NS)

        def real(t):
            return rt0 + round(t * NS) + round(skew * (t - t_first) / span * NS)

        rows.append(
            {
                "request_id": f"r{i}",
                "phase": "measure",
                "status": "ok",
                "due_ns": mono(due) if open_loop else 0,
                "t0_ns": mono(t_first),
                "t0_realtime_ns": real(t_first),
                "sent_ns": mono(sent),
                "sent_realtime_ns": real(sent),
                "end_ns": mono(end),
                "end_realtime_ns": real(end),
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Written as the run ends (the autopsy checks that the records are this job's own).
    os.utime(path, (BASE + t_last + 0.2, BASE + t_last + 0.2))


def sched(x):
    return f"{RES}/schedules/{x}/schedule.parquet"


def recs(x):
    return f"{RES}/raw/{x}/records.jsonl"


def rep(x):
    return f"{RES}/reports/{x}/slo-report.json"


def scenario(
    root: Path, *, complete=True, name="2026-11-29T100000.000000", slots=(SLOT, SLOT)
) -> Path:
    """Two schedules, two sweeps serialized by the target slot, two analyses, a report.

    Expected critical path: schedule:a (first) -> sweep:a (dependency) -> sweep:b (target_slot)
    -> analyze:b (dependency, 2.2 s gap) -> report (dependency) -> all (dependency).
    ``slots``: the resource each sweep holds.
    """
    log = Log(root)
    log.start(1, 1, "schedule", outputs=[sched("a")], wildcards="point=a")
    log.start(1, 2, "schedule", outputs=[sched("b")], wildcards="point=b")
    log.finish(2, 2, "schedule", 0.95)
    log.finish(2, 1, "schedule", 0.9)
    a, b = slots
    log.start(2, 3, "sweep", inputs=[sched("a")], outputs=[recs("a")], wildcards="point=a", slot=a)
    log.finish(12, 3, "sweep", 9.8)
    log.start(12, 4, "sweep", inputs=[sched("b")], outputs=[recs("b")], wildcards="point=b", slot=b)
    log.start(12, 5, "analyze", inputs=[recs("a")], outputs=[rep("a")], wildcards="point=a")
    log.finish(14, 5, "analyze", 1.5)
    log.finish(20, 4, "sweep", 7.9)
    log.start(22, 6, "analyze", inputs=[recs("b")], outputs=[rep("b")], wildcards="point=b")
    log.finish(24, 6, "analyze", 1.8)
    log.start(24, 7, "report", inputs=[rep("a"), rep("b")], outputs=[f"{RES}/pack/README.md"])
    log.finish(26, 7, "report", 1.9)
    log.start(26, 0, "all", inputs=[f"{RES}/pack/README.md"])
    if complete:
        log.finish(26, 0, "all")
    write_records(root / recs("a"), 2.5, 11.5, open_loop=True)
    write_records(root / recs("b"), 12.5, 19.5, open_loop=False)
    return log.write(name=name, complete=complete)


def autopsy(root: Path) -> dict:
    return run.run_autopsy(root / "results", root / ".snakemake" / "log", root, PACK, None)


def analysed(root: Path, log_path: Path):
    inv = sources.parse_snakemake_log(log_path)
    tl = timeline.job_timeline(inv, root)
    deps = timeline.job_dependencies(tl)
    win = clocks.measurement_windows(tl, root)
    path = timeline.critical_path(tl, deps)
    return inv, tl, deps, win, buckets.attribute_buckets(path, inv.started, win)


# -- parsing -----------------------------------------------------------------------------------


def test_parse_synthetic_log(tmp_path):
    inv = sources.parse_snakemake_log(scenario(tmp_path))
    assert inv.started == pytest.approx(BASE)
    assert inv.header_date == pytest.approx(BASE)
    assert inv.command.endswith("--cores 2")
    assert inv.complete and inv.elapsed_s == pytest.approx(26.5)
    assert inv.job_stats == {"schedule": 2, "sweep": 2, "analyze": 2, "report": 1, "all": 1}
    assert [j.jobid for j in inv.jobs] == [1, 2, 3, 4, 5, 6, 7, 0]
    assert {j.status for j in inv.jobs} == {"finished"}
    sweep_b = next(j for j in inv.jobs if j.jobid == 4)
    assert sweep_b.rule == "sweep" and sweep_b.local
    assert sweep_b.log_start == pytest.approx(BASE + 12)
    assert sweep_b.log_end == pytest.approx(BASE + 20)
    assert sweep_b.inputs == [sched("b")] and sweep_b.outputs == [recs("b")]
    assert sweep_b.wildcards == "point=b" and f"{SLOT}=1" in sweep_b.resources
    assert sweep_b.benchmark == f"{RES}/benchmarks/sweep/4.tsv"


def test_truncated_log_leaves_the_last_job_incomplete(tmp_path):
    inv = sources.parse_snakemake_log(scenario(tmp_path, complete=False))
    assert not inv.complete
    last = inv.jobs[-1]
    assert last.rule == "all" and last.status == "incomplete" and last.log_end is None
    # The autopsy still runs: the path ends at the job that did finish last.
    _, tl, deps, win, att = analysed(tmp_path, Path(inv.path))
    assert att["label"].iloc[-1] == "report"


def test_latest_invocation_skips_autopsy_only_logs(tmp_path):
    scenario(tmp_path, name="2026-11-29T100000.000000")
    log = Log(tmp_path)
    log.start(30, 1, "autopsy", outputs=[f"{RES}/pack/autopsy.md"])
    log.write(name="2026-11-29T100100.000000", complete=False)
    other = Log(tmp_path, "results/other")
    other.start(40, 1, "freeze", outputs=["results/other/manifest/frozen.json"])
    other.finish(41, 1, "freeze", 0.5)
    other.write(name="2026-11-29T100200.000000")
    log_dir = tmp_path / ".snakemake" / "log"
    # The newer log only froze a manifest: the run that measured is the one accounted for.
    assert sources.latest_invocation(log_dir).path.endswith("T100000.000000.snakemake.log")
    inv = sources.latest_invocation(log_dir, PACK)
    assert inv.path.endswith("T100000.000000.snakemake.log")


# -- timeline, critical path, buckets ------------------------------------------------------------


def test_timeline_derives_starts_from_benchmarks(tmp_path):
    inv, tl, deps, _, _ = analysed(tmp_path, scenario(tmp_path))
    row = tl.set_index("jobid").loc[3]
    assert row["timing"] == "derived"
    assert row["end_s"] == pytest.approx(BASE + 12)
    assert row["start_s"] == pytest.approx(BASE + 12 - 9.8)
    assert tl.set_index("jobid").loc[0, "timing"] == "measured"  # `all` has no benchmark
    edges = {(tl.loc[j, "jobid"], tl.loc[d, "jobid"]) for j, d in deps[["job", "dep"]].to_numpy()}
    assert edges == {(3, 1), (4, 2), (5, 3), (6, 4), (7, 5), (7, 6), (0, 7)}


def test_critical_path_dependency_and_target_slot_contention(tmp_path):
    _, _, _, _, att = analysed(tmp_path, scenario(tmp_path))
    assert list(att["label"]) == ["schedule:a", "sweep:a", "sweep:b", "analyze:b", "report", "all"]
    assert list(att["gate"]) == [
        "first",
        "dependency",
        "target_slot",
        "dependency",
        "dependency",
        "dependency",
    ]


def test_legacy_target_slot_logs_keep_their_gates(tmp_path):
    """Logs written before the resource was named after the target held `target_slot`."""
    log = scenario(tmp_path, slots=("target_slot", "target_slot"))
    _, tl, _, _, att = analysed(tmp_path, log)
    assert list(att["gate"])[2] == "target_slot"
    assert set(tl.loc[tl["rule"].eq("sweep"), "target_resource"]) == {"target_slot"}


def test_two_targets_resources_never_gate_each_other(tmp_path):
    """Sweeps of two targets hold two resources: one waiting for the other waited for a core."""
    log = scenario(tmp_path, slots=(SLOT, "target_10_0_0_5_8000"))
    _, tl, _, _, att = analysed(tmp_path, log)
    assert list(att["label"])[:3] == ["schedule:a", "sweep:a", "sweep:b"]
    assert list(att["gate"])[2] == "core"
    assert tl.loc[tl["rule"].eq("sweep"), "target_slot"].all()


def test_buckets_add_up_to_the_wall_clock_and_gaps_are_orchestration(tmp_path):
    inv, _, _, _, att = analysed(tmp_path, scenario(tmp_path))
    totals = buckets.bucket_totals(att)
    assert sum(totals.values()) == pytest.approx(26.0, abs=1e-9)
    assert float(att["seg_end"].iloc[-1]) == pytest.approx(26.0)
    gaps = dict(zip(att["label"], att["gap_s"], strict=True))
    # Snakemake's start-up before schedule:a (2 - 0.9 s), the 2.2 s before analyze:b.
    assert gaps["schedule:a"] == pytest.approx(1.1)
    assert gaps["analyze:b"] == pytest.approx(22.2 - 20)
    assert gaps["report"] == pytest.approx(24.1 - 24)
    assert gaps["sweep:a"] == pytest.approx(0.2) and gaps["sweep:b"] == pytest.approx(0.1)
    assert totals["orchestration"] == pytest.approx(1.1 + 0.2 + 0.1 + 2.2 + 0.1)
    # Load spans from the records: 9 s and 7 s; the analysis 1.8 s.
    assert totals["task_intrinsic"] == pytest.approx(9.0 + 7.0 + 1.8)
    # schedule 0.9 s; each sweep's benchmark s minus its load span: 9.8 - 9, 7.9 - 7.
    assert totals["infrastructure"] == pytest.approx(0.9 + 0.8 + 0.9)
    assert totals["documentation"] == pytest.approx(1.9)
    assert totals["implementation_debugging"] == 0.0


def test_core_contention_and_failed_attempt_on_the_path(tmp_path):
    log = Log(tmp_path)
    log.start(1, 1, "normalize", outputs=[f"{RES}/x.parquet"])
    log.start(1, 2, "normalize", outputs=[f"{RES}/y.parquet"])
    log.finish(5, 1, "normalize", 3.9)
    log.start(5, 3, "freeze", outputs=[f"{RES}/manifest/frozen.json"])
    log.finish(6, 3, "freeze", 0.9)
    log.start(6, 4, "normalize", outputs=[f"{RES}/z.parquet"])  # waits for a core, not data
    log.finish(7, 2, "normalize", 5.9)
    log.error(8, 4, "normalize")
    log.start(8, 4, "normalize", outputs=[f"{RES}/z.parquet"])  # Snakemake's retry
    log.finish(10, 4, "normalize", 1.8)
    log.start(10, 0, "all", inputs=[f"{RES}/z.parquet", f"{RES}/y.parquet"])
    log.finish(10, 0, "all")
    path = log.write()
    _, tl, _, _, att = analysed(tmp_path, path)
    assert list(tl.loc[tl["jobid"] == 4, "status"]) == ["error", "finished"]
    assert list(att["jobid"]) == [1, 3, 4, 4, 0]
    assert list(att["gate"]) == ["first", "core", "core", "retry", "dependency"]
    totals = buckets.bucket_totals(att)
    # The failed attempt has no benchmark of its own: its 1 s stamps, 6 to 8.
    assert totals["implementation_debugging"] == pytest.approx(2.0)
    assert totals["infrastructure"] == pytest.approx(3.9 + 0.9 + 1.8)
    assert sum(totals.values()) == pytest.approx(10.0, abs=1e-9)


def test_buckets_check_refuses_a_broken_sum(monkeypatch):
    path = pd.DataFrame(
        {
            "job": [0],
            "jobid": [1],
            "rule": ["schedule"],
            "label": ["schedule"],
            "status": ["finished"],
            "start_s": [101.0],
            "end_s": [103.0],
            "gate": ["first"],
            "gated_by": pd.array([None], dtype="Int64"),
        }
    )
    att = buckets.attribute_buckets(path, 100.0)
    assert att["orchestration"].iloc[0] == 1.0 and att["infrastructure"].iloc[0] == 2.0
    # A load window partly outside the job's segment: only its overlap is task-intrinsic.
    window = pd.DataFrame({"load_start": [102.5], "load_end": [104.0]}, index=path["job"])
    att = buckets.attribute_buckets(path.assign(rule=["sweep"]), 100.0, window)
    assert att["task_intrinsic"].iloc[0] == 0.5 and att["infrastructure"].iloc[0] == 1.5
    # The check is live: with no tolerance left, any rounding at all is refused.
    monkeypatch.setattr(buckets, "SUM_TOLERANCE_S", -1.0)
    with pytest.raises(AssertionError):
        buckets.attribute_buckets(path, 100.0)


# -- clock cross-check -------------------------------------------------------------------------


def _frame(path: Path) -> pd.DataFrame:
    return sources.record_clocks(path)


def test_clock_check_catches_injected_skew(tmp_path):
    write_records(tmp_path / "skew.jsonl", 0.0, 10.0, open_loop=True, n=500, skew=0.050)
    check = clocks.clock_check(_frame(tmp_path / "skew.jsonl"))
    assert not check.valid
    assert check.drift_ms > 40 and check.drift_ppm == pytest.approx(5000, rel=0.1)
    assert abs(check.span_diff_ms - 50) < 1 and not check.span_agrees
    assert "CLOCK SKEW" in check.verdict


def test_clock_check_passes_a_clean_run_and_counts_jitter_apart(tmp_path):
    write_records(tmp_path / "clean.jsonl", 0.0, 10.0, open_loop=True, n=500)
    clean = clocks.clock_check(_frame(tmp_path / "clean.jsonl"))
    assert clean.valid and clean.span_agrees and clean.outliers == 0
    assert clean.drift_ms < 0.01
    # One end stamp whose realtime read came 40 ms late (a thread switch): jitter, not drift.
    frame = _frame(tmp_path / "clean.jsonl")
    frame.loc[100, "end_realtime_ns"] += 40_000_000
    jitter = clocks.clock_check(frame)
    assert jitter.valid and jitter.outliers == 1
    assert jitter.max_outlier_ms == pytest.approx(40, abs=0.1)


def test_skewed_measurement_marks_its_figures_invalid(tmp_path):
    log_path = scenario(tmp_path)
    write_records(tmp_path / recs("b"), 12.5, 19.5, open_loop=False, skew=0.050)
    doc = autopsy(tmp_path)
    assert doc["invocation"]["log"] == str(log_path)
    assert not doc["clock_check"]["valid"]
    assert any("sweep:b" in f for f in doc["clock_check"]["invalid_figures"])
    jobs = {j["label"]: j for j in doc["critical_path"]["jobs"]}
    assert jobs["sweep:b"]["split"].startswith("none: no valid load window")
    assert jobs["sweep:a"]["split"] == "records"


def test_records_rewritten_by_a_later_invocation_are_not_used(tmp_path):
    scenario(tmp_path)
    later = BASE + 3600
    os.utime(tmp_path / recs("a"), (later, later))
    doc = autopsy(tmp_path)
    jobs = {j["label"]: j for j in doc["critical_path"]["jobs"]}
    assert jobs["sweep:a"]["split"].startswith("none") and jobs["sweep:b"]["split"] == "records"
    assert any("sweep:a" in f and "rewritten" in f for f in doc["clock_check"]["invalid_figures"])
    assert doc["buckets"]["total_s"] == pytest.approx(26.0)


# -- counterfactuals ---------------------------------------------------------------------------


def test_counterfactual_arithmetic_open_vs_closed_loop(tmp_path):
    inv, _, _, win, att = analysed(tmp_path, scenario(tmp_path))
    cfs = {c.name[0]: c for c in buckets.counterfactuals(att, win, inv.started)}
    wall = 26.0
    # sweep:a is open loop: only its drain tail (last end - last due) halves; sweep:b is closed.
    tail_a = float(win.set_index("label").loc["sweep:a", "drain_tail_s"])
    assert 0 < tail_a < 9
    assert cfs["a"].saved_s == pytest.approx(0.5 * (tail_a + 7.0))
    assert cfs["a"].new_wall_s == pytest.approx(wall - cfs["a"].saved_s)
    assert f"{tail_a:.2f}" in cfs["a"].arithmetic and "7.00" in cfs["a"].arithmetic
    assert cfs["b"].saved_s == pytest.approx(0.5 * (9.0 + 7.0))
    # Two targets: half the measurement jobs' work on the path (9.8 + 7.9 s).
    assert cfs["c"].saved_s == pytest.approx(0.5 * (9.8 + 7.9))
    assert cfs["c"].provenance == "estimated"
    assert cfs["d"].saved_s == 0.0  # no track job in this run


def test_finding_or_waste_answers_every_dominant_bucket(tmp_path):
    inv, _, _, win, att = analysed(tmp_path, scenario(tmp_path))
    totals = buckets.bucket_totals(att)
    fw = {f.bucket: f for f in buckets.finding_or_waste(att, totals)}
    assert set(fw) == {b for b, s in totals.items() if s / 26.0 >= 0.10}
    assert fw["task_intrinsic"].verdict == "finding"
    assert fw["task_intrinsic"].routed_to == "analysis plan"
    assert fw["infrastructure"].verdict == "waste"
    assert "s per run" in fw["infrastructure"].line


def test_run_autopsy_on_synthetic_run(tmp_path):
    scenario(tmp_path)
    doc = autopsy(tmp_path)
    json.dumps(doc, allow_nan=False)
    assert doc["buckets"]["total_s"] == pytest.approx(doc["critical_path"]["wall_clock_s"])
    assert doc["clock_check"]["valid"]
    assert doc["missing_evidence"] and doc["disagreements"]
    md = markdown.run_autopsy_markdown(doc)
    for section in (
        "## Timeline",
        "## Critical path",
        "## Buckets",
        "## Clock cross-check",
        "## Counterfactuals",
        "## Finding or waste",
        "## Disagreements between sources",
        "## Missing evidence",
    ):
        assert section in md


# -- a real run: the committed fixture (tests/data/autopsy) -------------------------------------


# The fixtures real_run and real_tracked (with its MLflow store) are in conftest.py.


def test_real_log_parses_every_job(real_run):
    inv = sources.parse_snakemake_log(real_run.log)
    logged = real_run.logged_rules()
    assert len(inv.jobs) == len(logged) > 0
    assert Counter(j.rule for j in inv.jobs) == Counter(logged) == Counter(inv.job_stats)
    assert set(inv.job_stats) == {
        "dashboard",
        "freeze",
        "schedule",
        "sweep",
        "track",
        "normalize",
        "analyze",
        "capacity",
        "failure_drill",
        "report",
        "failure_analyze",
        "failure_test",
        "autopsy",
        "all",
    }
    assert all(j.status == "finished" and j.log_end is not None for j in inv.jobs)
    assert inv.complete and inv.elapsed_s == pytest.approx(real_run.elapsed_s())
    assert inv.header_date == pytest.approx(inv.started, abs=1.0)


@pytest.mark.parametrize("full", [True, False], ids=["full-run", "latest"])
def test_real_run_autopsy_buckets_add_up(request, full):
    real = request.getfixturevalue("real_tracked" if full else "real_run")
    doc = run.run_autopsy(
        real.results,
        real.log_dir,
        real.root,
        real.pack,
        real.mlflow_db if full else None,
        log_path=real.log if full else None,
    )
    json.dumps(doc, allow_nan=False)
    assert doc["invocation"]["log"] == str(real.log)
    assert doc["invocation"]["jobs_executed"] == len(real.logged_rules())
    rows = doc["buckets"]["rows"]
    assert [r["bucket"] for r in rows] == list(buckets.BUCKETS)
    wall = doc["critical_path"]["wall_clock_s"]
    assert abs(sum(r["seconds"] for r in rows) - wall) < 1e-3
    # The last end is Snakemake's last stamp; its Elapsed time adds shutdown and truncation.
    assert real.elapsed_s() - 2.0 <= wall <= real.elapsed_s() + 1e-3
    assert doc["buckets"]["unknown_rules"] == []
    # Every measurement holds the one target's resource, so they never overlap (within the
    # stamps' 1 s), and a gate that is neither data nor a retry is the slot exactly when both
    # jobs hold the same target.
    tl = {t["job"]: t for t in doc["timeline"]}
    meas = sorted(
        (t for t in tl.values() if t["rule"] in sources.MEASUREMENT_RULES),
        key=lambda t: t["t_start"],
    )
    assert len({t["target_resource"] for t in meas}) == 1 and meas[0]["target_resource"]
    assert all(b["t_start"] >= a["t_end"] - 1.0 for a, b in zip(meas, meas[1:], strict=False))
    path = doc["critical_path"]["jobs"]
    # Sweeps of one target hold its resource, so some wait for one another on the path.
    assert doc["critical_path"]["gates"].get("target_slot", 0) > 0
    assert path[0]["gate"] == "first" and len(path) == doc["critical_path"]["n_jobs"]
    for prev, cur in zip(path, path[1:], strict=False):
        assert cur["gated_by"] == prev["job"]
        if cur["gate"] in ("core", "target_slot"):
            held = tl[cur["job"]]["target_resource"]
            same = bool(held) and held == tl[prev["job"]]["target_resource"]
            assert cur["gate"] == ("target_slot" if same else "core"), (prev, cur)
    # Every measurement job's records are in the fixture: each has a clock check, and a clean
    # host's clocks agree, so each measurement on the path is split by its own load window.
    assert len(doc["clock_check"]["jobs"]) == len(meas) > 0
    assert all(j["clock_valid"] for j in doc["clock_check"]["jobs"])
    # What is invalid is exactly the benchmarks that disagree with the log (none were
    # overwritten: the fixture holds one invocation), and the disagreements table counts them.
    ran = [t for t in tl.values() if t["end_s"] is not None and t["bench_s"] is not None]
    assert all(t["bench_this_run"] for t in ran)
    off = [t["label"] for t in ran if not t["bench_consistent"]]
    invalid = doc["clock_check"]["invalid_figures"]
    assert len(invalid) == len(off) and all(any(o in f for f in invalid) for o in off)
    assert doc["clock_check"]["valid"] == (not off)
    (bench,) = [d for d in doc["disagreements"] if d["sources"].startswith("benchmark s vs")]
    assert (bench["checked"], bench["disagreeing"]) == (len(ran), len(off))
    on_path = [j for j in path if j["rule"] in sources.MEASUREMENT_RULES]
    assert {j["split"] for j in on_path} <= {"records"}
    for j in on_path:
        assert j["task_intrinsic"] > 0 and j["task_intrinsic"] <= j["work_s"] + 1e-9
    assert "## Missing evidence" in markdown.run_autopsy_markdown(doc)
    missing = {m["gap"] for m in doc["missing_evidence"]}
    if full:
        recorded = json.loads((real.fixture / "mlflow_runs.json").read_text())
        assert doc["mlflow"]["runs"] == len(recorded)
        stages = {s["stage"]: s for s in doc["mlflow"]["stages"]}
        assert set(stages) == {"schedule", "sweep", "analysis", "failure"}
        # Child runs are logged by the track jobs, after the jobs they record ended.
        for s in stages.values():
            assert s["in_this_invocation"] == s["runs"] > 0
            assert s["lag_after_jobs_s"] > 0
        assert "MLflow cross-check" not in missing
    else:
        assert doc["mlflow"]["runs"] is None and "MLflow cross-check" in missing


def test_a_quiet_invocation_still_gets_its_request_autopsy(real_run, tmp_path):
    """`snakemake -q` writes a log without job records: the run has no timeline to autopsy, so
    autopsy.md says why and still holds the requests' autopsy (the pack does not fail)."""
    import logging

    from capacity_pack.plan.manifest import load_pack
    from capacity_pack.stages import entry

    quiet = tmp_path / "quiet-log"
    quiet.mkdir()
    header = real_run.log_text().split("Building DAG of jobs...")[0]
    (quiet / "2026-12-02T000000.000000.snakemake.log").write_text(
        header + "Building DAG of jobs...\n"
    )
    with pytest.raises(run.NoRunLog, match="-q"):
        run.run_autopsy(real_run.results, quiet, real_run.root, real_run.pack, None)
    out = tmp_path / "out"
    doc = entry("autopsy")(
        pack=load_pack(real_run.fixture / "pack.yaml"),
        results_dir=real_run.results,
        log_dir=quiet,
        repo_dir=real_run.root,
        markdown=out / "autopsy.md",
        json_path=out / "autopsy.json",
        log=logging.getLogger("test"),
    )
    assert "-q" in doc["run"]["unavailable"]
    md = (out / "autopsy.md").read_text()
    assert "## The run\n\nNot autopsied: " in md
    assert "# Request autopsy" in md
    assert json.loads((out / "autopsy.json").read_text())["requests"] == doc["requests"]
