"""An engine registered from this test module alone (kind ``toyllm``: its own identity endpoint,
metric names, cache-reset endpoint, ``/tokenize`` format and dashboard names), served on
127.0.0.1 by a real HTTP server, is picked up by identity probing, metric scraping, the cold
point's cache reset, the prompt fitter's token counter and the alert rules and Grafana dashboard,
with no other file edited. The engine is unregistered afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
from starlette.responses import JSONResponse

from capacity_pack import engines
from capacity_pack.drills.alerts import alert_rules
from capacity_pack.drills.dashboard import DCGM_METRICS, grafana_dashboard
from capacity_pack.engines.exposition import ExpositionError, samples
from capacity_pack.engines.tokenize import EndpointCounter
from capacity_pack.measure.target import TargetError, open_target
from tests.promql import selected_metrics
from tests.unit.drills.test_dashboard import pack_with, rules_of
from tests.unit.engines.test_engines import Fake, expected, openai, point_facts, serve

TOY_MODEL = "toy/model-7b"
TOY = engines.Engine(
    kind="toyllm",
    aliases=("toy-llm",),
    owned_by=("toyllm",),
    families=("toy:",),
    identity=(
        engines.IdentityEndpoint(
            paths=("/toy/about",),
            identifies=lambda path, body: (
                f"{path} says toyllm"
                if isinstance(body, Mapping) and body.get("engine") == "toyllm"
                else None
            ),
            fields={"total_slots": "slots", "context_length": "limits.context"},
            version="release",
        ),
    ),
    signals={
        "queue_depth": ("toy:queue",),
        "running": ("toy:busy",),
        "kv_usage": ("toy:kv_ratio",),
        "prefix_cache_queries": ("toy:lookups_total",),
        "prefix_cache_hits": ("toy:hits_total",),
    },
    metrics=engines.EngineMetrics(
        waiting="toy:queue",
        running="toy:busy",
        kv_usage="toy:kv_ratio",
        prefix_hits="toy:hits_total",
        prefix_queries="toy:lookups_total",
        preemptions="toy:evicted_requests_total",
        replica_label="shard",
    ),
    resets=(engines.HttpReset(name="toyllm", path="/toy/forget", describe="POST /toy/forget"),),
    tokenize=engines.TokenizeFormat(
        name="toyllm",
        path="/toy/tokenize",
        body=lambda model, text: {"toy_model": model, "text": text},
        read=lambda body: body.get("n") if isinstance(body, Mapping) else None,
    ),
)


def toy_answers() -> dict[str, Any]:
    def tokenize(request: Any) -> Any:
        body = json.loads(request._body)  # read by ToyServer.handle
        return JSONResponse({"n": len(body["text"].split())})

    return {
        "GET /toy/about": {
            "engine": "toyllm",
            "release": "1.2.3",
            "slots": 3,
            "limits": {"context": 2048},
        },
        "GET /v1/models": {"object": "list", "data": [{"id": TOY_MODEL, "owned_by": "toyllm"}]},
        "GET /health": "",
        "GET /metrics": (
            "# HELP toy:queue Requests waiting.\n# TYPE toy:queue gauge\n"
            'toy:queue{shard="0"} 0\ntoy:queue{shard="1"} 0\n'
            'toy:busy{shard="0"} 0\ntoy:busy{shard="1"} 0\n'
            'toy:kv_ratio{shard="0"} 0\ntoy:kv_ratio{shard="1"} 0\n'
            "# TYPE toy:lookups_total counter\n"
            'toy:lookups_total{shard="0"} 40\ntoy:lookups_total{shard="1"} 60\n'
            'toy:hits_total{shard="0"} 10\ntoy:hits_total{shard="1"} 15\n'
            # Junk: a line the readers skip, and a toy series with a value that is no number.
            "this line is not Prometheus text\n"
            'toy:busy{shard="2"} busy\n'
        ),
        "POST /toy/forget": {"forgotten": True},
        "POST /toy/tokenize": tokenize,
    }


class ToyServer(Fake):
    """The fake server, with request bodies kept for callables that read them."""

    async def handle(self, request: Any) -> Any:
        request._body = await request.body()
        return await super().handle(request)


@pytest.fixture(scope="module")
def toy() -> Iterator[None]:
    engines.register(TOY)
    try:
        yield
    finally:
        engines.unregister("toyllm")
    assert engines.get("toyllm") is None and "toyllm" not in engines.cache_reset_names()


@pytest.fixture
def toy_url(toy: None) -> Iterator[tuple[str, ToyServer]]:
    server = ToyServer(toy_answers())
    with serve(server.app) as url:
        yield url, server


def test_the_probe_identifies_the_toy_engine(toy_url):
    url, server = toy_url
    assert "/toy/about" in engines.probe_paths()
    ident = engines.probe_engine(url)
    assert ident.kind == "toyllm", ident.evidence
    assert ident.evidence == [
        "toyllm: /v1/models owned_by 'toyllm'",
        "toyllm: /toy/about says toyllm",
        "toyllm: /metrics has toy:* series",
    ]
    assert ident.version == "1.2.3" and ident.version_url == f"{url}/toy/about"
    assert ident.total_slots == 3 and ident.context_length == 2048
    assert ident.metric_families == ["toy:"] and ident.served_models == [TOY_MODEL]
    assert server.paths("POST") == []
    assert engines.engine_kind("toy-llm-1.2") == "toyllm"
    assert engines.check_identity(ident, expected("toyllm", "1.2.3", model=TOY_MODEL)) == []
    wrong = engines.check_identity(ident, expected("vllm", "1.2.3", model=TOY_MODEL))
    assert wrong[0].startswith(f"engine.name: manifest says vllm, the server at {url} "
                               "identifies as toyllm")  # fmt: skip


def test_its_signals_are_scraped_under_its_names(toy_url):
    url, _ = toy_url
    text = httpx.get(f"{url}/metrics").text
    # The load generator's reader: summed over the shards; the junk line costs itself only.
    assert engines.parse_metrics(text) == {
        "queue_depth": 0.0,
        "running": 0.0,
        "kv_usage": 0.0,
        "prefix_cache_queries": 100.0,
        "prefix_cache_hits": 25.0,
    }
    with pytest.raises(ExpositionError):
        samples(text, strict=True)
    # The cold check's reader, through the toy map.
    values, missing = engines.read_signals(
        text, engines.metric_map("toyllm"), map_name="toyllm", url=f"{url}/metrics"
    )
    assert values["prefix_cache_hits"] == 25.0 and missing == []


def test_a_cold_point_resets_through_its_endpoint(toy_url):
    url, server = toy_url
    target = openai(url, cache_reset="toyllm")
    assert engines.check_cache_reset(target) is None
    pack = expected("toyllm", "1.2.3", model=TOY_MODEL)
    with open_target(target, TOY_MODEL, "cold", expected=pack) as (_, facts):
        assert facts["cache_preparation"] == "/toy/forget"
        assert facts["engine_identity"]["kind"] == "toyllm"
        assert facts["metric_map"] == "toyllm" and facts["missing_evidence"] == []
        assert facts["cache_empty_verified"] is True, facts.get("cache_empty_reason")
        assert facts["prefix_cache_hits_at_start"] == 25.0
    assert server.paths("POST") == ["/toy/forget"]
    # A name no engine registers stops the point with the allowed ones named.
    bogus = openai(url, cache_reset="toyllm-turbo")
    with pytest.raises(TargetError) as err:
        point_facts(bogus, TOY_MODEL, "cold", pack)
    assert str(err.value) == (
        "target.cache_reset: Input should be 'none', 'restart', 'vllm', 'sglang', 'llamacpp' or "
        "'toyllm' (got 'toyllm-turbo')"
    )


def test_prompts_are_counted_by_its_tokenize_endpoint(toy_url):
    url, server = toy_url
    counter = EndpointCounter(url, TOY_MODEL)
    assert counter.count("four words right here") == 4 and counter.flavor == "toyllm"
    assert counter.count("two more") == 2
    # vLLM's and llama.cpp's shapes were tried once each (404 here), then only the toy's.
    assert server.paths("POST") == ["/tokenize", "/tokenize", "/toy/tokenize", "/toy/tokenize"]


def test_the_dashboard_and_alerts_use_its_series(toy):
    pack = pack_with(**{"engine.name": "toyllm"})
    allowed = engines.engine_metrics("toyllm").metric_names() | set(DCGM_METRICS) | {"up"}
    doc, _ = alert_rules(pack)
    exprs = {r["alert"]: r["expr"] for r in rules_of(doc)}
    assert "toy:queue" in exprs["QueueSaturation"] and "toy:kv_ratio" in exprs["KVCachePressure"]
    for expr in exprs.values():
        assert selected_metrics(expr) <= allowed, expr
    panel_exprs = [
        t["expr"]
        for p in grafana_dashboard(pack)["panels"]
        if p["type"] != "row"
        for t in p["targets"]
    ]
    assert any("toy:busy" in e for e in panel_exprs)
    assert any("by (shard)" in e for e in panel_exprs)
    for expr in panel_exprs:
        assert selected_metrics(expr.replace("$__rate_interval", "1m")) <= allowed, expr
