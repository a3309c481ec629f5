"""The simulated engine on both serving stacks over real HTTP on 127.0.0.1: uvicorn's standard
extras (uvloop + httptools, the default) and its pure-Python path (asyncio + h11) serve the same
streams, and each server reports the stack it runs on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from capacity_pack.sim import metrics as prom
from capacity_pack.sim.process import SimProcess
from capacity_pack.sim.server import serving_stack

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
