"""The simulated engine over real HTTP on 127.0.0.1: wire format, errors, metrics, ground truth."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from capacity_pack.sim import metrics as prom
from capacity_pack.sim.process import SimProcess
from capacity_pack.sim.tokenizer import count_tokens

MODEL = "sim-small"
WORDS = [f"word{i}" for i in range(5000)]


def prompt(n: int, offset: int = 0) -> str:
    return " ".join(WORDS[(offset + i) % len(WORDS)] for i in range(n))


@pytest.fixture(scope="module")
def ground_truth(tmp_path_factory):
    return tmp_path_factory.mktemp("sim") / "ground-truth.jsonl"


@pytest.fixture(scope="module")
def server(ground_truth):
    with SimProcess("--profile", "small-fast", "--ground-truth", str(ground_truth)) as sim:
        yield sim


@pytest.fixture(scope="module")
def client(server):
    # The control-plane token rides along; the OpenAI routes ignore it.
    with httpx.Client(
        base_url=server.url, headers=server.control_headers, timeout=30, trust_env=False
    ) as c:
        yield c


@pytest.fixture(scope="module")
def burst_server():
    # Two sequences at a time and a short waiting queue: bursts queue up and overflow.
    with SimProcess("--max-num-seqs", "2", "--max-waiting-requests", "8") as sim:
        yield sim


def sse_payloads(text: str) -> list[str]:
    """The data payloads of an SSE body, checking the framing on the way."""
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = text.split("\n\n")
    assert events[-1] == ""
    payloads = []
    for event in events[:-1]:
        assert event.startswith("data: "), event
        assert "\n" not in event
        payloads.append(event[len("data: ") :])
    return payloads


def metrics(client: httpx.Client) -> dict[str, prom.MetricFamily]:
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    return prom.parse(resp.text)


def metric(families, name: str, **labels: str) -> float:
    value = prom.value(families, name, **labels)
    assert value is not None, f"no sample {name} {labels}"
    return value


def stream(client: httpx.Client, path: str, body: dict, **kwargs) -> httpx.Response:
    resp = client.post(path, json={**body, "stream": True}, **kwargs)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    return resp


# ---------------------------------------------------------------------------------------------
# Wire format
# ---------------------------------------------------------------------------------------------


def test_completion_stream_shape_and_usage_chunk(client):
    body = {
        "model": MODEL,
        "prompt": prompt(50),
        "max_tokens": 12,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    resp = stream(client, "/v1/completions", body, headers={"X-Request-Id": "req-shape-1"})
    assert resp.headers["x-request-id"] == "req-shape-1"
    payloads = sse_payloads(resp.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    tokens, usage_chunk = chunks[:-1], chunks[-1]
    assert len(tokens) == 12
    for i, chunk in enumerate(tokens):
        assert chunk["id"] == "cmpl-req-shape-1"
        assert chunk["object"] == "text_completion"
        assert chunk["model"] == MODEL
        assert isinstance(chunk["created"], int)
        (choice,) = chunk["choices"]
        assert choice["index"] == 0
        assert count_tokens(choice["text"]) == 1 and choice["text"].startswith(" ")
        assert choice["logprobs"] is None and choice["stop_reason"] is None
        assert choice["finish_reason"] == ("length" if i == 11 else None)
        assert chunk["usage"] is None
    assert usage_chunk["choices"] == []
    assert usage_chunk["id"] == "cmpl-req-shape-1"
    assert usage_chunk["usage"] == {
        "prompt_tokens": 50,
        "total_tokens": 62,
        "completion_tokens": 12,
    }


def test_chat_stream_shape(client):
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": prompt(5)},
            {"role": "user", "content": prompt(20, 5)},
        ],
        "max_completion_tokens": 5,
        "ignore_eos": True,
    }
    payloads = sse_payloads(stream(client, "/v1/chat/completions", body).text)
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert len(chunks) == 6  # role, then one per token; no usage chunk without include_usage
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["id"].startswith("chatcmpl-")
    deltas = [c["choices"][0]["delta"]["content"] for c in chunks[1:]]
    assert all(count_tokens(d) == 1 for d in deltas)
    assert [c["choices"][0]["finish_reason"] for c in chunks[1:]] == [None] * 4 + ["length"]

    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    chunks = [
        json.loads(p) for p in sse_payloads(stream(client, "/v1/chat/completions", body).text)[:-1]
    ]
    assert [c["usage"]["completion_tokens"] for c in chunks[1:-1]] == [1, 2, 3, 4, 5]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 25


@pytest.mark.parametrize("max_tokens", [1, 7, 40])
def test_exact_output_lengths_with_ignore_eos(client, max_tokens):
    base = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True}
    payloads = sse_payloads(stream(client, "/v1/completions", {**base, "prompt": prompt(30)}).text)
    assert len(payloads) == max_tokens + 1

    resp = client.post("/v1/completions", json={**base, "prompt": prompt(30)})
    assert resp.status_code == 200
    data = resp.json()
    assert data["object"] == "text_completion"
    assert data["usage"]["completion_tokens"] == max_tokens
    assert count_tokens(data["choices"][0]["text"]) == max_tokens
    assert data["choices"][0]["finish_reason"] == "length"

    chat = {**base, "messages": [{"role": "user", "content": prompt(30, 1000 + max_tokens)}]}
    data = client.post("/v1/chat/completions", json=chat).json()
    assert data["object"] == "chat.completion"
    assert count_tokens(data["choices"][0]["message"]["content"]) == max_tokens
    assert data["usage"] == {
        "prompt_tokens": 30,
        "total_tokens": 30 + max_tokens,
        "completion_tokens": max_tokens,
    }


def test_prompt_token_ids_and_default_max_tokens(client):
    data = client.post("/v1/completions", json={"prompt": list(range(1, 25))}).json()
    assert data["usage"]["prompt_tokens"] == 24
    # vLLM's completions default is 16 tokens; this one may stop earlier at a seeded EOS.
    assert 1 <= data["usage"]["completion_tokens"] <= 16


def test_outputs_stop_early_without_ignore_eos_and_honour_min_tokens(client):
    async def run() -> list[dict]:
        async with httpx.AsyncClient(base_url=client.base_url, timeout=60) as ac:
            bodies = [{"prompt": prompt(10, i), "max_tokens": 600} for i in range(12)]
            bodies += [
                {"prompt": prompt(10, i), "max_tokens": 60, "min_tokens": 50} for i in range(6)
            ]
            resps = await asyncio.gather(*(ac.post("/v1/completions", json=b) for b in bodies))
            return [r.json() for r in resps]

    results = asyncio.run(run())
    free, bounded = results[:12], results[12:]
    lengths = [r["usage"]["completion_tokens"] for r in free]
    reasons = [r["choices"][0]["finish_reason"] for r in free]
    # EOS at a seeded geometric draw with mean 128: nearly all stop well before 600 tokens.
    assert reasons.count("stop") >= 9 and len(set(lengths)) >= 5
    assert all(1 <= n <= 600 for n in lengths)
    for r in bounded:
        assert 50 <= r["usage"]["completion_tokens"] <= 60
    # The same seed gives the same output.
    a, b = (
        client.post(
            "/v1/completions", json={"prompt": "x y", "max_tokens": 300, "seed": 42}
        ).json()["choices"][0]
        for _ in range(2)
    )
    assert a["text"] == b["text"] and a["finish_reason"] == b["finish_reason"]


def test_stop_strings_cut_the_output(client):
    first = client.post(
        "/v1/completions", json={"prompt": "a b", "max_tokens": 30, "seed": 5, "ignore_eos": True}
    ).json()["choices"][0]["text"]
    target = first.split()[9]
    data = client.post(
        "/v1/completions",
        json={"prompt": "a b", "max_tokens": 30, "seed": 5, "ignore_eos": True, "stop": [target]},
    ).json()
    choice = data["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == target
    assert target not in choice["text"] and first.startswith(choice["text"])


# ---------------------------------------------------------------------------------------------
# Other endpoints and errors
# ---------------------------------------------------------------------------------------------


def test_health_ping_version_models(client):
    assert client.get("/health").status_code == 200
    assert client.get("/ping").status_code == 200
    assert client.post("/ping").status_code == 200
    assert client.get("/version").json() == {"version": "0.1.0"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert card["id"] == MODEL and card["object"] == "model" and card["max_model_len"] == 8192


def _assert_error(resp: httpx.Response, status: int, err_type: str, contains: str = "") -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status and body["error"]["type"] == err_type
    assert contains in body["error"]["message"]
    return body["error"]


def test_error_shapes(client):
    post = client.post
    _assert_error(post("/v1/completions", content=b"{not json"), 400, "BadRequestError", "JSON")
    _assert_error(post("/v1/completions", json=[1, 2]), 400, "BadRequestError")
    err = _assert_error(post("/v1/completions", json={"max_tokens": 3}), 400, "BadRequestError")
    assert err["param"] == "prompt"
    _assert_error(post("/v1/completions", json={"prompt": "   "}), 400, "BadRequestError")
    _assert_error(
        post("/v1/completions", json={"prompt": prompt(8000), "max_tokens": 500}),
        400,
        "BadRequestError",
        "maximum context length is 8192 tokens",
    )
    _assert_error(
        post("/v1/completions", json={"prompt": "a", "max_tokens": 0}), 400, "BadRequestError"
    )
    _assert_error(post("/v1/completions", json={"prompt": "a", "n": 2}), 400, "BadRequestError")
    _assert_error(
        post("/v1/completions", json={"prompt": "a", "stream_options": {"include_usage": True}}),
        400,
        "BadRequestError",
        "stream=True",
    )
    _assert_error(post("/v1/chat/completions", json={"messages": []}), 400, "BadRequestError")
    err = _assert_error(
        post("/v1/completions", json={"model": "gpt-nothing", "prompt": "a"}),
        404,
        "NotFoundError",
        "gpt-nothing",
    )
    assert err["param"] == "model"
    _assert_error(client.get("/v1/nothing"), 404, "NotFoundError")
    assert client.get("/v1/completions").status_code == 405


def test_admission_control_rejects_with_429(burst_server):
    async def run() -> list[int]:
        async with httpx.AsyncClient(base_url=burst_server.url, timeout=60) as ac:
            body = {"prompt": prompt(20), "max_tokens": 30, "ignore_eos": True}
            resps = await asyncio.gather(
                *(ac.post("/v1/completions", json=body) for _ in range(16))
            )
            for r in resps:
                if r.status_code == 429:
                    _assert_error(r, 429, "RateLimitError", "waiting queue is full")
            return [r.status_code for r in resps]

    codes = asyncio.run(run())
    # At most 2 running + 8 waiting fit (8 when the burst lands before the first step admits
    # any); the rest of a simultaneous burst of 16 is refused.
    assert 8 <= codes.count(200) <= 10 and codes.count(429) >= 6
    assert set(codes) <= {200, 429}
    with httpx.Client(base_url=burst_server.url, trust_env=False) as c:
        fams = metrics(c)
    assert metric(fams, "sim:requests_rejected_total", reason="queue_full") == codes.count(429)


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def test_metrics_parse_and_count_requests(client):
    before = metrics(client)
    names = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prompt_tokens_total": "counter",
        "vllm:generation_tokens_total": "counter",
        "vllm:request_success_total": "counter",
        "vllm:num_preemptions_total": "counter",
        "vllm:prefix_cache_queries_total": "counter",
        "vllm:prefix_cache_hits_total": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "sim:step_lateness_seconds": "histogram",
        "sim:prefix_cache_evictions_total": "counter",
    }
    for name, kind in names.items():
        assert before[name].type == kind
        for sample in before[name].samples:
            assert sample.label("model_name") == MODEL and sample.label("engine") == "0"
    ttft_bounds = [
        float(s.label("le"))
        for s in before["vllm:time_to_first_token_seconds"].samples
        if s.name.endswith("_bucket")
    ]
    assert ttft_bounds[:3] == [0.001, 0.005, 0.01] and ttft_bounds[-2:] == [2560.0, float("inf")]
    itl = before["vllm:inter_token_latency_seconds"].samples
    assert [float(s.label("le")) for s in itl if s.name.endswith("_bucket")][:2] == [0.01, 0.025]
    e2e = before["vllm:e2e_request_latency_seconds"].samples
    assert [float(s.label("le")) for s in e2e if s.name.endswith("_bucket")][-2] == 7680.0
    reasons = {s.label("finished_reason") for s in before["vllm:request_success_total"].samples}
    assert reasons == {"stop", "length", "abort"}

    for n in (3, 5):
        client.post(
            "/v1/completions",
            json={"prompt": prompt(17, 100 + n), "max_tokens": n, "ignore_eos": True},
        )
    after = metrics(client)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vllm:prompt_tokens_total") == 34
    assert delta("vllm:generation_tokens_total") == 8
    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert delta("vllm:inter_token_latency_seconds_count") == 2 + 4
    assert delta("vllm:e2e_request_latency_seconds_count") == 2
    assert delta("vllm:request_queue_time_seconds_count") == 2
    assert delta("vllm:prefix_cache_queries_total") == 34
    assert delta("sim:step_lateness_seconds_count") >= 8
    assert metric(after, "vllm:num_requests_running") == 0
    assert 0.0 <= metric(after, "vllm:kv_cache_usage_perc") <= 1.0


def test_waiting_rises_under_a_burst_and_drains(burst_server):
    with httpx.Client(base_url=burst_server.url, timeout=30, trust_env=False) as c:
        assert metric(metrics(c), "vllm:num_requests_waiting") == 0

        async def run() -> tuple[list[float], list[float], list[float]]:
            waiting, running, ttfts = [], [], []
            async with httpx.AsyncClient(base_url=burst_server.url, timeout=60) as ac:

                async def one(i: int) -> None:
                    t0 = time.monotonic()
                    body = {
                        "prompt": prompt(40, i),
                        "max_tokens": 25,
                        "ignore_eos": True,
                        "stream": True,
                    }
                    first = None
                    async with ac.stream("POST", "/v1/completions", json=body) as r:
                        async for _ in r.aiter_lines():
                            first = first or time.monotonic() - t0
                    ttfts.append(first)

                tasks = [asyncio.ensure_future(one(i)) for i in range(8)]
                while not all(t.done() for t in tasks):
                    fams = prom.parse((await ac.get("/metrics")).text)
                    waiting.append(prom.value(fams, "vllm:num_requests_waiting"))
                    running.append(prom.value(fams, "vllm:num_requests_running"))
                    await asyncio.sleep(0.02)
                await asyncio.gather(*tasks)
            return waiting, running, ttfts

        waiting, running, ttfts = asyncio.run(run())
        assert max(waiting) >= 4
        assert max(running) <= 2
        fams = metrics(c)
        assert metric(fams, "vllm:num_requests_waiting") == 0
        assert metric(fams, "vllm:num_requests_running") == 0
    # Queued requests wait whole services of the ones ahead: the slowest first token comes
    # several decode lengths after the fastest.
    assert max(ttfts) > 3 * min(ttfts)


def test_prefix_hits_rise_on_repeats_and_reset_clears_them(client):
    shared = prompt(64, 3000)
    body = {"prompt": shared, "max_tokens": 2, "ignore_eos": True}
    first = client.post("/v1/completions", json=body).json()
    assert "prompt_tokens_details" not in first["usage"]
    before = metrics(client)
    second = client.post("/v1/completions", json=body).json()
    # (64 - 1) // 16 = 3 full blocks come from the cache.
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 48}
    after = metrics(client)
    assert (
        metric(after, "vllm:prefix_cache_hits_total")
        - metric(before, "vllm:prefix_cache_hits_total")
        == 48
    )
    assert (
        metric(after, "vllm:prefix_cache_queries_total")
        - metric(before, "vllm:prefix_cache_queries_total")
        == 64
    )
    # A streamed repeat reports the cached tokens in its usage chunk too.
    payloads = sse_payloads(
        stream(client, "/v1/completions", {**body, "stream_options": {"include_usage": True}}).text
    )
    assert json.loads(payloads[-2])["usage"]["prompt_tokens_details"] == {"cached_tokens": 48}

    reset = client.post("/reset_prefix_cache")
    assert reset.status_code == 200 and reset.json()["reset"] is True
    third = client.post("/v1/completions", json=body).json()
    assert "prompt_tokens_details" not in third["usage"]
    fams = metrics(client)
    assert metric(fams, "sim:prefix_cache_resets_total", result="done") >= 1


def test_reset_is_refused_while_blocks_are_in_use(client):
    body = {"prompt": prompt(32), "max_tokens": 200, "ignore_eos": True, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as resp:
        lines = resp.iter_lines()
        assert next(lines).startswith("data: ")  # the request now holds KV blocks
        refused = client.post("/reset_prefix_cache")
        assert refused.status_code == 200
        assert refused.json()["reset"] is False and refused.json()["blocks_in_use"] > 0
        fams = metrics(client)
        assert metric(fams, "sim:prefix_cache_resets_total", result="refused") >= 1
    # Closing the stream early aborts the request and frees its blocks.
    deadline = time.monotonic() + 10
    while metric(metrics(client), "vllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(metrics(client), "vllm:request_success_total", finished_reason="abort") >= 1
    assert client.post("/reset_prefix_cache").json()["reset"] is True


def test_preemptions_occur_when_kv_is_made_small(client):
    before = metric(metrics(client), "vllm:num_preemptions_total")
    # 35,425 blocks x 0.0005 = 17 blocks (272 tokens) for four 100-token requests (7 blocks each).
    r = client.post("/sim/faults", json={"kv_capacity_fraction": 0.0005})
    assert r.status_code == 200 and r.json()["kv_capacity_fraction"] == 0.0005
    try:
        assert client.get("/sim/state").json()["kv_blocks_usable"] == 17

        async def run() -> list[dict]:
            async with httpx.AsyncClient(base_url=client.base_url, timeout=60) as ac:
                bodies = [
                    {"prompt": prompt(40, 700 * i), "max_tokens": 60, "ignore_eos": True}
                    for i in range(4)
                ]
                resps = await asyncio.gather(*(ac.post("/v1/completions", json=b) for b in bodies))
                return [x.json() for x in resps]

        results = asyncio.run(run())
        assert [x["usage"]["completion_tokens"] for x in results] == [60] * 4
        fams = metrics(client)
        assert metric(fams, "vllm:num_preemptions_total") > before
        # A request larger than the usable cache is refused outright.
        big = client.post("/v1/completions", json={"prompt": prompt(300), "max_tokens": 5})
        _assert_error(big, 503, "ServiceUnavailableError", "KV blocks")
    finally:
        client.post("/sim/faults", json={"kv_capacity_fraction": 1.0})
    bad = client.post("/sim/faults", json={"kv_capacity_fraction": 2})
    _assert_error(bad, 400, "BadRequestError", "kv_capacity_fraction")
    _assert_error(client.post("/sim/faults", json={"nonsense": 1}), 400, "BadRequestError")


# ---------------------------------------------------------------------------------------------
# Ground truth
# ---------------------------------------------------------------------------------------------


def test_ground_truth_log(client, ground_truth):
    rid = "gt-check-1"
    body = {"prompt": prompt(20, 4000), "max_tokens": 9, "ignore_eos": True}
    payloads = sse_payloads(
        stream(client, "/v1/completions", body, headers={"X-Request-Id": rid}).text
    )
    assert len(payloads) == 10
    client.post(
        "/v1/completions",
        json={"model": "other", "prompt": "a"},
        headers={"X-Request-Id": "gt-check-404"},
    )
    records = {}
    for line in ground_truth.read_text().splitlines():
        rec = json.loads(line)
        records[rec["request_id"]] = rec
    rec = records[rid]
    assert rec["status"] == 200 and rec["stream"] is True and rec["endpoint"] == "completions"
    assert rec["prompt_tokens"] == 20 and rec["completion_tokens"] == 9
    assert rec["finish_reason"] == "length" and rec["cached_tokens"] == 0
    assert rec["arrival_ns"] <= rec["scheduled_ns"] <= rec["first_token_ns"] <= rec["last_token_ns"]
    assert rec["first_token_ns"] <= rec["first_token_sent_ns"] <= rec["last_token_sent_ns"]
    assert rec["last_token_ns"] <= rec["last_token_sent_ns"]
    assert rec["finished_ns"] == rec["last_token_ns"]
    # Unix-epoch nanoseconds, close to now.
    assert abs(rec["arrival_ns"] - time.time_ns()) < 600e9
    assert rec["arrival_ns"] - rec["clock_offset_ns"] > 0
    assert records["gt-check-404"]["status"] == 404
    assert "first_token_ns" not in records["gt-check-404"]
