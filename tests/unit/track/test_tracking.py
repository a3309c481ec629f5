"""MLflow tracking against a real SQLite store: parent and child runs, params, artifacts, the
URI override, secret scrubbing, and several processes logging at once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import pytest

from capacity_pack.plan.manifest import SECTIONS, freeze, load_pack
from capacity_pack.track import tracking
from tests.paths import ROOT
from tests.processes import start_together

CONFIG = ROOT / "config" / "config.yaml"


@pytest.fixture(autouse=True)
def _mlflow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's own MLFLOW_TRACKING_URI must not redirect the tests; no telemetry offline.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(scope="module")
def frozen() -> dict:
    return freeze(load_pack(CONFIG))


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated, empty store; copying it spares each test MLflow's ~2 s migration."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        MlflowClient(tracking_uri=f"sqlite:///{db}")
    return db


@pytest.fixture
def results(tmp_path: Path, template_db: Path) -> Path:
    out = tmp_path / "results"
    out.mkdir()
    shutil.copy(template_db, out / "mlflow.db")
    return out


def client_for(results: Path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking.tracking_uri(results))


def parent_runs(results: Path, frozen: dict) -> list:
    from mlflow.entities import ViewType

    client = client_for(results)
    exp = client.get_experiment_by_name(tracking.experiment_name("rehearsal-sim"))
    return client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`capacity_pack.manifest_sha256` = '{frozen['sha256']}' "
        "and tags.`capacity_pack.run_kind` = 'parent'",
        run_view_type=ViewType.ALL,
    )


def artifact_dir(run) -> Path:
    return Path(url2pathname(urlparse(run.info.artifact_uri).path))


def test_names_and_default_uri(tmp_path: Path) -> None:
    assert tracking.experiment_name("rehearsal-sim") == "capacity-pack/rehearsal-sim"
    assert (
        tracking.tracking_uri(tmp_path / "r") == f"sqlite:///{(tmp_path / 'r').resolve()}/mlflow.db"
    )


def test_import_does_not_load_mlflow() -> None:
    code = "import sys, capacity_pack.track.tracking; assert 'mlflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_parent_created_once_and_found_again(results: Path, frozen: dict) -> None:
    assert tracking.find_parent_run(frozen, results_dir=results) is None
    first = tracking.ensure_parent_run(frozen, results_dir=results)
    assert tracking.ensure_parent_run(frozen, results_dir=results) == first
    assert tracking.find_parent_run(frozen, results_dir=results) == first
    assert [r.info.run_id for r in parent_runs(results, frozen)] == [first]

    client = client_for(results)
    run = client.get_run(first)
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.name == "capacity-pack/rehearsal-sim"
    assert exp.artifact_location == (results / "mlartifacts" / "rehearsal-sim").resolve().as_uri()
    assert run.info.run_name == f"rehearsal-sim @ {frozen['sha256'][:12]}"
    assert run.info.status == "FINISHED"

    tags = run.data.tags
    manifest = frozen["manifest"]
    expected = {
        "capacity_pack.run_kind": "parent",
        "capacity_pack.manifest_sha256": frozen["sha256"],
        "capacity_pack.pack": "rehearsal-sim",
        "capacity_pack.pack_size": "rehearsal",
        "capacity_pack.pack_label": frozen["derived"]["pack_label"],
        "capacity_pack.model.id": manifest["model"]["id"],
        "capacity_pack.model.revision": manifest["model"]["revision"],
        "capacity_pack.model.tokenizer_revision": manifest["model"]["tokenizer_revision"],
        "capacity_pack.model.precision": manifest["model"]["precision"],
        "capacity_pack.engine.name": manifest["engine"]["name"],
        "capacity_pack.engine.version": manifest["engine"]["version"],
    }
    expected["capacity_pack.section_sha256"] = json.dumps(
        {s: frozen["section_sha256"][s] for s in sorted(SECTIONS)}, separators=(",", ":")
    )
    assert {k: tags.get(k) for k in expected} == expected
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    assert tags["capacity_pack.git_commit"] == (
        head.stdout.strip() if head.returncode == 0 else "unknown"
    )
    assert tags["capacity_pack.git_dirty"] in {"true", "false", "unknown"}

    logged = json.loads((artifact_dir(run) / "frozen_manifest.json").read_text())
    assert logged == frozen


def test_parent_params_are_flattened_settings(results: Path, frozen: dict) -> None:
    params = (
        client_for(results)
        .get_run(tracking.ensure_parent_run(frozen, results_dir=results))
        .data.params
    )
    assert params["client.request_schedule_seed"] == "20261129"
    assert params["workload.interactive.mix"] == "0.5"
    assert params["workload.long_context.input_tokens.p50"] == "960.0"
    assert params["sweep.open_loop_rps"] == "[]"
    assert params["sweep.search.initial"] == "predicted"
    assert params["engine.placement.tp"] == "1"
    assert params["experiments.spike_smoke.segments.0.rate_rps"] == "10.0"
    assert params["pack.size"] == "rehearsal"
    assert "workload.interactive.name" not in params  # the name is the key
    assert all(not isinstance(v, dict) for v in params.values())


def test_child_run_carries_parent_tags_params_metrics_artifacts(
    results: Path, frozen: dict, tmp_path: Path
) -> None:
    (tmp_path / "summary.json").write_text('{"ok": true}\n')
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "ttft.txt").write_text("p99\n")
    run_id = tracking.log_child_run(
        frozen,
        stage="loadgen",
        job="open_loop",
        point="rps_10",
        cache_state="warm",
        repeat=2,
        params={"rate_rps": 10.0, "schedule": {"seed": 7, "classes": ["a", "b"]}},
        metrics={"ttft_p99_ms": 123.5, "goodput_rps": 9, "ttft_p999_ms": None},
        tags={"host": "node-1"},
        artifacts=[tmp_path / "summary.json", tmp_path / "plots"],
        results_dir=results,
    )
    parent = tracking.find_parent_run(frozen, results_dir=results)
    run = client_for(results).get_run(run_id)
    tags = run.data.tags
    manifest = frozen["manifest"]
    expected = {
        "mlflow.parentRunId": parent,
        "capacity_pack.run_kind": "child",
        "capacity_pack.stage": "loadgen",
        "capacity_pack.job": "open_loop",
        "capacity_pack.point": "rps_10",
        "capacity_pack.cache_state": "warm",
        "capacity_pack.repeat": "2",
        "capacity_pack.manifest_sha256": frozen["sha256"],
        "capacity_pack.model.revision": manifest["model"]["revision"],
        "capacity_pack.model.tokenizer_revision": manifest["model"]["tokenizer_revision"],
        "capacity_pack.engine.version": manifest["engine"]["version"],
        "capacity_pack.git_commit": tracking.git_state()[0],
        "capacity_pack.metrics_withheld": "ttft_p999_ms",
        "host": "node-1",
    }
    expected["capacity_pack.section_sha256"] = json.dumps(
        {s: frozen["section_sha256"][s] for s in sorted(SECTIONS)}, separators=(",", ":")
    )
    assert {k: tags.get(k) for k in expected} == expected
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "loadgen open_loop rps_10 warm r2"
    assert run.data.params == {
        "rate_rps": "10.0",
        "schedule.seed": "7",
        "schedule.classes": '["a", "b"]',
        # What defines every run of the manifest: its target, engine and model.
        **tracking.identity_params(frozen),
    }
    assert run.data.metrics == {"ttft_p99_ms": 123.5, "goodput_rps": 9.0}

    where = artifact_dir(run)
    assert where.is_relative_to((results / "mlartifacts").resolve())
    assert (where / "summary.json").read_text() == '{"ok": true}\n'
    assert (where / "plots" / "ttft.txt").read_text() == "p99\n"

    other = tracking.log_child_run(frozen, stage="analysis", job="fit", results_dir=results)
    assert [r.info.run_id for r in tracking.child_runs(frozen, results_dir=results)] == [
        run_id,
        other,
    ]
    assert [
        r.info.run_id for r in tracking.child_runs(frozen, results_dir=results, stage="analysis")
    ] == [other]
    assert len(parent_runs(results, frozen)) == 1


def test_long_values_and_odd_keys_are_shortened_not_refused(results: Path, frozen: dict) -> None:
    run_id = tracking.log_child_run(
        frozen,
        stage="s",
        job="j",
        params={"long": "x" * 10_000, "k" * 300: 1, "odd key?/../x": 2},
        tags={"long_tag": "y" * 9_000},
        results_dir=results,
    )
    run = client_for(results).get_run(run_id)
    long_value = run.data.params["long"]
    assert len(long_value) <= 6000 and "truncated: 10000 chars" in long_value
    assert long_value.startswith("x" * 5000)
    long_keys = [k for k in run.data.params if k.startswith("kkk")]
    assert len(long_keys) == 1 and len(long_keys[0]) <= 250
    assert run.data.params["odd key__.._x"] == "2"
    assert len(run.data.tags["long_tag"]) <= 8000
    with pytest.raises(ValueError, match="appear twice"):
        tracking.log_child_run(
            frozen, stage="s", job="j", params={"a.b": 1, "a": {"b": 2}}, results_dir=results
        )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_metrics_are_refused_before_any_write(
    results: Path, frozen: dict, bad: float
) -> None:
    with pytest.raises(ValueError, match="metrics must be finite.*ttft_ms"):
        tracking.log_child_run(
            frozen, stage="s", job="j", metrics={"ok_ms": 1.0, "ttft_ms": bad}, results_dir=results
        )
    assert tracking.child_runs(frozen, results_dir=results) == []
    with pytest.raises(TypeError, match="must be a number"):
        tracking.log_child_run(
            frozen, stage="s", job="j", metrics={"ttft_ms": "fast"}, results_dir=results
        )


def test_tracking_uri_override(
    results: Path, frozen: dict, template_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(template_db, elsewhere / "other.db")
    uri = f"sqlite:///{elsewhere / 'other.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert tracking.tracking_uri(results) == uri

    (results / "mlflow.db").unlink()
    parent = tracking.ensure_parent_run(frozen, results_dir=results)
    child = tracking.log_child_run(frozen, stage="s", job="j", results_dir=results)
    assert not (results / "mlflow.db").exists()
    assert (elsewhere / "other.db.lock").exists()
    assert tracking.find_parent_run(frozen, results_dir=results) == parent
    assert [r.info.run_id for r in tracking.child_runs(frozen, results_dir=results)] == [child]

    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking.find_parent_run(frozen, results_dir=results) is None


@pytest.mark.parametrize(
    "key",
    ["api_key", "OPENAI_API_KEY", "apiKey", "hf_token", "token", "access_token_value",
     "Authorization", "db_password", "client_secret", "aws.credentials", "session_cookie"],
)  # fmt: skip
def test_secret_looking_keys(key: str) -> None:
    assert tracking.looks_secret(key)


@pytest.mark.parametrize(
    "key",
    ["input_tokens", "workload.interactive.output_tokens", "model.tokenizer_revision",
     "time_to_first_token_ms", "max_num_batched_tokens", "cache_key_prefix", "monkey"],
)  # fmt: skip
def test_ordinary_keys(key: str) -> None:
    assert not tracking.looks_secret(key)


def test_secrets_never_reach_mlflow(
    results: Path, frozen: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cr3t-value-0123456789"
    monkeypatch.setenv("CAPACITY_PACK_TEST_API_TOKEN", secret)
    # A "secret" equal to a manifest value shows the parent's params, tags and artifact too.
    monkeypatch.setenv("CAPACITY_PACK_TEST_MODEL_KEY", frozen["manifest"]["model"]["revision"])
    run_id = tracking.log_child_run(
        frozen,
        stage="s",
        job="j",
        params={
            "api_key": "abc-not-in-env",
            "target": {"hf_token": "hf_xyz"},
            "endpoint_auth": secret,
            "header": f"Bearer {secret}",
            "input_tokens": 5,
            "time_to_first_token_ms": 250,
        },
        tags={"Authorization": "Bearer zzz", "DB_PASSWORD": "pw", "leak": secret, "ok": "yes"},
        results_dir=results,
    )
    client = client_for(results)
    run = client.get_run(run_id)
    identity = tracking.identity_params(frozen)
    del identity["model_revision"]  # the "secret" above: scrubbed like any other value
    assert run.data.params == {"input_tokens": "5", "time_to_first_token_ms": "250", **identity}
    assert run.data.tags["ok"] == "yes"
    for key in ("Authorization", "DB_PASSWORD", "leak"):
        assert key not in run.data.tags
    dropped = set(run.data.tags["capacity_pack.redacted"].split(","))
    assert {"api_key", "target.hf_token", "endpoint_auth", "header", "leak"} <= dropped
    assert {"capacity_pack.model.revision", "model_revision"} <= dropped

    parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    assert "model.revision" not in parent.data.params
    assert "model.id" in parent.data.params
    assert "capacity_pack.model.revision" not in parent.data.tags
    parent_dropped = set(parent.data.tags["capacity_pack.redacted"].split(","))
    assert {"frozen_manifest.json", "model.revision", "capacity_pack.model.revision"} <= (
        parent_dropped
    )

    stored = [results / "mlflow.db", *(results / "mlartifacts").rglob("*")]
    for path in stored:
        if path.is_file():
            data = path.read_bytes()
            for value in (secret, "abc-not-in-env", "hf_xyz", "Bearer zzz", "sim-small-r1"):
                assert value.encode() not in data, f"{value!r} leaked into {path}"


WORKER = """
import json, sys, time
from pathlib import Path

import mlflow  # imported before the start line so that the processes log at the same moment
from capacity_pack.track import tracking

frozen = json.loads(Path(sys.argv[1]).read_text())
results, start = Path(sys.argv[2]), Path(sys.argv[3])
worker, runs, metrics = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
(start.parent / f"ready-{worker}").touch()
while not start.exists():
    time.sleep(0.005)
for i in range(runs):
    tracking.log_child_run(
        frozen, stage="loadgen", job=f"w{worker}", point=f"p{i}", repeat=i,
        metrics={f"m{k}_ms": worker * 1000 + i * 10 + k for k in range(metrics)},
        results_dir=results,
    )
"""


@pytest.mark.slow
def test_parallel_processes_lose_nothing(frozen: dict, tmp_path: Path) -> None:
    workers, runs, metrics = 4, 5, 8
    results = tmp_path / "results"  # no database yet: creation and migration race too
    (tmp_path / "frozen.json").write_text(json.dumps(frozen))
    start = tmp_path / "start"
    common = [str(tmp_path / "frozen.json"), str(results), str(start)]
    argvs = [
        [sys.executable, "-c", WORKER, *common, str(w), str(runs), str(metrics)]
        for w in range(workers)
    ]
    procs = start_together(argvs, tmp_path, start, dict(os.environ))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out

    assert len(parent_runs(results, frozen)) == 1
    children = tracking.child_runs(frozen, results_dir=results)
    assert len(children) == workers * runs
    seen = set()
    for run in children:
        worker = int(run.data.tags["capacity_pack.job"].removeprefix("w"))
        i = int(run.data.tags["capacity_pack.repeat"])
        seen.add((worker, i))
        assert run.info.status == "FINISHED"
        assert run.data.metrics == {
            f"m{k}_ms": float(worker * 1000 + i * 10 + k) for k in range(metrics)
        }
    assert seen == {(w, i) for w in range(workers) for i in range(runs)}
