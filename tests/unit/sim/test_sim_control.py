"""The control plane of ``sim serve`` and ``sim cluster``: a web page cannot steer it (``Host``
check, ``Origin`` check, token, JSON bodies), the project's own clients can, and only loopback is
bound without ``--allow-remote``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from capacity_pack.sim import metrics as prom
from capacity_pack.sim.process import SimProcess

# The documented header, spelled out: the tests speak to the servers as any client would.
TOKEN_HEADER = "X-Sim-Control-Token"
BODY = {"prompt": "alpha beta gamma delta", "max_tokens": 4, "ignore_eos": True}
EVIL = "evil.example"
# What a page would try: every mutating control route with a harmful body, and the reads.
SERVE_ROUTES = [
    ("POST", "/sim/faults", {"error_rate": 1.0, "error_status": 503}),
    ("POST", "/sim/stall", {"seconds": 30}),
    ("POST", "/sim/kill", {"after_s": 0}),
    ("GET", "/sim/faults", None),
    ("GET", "/sim/state", None),
]
CLUSTER_ROUTES = [
    ("POST", "/cluster/replicas/0/kill", {"delay_s": 0}),
    ("POST", "/cluster/replicas/0/restart", {"delay_s": 0}),
    ("POST", "/cluster/replicas/0/link", {"latency_ms": 500}),
    ("POST", "/cluster/replicas/add", {"delay_s": 0}),
    ("POST", "/sim/faults", {"error_rate": 1.0, "error_status": 503}),
    ("POST", "/sim/stall", {"seconds": 30}),
    ("GET", "/sim/faults", None),
    ("GET", "/cluster/replicas", None),
    ("GET", "/cluster/events", None),
]


@pytest.fixture(scope="module")
def serve():
    with SimProcess() as sim:
        yield sim


@pytest.fixture(scope="module")
def cluster():
    with SimProcess("--replicas", "1", "--health-interval-s", "0.2", command="cluster") as sim:
        yield sim


def _sims(request: pytest.FixtureRequest, kind: str) -> tuple[SimProcess, list]:
    sim = request.getfixturevalue(kind)
    return sim, SERVE_ROUTES if kind == "serve" else CLUSTER_ROUTES


def _send(
    sim: SimProcess,
    method: str,
    path: str,
    body: dict | None,
    *,
    host: str | None = None,
    origin: str | None = None,
    content_type: str | None = "application/json",
    token: str | None = None,
    port: int | None = None,
) -> httpx.Response:
    headers = {"Host": host if host is not None else f"127.0.0.1:{sim.port}"}
    if origin is not None:
        headers["Origin"] = origin
    if token is not None:
        headers[TOKEN_HEADER] = token
    content = None
    if body is not None:
        content = json.dumps(body).encode()
        if content_type is not None:
            headers["Content-Type"] = content_type
    url = f"http://127.0.0.1:{port or sim.port}{path}"
    return httpx.request(method, url, content=content, headers=headers, timeout=10, trust_env=False)


def _error_type(resp: httpx.Response) -> str:
    return resp.json()["error"]["type"]


def _nothing_changed(sim: SimProcess, kind: str) -> None:
    with httpx.Client(base_url=sim.url, headers=sim.control_headers, trust_env=False) as c:
        assert c.get("/health").status_code == 200
        t0 = time.perf_counter()
        assert c.post("/v1/completions", json=BODY, timeout=20).status_code == 200
        assert time.perf_counter() - t0 < 5  # no 30 s stall was injected
        fams = prom.parse(c.get("/metrics").text)
        assert prom.value(fams, "sim:faults_injected_total", kind="stall") == 0
        assert prom.value(fams, "sim:faults_injected_total", kind="error") == 0
        if kind == "serve":
            assert c.get("/sim/faults").json()["error_rate"] == 0.0
        else:
            assert [r["starts"] for r in c.get("/cluster/replicas").json()["replicas"]] == [1]
            events = {e["event"] for e in c.get("/cluster/events").json()["events"]}
            assert not events & {"killed", "restarted", "added", "link_changed"}, events
            faults = c.get("/sim/faults").json()["replicas"]
            assert [r["body"]["error_rate"] for r in faults] == [0.0]


@pytest.mark.parametrize("kind", ["serve", "cluster"])
def test_a_web_page_cannot_reach_the_control_plane(request, kind):
    sim, routes = _sims(request, kind)
    port = sim.port
    for method, path, body in routes:
        what = f"{method} {path}"
        # DNS rebinding: the page's own name, re-pointed at 127.0.0.1, in Host and Origin.
        resp = _send(
            sim, method, path, body, host=f"{EVIL}:{port}", origin=f"http://{EVIL}:{port}",
            content_type="text/plain;charset=UTF-8",
        )  # fmt: skip
        assert resp.status_code == 403 and _error_type(resp) == "PermissionDeniedError", what
        # A plain cross-origin request (a form, a no-cors fetch): the right Host, a foreign
        # Origin, a text/plain body, no token.
        resp = _send(
            sim, method, path, body, origin=f"http://{EVIL}", content_type="text/plain"
        )  # fmt: skip
        assert resp.status_code == 403 and _error_type(resp) == "PermissionDeniedError", what
        # Anything else without the token: 401, whatever the body.
        for content_type in ("text/plain", "application/json"):
            resp = _send(sim, method, path, body, content_type=content_type)
            assert resp.status_code == 401 and _error_type(resp) == "AuthenticationError", what
            assert sim.token not in resp.text
        resp = _send(sim, method, path, body, token="not-the-token")
        assert resp.status_code == 401, what
        if method == "POST":
            # Even the token does not make a non-JSON body acceptable.
            for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
                resp = _send(sim, method, path, body, content_type=content_type, token=sim.token)
                assert resp.status_code == 415, (what, content_type)
                assert _error_type(resp) == "UnsupportedMediaTypeError"
        # The CORS preflight a page needs before it may send the token header is never granted.
        pre = httpx.options(
            f"{sim.url}{path}",
            headers={"Origin": f"http://{EVIL}", "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": TOKEN_HEADER.lower()},
            trust_env=False,
        )  # fmt: skip
        assert pre.status_code >= 400 and "access-control-allow-origin" not in pre.headers
    _nothing_changed(sim, kind)


def test_the_token_and_a_json_body_open_the_control_plane(serve):
    token = serve.token
    ok = [
        ("POST", "/sim/faults", {"error_rate": 0.0}, 200),
        ("POST", "/sim/stall", {"seconds": 0}, 200),
        ("POST", "/sim/kill", {"after_s": 3600}, 202),  # far off: the fixture stops it first
        ("GET", "/sim/faults", None, 200),
        ("GET", "/sim/state", None, 200),
    ]
    for method, path, body, status in ok:
        for host in (f"127.0.0.1:{serve.port}", f"localhost:{serve.port}", f"[::1]:{serve.port}"):
            resp = _send(serve, method, path, body, host=host, token=token)
            assert resp.status_code == status, (method, path, host, resp.text)
    # A body-less POST with no Content-Type is an empty JSON object.
    resp = _send(serve, "POST", "/sim/faults", None, token=token)
    assert resp.status_code == 200 and resp.json()["error_rate"] == 0.0
    resp = _send(
        serve, "POST", "/sim/faults", {"error_rate": 0.0},
        content_type="application/json; charset=utf-8", token=token,
    )  # fmt: skip
    assert resp.status_code == 200


def test_the_router_forwards_control_calls_with_each_replicas_token(cluster):
    token = cluster.token
    ok = [
        ("POST", "/cluster/replicas/0/kill", {"delay_s": 3600}, 202),
        ("POST", "/cluster/replicas/0/restart", {"delay_s": 3600}, 202),
        ("POST", "/cluster/replicas/0/link", {"latency_ms": 0, "delay_s": 3600}, 202),
        ("POST", "/cluster/replicas/add", {"delay_s": 3600}, 202),
        ("GET", "/cluster/replicas", None, 200),
        ("GET", "/cluster/events", None, 200),
    ]
    for method, path, body, status in ok:
        resp = _send(cluster, method, path, body, token=token)
        assert resp.status_code == status, (method, path, resp.text)
    for path, body in (("/sim/faults", {"error_rate": 0.0}), ("/sim/stall", {"seconds": 0})):
        resp = _send(cluster, "POST", path, body, token=token)
        assert resp.status_code == 200, resp.text
        assert [r["status"] for r in resp.json()["replicas"]] == [200]
    # A page that finds the replica's own port is refused there too, the router's token as well.
    listed = _send(cluster, "GET", "/cluster/replicas", None, token=token).json()["replicas"]
    replica_port = listed[0]["port"]
    for guess in (None, token):
        resp = _send(
            cluster, "POST", "/sim/faults", {"error_rate": 1.0}, token=guess, port=replica_port,
            host=f"127.0.0.1:{replica_port}",
        )  # fmt: skip
        assert resp.status_code == 401
    resp = _send(
        cluster, "GET", "/health", None, host=f"{EVIL}:{replica_port}", port=replica_port
    )  # fmt: skip
    assert resp.status_code == 403


@pytest.mark.parametrize("kind", ["serve", "cluster"])
def test_reset_prefix_cache_needs_no_token_but_refuses_browsers(request, kind):
    sim, _ = _sims(request, kind)
    # The pack's own reset (vLLM's contract): a bare POST, no token.
    resp = httpx.post(f"{sim.url}/reset_prefix_cache", trust_env=False, timeout=10)
    assert resp.status_code == 200 and resp.json()["reset"] is True
    assert _send(sim, "POST", "/reset_prefix_cache", {}).status_code == 200
    port = sim.port
    rebound = _send(sim, "POST", "/reset_prefix_cache", None, host=f"{EVIL}:{port}")
    assert rebound.status_code == 403
    cross = _send(sim, "POST", "/reset_prefix_cache", None, origin=f"http://{EVIL}")
    assert cross.status_code == 403
    cross = _send(sim, "POST", "/reset_prefix_cache", None, origin="null")
    assert cross.status_code == 403
    same = _send(sim, "POST", "/reset_prefix_cache", None, origin=f"http://127.0.0.1:{port}")
    assert same.status_code == 200
    plain = _send(sim, "POST", "/reset_prefix_cache", {}, content_type="text/plain")
    assert plain.status_code == 415


@pytest.mark.parametrize("kind", ["serve", "cluster"])
def test_the_data_plane_is_open_but_answers_only_to_its_own_address(request, kind):
    sim, _ = _sims(request, kind)
    port = sim.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}"):
        assert _send(sim, "GET", "/health", None, host=host).status_code == 200, host
    assert _send(sim, "POST", "/v1/completions", BODY).status_code == 200
    assert _send(sim, "GET", "/v1/models", None).status_code == 200
    assert _send(sim, "GET", "/metrics", None).status_code == 200
    for host in (f"{EVIL}:{port}", EVIL, f"127.0.0.1:{port + 1}", "localhost", "127.0.0.1",
                 f"127.0.0.1.{EVIL}:{port}", f"[::1:{port}", ""):  # fmt: skip
        for method, path, body in (("GET", "/health", None), ("POST", "/v1/completions", BODY)):
            resp = _send(sim, method, path, body, host=host)
            assert resp.status_code in (400, 403), (host, path)
            if resp.status_code == 403:
                assert _error_type(resp) == "PermissionDeniedError"


def test_each_process_writes_its_token_to_a_private_file(serve, cluster):
    for sim in (serve, cluster):
        assert stat.S_IMODE(sim.token_file.stat().st_mode) == 0o600
        assert sim.token_file.read_text().strip() == sim.token and len(sim.token) >= 40
    assert serve.token != cluster.token


def test_the_token_file_defaults_next_to_the_port_file_and_ignores_the_umask(tmp_path):
    port_file = tmp_path / "port"
    argv = [sys.executable, "-m", "capacity_pack.sim", "serve", "--port", "0",
            "--port-file", str(port_file)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.umask(0))
    try:
        line = proc.stdout.readline()
        token_file = tmp_path / "port.token"
        port = int(port_file.read_text())
        assert f"listening on http://127.0.0.1:{port}" in line and str(token_file) in line
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        url = f"http://127.0.0.1:{port}/sim/state"
        assert httpx.get(url, trust_env=False).status_code == 401
        assert httpx.get(url, headers={TOKEN_HEADER: token}, trust_env=False).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize(
    "command", [["serve"], ["cluster", "--replicas", "1"]], ids=["serve", "cluster"]
)
@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_non_loopback_bind_needs_allow_remote(command, host):
    argv = [sys.executable, "-m", "capacity_pack.sim", *command, "--host", host, "--port", "0"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    message = result.stderr.strip()
    assert "\n" not in message, message
    assert f"--host {host} is not a loopback address" in message and "--allow-remote" in message


def test_allow_remote_binds_with_a_warning(tmp_path):
    port_file = tmp_path / "port"
    argv = [sys.executable, "-m", "capacity_pack.sim", "serve", "--host", "0.0.0.0",
            "--allow-remote", "--port", "0", "--port-file", str(port_file)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        port = int(port_file.read_text())
        token = Path(f"{port_file}.token").read_text().strip()
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/health", trust_env=False).status_code == 200
        headers = {TOKEN_HEADER: token}
        assert httpx.get(f"{base}/sim/state", headers=headers, trust_env=False).status_code == 200
        # Still no DNS names but this host's: rebinding stays refused.
        rebound = httpx.get(f"{base}/health", headers={"Host": f"{EVIL}:{port}"}, trust_env=False)
        assert rebound.status_code == 403
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert err.splitlines()[0].startswith("warning: binding 0.0.0.0: the simulator is reachable")


# -- pieces -------------------------------------------------------------------------------------


def test_bind_rule():
    from capacity_pack.sim import control
    from capacity_pack.sim.control import bind_problem

    assert control.TOKEN_HEADER == TOKEN_HEADER
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert bind_problem(host, False) == (None, None), host
    for host in ("0.0.0.0", "::", "192.168.1.5", "example.org"):
        error, warning = bind_problem(host, False)
        assert error is not None and "--allow-remote" in error and warning is None
        error, warning = bind_problem(host, True)
        assert error is None and warning is not None and warning.startswith("warning:")


def test_host_policy():
    from capacity_pack.sim.control import HostPolicy, split_host

    loop = HostPolicy.for_bind("127.0.0.1", 8000)
    for ok in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "LocalHost:8000"):
        assert loop.allows(ok), ok
    for bad in (None, "", "evil.example:8000", "127.0.0.1:8001", "127.0.0.1", "10.0.0.1:8000",
                "[::1]", "::1:8000", "127.0.0.1:80x", "localhost.:8000", "[::1:8000"):  # fmt: skip
        assert not loop.allows(bad), bad
    assert HostPolicy.for_bind("127.0.0.1", 80).allows("localhost")
    assert loop.allows_origin("http://127.0.0.1:8000")
    assert not loop.allows_origin("https://127.0.0.1:8000") and not loop.allows_origin("null")
    assert not loop.allows_origin("http://evil.example:8000")
    one = HostPolicy.for_bind("192.168.1.5", 8000)
    assert one.allows("192.168.1.5:8000") and not one.allows("192.168.1.6:8000")
    anywhere = HostPolicy.for_bind("0.0.0.0", 8000)
    assert anywhere.allows("10.1.2.3:8000") and anywhere.allows("[fe80::1]:8000")
    assert not anywhere.allows("evil.example:8000")
    named = HostPolicy.for_bind("0.0.0.0", 8000, ("Sim-Service",))
    assert named.allows("sim-service:8000") and not named.allows("sim-service:8001")
    assert split_host("[::1]:9") == ("[::1]", 9) and split_host("a:b:c") is None
