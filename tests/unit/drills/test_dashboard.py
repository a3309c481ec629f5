"""Engine metric maps, the Prometheus alerting rules and the Grafana dashboard of a pack."""

from __future__ import annotations

import copy
import json
import re
import subprocess

import pytest
import yaml

from capacity_pack.drills.alerts import (
    SEVERITIES,
    STATIC_LABELS,
    AlertThresholds,
    alert_rules,
    write_alert_rules,
)
from capacity_pack.drills.dashboard import (
    DCGM_METRICS,
    ROW_TITLES,
    build_dashboard,
    grafana_dashboard,
    write_grafana_dashboard,
)
from capacity_pack.drills.queries import DashboardError, engine_metrics, metric_map_name
from capacity_pack.engines import metric_maps
from capacity_pack.plan.manifest import load_pack, load_yaml, validate_pack
from tests.paths import DEFAULT
from tests.promql import needs_promtool, parse, require_promtool, selected_metrics

MECHANISMS = {
    "replica_failure",
    "queue_saturation",
    "kv_pressure",
    "transfer_degradation",
    "cancellation",
    "cold_start",
    "errors",
    "slo",
}


def pack_with(**changes):
    """The default pack with dotted-path changes, e.g. ``{"engine.name": "vllm"}``."""
    data = copy.deepcopy(load_yaml(DEFAULT))
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    return validate_pack(data, str(DEFAULT))


@pytest.fixture(scope="module")
def sim_pack():
    return load_pack(DEFAULT)


def rules_of(doc):
    (group,) = doc["groups"]
    return group["rules"]


def by_labels(expr: str) -> set[str]:
    found = set()
    for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        found.update(x.strip() for x in clause.split(",") if x.strip())
    return found


# ---------------------------------------------------------------------------------------------
# Engine maps
# ---------------------------------------------------------------------------------------------


def test_vllm_map_uses_vllm_v1_names():
    m = metric_maps()["vllm"]
    assert m.waiting == "vllm:num_requests_waiting"
    assert m.running == "vllm:num_requests_running"
    assert m.kv_usage == "vllm:kv_cache_usage_perc"
    assert (m.prefix_hits, m.prefix_queries) == (
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
    )
    assert m.prefix_hit_rate is None
    assert m.preemptions == "vllm:num_preemptions_total"
    assert m.request_success == "vllm:request_success_total"
    assert (m.finish_reason_label, m.abort_reason) == ("finished_reason", "abort")
    assert m.ttft_hist == "vllm:time_to_first_token_seconds"
    assert m.itl_hist == "vllm:inter_token_latency_seconds"
    assert m.iteration_tokens_hist == "vllm:iteration_tokens_total"
    assert m.replica_label == "engine"
    assert m.evictions is None and not m.router
    assert m.ttft_buckets[:3] == (0.001, 0.005, 0.01) and m.ttft_buckets[-1] == 2560.0
    assert m.itl_buckets[:3] == (0.01, 0.025, 0.05) and m.itl_buckets[-1] == 80.0


def test_sglang_map_exposes_only_what_sglang_has():
    m = metric_maps()["sglang"]
    assert m.waiting == "sglang:num_queue_reqs"
    assert m.running == "sglang:num_running_reqs"
    assert m.kv_usage == "sglang:token_usage"
    assert m.prefix_hit_rate == "sglang:cache_hit_rate"
    assert m.prefix_hits is None and m.prefix_queries is None
    assert m.preemptions == "sglang:num_retracted_requests_total"
    assert m.replica_label == "dp_rank"
    # SGLang has no finish-reason counter, no eviction counter and no iteration histogram.
    assert m.request_success is None and m.evictions is None
    assert m.iteration_tokens_hist is None and not m.router
    assert all(v.startswith("sglang:") for v in m.metric_names())


def test_sim_map_is_vllm_plus_sim_and_router_extras():
    vllm, sim = metric_maps()["vllm"], metric_maps()["capacity-pack-sim"]
    assert sim.router and sim.evictions == "sim:prefix_cache_evictions_total"
    assert sim.engine_rejections == "sim:requests_rejected_total"
    for field in type(vllm).model_fields:
        if field not in {"evictions", "engine_rejections", "router"}:
            assert getattr(sim, field) == getattr(vllm, field), field
    names = sim.metric_names()
    assert {"router:replica_up", "router:replica_health_rtt_seconds"} <= names
    assert "vllm:time_to_first_token_seconds_bucket" in names
    assert "vllm:time_to_first_token_seconds" not in names


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("vllm", "vllm"),
        ("vllm-0.11", "vllm"),
        ("VLLM", "vllm"),
        ("sglang-0.5.4", "sglang"),
        ("capacity-pack-sim", "capacity-pack-sim"),
    ],
)
def test_engine_metrics_matches_exact_or_prefix(name, key):
    assert engine_metrics(name) == metric_maps()[key]


def test_unknown_engine_names_the_known_ones_and_asks_for_overrides():
    with pytest.raises(DashboardError) as err:
        engine_metrics("tutorial-engine-fixture")
    text = str(err.value)
    for known in metric_maps():
        assert known in text
    assert "overrides" in text
    # A name that merely starts with the letters of a known engine is not that engine.
    with pytest.raises(DashboardError):
        engine_metrics("vllmx")


def test_overrides_replace_drop_and_build_maps():
    m = engine_metrics("vllm", {"replica_label": "pod", "preemptions": None})
    assert m.replica_label == "pod" and m.preemptions is None
    assert m.waiting == "vllm:num_requests_waiting"
    assert metric_maps()["vllm"].preemptions is not None  # the shared map is untouched
    custom = engine_metrics("my-engine", {"waiting": "my:queue", "replica_label": "worker"})
    assert custom.waiting == "my:queue" and custom.kv_usage is None
    with pytest.raises(DashboardError, match="valid fields"):
        engine_metrics("vllm", {"queue_depth": "x"})
    with pytest.raises(DashboardError, match="finish_reason_label"):
        engine_metrics("sglang", {"request_success": "sglang:num_requests_total"})


# ---------------------------------------------------------------------------------------------
# Alert rules
# ---------------------------------------------------------------------------------------------


def test_rules_structure_and_bounded_labels(sim_pack):
    doc, omitted = alert_rules(sim_pack)
    assert omitted == []
    (group,) = doc["groups"]
    assert set(group) == {"name", "interval", "rules"}
    assert group["name"] == "capacity-pack-rehearsal-sim" and group["interval"] == "1s"
    m = metric_maps()["capacity-pack-sim"]
    allowed_by = {m.replica_label, "replica", "code", m.finish_reason_label}
    for rule in group["rules"]:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}
        assert tuple(rule["labels"]) == STATIC_LABELS
        assert rule["labels"]["severity"] in SEVERITIES
        assert rule["labels"]["pack"] == "rehearsal-sim"
        assert rule["labels"]["model_revision"] == "sim-small-r1"
        assert rule["labels"]["engine_version"] == "0.1.0"
        assert set(rule["annotations"]) == {"summary", "description"}
        assert (
            "{{ $value" in rule["annotations"]["description"]
            or "{{ $labels." in (rule["annotations"]["description"])
        )
        assert by_labels(rule["expr"]) <= allowed_by, rule["expr"]
        assert "request_id" not in rule["expr"]
        assert re.fullmatch(r"[0-9]+(ms|s)", rule["for"])
        # Drill scale: seconds, not minutes.
        assert rule["for"] in {"1s", "2s", "3s"}
        windows = re.findall(r"\[([^\]]+)\]", rule["expr"])
        assert all(w == "10s" for w in windows)
    assert {r["labels"]["mechanism"] for r in group["rules"]} == MECHANISMS


def test_sim_rule_expressions(sim_pack):
    rules = {r["alert"]: r for r in rules_of(alert_rules(sim_pack)[0])}
    assert list(rules) == [
        "ReplicaDown",
        "QueueSaturation",
        "KVCachePressure",
        "TransferDegraded",
        "RequestCancellations",
        "ColdReplica",
        "ErrorRate",
        "SLOBurnTTFT",
        "SLOBurnTPOT",
    ]
    assert rules["ReplicaDown"]["expr"] == (
        "(min by (replica) (router:replica_up) == 0 unless on (replica) "
        "(max by (replica) (router:replica_starting) == 1)) or up == 0"
    )
    q = rules["QueueSaturation"]["expr"]
    assert "sum by (engine) (vllm:num_requests_waiting) > 8" in q
    assert "max by (engine) (vllm:kv_cache_usage_perc) < 0.9" in q
    assert "rate(router:admission_rejected_total[10s])) > 0.5" in q
    # A share too: one Poisson burst of refusals lifts the rate for a whole window, not the share.
    assert (
        "sum(rate(router:admission_rejected_total[10s])) / sum(rate(router:responses_total[10s]))"
        " > 0.05" in q
    )
    rtt = "max by (replica) (router:replica_health_rtt_seconds)"
    assert rules["TransferDegraded"]["expr"] == (
        f"(({rtt} > 0.1) and ({rtt} > on() group_left() "
        "(2 * min(router:replica_health_rtt_seconds)))) "
        f"or (({rtt} > 0.1) and on() (count({rtt}) == 1))"
    )
    assert 'finished_reason="abort"' in rules["RequestCancellations"]["expr"]
    assert rules["RequestCancellations"]["expr"].endswith("> 0.05")
    assert rules["ErrorRate"]["expr"].endswith("> 0.01")  # acceptance.error_rate_max
    assert 'code!~"2.."' in rules["ErrorRate"]["expr"]
    cold = rules["ColdReplica"]["expr"]
    assert "< 0.5 * scalar(" in cold and cold.endswith("> 0.2))")
    assert cold.startswith("(max by (replica) (router:replica_starting) == 1) or ")
    # Strictest cutoffs: 250 ms TTFT and 25 ms TPOT, both exact vLLM bucket bounds; budget 5%.
    ttft, tpot = rules["SLOBurnTTFT"], rules["SLOBurnTPOT"]
    assert 'vllm:time_to_first_token_seconds_bucket{le="0.25"}' in ttft["expr"]
    assert 'vllm:inter_token_latency_seconds_bucket{le="0.05"}' in tpot["expr"]
    assert ttft["expr"].endswith("> 0.1") and tpot["expr"].endswith("> 0.1")
    assert "le=0.25" in ttft["annotations"]["description"]
    assert "interactive" in ttft["annotations"]["description"]
    assert "no workload-class label" in ttft["annotations"]["description"]


def test_slo_cutoff_rounds_up_to_a_bucket_bound():
    data = load_yaml(DEFAULT)
    workload = copy.deepcopy(data["workload"])
    for c in workload:
        c["request_ttft_cutoff_ms"] = 300
        c["request_tpot_cutoff_ms"] = 60
    pack = pack_with(workload=workload, **{"acceptance.class_slo_attainment_min": 0.99})
    rules = {r["alert"]: r for r in rules_of(alert_rules(pack)[0])}
    assert 'le="0.5"' in rules["SLOBurnTTFT"]["expr"]
    assert 'le="0.075"' in rules["SLOBurnTPOT"]["expr"]
    assert rules["SLOBurnTTFT"]["expr"].endswith("> 0.02")  # 2 x (1 - 0.99)
    assert "rounded up from 300 ms" in rules["SLOBurnTTFT"]["annotations"]["description"]

    for c in workload:
        c["request_tpot_cutoff_ms"] = 100_000  # beyond the ITL histogram's 80 s bound
    doc, omitted = alert_rules(pack_with(workload=workload))
    assert "SLOBurnTPOT" not in {r["alert"] for r in rules_of(doc)}
    assert any(o["alert"] == "SLOBurnTPOT" and "largest bucket" in o["reason"] for o in omitted)


def test_thresholds_from_argument_and_pack(sim_pack):
    custom = AlertThresholds(rate_window_s=300, for_s=300, kv_usage_max=0.8, error_rate_max=0.05)
    rules = {r["alert"]: r for r in rules_of(alert_rules(sim_pack, custom)[0])}
    assert "[5m]" not in rules["KVCachePressure"]["expr"]
    assert "[300s]" in rules["KVCachePressure"]["expr"]
    assert "> 0.8" in rules["KVCachePressure"]["expr"]
    assert rules["KVCachePressure"]["for"] == "300s"
    assert rules["ErrorRate"]["expr"].endswith("> 0.05")
    # A mapping works too (the pack's failure.alert_thresholds is one), sub-second durations too.
    rules = {r["alert"]: r for r in rules_of(alert_rules(sim_pack, {"replica_down_for_s": 0.5})[0])}
    assert rules["ReplicaDown"]["for"] == "500ms"
    with pytest.raises(DashboardError, match="valid fields"):
        alert_rules(sim_pack, {"no_such_threshold": 1.0})
    if "failure" in type(sim_pack).model_fields and sim_pack.failure is not None:
        pack = sim_pack.model_copy(deep=True)
        pack.failure.alert_thresholds = {"health_rtt_max_s": 0.2}
        rules = {r["alert"]: r for r in rules_of(alert_rules(pack)[0])}
        assert (
            rules["TransferDegraded"]["expr"].count("(router:replica_health_rtt_seconds) > 0.2")
            == 2
        )


def test_rules_missing_signals_are_left_out_and_reported():
    doc, omitted = alert_rules(pack_with(**{"engine.name": "sglang-0.5"}))
    names = {r["alert"] for r in rules_of(doc)}
    whole = {o["alert"] for o in omitted if o["scope"] == "rule"}
    assert whole == {"TransferDegraded", "RequestCancellations", "ErrorRate"}
    assert not names & whole
    assert {"ReplicaDown", "QueueSaturation", "KVCachePressure", "ColdReplica"} <= names
    assert all(o["reason"] for o in omitted)
    rules = {r["alert"]: r for r in rules_of(doc)}
    assert "sglang:num_retracted_requests_total" in rules["KVCachePressure"]["expr"]
    assert "by (dp_rank)" in rules["ColdReplica"]["expr"]
    assert "avg_over_time(sglang:cache_hit_rate[10s])" in rules["ColdReplica"]["expr"]
    # SGLang's own TTFT buckets: 250 ms rounds up to 0.4 s.
    assert 'le="0.4"' in rules["SLOBurnTTFT"]["expr"]

    # Dropping both KV signals removes the rule; dropping one keeps it and reports the clause.
    doc, omitted = alert_rules(
        pack_with(**{"engine.name": "vllm"}), overrides={"kv_usage": None, "preemptions": None}
    )
    assert "KVCachePressure" not in {r["alert"] for r in rules_of(doc)}
    assert {"alert": "KVCachePressure", "mechanism": "kv_pressure", "scope": "rule"}.items() <= (
        next(o for o in omitted if o["alert"] == "KVCachePressure" and o["scope"] == "rule").items()
    )
    doc, omitted = alert_rules(
        pack_with(**{"engine.name": "vllm"}), overrides={"preemptions": None}
    )
    kv = next(r for r in rules_of(doc) if r["alert"] == "KVCachePressure")
    assert "preemptions" not in kv["expr"]
    assert any(o["alert"] == "KVCachePressure" and o["scope"] == "clause" for o in omitted)


def test_replica_label_override_reaches_every_aggregation(sim_pack):
    doc, _ = alert_rules(sim_pack, overrides={"replica_label": "pod"})
    exprs = " ".join(r["expr"] for r in rules_of(doc))
    assert "by (engine)" not in exprs and "by (pod)" in exprs
    descs = " ".join(r["annotations"]["description"] for r in rules_of(doc))
    assert "$labels.pod" in descs and "$labels.engine" not in descs


def test_write_alert_rules_is_atomic_and_comments_omissions(tmp_path):
    pack = pack_with(**{"engine.name": "vllm"})
    path = tmp_path / "alerts" / "rules.yml"
    omitted = write_alert_rules(pack, path)
    assert [p.name for p in path.parent.iterdir()] == ["rules.yml"]
    text = path.read_text()
    assert yaml.safe_load(text) == alert_rules(pack)[0]
    assert omitted == alert_rules(pack)[1]
    for o in omitted:
        assert f"# left out ({o['scope']}): {o['alert']}: {o['reason']}" in text
    # A failure while writing leaves the old file in place.
    with pytest.raises(DashboardError):
        write_alert_rules(pack, path, thresholds={"bogus": 1.0})
    assert path.read_text() == text


def test_unknown_engine_pack_needs_overrides():
    # A simulated target stands in for any engine: its series are the simulator's.
    sim = pack_with(**{"engine.name": "tutorial-engine-fixture"})
    assert metric_map_name(sim) == "capacity-pack-sim"
    assert "ReplicaDown" in {r["alert"] for r in rules_of(alert_rules(sim)[0])}
    pack = pack_with(
        **{"engine.name": "tutorial-engine-fixture", "engine.metric_names": "no-such-map"}
    )
    with pytest.raises(DashboardError, match="overrides"):
        alert_rules(pack)
    doc, omitted = alert_rules(pack, overrides={"kv_usage": "fixture:kv", "replica_label": "w"})
    assert [r["alert"] for r in rules_of(doc)] == ["ReplicaDown", "KVCachePressure"]
    assert {o["alert"] for o in omitted if o["scope"] == "rule"} >= {"SLOBurnTTFT", "ErrorRate"}


# -- promtool ---------------------------------------------------------------------------------


@needs_promtool
@pytest.mark.parametrize("engine", sorted(metric_maps()))
def test_promtool_check_rules_passes(tmp_path, engine):
    path = tmp_path / "rules.yml"
    write_alert_rules(pack_with(**{"engine.name": engine}), path)
    out = subprocess.run(
        [require_promtool(), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


EVAL_AT_S = 20


def _scenarios(doc: dict) -> list[tuple[list[dict[str, str]], dict[str, list[dict[str, str]]]]]:
    """Synthetic 1 s series (promtool's notation) and, per alert, the label sets firing at
    ``EVAL_AT_S``: each mechanism on its own signal for the right replica, and a healthy fleet
    that fires nothing."""
    static = dict(rules_of(doc)[0]["labels"])
    v, e = "vllm:", {"model_name": "sim-small"}
    e0 = {**e, "engine": "0"}

    def labels(alert: str, **extra: str) -> dict[str, str]:
        mech = next(r for r in rules_of(doc) if r["alert"] == alert)["labels"]
        return {**static, **mech, **extra}

    healthy = [
        _series("router:replica_up", {"replica": "0"}, "1x30"),
        _series("router:replica_up", {"replica": "1"}, "1x30"),
        _series("router:replica_health_rtt_seconds", {"replica": "0"}, "0.001x30"),
        _series(f"{v}num_requests_waiting", {**e, "engine": "0"}, "0x30"),
        _series(f"{v}kv_cache_usage_perc", {**e, "engine": "0"}, "0.3x30"),
        _series(f"{v}num_preemptions_total", {**e, "engine": "0"}, "0x30"),
        _series(f"{v}prefix_cache_hits_total", {**e, "engine": "0"}, "0+50x30"),
        _series(f"{v}prefix_cache_queries_total", {**e, "engine": "0"}, "0+100x30"),
        _series(f"{v}prefix_cache_hits_total", {**e, "engine": "1"}, "0+45x30"),
        _series(f"{v}prefix_cache_queries_total", {**e, "engine": "1"}, "0+100x30"),
        _series("router:responses_total", {"code": "200"}, "0+10x30"),
        _series("router:admission_rejected_total", {}, "0x30"),
        _series(f"{v}request_success_total", {**e0, "finished_reason": "stop"}, "0+10x30"),
        _series(f"{v}request_success_total", {**e0, "finished_reason": "abort"}, "0x30"),
        _series(f"{v}time_to_first_token_seconds_bucket", {**e0, "le": "0.25"}, "0+10x30"),
        _series(f"{v}time_to_first_token_seconds_count", e0, "0+10x30"),
        _series(f"{v}inter_token_latency_seconds_bucket", {**e0, "le": "0.05"}, "0+99x30"),
        _series(f"{v}inter_token_latency_seconds_count", e0, "0+100x30"),
    ]
    all_alerts = [r["alert"] for r in rules_of(doc)]
    cases = [
        (healthy, {a: [] for a in all_alerts}),
        (
            [
                _series("router:replica_up", {"replica": "0"}, "1x30"),
                _series("router:replica_up", {"replica": "1"}, "1 1 1 0x27"),
            ],
            {"ReplicaDown": [labels("ReplicaDown", replica="1")]},
        ),
        (
            [
                # Replica 0 queues with KV to spare: saturation. Replica 1 queues with KV full:
                # KV pressure, not saturation.
                _series(f"{v}num_requests_waiting", {**e, "engine": "0"}, "20x30"),
                _series(f"{v}kv_cache_usage_perc", {**e, "engine": "0"}, "0.4x30"),
                _series(f"{v}num_requests_waiting", {**e, "engine": "1"}, "20x30"),
                _series(f"{v}kv_cache_usage_perc", {**e, "engine": "1"}, "0.97x30"),
            ],
            {
                "QueueSaturation": [labels("QueueSaturation", engine="0")],
                "KVCachePressure": [labels("KVCachePressure", engine="1")],
            },
        ),
        (
            [
                _series(f"{v}kv_cache_usage_perc", {**e, "engine": "0"}, "0.5x30"),
                _series(f"{v}num_preemptions_total", {**e, "engine": "0"}, "0+2x30"),
            ],
            {"KVCachePressure": [labels("KVCachePressure", engine="0")]},
        ),
        (
            [
                # Sustained shedding: 3 of every 20 responses refused.
                _series(f"{v}kv_cache_usage_perc", {**e, "engine": "0"}, "0.5x30"),
                _series("router:admission_rejected_total", {}, "0+3x30"),
                _series("router:responses_total", {"code": "200"}, "0+17x30"),
                _series("router:responses_total", {"code": "429"}, "0+3x30"),
            ],
            {"QueueSaturation": [labels("QueueSaturation")]},
        ),
        (
            [
                # One burst of 8 refusals at a Poisson peak, 100 responses a second: the rate
                # over the window passes shed_rate_min for the whole window, the share does not.
                _series(f"{v}kv_cache_usage_perc", {**e, "engine": "0"}, "0.5x30"),
                _series("router:admission_rejected_total", {}, "0x15 8x14"),
                _series("router:responses_total", {"code": "200"}, "0+100x30"),
            ],
            {"QueueSaturation": []},
        ),
        (
            [
                _series("router:replica_health_rtt_seconds", {"replica": "0"}, "0.001x30"),
                _series("router:replica_health_rtt_seconds", {"replica": "1"}, "0.3x30"),
            ],
            {"TransferDegraded": [labels("TransferDegraded", replica="1")]},
        ),
        (
            [
                # A loaded host: every probe slow alike, no link at fault.
                _series("router:replica_health_rtt_seconds", {"replica": "0"}, "0.25x30"),
                _series("router:replica_health_rtt_seconds", {"replica": "1"}, "0.4x30"),
            ],
            {"TransferDegraded": []},
        ),
        (
            # One replica has no peer: the absolute threshold alone.
            [_series("router:replica_health_rtt_seconds", {"replica": "0"}, "0.3x30")],
            {"TransferDegraded": [labels("TransferDegraded", replica="0")]},
        ),
        (
            [
                _series(
                    f"{v}request_success_total",
                    {**e, "engine": "0", "finished_reason": "stop"},
                    "0+7x30",
                ),
                _series(
                    f"{v}request_success_total",
                    {**e, "engine": "0", "finished_reason": "abort"},
                    "0+3x30",
                ),
            ],  # fmt: skip
            {"RequestCancellations": [labels("RequestCancellations")]},
        ),
        (
            [
                # Fleet hit rate 0.45; replica 1 at 0.1 is below half of it.
                _series(f"{v}prefix_cache_hits_total", {**e, "engine": "0"}, "0+80x30"),
                _series(f"{v}prefix_cache_queries_total", {**e, "engine": "0"}, "0+100x30"),
                _series(f"{v}prefix_cache_hits_total", {**e, "engine": "1"}, "0+10x30"),
                _series(f"{v}prefix_cache_queries_total", {**e, "engine": "1"}, "0+100x30"),
            ],
            {"ColdReplica": [labels("ColdReplica", engine="1")]},
        ),
        (
            [
                # The whole fleet is cold (hit rate 0.1): no single replica is "the cold one".
                _series(f"{v}prefix_cache_hits_total", {**e, "engine": "0"}, "0+19x30"),
                _series(f"{v}prefix_cache_queries_total", {**e, "engine": "0"}, "0+100x30"),
                _series(f"{v}prefix_cache_hits_total", {**e, "engine": "1"}, "0+1x30"),
                _series(f"{v}prefix_cache_queries_total", {**e, "engine": "1"}, "0+100x30"),
            ],
            {"ColdReplica": []},
        ),
        (
            [
                _series("router:responses_total", {"code": "200"}, "0+90x30"),
                _series("router:responses_total", {"code": "503"}, "0+10x30"),
            ],
            {"ErrorRate": [labels("ErrorRate")]},
        ),
        (
            [
                _series(
                    f"{v}time_to_first_token_seconds_bucket",
                    {**e, "engine": "0", "le": "0.25"},
                    "0+5x30",
                ),
                _series(f"{v}time_to_first_token_seconds_count", {**e, "engine": "0"}, "0+10x30"),
                _series(
                    f"{v}inter_token_latency_seconds_bucket",
                    {**e, "engine": "0", "le": "0.05"},
                    "0+50x30",
                ),
                _series(f"{v}inter_token_latency_seconds_count", {**e, "engine": "0"}, "0+100x30"),
            ],  # fmt: skip
            {
                "SLOBurnTTFT": [labels("SLOBurnTTFT")],
                "SLOBurnTPOT": [labels("SLOBurnTPOT")],
            },
        ),
    ]
    return cases


@needs_promtool
def test_promtool_unit_every_mechanism_fires_on_its_signal(tmp_path, sim_pack):
    doc, _ = alert_rules(sim_pack)
    # Annotations are templated per alert; the unit test checks expressions and labels only.
    for rule in rules_of(doc):
        rule.pop("annotations")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    tests = []
    for series, expected in _scenarios(doc):
        tests.append(
            {
                "interval": "1s",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": f"{EVAL_AT_S}s",
                        "alertname": name,
                        "exp_alerts": [{"exp_labels": lab} for lab in labs],
                    }
                    for name, labs in expected.items()
                ],
            }
        )
    unit = {"rule_files": ["rules.yml"], "evaluation_interval": "1s", "tests": tests}
    (tmp_path / "unit.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    out = subprocess.run(
        [require_promtool(), "test", "rules", "unit.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


# -- Prometheus' grammar (promql-parser) -------------------------------------------------------


def _allowed(engine: str) -> set[str]:
    return engine_metrics(engine).metric_names() | set(DCGM_METRICS) | {"up"}


def _panel_exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]


@pytest.mark.parametrize("engine", sorted(metric_maps()))
def test_every_expression_parses_and_selects_only_mapped_names(engine):
    pack = pack_with(**{"engine.name": engine})
    allowed = _allowed(engine)
    for rule in rules_of(alert_rules(pack)[0]):
        parse(rule["expr"])
        assert selected_metrics(rule["expr"]) <= allowed, rule["alert"]
    exprs = _panel_exprs(grafana_dashboard(pack))
    assert exprs
    for expr in exprs:
        # Grafana substitutes its interval macro before the query reaches Prometheus.
        concrete = expr.replace("$__rate_interval", "1m")
        parse(concrete)
        assert selected_metrics(concrete) <= allowed, expr


def _expand(values: str) -> list[float]:
    """promtool's series notation: ``a``, ``axn`` (n+1 copies), ``a+bxn`` (n+1 steps)."""
    out: list[float] = []
    for token in values.split():
        m = re.fullmatch(r"([-0-9.e]+)(?:([+-][0-9.e]+))?x([0-9]+)", token)
        if m is None:
            out.append(float(token))
            continue
        start, step, n = float(m[1]), float(m[2] or 0), int(m[3])
        out.extend(start + i * step for i in range(n + 1))
    return out


@needs_promtool
def test_drill_evaluation_fires_what_the_scenarios_expect(tmp_path, sim_pack):
    """The drills' alert evaluation (drills.prometheus: the written rule file, the series on a
    grid, promtool's report parsed back) fires what each scenario states at EVAL_AT_S."""
    import pandas as pd

    from capacity_pack.drills.prometheus import evaluate_alert_rules
    from capacity_pack.engines.exposition import format_labels

    require_promtool()
    path = tmp_path / "rules.yml"
    write_alert_rules(sim_pack, path)
    ns = 1_000_000_000
    rules_doc = alert_rules(sim_pack)[0]
    for series, expected in _scenarios(rules_doc):
        rows = []
        for s in series:
            metric, _, rest = s["series"].partition("{")
            for i, value in enumerate(_expand(s["values"])):
                rows.append({"t_ns": i * ns, "metric": metric, "labels": "{" + rest,
                             "value": value})  # fmt: skip
        samples = pd.DataFrame(rows)
        scrapes = pd.DataFrame({"t_ns": sorted(samples["t_ns"].unique()), "ok": True})
        ep = evaluate_alert_rules(path, samples, scrapes).episodes
        at = EVAL_AT_S * ns
        fired = (ep["firing_t_ns"] <= at).fillna(False)
        now = ep[fired & (ep["resolved_t_ns"].isna() | (ep["resolved_t_ns"] > at)).fillna(False)]
        for alert, labels in expected.items():
            got = sorted(now.loc[now["alert"] == alert, "labels"])
            want = sorted(format_labels(lab) for lab in labels)
            assert got == want, (alert, [s["series"] for s in series])


# ---------------------------------------------------------------------------------------------
# Grafana dashboard
# ---------------------------------------------------------------------------------------------


def _rows(dashboard: dict) -> list[tuple[dict, list[dict]]]:
    rows: list[tuple[dict, list[dict]]] = []
    for p in dashboard["panels"]:
        if p["type"] == "row":
            rows.append((p, []))
        else:
            assert rows, f"panel {p['title']!r} comes before any row"
            rows[-1][1].append(p)
    return rows


def test_dashboard_is_importable_json(sim_pack):
    d = grafana_dashboard(sim_pack)
    assert json.loads(json.dumps(d)) == d
    for key in ("__inputs", "__requires", "uid", "title", "schemaVersion", "time", "refresh"):
        assert key in d
    assert d["schemaVersion"] == 39
    (inp,) = d["__inputs"]
    assert inp["name"] == "DS_PROMETHEUS" and inp["pluginId"] == "prometheus"
    assert inp["type"] == "datasource"
    assert {r["id"] for r in d["__requires"]} >= {"grafana", "prometheus", "timeseries"}
    assert d["uid"] == "cp-rehearsal-sim" and len(d["uid"]) <= 40
    assert "rehearsal" in d["title"].lower() or "Rehearsal" in d["title"]
    assert set(d["time"]) == {"from", "to"}
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["replica"]["definition"] == "label_values(vllm:num_requests_waiting, engine)"
    assert variables["replica"]["includeAll"] and variables["replica"]["multi"]


def test_dashboard_rows_panels_and_grid(sim_pack):
    d, omitted = build_dashboard(sim_pack)
    assert omitted == []
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    rows = _rows(d)
    assert [r["title"] for r, _ in rows] == list(ROW_TITLES)
    occupied: set[tuple[int, int]] = set()
    previous_bottom = 0
    for row, children in rows:
        assert row["collapsed"] is False and row["gridPos"]["w"] == 24
        assert row["gridPos"]["y"] >= previous_bottom
        assert children, f"row {row['title']!r} is empty"
        for p in children:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0
            assert g["y"] > row["gridPos"]["y"]
            cells = {
                (x, y)
                for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])
            }
            assert not cells & occupied, f"panel {p['title']!r} overlaps another"
            occupied |= cells
            previous_bottom = max(previous_bottom, g["y"] + g["h"])
            assert p["type"] == "timeseries"
            assert p["datasource"]["uid"] == "${datasource}"
            assert p["fieldConfig"]["defaults"]["unit"]
            assert p["targets"] and all(t["expr"] and t["legendFormat"] for t in p["targets"])
            assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
            assert re.search(
                r"queue saturation|KV pressure|GPU/replica failure|network/transfer degradation",
                p["description"],
            ), p["title"]
    titles = {p["title"] for _, children in rows for p in children}
    assert {
        "Responses by status code",
        "TTFT p50 / p95",
        "ITL p50 / p95",
        "E2E latency p50 / p95",
        "Token throughput",
        "Share within the SLO-burn TTFT / TPOT cutoff",
        "Router retries per replica",
        "Waiting requests per replica",
        "Running requests per replica",
        "Queue time p95 per replica",
        "Batched tokens per iteration",
        "Preemptions per replica",
        "Admission rejections",
        "KV-cache usage per replica",
        "Prefix-cache hit rate per replica",
        "Prefix-cache evictions per replica",
        "GPU utilisation",
        "GPU memory (HBM) used",
        "GPU power",
        "Replicas up",
        "Outstanding requests per replica",
        "Router selection rate per replica",
        "Health-check RTT per replica",
        "Relayed bytes per replica",
        "Relay failures and upstream errors per replica",
    } <= titles


def test_dashboard_units_and_filters(sim_pack):
    panels = {p["title"]: p for p in grafana_dashboard(sim_pack)["panels"] if p["type"] != "row"}
    unit = {t: p["fieldConfig"]["defaults"]["unit"] for t, p in panels.items()}
    assert unit["TTFT p50 / p95"] == "s"
    assert unit["KV-cache usage per replica"] == "percentunit"
    assert unit["Responses by status code"] == "reqps"
    assert unit["Health-check RTT per replica"] == "s"
    kv = panels["KV-cache usage per replica"]["targets"][0]["expr"]
    assert kv == 'max by (engine) (vllm:kv_cache_usage_perc{engine=~"$replica"})'
    rtt = panels["Health-check RTT per replica"]["targets"][0]["expr"]
    assert rtt == 'max by (replica) (router:replica_health_rtt_seconds{replica=~"$replica"})'
    share = [t["expr"] for t in panels["Share within the SLO-burn TTFT / TPOT cutoff"]["targets"]]
    # The SLO-burn alerts' cutoffs: TTFT the strictest (250 ms), ITL gaps the loosest TPOT cutoff
    # (30 ms, rounded up to vLLM's 0.05 s bucket), as SLOBurnTPOT holds them.
    assert any('le="0.25"' in s for s in share) and any('le="0.05"' in s for s in share)
    assert not any('le="0.025"' in s for s in share)
    for title in ("GPU utilisation", "GPU memory (HBM) used", "GPU power"):
        assert "dcgm-exporter" in panels[title]["description"]
    assert panels["GPU utilisation"]["targets"][0]["expr"] == "DCGM_FI_DEV_GPU_UTIL"


def test_dashboard_leaves_out_and_lists_missing_panels():
    d, omitted = build_dashboard(pack_with(**{"engine.name": "sglang"}))
    titles = {p["title"] for p in d["panels"] if p["type"] != "row"}
    left = {o["panel"] for o in omitted}
    assert {
        "Responses by status code",
        "Finished requests by reason",
        "Batched tokens per iteration",
        "Prefix-cache evictions per replica",
        "Health-check RTT per replica",
    } <= left
    assert not titles & left
    assert all(o["row"] in ROW_TITLES and o["reason"] for o in omitted)
    # The Distributed row keeps Prometheus's scrape health even without router series.
    rows = dict((r["title"], [p["title"] for p in c]) for r, c in _rows(d))
    assert rows["Distributed"] == ["Replicas up"]
    assert "Left out:" in d["description"] and "Responses by status code" in d["description"]
    hit = next(p for p in d["panels"] if p["title"] == "Prefix-cache hit rate per replica")
    assert "sglang:cache_hit_rate" in hit["targets"][0]["expr"]


def test_write_grafana_dashboard(tmp_path, sim_pack):
    path = tmp_path / "dash" / "grafana-dashboard.json"
    omitted = write_grafana_dashboard(sim_pack, path)
    assert omitted == []
    assert json.loads(path.read_text()) == grafana_dashboard(sim_pack)
    assert [p.name for p in path.parent.iterdir()] == ["grafana-dashboard.json"]


def test_long_pack_names_get_a_bounded_unique_uid():
    a = pack_with(**{"pack.name": "a" * 50 + "-one"})
    b = pack_with(**{"pack.name": "a" * 50 + "-two"})
    ua, ub = grafana_dashboard(a)["uid"], grafana_dashboard(b)["uid"]
    assert len(ua) <= 40 and len(ub) <= 40 and ua != ub
    assert re.fullmatch(r"[A-Za-z0-9_-]+", ua)
