"""Fault knobs (command line and control endpoint), hard kill, and the command line itself."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pytest
from click.testing import CliRunner

from capacity_pack.cli import main
from capacity_pack.sim import metrics as prom
from capacity_pack.sim.process import SimProcess


def _metric(client: httpx.Client, name: str, **labels: str) -> float:
    value = prom.value(prom.parse(client.get("/metrics").text), name, **labels)
    assert value is not None, name
    return value


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    gt = tmp_path_factory.mktemp("faults") / "gt.jsonl"
    with SimProcess("--ground-truth", str(gt)) as proc:
        proc.ground_truth = gt
        yield proc


@pytest.fixture(scope="module")
def client(sim):
    with httpx.Client(
        base_url=sim.url, headers=sim.control_headers, timeout=30, trust_env=False
    ) as c:
        yield c


BODY = {"prompt": "one two three four", "max_tokens": 20, "ignore_eos": True}


def test_injected_errors_from_the_control_endpoint(client):
    assert client.get("/sim/faults").json()["error_rate"] == 0.0
    assert (
        client.post("/sim/faults", json={"error_rate": 1.0, "error_status": 503}).status_code == 200
    )
    try:
        resp = client.post("/v1/completions", json=BODY)
        assert resp.status_code == 503
        err = resp.json()["error"]
        assert err["type"] == "ServiceUnavailableError" and err["code"] == 503
        assert "injected" in err["message"]
    finally:
        client.post("/sim/faults", json={"error_rate": 0.0, "error_status": 500})
    assert client.post("/v1/completions", json=BODY).status_code == 200
    assert _metric(client, "sim:faults_injected_total", kind="error") >= 1


def test_mid_stream_disconnect(client, sim):
    client.post("/sim/faults", json={"disconnect_rate": 1.0})
    try:
        received = []
        with pytest.raises(httpx.RemoteProtocolError):
            body = {**BODY, "stream": True}
            with client.stream(
                "POST", "/v1/completions", json=body, headers={"X-Request-Id": "cut-1"}
            ) as resp:
                assert resp.status_code == 200
                for line in resp.iter_lines():
                    received.append(line)
        payloads = [x for x in received if x.startswith("data: ")]
        # Cut after 1..19 tokens: some data arrived, but never the end of the stream.
        assert 1 <= len(payloads) <= 19
        assert "data: [DONE]" not in received
        # Non-streaming requests are not cut.
        assert client.post("/v1/completions", json=BODY).status_code == 200
    finally:
        client.post("/sim/faults", json={"disconnect_rate": 0.0})
    assert _metric(client, "sim:faults_injected_total", kind="disconnect") >= 1
    assert client.get("/health").status_code == 200
    deadline = time.monotonic() + 5
    rec = None
    while rec is None and time.monotonic() < deadline:
        for line in sim.ground_truth.read_text().splitlines():
            if json.loads(line)["request_id"] == "cut-1":
                rec = json.loads(line)
        time.sleep(0.05)
    assert rec is not None and rec["disconnected"] is True
    assert rec["error"] == "injected disconnect" and rec["completion_tokens"] >= 1


def test_stalls_delay_tokens(client):
    t0 = time.monotonic()
    assert client.post("/sim/stall", json={"seconds": 0.8}).status_code == 200
    resp = client.post("/v1/completions", json={**BODY, "max_tokens": 2})
    assert resp.status_code == 200
    assert time.monotonic() - t0 >= 0.75
    assert _metric(client, "sim:stall_seconds_total") >= 0.5
    client.post("/sim/faults", json={"stall_every_s": 0.3, "stall_s": 0.1})
    try:
        before = _metric(client, "sim:stall_seconds_total")
        client.post("/v1/completions", json={**BODY, "max_tokens": 60})
        assert _metric(client, "sim:stall_seconds_total") > before
    finally:
        client.post("/sim/faults", json={"stall_every_s": 0.0, "stall_s": 0.0})
    bad = client.post("/sim/stall", json={"seconds": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "seconds"


def test_command_line_faults_and_kill_after():
    args = ["--fault-error-rate", "1", "--fault-error-status", "429", "--kill-after-s", "2.5"]
    with SimProcess(*args) as sim, httpx.Client(base_url=sim.url, trust_env=False) as c:
        assert c.post("/v1/completions", json=BODY).status_code == 429
        assert sim.proc.wait(timeout=20) == -signal.SIGKILL


def test_kv_fraction_flag_causes_preemptions():
    import asyncio

    with SimProcess("--fault-kv-fraction", "0.0005") as sim:

        async def run() -> list[int]:
            async with httpx.AsyncClient(base_url=sim.url, timeout=60, trust_env=False) as ac:
                bodies = [
                    {
                        "prompt": " ".join(f"p{i}w{j}" for j in range(40)),
                        "max_tokens": 60,
                        "ignore_eos": True,
                    }
                    for i in range(4)
                ]
                resps = await asyncio.gather(*(ac.post("/v1/completions", json=b) for b in bodies))
                return [r.json()["usage"]["completion_tokens"] for r in resps]

        assert asyncio.run(run()) == [60] * 4
        with httpx.Client(base_url=sim.url, trust_env=False) as c:
            assert _metric(c, "vllm:num_preemptions_total") > 0
            assert _metric(c, "sim:kv_blocks_usable") == 17


def test_hard_kill_from_the_control_endpoint():
    with (
        SimProcess() as sim,
        httpx.Client(base_url=sim.url, headers=sim.control_headers, trust_env=False) as c,
    ):
        resp = c.post("/sim/kill", json={})
        assert resp.status_code == 202
        assert sim.proc.wait(timeout=20) == -signal.SIGKILL
        with pytest.raises(httpx.TransportError):
            c.get("/health")


def test_unknown_profile_fails_with_the_shipped_list():
    result = CliRunner().invoke(main, ["sim", "serve", "--profile", "nope", "--port", "0"])
    assert result.exit_code == 1
    assert "unknown simulator profile 'nope'" in result.output
    assert "small-fast" in result.output and "llama-3.1-8b-h100" in result.output
    result = CliRunner().invoke(main, ["sim", "profiles"])
    assert result.exit_code == 0 and "llama-3.1-70b-tp2-h100" in result.output


def test_port_zero_announces_and_writes_the_bound_port(tmp_path):
    port_file = tmp_path / "port"
    argv = [
        sys.executable,
        "-m",
        "capacity_pack.sim",
        "serve",
        "--port",
        "0",
        "--port-file",
        str(port_file),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        port = int(port_file.read_text())
        assert f"listening on http://127.0.0.1:{port}" in line
        assert httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_cluster_schedule_flags_are_checked():
    result = CliRunner().invoke(main, ["sim", "cluster", "--replicas", "2", "--kill", "5@1"])
    assert result.exit_code == 1 and "no replica 5" in result.output
    result = CliRunner().invoke(main, ["sim", "cluster", "--replicas", "2", "--kill", "x"])
    assert result.exit_code == 1 and "REPLICA@SECONDS" in result.output
