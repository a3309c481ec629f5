"""The API key: read only from the environment variable ``target.api_key_env`` names, sent with
every request, and never written: not in records, summaries, metrics, logs, the frozen manifest,
error messages, or MLflow (params, tags, the SQLite store, artifacts)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from starlette.responses import JSONResponse

from capacity_pack.io import write_json_atomic
from capacity_pack.measure.records import read_records
from capacity_pack.measure.run import run_point
from capacity_pack.measure.settings import LoadSettings
from capacity_pack.measure.sweep import measure_point
from capacity_pack.measure.target import SimProcess, TargetError, open_target
from capacity_pack.plan import schedule as S
from capacity_pack.plan.manifest import SimTarget, freeze, validate_pack
from capacity_pack.track import tracking
from capacity_pack.track.records import sweep as sweep_record
from tests.conftest import pack_data
from tests.paths import ROOT
from tests.processes import stop_group
from tests.unit.engines.test_engines import MODEL, Fake, expected, openai, point_facts, serve, vllm
from tests.unit.measure.test_loadgen import constant_schedule


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(variable name, key): a name no secret heuristic recognises, so only api_key_env can
    tell the key apart."""
    name = f"CP_ENDPOINT_{secrets.token_hex(4).upper()}"
    value = f"sk-{secrets.token_urlsafe(24)}"
    monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return name, value


def leaks(root: Path, secret: str) -> list[str]:
    """Files under ``root`` holding ``secret`` (bytes, so SQLite pages and parquet count)."""
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_a_measured_and_tracked_point_never_stores_the_key(tmp_path, key):
    name, secret = key
    results = tmp_path / "results"
    with SimProcess(SimTarget(kind="sim", profile="small-fast"), "sim-small") as sim:
        data = pack_data()
        data["target"] = {"kind": "openai", "base_url": sim.base_url, "cache_reset": "vllm",
                          "api_key_env": name}  # fmt: skip
        data["client"].update(initial_scheduled_requests=20, minimum_duration_seconds=1,
                              warmup_seconds=0.2, maximum_duration_seconds=2)  # fmt: skip
        data["client"].pop("class_schedule_counts")
        data["acceptance"]["min_successful_samples_per_class"] = 3
        pack = validate_pack(data)
        frozen = freeze(pack)
        write_json_atomic(results / pack.pack.name / "frozen_manifest.json", frozen)
        point = S.Point(mode="open", rate_rps=30, cache_state="cold", repeat=0)
        out = results / pack.pack.name / "sweep" / point.key
        summary = measure_point(pack, point, S.build_schedule(pack, point), out)
    write_json_atomic(out / "summary.json", summary)
    assert summary["failed"] == 0 and summary["cache_empty_verified"] is True
    assert summary["engine_identity"]["kind"] == "capacity-pack-sim"
    assert summary["identity_mismatches"] == [] and summary["tls_verify"] is True
    assert frozen["manifest"]["target"]["api_key_env"] == name

    runs = tracking.log_stage(
        frozen, lambda _path, doc: sweep_record(doc), [out / "summary.json"], results_dir=results
    )
    # An artifact that captured the key (a server log, say) is stored redacted, or not at all.
    (tmp_path / "server-notes.txt").write_text(f"auth header was Bearer {secret}\n")
    (tmp_path / "dump.bin").write_bytes(b"\x00\xff" + secret.encode() + b"\x00\xfe")
    run_id = tracking.log_child_run(
        frozen, stage="sweep", job="extra", params={"note": f"x {secret}", "rate": 30},
        tags={"echo": secret}, artifacts=[tmp_path / "server-notes.txt", tmp_path / "dump.bin"],
        results_dir=results,
    )  # fmt: skip
    assert len(runs) == 1 and run_id

    assert (results / "mlflow.db").is_file() and list((results / "mlartifacts").rglob("*.json"))
    assert leaks(results, secret) == []
    from mlflow import MlflowClient

    run = MlflowClient(tracking_uri=tracking.tracking_uri(results)).get_run(run_id)
    assert set(run.data.tags["capacity_pack.redacted"].split(",")) >= {
        "note", "echo", "artifact:server-notes.txt", "artifact:dump.bin"
    }  # fmt: skip
    stored = [p for p in (results / "mlartifacts").rglob("server-notes.txt")]
    assert [p.read_text() for p in stored] == ["auth header was Bearer [redacted]\n"]
    assert not list((results / "mlartifacts").rglob("dump.bin"))


def test_the_key_is_sent_with_every_request_and_scrubbed_from_what_echoes_it(tmp_path, key):
    name, secret = key
    answers = vllm()
    # A careless server quoting the credential back in its errors.
    answers["POST /v1/completions"] = lambda r: JSONResponse(
        {"error": {"message": f"bad key: {r.headers.get('authorization')}"}}, status_code=401
    )
    answers["POST /reset_prefix_cache"] = lambda r: JSONResponse(
        {"error": f"refused for {r.headers.get('authorization')}"}, status_code=403
    )
    fake = Fake(answers)
    with serve(fake.app) as url:
        target = openai(url, api_key_env=name, cache_reset="vllm")
        with open_target(target, MODEL, "warm", expected=expected("vllm", "0.11.0")) as (_, f):
            assert leaks_in(f, secret) == []
        with pytest.raises(TargetError) as err:
            point_facts(target, MODEL, "cold", expected("vllm", "0.11.0"))
        assert secret not in str(err.value) and "[redacted]" in str(err.value)
        settings = LoadSettings(base_url=url, model=MODEL, mode="open", request_timeout_s=5,
                                api_key_env=name, metrics_interval_s=0.1)  # fmt: skip
        records = tmp_path / "records.jsonl"
        run_point(constant_schedule(2, 20), settings, records, metrics_path=tmp_path / "m.pq")
    (rec, _) = read_records(records)
    assert rec["http_status"] == 401 and "[redacted]" in rec["error"]
    assert leaks(tmp_path, secret) == []
    # Probes, scrapes, the reset and the requests all carried the key.
    bearer = f"Bearer {secret}"
    sent = {(m, p): h.get("authorization") for m, p, _, h in fake.calls}
    for call in [("GET", "/version"), ("GET", "/v1/models"), ("GET", "/metrics"),
                 ("POST", "/reset_prefix_cache"), ("POST", "/v1/completions")]:  # fmt: skip
        assert sent[call] == bearer, call


def leaks_in(obj: object, secret: str) -> list[str]:
    text = json.dumps(obj, default=str)
    return [secret] if secret in text else []


# ---------------------------------------------------------------------------------------------
# A tracking password in MLFLOW_TRACKING_URI: no job log, no console line, no file holds it
# ---------------------------------------------------------------------------------------------

TRACK_PACK = "redact-test"


@pytest.fixture(scope="module")
def sqlite_server(tmp_path_factory: pytest.TempPathFactory):
    """A real ``mlflow server`` on 127.0.0.1 over a SQLite store (outside the run directory)."""
    import subprocess
    import sys

    from tests.integration.test_tracking_server import free_port, quiet_mlflow_env, wait_healthy

    base = tmp_path_factory.mktemp("mlflow-sqlite-server")
    log = base / "server.log"
    port = free_port()
    cmd = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--backend-store-uri", f"sqlite:///{base / 'mlflow.db'}",
        "--serve-artifacts", "--artifacts-destination", str(base / "artifacts"),
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=quiet_mlflow_env(),
                                cwd=base, start_new_session=True)  # fmt: skip
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        yield port
    finally:
        stop_group(proc)


@pytest.mark.slow
def test_a_tracking_password_reaches_no_file_and_no_console(tmp_path, sqlite_server):
    from tests.conftest import run_snakemake, small_pack_data, write_pack
    from tests.integration.test_tracking_server import free_port, quiet_mlflow_env

    password = "pw-" + secrets.token_hex(8)
    data = small_pack_data(TRACK_PACK, requests=20, min_samples=3,
                           sweep={"open_loop_rps": [10], "closed_loop_concurrency": [1],
                                  "cache_states": ["warm"]})  # fmt: skip
    data.pop("failure")
    write_pack(tmp_path, data)
    target = f"results/{TRACK_PACK}/tracking/point.json"
    env = quiet_mlflow_env()
    env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"  # the failing run fails at once
    # First a tracking server that is not there: freeze, which opens the parent run, fails
    # with MLflow's error, which names the URI, password and all.
    env["MLFLOW_TRACKING_URI"] = f"http://alice:{password}@127.0.0.1:{free_port()}"
    failed = run_snakemake(tmp_path, target, check=False, env=env)
    assert failed.returncode != 0
    logs = tmp_path / "results" / TRACK_PACK / "logs"
    text = (logs / "freeze.log").read_text()
    assert "Traceback" in text and "API request to http://alice:[redacted]@127.0.0.1" in text
    assert "MlflowException: API request to http://alice:[redacted]@" in failed.stderr
    assert password not in failed.stdout + failed.stderr
    assert leaks(tmp_path, password) == []
    # Then the real server: the jobs track, and MLflow prints "View run ... at <URI>".
    env["MLFLOW_TRACKING_URI"] = f"http://alice:{password}@127.0.0.1:{sqlite_server}"
    ran = run_snakemake(tmp_path, target, env=env)
    assert "View run" in ran.stdout and "alice:[redacted]@127.0.0.1" in ran.stdout
    assert password not in ran.stdout + ran.stderr
    # Each log is its good run's alone: the failure's traceback went with the rerun.
    assert "Traceback" not in (logs / "freeze.log").read_text()
    assert (logs / "track" / "point.log").is_file()
    assert leaks(tmp_path, password) == []


def test_the_command_lines_errors_are_redacted(tmp_path):
    """``capacity-pack``'s own error output: a file named by a URL with a password in it."""
    import subprocess
    import sys

    password = "pw-" + secrets.token_hex(6)
    config = f"http://alice:{password}@127.0.0.1:9/pack.yaml"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "workflow")}
    res = subprocess.run(
        [sys.executable, "-m", "capacity_pack", "freeze", config, "-o", str(tmp_path / "f.json")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2 and "does not exist" in res.stderr
    assert "http://alice:[redacted]@127.0.0.1:9/pack.yaml" in res.stderr
    assert password not in res.stdout + res.stderr
