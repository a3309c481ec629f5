"""The real Snakemake pipeline on a small pack: outputs, MLflow lineage, rerun-only-what-changed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

pytestmark = pytest.mark.slow


def small_pack() -> dict:
    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    data["pack"]["name"] = "pipeline-test"
    data["sweep"].update(open_loop_rps=[10, 20], closed_loop_concurrency=[1], repeats=1)
    data["experiments"] = []
    return data


def write_pack(workdir: Path, data: dict) -> Path:
    path = workdir / "pack.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    res = subprocess.run(
        [
            *SNAKEMAKE,
            "-s",
            str(ROOT / "Snakefile"),
            "--directory",
            str(workdir),
            "--configfile",
            str(workdir / "pack.yaml"),
            "--cores",
            "2",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if check and res.returncode != 0:
        raise AssertionError(f"snakemake failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def planned_jobs(workdir: Path) -> list[str]:
    """Jobs a dry run would execute, as 'rule' or 'rule:point/cache/repN'."""
    res = snakemake(workdir, "--dry-run", "--quiet", "rules")
    out = snakemake(workdir, "--dry-run")
    jobs = []
    for block in re.split(r"\n(?=rule \w+:|localrule \w+:)", out.stdout):
        m = re.match(r"(?:local)?rule (\w+):", block.strip())
        if not m:
            continue
        w = re.search(r"wildcards: point=([^,\s]+), cache=(\w+), repeat=(\d+)", block)
        jobs.append(f"{m.group(1)}:{w.group(1)}/{w.group(2)}/rep{w.group(3)}" if w else m.group(1))
    assert res.returncode == 0
    return sorted(j for j in jobs if j != "all")


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("pack")
    write_pack(workdir, small_pack())
    snakemake(workdir)
    return workdir


def test_pipeline_writes_frozen_manifest_and_schedules(ran):
    results = ran / "results" / "pipeline-test"
    frozen = json.loads((results / "manifest" / "frozen.json").read_text())
    assert frozen["derived"]["weighted_mean_input_tokens"] == pytest.approx(460.8)
    keys = sorted(
        str(p.parent.relative_to(results / "schedules"))
        for p in results.glob("schedules/*/*/*/schedule.parquet")
    )
    assert keys == sorted(
        f"{pt}/{c}/rep0" for pt in ("open-r10", "open-r20", "closed-c1") for c in ("cold", "warm")
    )
    for job in ("freeze", "schedule/open-r10/cold/rep0"):
        assert (results / "logs" / f"{job}.log").exists()
        assert (results / "benchmarks" / f"{job}.tsv").exists()


def test_mlflow_holds_parent_and_child_runs(ran):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ran}/results/mlflow.db")
    exp = client.get_experiment_by_name("capacity-pack/pipeline-test")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    frozen = json.loads((ran / "results/pipeline-test/manifest/frozen.json").read_text())
    parents = [r for r in runs if r.data.tags.get("capacity_pack.run_kind") == "parent"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags["capacity_pack.manifest_sha256"] == frozen["sha256"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 6
    for child in children:
        tags = child.data.tags
        assert tags["capacity_pack.stage"] == "schedule"
        assert tags["capacity_pack.cache_state"] in {"cold", "warm"}
        assert tags["capacity_pack.repeat"] == "0"
        assert tags["capacity_pack.point"] in {"open-r10", "open-r20", "closed-c1"}
        assert tags["capacity_pack.model.revision"] == "sim-small-r1"
        assert tags["capacity_pack.engine.version"] == "0.1.0"
        assert tags["capacity_pack.model.tokenizer_revision"] == "capacity-pack-ws-v1"
        assert tags["capacity_pack.section.client"] == frozen["section_sha256"]["client"]
        assert re.fullmatch(r"[0-9a-f]{40}|unknown", tags["capacity_pack.git_commit"])
        assert child.data.metrics["scheduled_requests"] > 0


def test_nothing_to_do_after_a_complete_run(ran):
    assert planned_jobs(ran) == []


def test_changed_acceptance_reruns_freeze_only(ran):
    data = small_pack()
    data["acceptance"]["class_slo_attainment_min"] = 0.99
    write_pack(ran, data)
    try:
        assert planned_jobs(ran) == ["freeze", "track_schedules"]
    finally:
        write_pack(ran, small_pack())


def test_added_rate_adds_only_that_rates_jobs(ran):
    data = small_pack()
    data["sweep"]["open_loop_rps"] = [10, 20, 30]
    write_pack(ran, data)
    try:
        assert planned_jobs(ran) == [
            "freeze",
            "schedule:open-r30/cold/rep0",
            "schedule:open-r30/warm/rep0",
            "track_schedules",
        ]
    finally:
        write_pack(ran, small_pack())


def test_changed_seed_reruns_every_schedule(ran):
    data = small_pack()
    data["client"]["request_schedule_seed"] += 1
    write_pack(ran, data)
    try:
        jobs = planned_jobs(ran)
        assert jobs[0] == "freeze" and jobs[-1] == "track_schedules"
        assert sorted(jobs[1:-1]) == sorted(
            f"schedule:{p}/{c}/rep0"
            for c in ("cold", "warm")
            for p in ("open-r10", "open-r20", "closed-c1")
        )
    finally:
        write_pack(ran, small_pack())


def test_new_manifest_gets_its_own_parent_with_every_child(ran):
    """Changing the gate reuses the schedules but logs them again under the new parent."""
    from mlflow import MlflowClient

    data = small_pack()
    data["acceptance"]["error_rate_max"] = 0.02
    write_pack(ran, data)
    try:
        snakemake(ran)
        snakemake(ran, "--forcerun", "track_schedules")  # tracking twice logs nothing twice
        client = MlflowClient(tracking_uri=f"sqlite:///{ran}/results/mlflow.db")
        exp = client.get_experiment_by_name("capacity-pack/pipeline-test")
        runs = client.search_runs([exp.experiment_id], max_results=1000)
        parents = [r for r in runs if r.data.tags.get("capacity_pack.run_kind") == "parent"]
        assert len(parents) == 2
        for parent in parents:
            kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
            assert len(kids) == 6
            assert len({r.data.tags["capacity_pack.job"] for r in kids}) == 6
    finally:
        write_pack(ran, small_pack())
        snakemake(ran)


def test_invalid_config_fails_before_any_job(tmp_path):
    data = small_pack()
    data["workload"][1]["request_tpot_cutoff_ms"] = "fast"
    write_pack(tmp_path, data)
    res = snakemake(tmp_path, check=False)
    assert res.returncode != 0
    assert "workload.1.request_tpot_cutoff_ms" in res.stderr + res.stdout
    assert not (tmp_path / "results").exists()


def test_lint_findings_stop_the_pipeline(tmp_path):
    data = small_pack()
    data["client"]["warmup_seconds"] = 0
    write_pack(tmp_path, data)
    res = snakemake(tmp_path, check=False)
    assert res.returncode != 0
    assert "no-warmup" in res.stderr + res.stdout
    assert not (tmp_path / "results").exists()
