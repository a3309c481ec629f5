"""A small pack through real Snakemake, tracked by a real shared MLflow server: ``mlflow server``
on 127.0.0.1 with a PostgreSQL backend store (a private cluster from Debian's postgresql,
started here) and proxied artifacts (``mlflow-artifacts:`` URIs served from
``--artifacts-destination``).

The pack's jobs see only ``MLFLOW_TRACKING_URI=http://127.0.0.1:<port>``, as they would with a
team's server (docs/tracking-server.md). The tests read the runs back through the server, read
the ``runs`` table from PostgreSQL itself, and check that nothing fell back to a local SQLite
store or artifact folder.

Needs PostgreSQL's server binaries (``apt-get install postgresql``; .ci/run installs them) and
psycopg2 (the ``test`` extra). Deselect with ``pytest -m "not postgres"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from capacity_pack import redact
from capacity_pack.plan.manifest import freeze, load_pack, validate_pack
from capacity_pack.track import tracking
from tests.conftest import SNAKEMAKE, small_pack_data
from tests.paths import ROOT
from tests.processes import start_together, stop_group

PACK = "server-test"
PG_ROLE = "mlflow"
PG_DATABASE = "mlflow"
# Made up per cluster: it only has to be a secret that appears nowhere in what MLflow stores.
PG_PASSWORD = "pg-test-" + os.urandom(8).hex()
DEBIAN_PG_LIB = Path("/usr/lib/postgresql")


def server_test(fn):
    """Marks a test that needs PostgreSQL (deselect with -m "not postgres") and is slow."""
    return pytest.mark.postgres(pytest.mark.slow(fn))


# ---------------------------------------------------------------------------------------------
# A private PostgreSQL cluster
# ---------------------------------------------------------------------------------------------


def pg_bindir() -> Path:
    """The directory holding initdb and pg_ctl: Debian keeps them off PATH, per major version."""
    on_path = shutil.which("pg_ctl")
    if on_path and Path(on_path).with_name("initdb").exists():
        return Path(on_path).resolve().parent
    versions = sorted(
        DEBIAN_PG_LIB.glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    if versions:
        return versions[-1].parent
    pytest.fail(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's postgresql "
        "(apt-get install --no-install-recommends postgresql; .ci/run does this), or deselect "
        'these tests with pytest -m "not postgres"',
        pytrace=False,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_cluster_owner() -> list[str]:
    """The command prefix that runs PostgreSQL: initdb and postgres refuse to run as root."""
    if os.geteuid() != 0:
        return []
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        pytest.fail(
            "running as root, and there is no postgres system user to run PostgreSQL as: "
            "install Debian's postgresql (it creates the user)",
            pytrace=False,
        )
    return ["runuser", "-u", "postgres", "--"]


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)
    if res.returncode != 0:
        raise AssertionError(f"{cmd} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


@dataclass
class Postgres:
    port: int
    superuser_password: str

    def connect(self, user: str = "postgres", password: str | None = None, db: str = "postgres"):
        import psycopg2

        return psycopg2.connect(
            host="127.0.0.1",
            port=self.port,
            user=user,
            password=password or self.superuser_password,
            dbname=db,
            connect_timeout=10,
        )

    def query(self, sql: str, *args: object, db: str = PG_DATABASE) -> list[tuple]:
        """Rows of ``sql`` as the server's own role, straight from PostgreSQL."""
        conn = self.connect(PG_ROLE, PG_PASSWORD, db)
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall()


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    bindir = pg_bindir()
    prefix = as_cluster_owner()
    # Not under pytest's tmp_path: its parents are private to root, and the cluster's owner
    # (postgres, when the tests run as root) must reach its data directory.
    base = Path(tempfile.mkdtemp(prefix="capacity-pack-pg-"))
    data, sockets, log = base / "data", base / "sockets", base / "postgres.log"
    pg_ctl = [*prefix, str(bindir / "pg_ctl"), "-D", str(data)]
    try:
        if prefix:
            shutil.chown(base, "postgres")
        superuser_password = os.urandom(12).hex()
        pwfile = base / "pwfile"
        pwfile.write_text(superuser_password + "\n")
        if prefix:
            shutil.chown(pwfile, "postgres")
        run([*prefix, "mkdir", "-m", "700", str(sockets)])
        # Password authentication over TCP, as a shared server would use; the unix socket lives
        # in the cluster's own directory so that no system-wide /var/run/postgresql is needed.
        run(
            [*prefix, str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
             f"--pwfile={pwfile}", "--auth-host=scram-sha-256", "--auth-local=peer",
             "-E", "UTF8", "--no-locale", "--no-sync"]
        )  # fmt: skip
        port = free_port()
        # A throwaway cluster: durability (fsync) only costs time here.
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {sockets} -c fsync=off"
        started = subprocess.run(
            [*pg_ctl, "-l", str(log), "-o", options, "-w", "-t", "60", "start"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if started.returncode != 0:
            server_log = log.read_text() if log.exists() else ""
            raise AssertionError(f"PostgreSQL did not start:\n{started.stderr}\n{server_log}")
        pg = Postgres(port, superuser_password)
        # The role and database a team creates for its server (docs/tracking-server.md).
        with contextlib.closing(pg.connect()) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f"CREATE ROLE {PG_ROLE} LOGIN PASSWORD %s", (PG_PASSWORD,))
                cur.execute(f"CREATE DATABASE {PG_DATABASE} OWNER {PG_ROLE}")
        yield pg
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run([*pg_ctl, "-m", "fast", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The MLflow server
# ---------------------------------------------------------------------------------------------


@dataclass
class Server:
    uri: str
    artifacts: Path
    log: Path


def quiet_mlflow_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != tracking.TRACKING_URI_ENV}
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"  # no network here, and nothing to phone home
    return env


@pytest.fixture(scope="module")
def server(postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("mlflow-server")
    artifacts = base / "artifacts"
    log = base / "server.log"
    port = free_port()
    env = quiet_mlflow_env()
    # The password reaches psycopg2 through libpq's PGPASSWORD: never inside the store URI.
    env["PGPASSWORD"] = PG_PASSWORD
    store = f"postgresql://{PG_ROLE}@127.0.0.1:{postgres.port}/{PG_DATABASE}"
    # As docs/tracking-server.md sets a server up: the schema is created (and, after an MLflow
    # upgrade, migrated) by one command, before any client can reach the server.
    run([sys.executable, "-m", "mlflow", "db", "upgrade", store], env=env)
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", store,
        "--serve-artifacts", "--artifacts-destination", str(artifacts),
    ]  # fmt: skip
    with open(log, "wb") as out:
        # Its own session, so that the finalizer stops the server and its uvicorn worker.
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=base, start_new_session=True
        )
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(uri, proc, log)
        yield Server(uri, artifacts, log)
    finally:
        stop_group(proc)


def wait_healthy(uri: str, proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    """Until /health answers: the first start creates MLflow's tables in PostgreSQL first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"mlflow server exited ({proc.returncode}):\n{log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{uri}/health", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"mlflow server not healthy in {timeout_s} s:\n{log.read_text()}")
        time.sleep(0.25)


# ---------------------------------------------------------------------------------------------
# A small pack through Snakemake
# ---------------------------------------------------------------------------------------------


def small_pack() -> dict:
    # Two points, one cache state, no drills: every tracked stage and the parent's decision,
    # in seconds rather than the default pack's minutes.
    data = small_pack_data(
        PACK,
        requests=40,
        min_samples=5,
        sweep={"open_loop_rps": [10], "closed_loop_concurrency": [1], "cache_states": ["warm"]},
    )
    data.pop("failure")
    return data


def snakemake(workdir: Path, uri: str, *args: str) -> subprocess.CompletedProcess:
    env = quiet_mlflow_env()
    env[tracking.TRACKING_URI_ENV] = uri
    cmd = [
        *SNAKEMAKE, "-s", str(ROOT / "Snakefile"),
        "--directory", str(workdir), "--configfile", str(workdir / "pack.yaml"),
        "--cores", "2", *args,
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0:
        raise AssertionError(f"snakemake failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def targets() -> list[str]:
    out = f"results/{PACK}"
    # The points' runs, and the finished pack that publish puts on the parent run.
    return [f"{out}/tracking/point.json", f"{out}/tracking/parent.json"]


@pytest.fixture(scope="module")
def ran(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("pack")
    (workdir / "pack.yaml").write_text(yaml.safe_dump(small_pack(), sort_keys=False))
    snakemake(workdir, server.uri, *targets())
    return workdir


@pytest.fixture
def client(server: Server, monkeypatch: pytest.MonkeyPatch):
    from mlflow import MlflowClient

    monkeypatch.setenv(tracking.TRACKING_URI_ENV, server.uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return MlflowClient(tracking_uri=server.uri)


def frozen_of(workdir: Path) -> dict:
    return json.loads((workdir / f"results/{PACK}/manifest/frozen.json").read_text())


def all_runs(client, name: str) -> list:
    exp = client.get_experiment_by_name(name)
    assert exp is not None, f"no experiment {name!r} on the server"
    return client.search_runs([exp.experiment_id], max_results=1000)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


@server_test
def test_parent_run_per_manifest_on_the_server(ran: Path, client) -> None:
    frozen = frozen_of(ran)
    exp = client.get_experiment_by_name(tracking.experiment_name(PACK))
    # The server chose where the artifacts go: its proxied root, not a path on this machine.
    assert exp.artifact_location.startswith("mlflow-artifacts:"), exp.artifact_location
    runs = all_runs(client, tracking.experiment_name(PACK))
    parents = [r for r in runs if r.data.tags.get(tracking.RUN_KIND) == "parent"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags[tracking.MANIFEST_SHA] == frozen["sha256"]
    assert parent.data.tags[tracking.PARENT_STATE] == "complete"
    assert parent.info.run_name == f"{PACK} @ {frozen['sha256'][:12]}"
    assert parent.data.params["pack.name"] == PACK
    assert parent.data.params["sweep.open_loop_rps"] == "[10.0]"
    # publish put the decision on it: metrics, description, and the pack files under pack/.
    assert parent.data.metrics, "the decision's metrics are missing"
    assert "capacity_pack.decision" in parent.data.tags
    assert "decision, warm: " in parent.data.tags["mlflow.note.content"]
    pack_files = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, "pack")}
    assert {"README.md", "index.html", "autopsy.md"} <= pack_files
    assert tracking.find_parent_run(frozen, results_dir=ran / "results") == parent.info.run_id


@server_test
def test_one_run_per_point(ran: Path, client) -> None:
    frozen = frozen_of(ran)
    parent = tracking.find_parent_run(frozen, results_dir=ran / "results")
    children = tracking.child_runs(frozen, results_dir=ran / "results")
    # Two points (open-r10, closed-c1), warm, one repeat: one run each, named for people.
    assert sorted(c.info.run_name for c in children) == [
        "closed-c1 · warm · rep0",
        "open-r10 · warm · rep0",
    ]
    for child in children:
        tags = child.data.tags
        assert child.info.status == "FINISHED"
        assert tags[tracking.PARENT_RUN_ID] == parent
        assert tags[tracking.RUN_KIND] == "child"
        assert tags[tracking.MANIFEST_SHA] == frozen["sha256"]
        assert tags[tracking.STAGE] == "point"
        assert tags["capacity_pack.cache_state"] == "warm"
        assert json.loads(tags["capacity_pack.section_sha256"]) == frozen["section_sha256"]
        assert child.data.params["cache_state"] == "warm"
        assert child.data.metrics["requests_recorded"] > 0
        assert "observed_goodput_rps" in child.data.metrics
        # Each share's summary went up through the server and lies under its artifact root.
        assert child.info.artifact_uri.startswith("mlflow-artifacts:")
        names = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert names == {"schedule", "sweep", "analysis"}


@server_test
def test_the_mlflow_ui_shows_the_named_points_with_their_params(
    ran: Path, server: Server, client
) -> None:
    """What a person sees in the MLflow UI, in headless Chromium: the experiment's runs table
    with the parent expanded onto its points (named, lasting their measurement windows), and
    the compare view with the params that define each point and its results."""
    import urllib.parse

    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.browser import chromium

    exp = client.get_experiment_by_name(tracking.experiment_name(PACK))
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    frozen = frozen_of(ran)
    points = tracking.child_runs(frozen, results_dir=ran / "results")
    parent = client.get_run(tracking.find_parent_run(frozen, results_dir=ran / "results"))
    base = f"{server.uri}/#/experiments/{exp.experiment_id}"

    def body_shows(browser, *texts: str) -> bool:
        body = browser.find_element(By.TAG_NAME, "body").text
        return all(t in body for t in texts)

    with chromium(1600, 1000) as browser:
        # The runs table re-renders while it loads: a row found a moment ago can be gone when
        # it is read (a CI run failed so), so each look is retried whole, and row texts are read
        # in one script call.
        wait = WebDriverWait(
            browser, 90, poll_frequency=0.25, ignored_exceptions=(StaleElementReferenceException,)
        )
        browser.get(f"{base}/runs?workflowType=machine_learning")

        def row_texts(b) -> list[str]:
            script = "return Array.from(document.querySelectorAll('[role=row]'), r => r.innerText)"
            return b.execute_script(script)

        def open_parent(b) -> bool:
            for r in b.find_elements(By.CSS_SELECTOR, "[role=row]"):
                if parent.info.run_name in r.text:
                    r.find_element(By.CSS_SELECTOR, "button").click()
                    return True
            return False

        # The parent folds its points: its expander opens them, each under its own name, each
        # on a row of the table.
        wait.until(open_parent)
        names = [p.info.run_name for p in points]
        wait.until(lambda b: all(any(n in t for t in row_texts(b)) for n in names))
        for point in points:
            window_s = (point.info.end_time - point.info.start_time) / 1000
            assert window_s > 0.5, "the run lasts its measurement window, not its logging"

        ids = json.dumps([p.info.run_id for p in points])
        query = urllib.parse.urlencode(
            {"runs": ids, "experiments": json.dumps([exp.experiment_id])}
        )
        browser.get(f"{server.uri}/#/compare-runs?{query}")
        wait.until(lambda b: body_shows(b, "Parameters", "offered_rps", *names))
        lines = browser.find_element(By.TAG_NAME, "body").text.splitlines()

        def row_of(key: str) -> list[str]:
            line = next(x for x in lines if x.split(" ")[0] == key)
            return line.split(" ")[1:]

        by_name = {p.info.run_name: p for p in points}
        # The columns, in the order the header lists the runs' names.
        order = [x for x in lines if x in by_name]
        assert sorted(order) == sorted(names)
        assert row_of("mode") == [by_name[n].data.params["mode"] for n in order]
        assert row_of("cache_state") == ["warm"] * len(order)
        assert row_of("offered_rps") == ["10.0"]  # the closed-loop point has none
        assert row_of("engine") == [frozen["manifest"]["engine"]["name"]] * len(order)
        # The results on the same runs (the table lists the first metrics; it scrolls on).
        wait.until(lambda b: body_shows(b, "Metrics", "attempted_requests"))


@server_test
def test_frozen_manifest_downloads_through_the_server(
    ran: Path, client, server: Server, tmp_path: Path
) -> None:
    from mlflow.artifacts import download_artifacts

    frozen = frozen_of(ran)
    parent = tracking.find_parent_run(frozen, results_dir=ran / "results")
    got = download_artifacts(
        run_id=parent,
        artifact_path=tracking.MANIFEST_ARTIFACT,
        dst_path=str(tmp_path),
        tracking_uri=server.uri,
    )
    assert json.loads(Path(got).read_text()) == frozen
    stored = list(server.artifacts.rglob(tracking.MANIFEST_ARTIFACT))
    assert len(stored) == 1 and parent in stored[0].parts, stored


@server_test
def test_runs_live_in_postgresql_and_nowhere_local(ran: Path, client, postgres: Postgres) -> None:
    frozen = frozen_of(ran)
    runs = all_runs(client, tracking.experiment_name(PACK))
    rows = postgres.query(
        "SELECT r.run_uuid FROM runs r JOIN experiments e USING (experiment_id) WHERE e.name = %s",
        tracking.experiment_name(PACK),
    )
    assert {row[0] for row in rows} == {r.info.run_id for r in runs}
    assert len(rows) == 1 + 2
    (tagged,) = postgres.query(
        "SELECT count(*) FROM tags WHERE key = %s AND value = %s",
        tracking.MANIFEST_SHA,
        frozen["sha256"],
    )
    assert tagged[0] == len(rows)
    results = ran / "results"
    assert not list(results.rglob("mlflow.db*")), "a local SQLite store was written"
    assert not (results / tracking.ARTIFACT_DIR).exists(), "artifacts were written locally"
    assert not (ran / "mlruns").exists() and not (ran / "mlartifacts").exists()


@server_test
def test_tracking_again_logs_nothing_twice(ran: Path, server: Server, postgres: Postgres) -> None:
    before = postgres.query("SELECT count(*) FROM runs")[0][0]
    snakemake(ran, server.uri, "--forcerun", "track", *targets())
    assert postgres.query("SELECT count(*) FROM runs")[0][0] == before


@server_test
def test_secrets_stay_out_of_the_server(
    server: Server, postgres: Postgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient
    from mlflow.artifacts import download_artifacts

    data = small_pack()
    data["pack"]["name"] = "server-secrets"  # its own experiment: the pack's runs stay as they are
    frozen = freeze(validate_pack(data))
    secret = "s3cr3t-server-" + os.urandom(6).hex()
    monkeypatch.setenv(tracking.TRACKING_URI_ENV, server.uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("CAPACITY_PACK_TEST_API_TOKEN", secret)
    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    # A "secret" equal to a manifest value keeps the manifest itself off the server.
    monkeypatch.setenv("CAPACITY_PACK_TEST_MODEL_KEY", frozen["manifest"]["model"]["revision"])
    note = tmp_path / "note.txt"
    note.write_text(f"Authorization: Bearer {secret}\n")
    run_id = tracking.log_child_run(
        frozen,
        stage="check",
        job="secrets",
        params={
            "api_key": "abc-not-in-env",
            "header": f"Bearer {secret}",
            "store_auth": PG_PASSWORD,
            "input_tokens": 5,
        },
        artifacts=[note],
        results_dir=tmp_path / "results",
    )
    client = MlflowClient(tracking_uri=server.uri)
    run = client.get_run(run_id)
    identity = tracking.identity_params(frozen)
    del identity["model_revision"]  # the "secret" below: scrubbed like any other value
    assert run.data.params == {"input_tokens": "5", **identity}
    assert {"api_key", "header", "store_auth", "artifact:note.txt"} <= set(
        run.data.tags[tracking.REDACTED].split(",")
    )
    parent = run.data.tags[tracking.PARENT_RUN_ID]
    assert "model.revision" not in client.get_run(parent).data.params
    assert tracking.MANIFEST_ARTIFACT not in {a.path for a in client.list_artifacts(parent)}
    got = download_artifacts(run_id=run_id, artifact_path="note.txt", tracking_uri=server.uri)
    assert Path(got).read_text() == f"Authorization: Bearer {tracking.REDACTION}\n"
    exp_id = run.info.experiment_id
    stored = [p for p in (server.artifacts / exp_id).rglob("*") if p.is_file()]
    assert stored, "no artifact reached the server's artifact root"
    for value in (secret, "abc-not-in-env", PG_PASSWORD, "sim-small-r1"):
        leaks = postgres.query(
            "SELECT p.key FROM params p JOIN runs r USING (run_uuid) "
            "WHERE r.experiment_id = %s AND strpos(p.value, %s) > 0 "
            "UNION ALL SELECT t.key FROM tags t JOIN runs r USING (run_uuid) "
            "WHERE r.experiment_id = %s AND strpos(t.value, %s) > 0",
            int(exp_id),
            value,
            int(exp_id),
            value,
        )
        assert leaks == [], f"{value!r} reached PostgreSQL in {leaks}"
        for path in stored:
            assert value.encode() not in path.read_bytes(), f"{value!r} leaked into {path}"


WORKER = """
import json, sys, time
from pathlib import Path

import mlflow  # imported before the start line so that the processes open the store at once
from capacity_pack.track import tracking

frozen = json.loads(Path(sys.argv[1]).read_text())
results, start, worker = Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
(start.parent / f"ready-{worker}").touch()
while not start.exists():
    time.sleep(0.005)
for i in range(3):
    tracking.log_child_run(
        frozen, stage="loadgen", job=f"w{worker}", point=f"p{i}",
        metrics={"latency_ms": worker * 10 + i}, results_dir=results,
    )
"""


@server_test
def test_jobs_sharing_a_fresh_postgresql_store_directly(postgres: Postgres, tmp_path: Path) -> None:
    """Without a server, each job opens the database itself: the first opening creates MLflow's
    tables, and jobs that start together must not race to create them or the parent run."""
    database = "direct"
    with contextlib.closing(postgres.connect()) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {database} OWNER {PG_ROLE}")
    env = quiet_mlflow_env()
    env[tracking.TRACKING_URI_ENV] = f"postgresql://{PG_ROLE}@127.0.0.1:{postgres.port}/{database}"
    env["PGPASSWORD"] = PG_PASSWORD
    results = tmp_path / "results"
    frozen_path = tmp_path / "frozen.json"
    frozen_path.write_text(json.dumps(freeze(load_pack(ROOT / "config" / "config.yaml"))))
    start = tmp_path / "start"
    workers = 3
    argv = [sys.executable, "-c", WORKER, str(frozen_path), str(results), str(start)]
    procs = start_together([[*argv, str(w)] for w in range(workers)], tmp_path, start, env)
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * workers, "\n".join(outs)

    kinds = postgres.query(
        "SELECT value, count(*) FROM tags WHERE key = %s GROUP BY value ORDER BY value",
        tracking.RUN_KIND,
        db=database,
    )
    assert kinds == [("child", workers * 3), ("parent", 1)]
    # A database store has no artifact server: the pack's results folder keeps the files.
    assert list((results / tracking.ARTIFACT_DIR).rglob(tracking.MANIFEST_ARTIFACT))
    assert not (results / tracking.DB_NAME).exists()


def test_store_passwords_count_as_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", "pg-pass-123456")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "basic-auth-123456")
    monkeypatch.setenv(tracking.TRACKING_URI_ENV, "postgresql://u:in%2Furi-123456@db:5432/mlflow")
    found = redact.secret_values()
    assert {"pg-pass-123456", "basic-auth-123456", "in/uri-123456", "in%2Furi-123456"} <= set(found)
    assert redact.redact_text("dsn password=pg-pass-123456") == "dsn password=[redacted]"
    monkeypatch.setenv(tracking.TRACKING_URI_ENV, "http://[::1")  # malformed: no crash here
    assert "pg-pass-123456" in redact.secret_values()
