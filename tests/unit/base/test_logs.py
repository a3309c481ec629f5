"""Job logging: every sink redacted (records of any logger, standard error and output, the
traceback of a failure in the log, on the console and at the interpreter), and a fresh log per
run of the job."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from capacity_pack.logs import RedactingWriter, job_logging
from tests.paths import ROOT

PASSWORD = "tr4ck-pw-5150"
URI = f"http://alice:{PASSWORD}@127.0.0.1:9"


@pytest.fixture
def tracking_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", URI)


def test_a_failing_job_leaves_no_password_in_its_log_or_on_the_console(
    tmp_path: Path, tracking_uri: None, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "logs" / "track.log"
    with pytest.raises(RuntimeError), job_logging(log) as job:
        job.info("tracking to %s", URI)
        # A library's logger, as MLflow's or urllib3's would be, and its direct writes.
        logging.getLogger("urllib3.connectionpool").warning("connecting to %s", URI)
        print(f"View run at: {URI}/#/experiments/1", file=sys.stderr)
        print(f"View run at: {URI}/#/experiments/1")
        raise RuntimeError(f"API request to {URI}/api/2.0/mlflow/runs/create failed")
    text = log.read_text()
    out, err = capsys.readouterr()
    for where in (text, out, err):
        assert PASSWORD not in where
    assert text.count("alice:[redacted]@127.0.0.1") == 4, text
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: API request to http://alice:[redacted]@" in err


def test_an_interrupted_job_logs_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from capacity_pack.measure.interrupt import Interrupted

    log = tmp_path / "sweep.log"
    with pytest.raises(Interrupted) as caught, job_logging(log) as job:
        job.info("measuring")
        raise Interrupted("SIGTERM")
    assert caught.value.code == 143
    text = log.read_text()
    assert "Traceback" not in text
    assert text.splitlines()[-1] == "Interrupted: measurement interrupted by SIGTERM"
    err = capsys.readouterr().err
    assert err.strip() == "Interrupted: measurement interrupted by SIGTERM"
    # A clean exit says nothing on the console.
    with pytest.raises(SystemExit), job_logging(log):
        raise SystemExit(0)
    assert capsys.readouterr().err == ""


def test_the_log_starts_fresh_at_every_run_of_the_job(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("an earlier run's traceback\n")
    with job_logging(log) as job:
        job.info("this run")
    assert "earlier" not in log.read_text() and "this run" in log.read_text()


def test_a_secret_written_in_pieces_is_redacted_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setenv("CP_TEST_API_TOKEN", "pieces-secret-0451")
    sink = io.StringIO()
    w = RedactingWriter(sink)
    w.write("token pieces-")
    w.write("secret-0451 ")
    assert sink.getvalue() == ""  # held until the line is whole
    w.write("end\nnext")
    w.flush()
    assert sink.getvalue() == "token [redacted] end\nnext"
    with pytest.raises(TypeError):
        w.write(b"bytes")  # type: ignore[arg-type]


def test_the_traceback_python_prints_for_a_job_script_is_redacted(tmp_path: Path) -> None:
    """The exception leaves the rule script, as under Snakemake: the interpreter prints it."""
    script = textwrap.dedent(
        f"""
        from capacity_pack.logs import job_logging
        with job_logging({str(tmp_path / "job.log")!r}):
            raise ValueError("cannot reach {URI}")
        """
    )
    env = {"PATH": "/usr/bin:/bin", "MLFLOW_TRACKING_URI": URI}
    env["PYTHONPATH"] = str(ROOT / "workflow")
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 1
    assert "ValueError: cannot reach http://alice:[redacted]@127.0.0.1:9" in res.stderr
    assert "Traceback (most recent call last)" in res.stderr
    assert PASSWORD not in res.stderr + res.stdout + (tmp_path / "job.log").read_text()


def test_a_jobs_log_holds_no_line_per_http_request(tmp_path: Path) -> None:
    # A sweep job's requests are in its records; its log must not repeat each one.
    import http.server
    import threading

    import httpx

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    log_path = tmp_path / "job.log"
    try:
        with job_logging(log_path) as log:
            for _ in range(3):
                assert httpx.get(f"http://127.0.0.1:{srv.server_port}/health").status_code == 200
            log.info("measured 3 requests")
    finally:
        srv.shutdown()
    text = log_path.read_text()
    assert "measured 3 requests" in text
    assert "HTTP Request" not in text and "/health" not in text


def test_a_stated_error_is_one_line_in_the_log_and_on_the_console(tmp_path: Path, capsys) -> None:
    """An error the user fixes (its message says how) ends the job with status 1 and one line,
    never a traceback; any other exception keeps its traceback in the log."""
    from capacity_pack.errors import StatedError

    log_path = tmp_path / "job.log"
    with pytest.raises(SystemExit) as stop, job_logging(log_path):
        raise StatedError("no server answers at http://127.0.0.1:9 (ConnectError: refused)")
    assert stop.value.code == 1
    expected = "error: no server answers at http://127.0.0.1:9 (ConnectError: refused)"
    assert log_path.read_text().strip() == expected
    assert capsys.readouterr().err.strip() == expected

    with pytest.raises(ZeroDivisionError), job_logging(log_path):
        _ = 1 / 0
    assert "Traceback" in log_path.read_text()
