"""The simulated engine on both serving stacks over real HTTP on 127.0.0.1: uvicorn's standard
extras (uvloop + httptools, the default) and its pure-Python path (asyncio + h11) serve the same
streams, and each server reports the stack it runs on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from http.client import HTTPConnection

import httpx
import pytest
import yaml

from capacity_pack.sim import metrics as prom
from capacity_pack.sim.process import SimProcess
from capacity_pack.sim.profile import load_profile
from capacity_pack.sim.serving import serving_stack

STACKS = [("uvloop", "httptools"), ("asyncio", "h11")]
PROMPT = " ".join(f"word{i}" for i in range(40))


@pytest.fixture(scope="module", params=STACKS, ids=["+".join(s) for s in STACKS])
def served(request):
    loop, http = request.param
    with SimProcess("--profile", "small-fast", "--loop", loop, "--http", http) as sim:
        headers = sim.control_headers
        with httpx.Client(base_url=sim.url, headers=headers, timeout=30, trust_env=False) as c:
            yield (loop, http), c


def sse_chunks(text: str) -> list[dict]:
    """The JSON chunks of an SSE body (``[DONE]`` checked and dropped), framing checked."""
    events = text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]", text[-200:]
    chunks = []
    for event in events[:-2]:
        assert event.startswith("data: ") and "\n" not in event, event
        chunks.append(json.loads(event[len("data: ") :]))
    return chunks


def stream(client: httpx.Client, path: str, body: dict, request_id: str) -> list[dict]:
    resp = client.post(path, json={**body, "stream": True}, headers={"X-Request-Id": request_id})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["x-request-id"] == request_id
    return sse_chunks(resp.text)


def completion_stream(client: httpx.Client) -> list[dict]:
    body = {
        "prompt": PROMPT,
        "max_tokens": 24,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    return stream(client, "/v1/completions", body, "stack-cmpl-1")


def test_streamed_completion_is_whole_on_each_stack(served):
    _, client = served
    chunks = completion_stream(client)
    tokens, usage = chunks[:-1], chunks[-1]
    assert len(tokens) == 24
    for i, chunk in enumerate(tokens):
        assert chunk["id"] == "cmpl-stack-cmpl-1"
        (choice,) = chunk["choices"]
        assert choice["text"].startswith(" ")
        assert choice["finish_reason"] == ("length" if i == 23 else None)
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 40, "total_tokens": 64, "completion_tokens": 24}


def test_streamed_chat_is_whole_on_each_stack(served):
    _, client = served
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 9, "ignore_eos": True}
    chunks = stream(client, "/v1/chat/completions", body, "stack-chat-1")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = chunks[1:]
    assert len(deltas) == 9
    assert [c["choices"][0]["finish_reason"] for c in deltas] == [None] * 8 + ["length"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_server_reports_the_stack_it_runs_on(served):
    (loop, http), client = served
    families = prom.parse(client.get("/metrics").text)
    assert prom.value(families, "sim:server_info", loop=loop, http=http) == 1.0
    (sample,) = families["sim:server_info"].samples
    assert sample.label("loop") == loop and sample.label("http") == http
    assert client.get("/sim/state").json()["server"] == {"loop": loop, "http": http}


def test_both_stacks_stream_the_same_tokens():
    texts = []
    for loop, http in STACKS:
        with (
            SimProcess("--profile", "small-fast", "--loop", loop, "--http", http) as sim,
            httpx.Client(base_url=sim.url, timeout=30, trust_env=False) as client,
        ):
            chunks = completion_stream(client)
        texts.append([c["choices"][0]["text"] for c in chunks[:-1]])
    assert texts[0] == texts[1]


def test_default_stack_is_uvicorns_standard_extras():
    # uvicorn[standard] is a dependency, so "auto" resolves to uvloop and httptools.
    assert serving_stack() == ("uvloop", "httptools")
    with SimProcess("--profile", "small-fast") as sim:
        families = prom.parse(httpx.get(f"{sim.url}/metrics", timeout=30, trust_env=False).text)
    assert prom.value(families, "sim:server_info", loop="uvloop", http="httptools") == 1.0


def test_a_stack_that_is_not_installed_is_a_one_line_error(tmp_path):
    # None in sys.modules makes ``import uvloop`` fail, as on an install without the extras.
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['uvloop'] = None\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", "capacity_pack.sim", "serve", "--port", "0", "--loop", "uvloop"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "uvloop is not installed" in lines[0], done.stderr


class _SmallWindow(HTTPConnection):
    """A client whose receive buffer is 4 KiB: not reading soon fills the server's socket, so
    the server's transport pauses writing (flow control)."""

    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(60)
        sock.connect((self.host, self.port))
        self.sock = sock


@pytest.mark.parametrize("stack", STACKS, ids=["+".join(s) for s in STACKS])
def test_a_reader_that_stops_reading_holds_back_only_its_own_stream(stack, tmp_path):
    """The engine writes each step's tokens into the streams itself; a stream whose reader
    stops waits on flow control without holding back the others, and its tokens made
    meanwhile all arrive, in order, once it reads again."""
    loop, http_impl = stack
    data = load_profile("small-fast").model_dump()
    data["name"] = "fast-steps"
    data["hardware"].update(bandwidth_tb_s=400.0, dense_tflops=160_000.0)
    data["efficiency"].update(step_overhead_ms=0.1, per_sequence_overhead_us=0.0)
    data["model"]["max_model_len"] = 32768
    profile = tmp_path / "fast-steps.yaml"
    profile.write_text(yaml.safe_dump(data))
    truth = tmp_path / "ground-truth.jsonl"
    # About 6 MB of events: beyond what the kernel buffers for the server's socket (4 MiB at
    # most, net.ipv4.tcp_wmem), so the transport must pause.
    tokens = 30_000
    args = ["--profile", str(profile), "--loop", loop, "--http", http_impl]
    with SimProcess(*args, "--ground-truth", str(truth)) as sim:
        slow = _SmallWindow("127.0.0.1", sim.port, timeout=60)
        body = {"prompt": PROMPT, "max_tokens": tokens, "ignore_eos": True, "stream": True}
        slow.request(
            "POST",
            "/v1/completions",
            body=json.dumps(body),
            headers={"Content-Type": "application/json", "X-Request-Id": "slow-reader"},
        )
        with httpx.Client(base_url=sim.url, timeout=30, trust_env=False) as client:
            # Another stream, while the slow one is held: whole.
            chunks = completion_stream(client)
            assert len(chunks) == 25 and chunks[-1]["usage"]["completion_tokens"] == 24
            # The engine finishes the slow request (30,000 short steps) while nothing reads it.
            deadline = time.monotonic() + 60
            state = {"headers": sim.control_headers}
            while client.get("/sim/state", **state).json()["running"]:
                assert time.monotonic() < deadline, "the slow request never finished"
                time.sleep(0.1)
        time.sleep(0.5)
        resp = slow.getresponse()
        assert resp.status == 200
        events = sse_chunks(resp.read().decode())
        slow.close()
    texts = [e["choices"][0]["text"] for e in events]
    assert len(texts) == tokens and all(t.startswith(" ") for t in texts)
    assert [e["choices"][0]["finish_reason"] for e in events[-2:]] == [None, "length"]
    # Its last event left the server well after the engine finished it: the write waited on
    # the reader and resumed, rather than being dropped or blocking the engine.
    lines = [json.loads(x) for x in truth.read_text().splitlines()]
    (rec,) = [r for r in lines if r["request_id"] == "slow-reader"]
    assert rec["completion_tokens"] == tokens and rec["finish_reason"] == "length"
    assert rec["last_token_sent_ns"] - rec["finished_ns"] > 0.3e9, rec
