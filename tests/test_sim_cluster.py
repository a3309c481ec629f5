"""``sim cluster``: replicas behind a router, health checks, kill and restart, merged metrics."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from capacity_pack.sim import metrics as prom
from capacity_pack.sim.cluster import Cluster
from capacity_pack.sim.process import SimProcess

BODY = {"prompt": "alpha beta gamma delta", "max_tokens": 4, "ignore_eos": True}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    gt = tmp_path_factory.mktemp("cluster") / "gt.jsonl"
    args = [
        "--replicas",
        "2",
        "--router",
        "round_robin",
        "--health-interval-s",
        "0.2",
        "--ground-truth",
        str(gt),
    ]
    with SimProcess(*args, command="cluster") as proc:
        proc.ground_truth = gt
        yield proc


@pytest.fixture(scope="module")
def client(cluster):
    with httpx.Client(base_url=cluster.url, timeout=30, trust_env=False) as c:
        yield c


def _replicas(client: httpx.Client) -> list[dict]:
    return client.get("/cluster/replicas").json()["replicas"]


def _wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_round_robin_spreads_requests(client):
    assert client.get("/health").status_code == 200
    assert client.get("/version").json() == {"version": "0.1.0"}
    assert client.get("/v1/models").json()["data"][0]["id"] == "sim-small"
    seen = []
    for _ in range(4):
        resp = client.post("/v1/completions", json=BODY)
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4
        seen.append(resp.headers["x-sim-replica"])
    assert sorted(seen) == ["0", "0", "1", "1"]
    assert seen[0] != seen[1]
    stream = client.post("/v1/completions", json={**BODY, "stream": True})
    assert stream.text.endswith("data: [DONE]\n\n") and stream.text.count('"text":') == 4


def test_per_replica_metrics(client):
    fams = prom.parse(client.get("/metrics").text)
    assert prom.value(fams, "router:replica_up", replica="0") == 1.0
    assert prom.value(fams, "router:replica_up", replica="1") == 1.0
    engines = {s.label("engine") for s in fams["vllm:generation_tokens_total"].samples}
    assert engines == {"0", "1"}
    total = prom.value(fams, "vllm:generation_tokens_total")
    per = [prom.value(fams, "vllm:generation_tokens_total", engine=e) for e in ("0", "1")]
    assert total == sum(per) and all(p > 0 for p in per)
    assert prom.value(fams, "router:requests_total") >= 5


def test_faults_and_reset_fan_out(client):
    resp = client.post("/sim/faults?replica=1", json={"error_rate": 0.0})
    assert resp.status_code == 200 and [r["replica"] for r in resp.json()["replicas"]] == [1]
    resp = client.post("/reset_prefix_cache")
    assert resp.status_code == 200 and len(resp.json()["replicas"]) == 2


def test_killed_replica_leaves_rotation_and_restart_brings_it_back(client, cluster):
    # A long stream on each replica; killing one cuts its stream and spares the other.
    streams = []
    for _ in range(2):
        body = {**BODY, "max_tokens": 150, "stream": True}
        req = client.build_request("POST", "/v1/completions", json=body)
        resp = client.send(req, stream=True)
        streams.append(resp)
    victim = streams[0].headers["x-sim-replica"]
    survivor = streams[1].headers["x-sim-replica"]
    assert {victim, survivor} == {"0", "1"}
    r = client.post(f"/cluster/replicas/{victim}/kill", json={"delay_s": 0})
    assert r.status_code == 202
    with pytest.raises(httpx.RemoteProtocolError):
        for _ in streams[0].iter_lines():
            pass
    text = "\n".join(streams[1].iter_lines())
    assert text.rstrip().endswith("data: [DONE]")
    for s in streams:
        s.close()

    _wait_for(lambda: not _replicas(client)[int(victim)]["healthy"])
    assert _replicas(client)[int(victim)]["state"] == "killed"
    for _ in range(4):
        resp = client.post("/v1/completions", json=BODY)
        assert resp.status_code == 200 and resp.headers["x-sim-replica"] == survivor
    fams = prom.parse(client.get("/metrics").text)
    assert prom.value(fams, "router:replica_up", replica=victim) == 0.0
    assert {s.label("engine") for s in fams["vllm:num_requests_running"].samples} == {survivor}
    assert client.get("/health").status_code == 200

    r = client.post(f"/cluster/replicas/{victim}/restart", json={"at_unix_ns": time.time_ns()})
    assert r.status_code == 202
    _wait_for(lambda: _replicas(client)[int(victim)]["healthy"], timeout_s=30)
    assert _replicas(client)[int(victim)]["starts"] == 2
    seen = {client.post("/v1/completions", json=BODY).headers["x-sim-replica"] for _ in range(4)}
    assert seen == {"0", "1"}

    lines = [json.loads(x) for x in Path(cluster.ground_truth).read_text().splitlines()]
    assert {rec["replica"] for rec in lines} == {0, 1}


def test_control_errors(client):
    assert client.post("/cluster/replicas/7/kill", json={}).status_code == 400
    assert client.post("/cluster/replicas/0/explode", json={}).status_code == 400


def test_least_outstanding_picks_the_idlest_healthy_replica():
    c = Cluster(3, [], policy="least_outstanding")
    try:
        for r, (healthy, outstanding) in zip(
            c.replicas, [(True, 3), (True, 1), (False, 0)], strict=True
        ):
            r.healthy, r.outstanding = healthy, outstanding
        assert {c.pick().index for _ in range(5)} == {1}
        c.replicas[0].outstanding = 1
        assert {c.pick().index for _ in range(6)} == {0, 1}  # ties alternate
        for r in c.replicas:
            r.healthy = False
        assert c.pick() is None
    finally:
        c._tmp.cleanup()
