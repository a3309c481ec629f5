"""``sim cluster``: replicas behind a router, health checks, kill and restart, merged metrics."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from capacity_pack.sim import metrics as prom
from capacity_pack.sim.cluster import Cluster, cluster_app
from capacity_pack.sim.process import SimProcess
from capacity_pack.sim.replicas import Link

BODY = {"prompt": "alpha beta gamma delta", "max_tokens": 4, "ignore_eos": True}
CHAT = {"messages": [{"role": "user", "content": "alpha beta"}], "max_tokens": 4}


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
    with httpx.Client(
        base_url=cluster.url, headers=cluster.control_headers, timeout=30, trust_env=False
    ) as c:
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
    # A replica out of rotation has no health round trip (a stale one would read as a slow link).
    assert prom.value(fams, "router:replica_health_rtt_seconds", replica=victim) is None
    assert prom.value(fams, "router:replica_health_rtt_seconds", replica=survivor) is not None
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


# -- router features: events, accounting, link emulation (on the module's cluster) -------------


def _events(client: httpx.Client, since_ns: int = 0) -> list[dict]:
    resp = client.get("/cluster/events", params={"since_ns": since_ns})
    assert resp.status_code == 200
    return resp.json()["events"]


def _metric(client: httpx.Client, name: str, **labels: str) -> float:
    return prom.value(prom.parse(client.get("/metrics").text), name, **labels)


def _rtt(client: httpx.Client, replica: int) -> float:
    fams = prom.parse(client.get("/metrics").text)
    return prom.value(fams, "router:replica_health_rtt_seconds", replica=str(replica))


def test_event_log_and_response_accounting(client):
    events = _events(client)
    stamps = [e["unix_ns"] for e in events]
    assert stamps == sorted(set(stamps))  # strictly increasing: since_ns is an exact cursor
    kinds = [(e["replica"], e["event"]) for e in events]
    for replica in (0, 1):
        assert (replica, "spawned") in kinds and (replica, "ready") in kinds
    # The kill test above: killed, taken out of rotation with a reason, restarted, back.
    killed = next(e for e in events if e["event"] == "killed")
    after = [
        e for e in events if e["unix_ns"] > killed["unix_ns"] and e["replica"] == killed["replica"]
    ]
    assert [e["event"] for e in after][:4] == ["removed", "restarted", "spawned", "ready"]
    assert after[0]["detail"].startswith(
        ("process dead", "mid-stream failure", "upstream connect failure")
    )
    assert _events(client, since_ns=stamps[-1]) == []
    assert _events(client, since_ns=stamps[-2]) == events[-1:]
    assert client.get("/cluster/events", params={"since_ns": "x"}).status_code == 400

    fams = prom.parse(client.get("/metrics").text)
    ok_before = prom.value(fams, "router:responses_total", code="200")
    bytes_before = prom.value(fams, "router:relayed_bytes_total")
    sizes = [len(client.post("/v1/completions", json=BODY).content) for _ in range(2)]
    sizes.append(len(client.post("/v1/chat/completions", json=CHAT).content))
    assert client.get("/v1/models").status_code == 200  # relayed, but not a completion
    fams = prom.parse(client.get("/metrics").text)
    assert prom.value(fams, "router:responses_total", code="200") == ok_before + 3
    assert prom.value(fams, "router:relayed_bytes_total") >= bytes_before + sum(sizes)
    assert prom.value(fams, "router:admission_rejected_total") == 0
    assert prom.value(fams, "router:retries_total") == 0
    # The stream the kill test cut, and only that one.
    victim = str(killed["replica"])
    assert prom.value(fams, "router:relay_failures_total", replica=victim) == 1
    assert prom.value(fams, "router:relay_failures_total") == 1


def _timed_stream(client: httpx.Client, body: dict) -> tuple[str, float, float, bytes]:
    """(replica, seconds to the response head, seconds to the end, body) of one stream."""
    t0 = time.perf_counter()
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        head = time.perf_counter() - t0
        data = resp.read()
    return resp.headers["x-sim-replica"], head, time.perf_counter() - t0, data


def test_link_latency_is_a_pipeline_delay_seen_by_health_checks(client):
    body = {**BODY, "max_tokens": 40}
    resp = client.post("/cluster/replicas/0/link", json={"latency_ms": 150})
    assert resp.status_code == 202 and resp.json()["latency_ms"] == 150
    _wait_for(lambda: _rtt(client, 0) >= 0.3, timeout_s=5)  # 150 ms out, 150 ms back
    assert _rtt(client, 1) < 0.3
    try:
        runs = {
            rep: (head, total)
            for rep, head, total, _ in (_timed_stream(client, body) for _ in range(2))
        }
        assert set(runs) == {"0", "1"}
        (head0, total0), (_, total1) = runs["0"], runs["1"]
        assert head0 >= 0.3
        # Each of the 40 chunks waits 150 ms from its own arrival: +0.3 s in all, not +6 s.
        assert 0.28 <= total0 - total1 < 1.2
    finally:
        client.post("/cluster/replicas/0/link", json={})
    _wait_for(lambda: _rtt(client, 0) < 0.2, timeout_s=5)
    changes = [e for e in _events(client) if e["event"] == "link_changed"]
    assert [e["detail"] for e in changes[-2:]] == ["latency 150 ms, bandwidth unlimited", "clean"]
    assert "router:replica_link" not in client.get("/metrics").text


def test_link_bandwidth_is_one_bucket_shared_by_the_replicas_streams(client):
    rate = 6000.0
    body = {**BODY, "max_tokens": 64, "stream": True}
    resp = client.post("/cluster/replicas/0/link", json={"bandwidth_bytes_per_s": rate})
    assert resp.status_code == 202
    _wait_for(lambda: any(e["detail"].endswith(f"{rate:g} B/s") for e in _events(client)[-3:]))
    before = _metric(client, "router:relayed_bytes_total", replica="0")
    try:
        t0 = time.perf_counter()
        streams = [
            client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
            for _ in range(4)
        ]
        by_replica: dict[str, list[bytes]] = {"0": [], "1": []}
        done: dict[str, float] = {}
        for s in sorted(streams, key=lambda s: s.headers["x-sim-replica"], reverse=True):
            by_replica[s.headers["x-sim-replica"]].append(s.read())
            done[s.headers["x-sim-replica"]] = time.perf_counter() - t0
            s.close()
    finally:
        client.post("/cluster/replicas/0/link", json={"latency_ms": 0, "bandwidth_bytes_per_s": 0})
    sent = sum(len(b) for b in by_replica["0"])
    assert len(by_replica["0"]) == 2 and all(
        b.endswith(b"data: [DONE]\n\n") for b in by_replica["0"]
    )
    # Each stream alone fits in the 16 KiB burst: only a bucket shared by both holds them back.
    assert all(len(b) < 16384 for b in by_replica["0"])
    floor = (sent - 16384) / rate
    assert floor > 0.5
    assert floor - 0.05 <= done["0"] < floor + 2.0
    assert done["1"] < floor
    assert _metric(client, "router:relayed_bytes_total", replica="0") >= before + sent


def test_one_unanswered_check_keeps_a_replica_a_second_removes_it(client):
    """A replica frozen (SIGSTOP) past one 1 s check stays in rotation; frozen past two, it is
    removed as unanswering and rejoins once it answers again."""
    pid = _replicas(client)[1]["pid"]
    since = time.time_ns()
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(1.4)  # one check times out; the next is answered once the process resumes
    finally:
        os.kill(pid, signal.SIGCONT)
    time.sleep(0.6)
    assert not [e for e in _events(client, since) if e["replica"] == 1], "removed after one"
    assert _replicas(client)[1]["healthy"]
    os.kill(pid, signal.SIGSTOP)
    # While a check goes unanswered the replica has no round trip (the last one is stale).
    _wait_for(lambda: _replicas(client)[1]["health_rtt_s"] is None, timeout_s=2)
    try:
        _wait_for(lambda: not _replicas(client)[1]["healthy"], timeout_s=4)
    finally:
        os.kill(pid, signal.SIGCONT)
    removed = [e for e in _events(client, since) if e["event"] == "removed"]
    assert [(e["replica"], e["detail"]) for e in removed] == [
        (1, "health check failed (no answer in 1 s)")
    ]
    _wait_for(lambda: _replicas(client)[1]["healthy"], timeout_s=5)


@pytest.mark.parametrize(
    "body",
    [
        {"latency_ms": -1},
        {"bandwidth_bytes_per_s": "fast"},
        {"latency_ms": True},
        {"latency_ms": 10, "jitter_ms": 5},
        [1, 2],
    ],
)
def test_link_rejects_bad_settings(client, body):
    resp = client.post("/cluster/replicas/0/link", json=body)
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "BadRequestError"


def test_link_needs_an_existing_replica(client):
    assert client.post("/cluster/replicas/9/link", json={"latency_ms": 5}).status_code == 400
    nan = client.post(
        "/cluster/replicas/0/link",
        content=b'{"latency_ms": NaN}',
        headers={"content-type": "application/json"},
    )
    assert nan.status_code == 400


# -- admission control, supervisor, scale-out ------------------------------------------------


@pytest.fixture(scope="module")
def supervised():
    args = [
        "--replicas",
        "1",
        "--health-interval-s",
        "0.1",
        "--admission-max-outstanding",
        "1",
        "--restart-after-s",
        "0.3",
        "--add",
        "0",
    ]
    with (
        SimProcess(*args, command="cluster") as proc,
        httpx.Client(
            base_url=proc.url, headers=proc.control_headers, timeout=30, trust_env=False
        ) as c,
    ):
        yield c


def test_cli_add_brings_a_replica_into_rotation(supervised):
    _wait_for(lambda: [r["healthy"] for r in _replicas(supervised)] == [True, True])
    kinds = [(e["replica"], e["event"]) for e in _events(supervised)]
    assert kinds.index((1, "added")) < kinds.index((1, "spawned")) < kinds.index((1, "ready"))


def test_admission_control_sheds_when_every_replica_is_full(supervised):
    _wait_for(lambda: all(r["healthy"] for r in _replicas(supervised)))
    long = {**BODY, "max_tokens": 2000, "stream": True}
    held = [
        supervised.send(supervised.build_request("POST", "/v1/completions", json=long), stream=True)
        for _ in range(2)
    ]
    try:
        assert {s.headers["x-sim-replica"] for s in held} == {"0", "1"}
        requests_before = _metric(supervised, "router:requests_total")
        t0 = time.perf_counter()
        resp = supervised.post("/v1/completions", json=BODY)
        assert time.perf_counter() - t0 < 0.5
        assert resp.status_code == 429 and resp.headers["retry-after"] == "1"
        error = resp.json()["error"]
        assert error["type"] == "RateLimitError" and "admission control" in error["message"]
        assert supervised.post("/v1/chat/completions", json=CHAT).status_code == 429
        fams = prom.parse(supervised.get("/metrics").text)
        assert prom.value(fams, "router:admission_rejected_total") == 2
        assert prom.value(fams, "router:responses_total", code="429") == 2
        assert prom.value(fams, "router:requests_total") == requests_before  # no replica asked
        assert supervised.get("/v1/models").status_code == 200  # only completions are guarded
    finally:
        for s in held:
            s.close()
    _wait_for(lambda: all(r["outstanding"] == 0 for r in _replicas(supervised)))
    assert supervised.post("/v1/completions", json=BODY).status_code == 200
    _wait_for(lambda: _events(supervised)[-1]["event"] == "admission_shedding_stopped", 3)
    shedding = [e for e in _events(supervised) if e["event"].startswith("admission_shedding")]
    assert [e["event"] for e in shedding] == [
        "admission_shedding_started",
        "admission_shedding_stopped",
    ]
    assert shedding[0]["replica"] is None and "2 shed" in shedding[1]["detail"]


def test_supervisor_restarts_a_dead_replica(supervised):
    since = time.time_ns()
    assert supervised.post("/cluster/replicas/1/kill", json={}).status_code == 202
    _wait_for(lambda: any(e["event"] == "ready" for e in _events(supervised, since)), 30)
    events = _events(supervised, since)
    assert [e["event"] for e in events] == [
        "killed",
        "removed",
        "restart_scheduled",
        "restarted",
        "spawned",
        "ready",
    ]
    assert {e["replica"] for e in events} == {1}
    assert events[1]["detail"].startswith("process dead") and "-9" in events[1]["detail"]
    delay_s = (events[3]["unix_ns"] - events[2]["unix_ns"]) / 1e9
    assert 0.3 <= delay_s < 0.8
    replica = _replicas(supervised)[1]
    assert replica["starts"] == 2 and replica["state"] == "up"
    seen = {
        supervised.post("/v1/completions", json=BODY).headers["x-sim-replica"] for _ in range(4)
    }
    assert seen == {"0", "1"}


def test_scale_out_endpoint_adds_a_replica_without_blocking_the_router(supervised):
    resp = supervised.post("/cluster/replicas/add", json={"delay_s": 0})
    assert resp.status_code == 202 and resp.json()["replica"] == 2
    assert resp.json()["action"] == "add"
    t0 = time.perf_counter()
    assert supervised.post("/v1/completions", json=BODY).status_code == 200
    assert time.perf_counter() - t0 < 0.5
    listed = _replicas(supervised)
    assert [r["replica"] for r in listed] == [0, 1, 2] and listed[2]["state"] == "starting"
    _wait_for(lambda: _replicas(supervised)[2]["healthy"], 30)
    seen = {
        supervised.post("/v1/completions", json=BODY).headers["x-sim-replica"] for _ in range(6)
    }
    assert seen == {"0", "1", "2"}
    fams = prom.parse(supervised.get("/metrics").text)
    assert prom.value(fams, "router:replica_up", replica="2") == 1.0
    assert {s.label("engine") for s in fams["vllm:num_requests_running"].samples} == {"0", "1", "2"}
    assert supervised.post("/cluster/replicas/add", json={"delay_s": "soon"}).status_code == 400


# -- retries ----------------------------------------------------------------------------------


def _refuses(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_retry_on_a_dead_replica_the_health_loop_has_not_noticed():
    # No health check runs during the test: only the forward can find the dead replicas.
    args = ["--replicas", "2", "--router", "round_robin", "--health-interval-s", "60"]
    with (
        SimProcess(*args, command="cluster") as proc,
        httpx.Client(
            base_url=proc.url, headers=proc.control_headers, timeout=30, trust_env=False
        ) as c,
    ):
        ports = [r["port"] for r in _replicas(c)]
        assert c.post("/cluster/replicas/0/kill", json={}).status_code == 202
        _wait_for(lambda: _refuses(ports[0]))
        assert _replicas(c)[0]["healthy"]  # not noticed yet
        for _ in range(3):
            resp = c.post("/v1/completions", json=BODY)
            assert resp.status_code == 200 and resp.headers["x-sim-replica"] == "1"
        fams = prom.parse(c.get("/metrics").text)
        assert prom.value(fams, "router:retries_total", replica="0") == 1
        assert prom.value(fams, "router:retries_total", replica="1") == 0
        assert prom.value(fams, "router:responses_total", code="200") == 3
        removed = [e for e in _events(c) if e["event"] == "removed"]
        assert [(e["replica"], e["detail"]) for e in removed] == [
            (0, "upstream connect failure (ConnectError)")
        ]

        # The last replica dies too: nothing left to retry on.
        assert c.post("/cluster/replicas/1/kill", json={}).status_code == 202
        _wait_for(lambda: _refuses(ports[1]))
        resp = c.post("/v1/completions", json=BODY)
        assert resp.status_code == 502 and resp.json()["error"]["type"] == "BadGatewayError"
        assert c.post("/v1/completions", json=BODY).status_code == 503
        fams = prom.parse(c.get("/metrics").text)
        assert prom.value(fams, "router:retries_total", replica="1") == 0
        assert prom.value(fams, "router:responses_total", code="502") == 1
        assert prom.value(fams, "router:responses_total", code="503") == 1
        assert prom.value(fams, "router:no_replica_total") == 1


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("retries", [0, 1, 2, 5])
def test_retries_stop_at_the_budget_or_when_no_replica_is_left(retries):
    c = Cluster(3, [], policy="round_robin", retries=retries)

    async def run() -> httpx.Response:
        c._client = httpx.AsyncClient(trust_env=False)
        for r in c.replicas:
            r.port, r.healthy, r.state = _closed_port(), True, "up"
        transport = httpx.ASGITransport(app=cluster_app(c))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://router") as h:
                return await h.post("/v1/completions", json=BODY)
        finally:
            await c._client.aclose()

    try:
        resp = asyncio.run(run())
    finally:
        c._tmp.cleanup()
    attempts = min(retries + 1, 3)
    assert resp.status_code == 502
    assert sum(r.requests_total for r in c.replicas) == attempts
    assert sum(r.retries_total for r in c.replicas) == attempts - 1
    assert sum(not r.healthy for r in c.replicas) == attempts
    assert all(r.outstanding == 0 for r in c.replicas)
    assert c.responses_total == {502: 1}
    assert [e["event"] for e in c.events] == ["removed"] * attempts


# -- pieces -------------------------------------------------------------------------------------


def test_link_bucket_is_shared_and_latency_is_added_once():
    link = Link()
    assert link.clean and link.release_at(10.0, 10**6) == 10.0
    link.set(0.05, 1000.0)
    # The burst goes at once, then the bucket's debt, whoever's stream sends.
    assert link.release_at(10.0, 16 * 1024) == pytest.approx(10.05)
    assert link.release_at(10.0, 500) == pytest.approx(10.55)
    assert link.release_at(10.2, 500) == pytest.approx(11.05)
    # A link idle long enough earns back its burst, and no more.
    assert link.release_at(100.0, 16 * 1024) == pytest.approx(100.05)
    link.set(0.0, 0.0)
    assert link.clean


def test_supervisor_leaves_replicas_removed_on_purpose_dead():
    c = Cluster(2, [], restart_after_s=0.5)

    async def run() -> None:
        for r in c.replicas:
            r.proc = subprocess.Popen([sys.executable, "-c", "pass"])
            r.proc.wait()
            r.healthy, r.state = True, "up"
        c.replicas[1].removed = True
        for r in c.replicas:
            c._health_once(r)
        assert c.replicas[0].restart_timer is not None
        assert c.replicas[1].restart_timer is None
        c._health_once(c.replicas[0])  # still dead: one restart pending, not two
        c._cancel_restart(c.replicas[0])

    try:
        asyncio.run(run())
    finally:
        c._tmp.cleanup()
    assert [(e["replica"], e["event"]) for e in c.events] == [
        (0, "removed"),
        (0, "restart_scheduled"),
    ]
    assert c.events[0]["detail"] == "process dead (exit status 0)"


def test_a_replica_command_needs_json_argv_with_a_port_placeholder():
    from click.testing import CliRunner

    from capacity_pack.sim.cli import sim

    runner = CliRunner()
    for given, expected in (
        ("not json", "--replica-command: not JSON"),
        ('{"a": 1}', "expected a JSON list of strings"),
        ('["server", "--port", "8000"]', "no {port} placeholder"),
    ):
        res = runner.invoke(sim, ["cluster", "--replicas", "1", "--replica-command", given])
        assert res.exit_code != 0 and expected in res.output, res.output
    with pytest.raises(ValueError, match=r"\{port\} placeholder"):
        Cluster(1, [], replica_command=["server"])


def test_command_replicas_behind_the_router(tmp_path):
    """Replicas that are any server started by a command (here the simulated engine as a plain
    process on the router's port): routed, health-checked, killed and restarted on their port."""
    command = [sys.executable, "-m", "capacity_pack.sim", "serve", "--model-name", "m",
               "--host", "{host}", "--port", "{port}"]  # fmt: skip
    with SimProcess(
        "--replicas", "2", "--replica-command", json.dumps(command), "--health-interval-s", "0.1",
        "--restart-after-s", "0.2", "--no-upstream-keep-alive", command="cluster",
    ) as router:  # fmt: skip
        h = router.control_headers
        body = {"model": "m", "prompt": "hello there", "max_tokens": 3, "ignore_eos": True}
        seen = set()
        for _ in range(4):
            r = httpx.post(f"{router.url}/v1/completions", json=body, timeout=30)
            assert r.status_code == 200
            seen.add(r.headers["x-sim-replica"])
        assert seen == {"0", "1"}
        before = httpx.get(f"{router.url}/cluster/replicas", headers=h).json()["replicas"]
        assert httpx.post(f"{router.url}/cluster/replicas/0/kill", headers=h).status_code == 202
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = httpx.get(f"{router.url}/cluster/replicas", headers=h).json()["replicas"]
            if now[0]["starts"] == 2 and now[0]["healthy"]:
                break
            time.sleep(0.1)
        assert now[0]["starts"] == 2 and now[0]["healthy"], now
        assert now[0]["port"] == before[0]["port"]  # restarted on its own port
        events = [
            e["event"]
            for e in httpx.get(f"{router.url}/cluster/events", headers=h).json()["events"]
        ]
        assert "killed" in events and "restarted" in events
