"""The drill-kind registry: the manifest's kinds are the registered ones, each kind's alert
mechanism has a rule, and a toy kind registered here (reusing a fault the simulated cluster
has) goes through planning, scheduling, injection and the analysis' times without an edit to
the drill code."""

from __future__ import annotations

import asyncio
import typing

import httpx
import pytest

from capacity_pack.drills import kinds as registry
from capacity_pack.drills.alerts import alert_rules
from capacity_pack.drills.analyze import fault_cleared, first_detection, injection_time
from capacity_pack.drills.kinds import NS, DrillKind, RouterEvent
from capacity_pack.drills.kinds.cancellation import KIND as CANCELLATION
from capacity_pack.drills.kinds.replica_kill import KIND as REPLICA_KILL
from capacity_pack.drills.plan import DrillInputs, drill_schedule
from capacity_pack.drills.run import DrillRecorder
from capacity_pack.plan.failure import DRILL_KINDS, default_drills
from capacity_pack.plan.failure import DrillKind as ManifestKind
from capacity_pack.plan.manifest import validate_pack
from tests.conftest import pack_data
from tests.drills import plan_at

CAPACITY = {"primary_cache_state": "warm", "open_loop": {"warm": {"capacity_per_replica_rps": 3}}}


@pytest.fixture(scope="module")
def pack():
    return validate_pack(pack_data(), "test pack")


def test_the_manifests_kinds_are_the_registered_ones_in_order():
    names = tuple(k.name for k in registry.kinds())
    assert names == DRILL_KINDS == typing.get_args(ManifestKind)
    assert [(d.name, d.kind) for d in default_drills()] == [(k, k) for k in names]


def test_each_kind_keeps_its_mechanism_and_consequences():
    facts = {
        k.name: (k.mechanism, set(k.consequences), k.reversible, k.rate_step, k.kills_replica)
        for k in registry.kinds()
    }
    assert facts == {
        "replica_kill": ("replica_failure", {"queue_saturation", "cold_start"}, False, False, True),
        "cold_replica": ("cold_start", {"queue_saturation"}, False, True, False),
        "kv_pressure": ("kv_pressure", {"queue_saturation"}, True, False, False),
        "cancellation": ("cancellation", set(), True, False, False),
        "degraded_link": ("transfer_degradation", set(), True, False, False),
    }


def test_every_mechanism_a_kind_names_has_an_alert_rule(pack):
    doc, _ = alert_rules(pack)
    ruled = {r["labels"]["mechanism"] for g in doc["groups"] for r in g["rules"]}
    for k in registry.kinds():
        assert {k.mechanism, *k.consequences} <= ruled, k.name


def test_registration_is_refused_twice_and_checked():
    with pytest.raises(ValueError, match="'replica_kill' is registered already"):
        registry.register(REPLICA_KILL)
    with pytest.raises(ValueError, match="client_fault"):
        DrillKind(name="nothing", mechanism="x")
    with pytest.raises(ValueError, match="drill kind name"):
        DrillKind(name="Bad-Name", mechanism="x", client_fault="y")
    with pytest.raises(LookupError, match="'nope' is not registered"):
        registry.kind("nope")


@pytest.fixture
def toy():
    """A kind that kills the drill's replica (the cluster's kill route) for a while, steps the
    rate up and cancels requests: registered for the test, gone after it."""
    spec = registry.register(
        DrillKind(
            name="toy_outage",
            mechanism="replica_failure",
            consequences=frozenset({"queue_saturation"}),
            router=REPLICA_KILL.router,
            reversible=True,
            rate_step=True,
            injected=RouterEvent("killed", own_replica=True, what="toy kill"),
            cleared=RouterEvent("ready", own_replica=False, what="toy replica"),
            schedule=CANCELLATION.schedule,
        )
    )
    yield spec
    registry.unregister(spec.name)
    assert "toy_outage" not in {k.name for k in registry.kinds()}


def toy_inputs(pack, kind: str) -> DrillInputs:
    # The manifest's kinds are a fixed list (plan/ sits below the registry): the toy drill
    # enters past it, as a drill of a newly listed kind would.
    inputs = DrillInputs.for_drill(pack, "replica_kill")
    drill = inputs.drill.model_copy(update={"kind": kind, "replica": 1, "cancel_fraction": 1.0})
    return inputs.model_copy(update={"drill": drill})


def test_a_toy_kind_is_planned_and_scheduled_by_its_registration(pack, toy):
    inputs = toy_inputs(pack, toy.name)
    plan = plan_at(inputs, CAPACITY)
    assert plan.runnable and plan.replicas == 2
    assert plan.rate_after_rps == pytest.approx(plan.rate_rps * 3 / 2)  # rate_step
    assert plan.restore_at_s == plan.inject_at_s + inputs.drill.fault_s  # reversible
    frame, start_ns = drill_schedule(inputs, plan)
    due = frame["scheduled_offset_ns"] - start_ns
    during = (due >= plan.inject_at_s * NS) & (due < plan.restore_at_s * NS)
    assert during.any()
    assert (frame.loc[during, "cancel_after_ns"] == int(inputs.drill.cancel_after_s * NS)).all()
    assert (frame.loc[~during, "cancel_after_ns"] != int(inputs.drill.cancel_after_s * NS)).all()


def test_a_toy_kind_is_injected_through_its_router_call(pack, toy, monkeypatch):
    sent: list[tuple[str, str]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append((request.method, request.url.path))
        return httpx.Response(200, json={})

    class Client(httpx.AsyncClient):
        def __init__(self, **kw):
            super().__init__(transport=httpx.MockTransport(answer), **kw)

    monkeypatch.setattr(httpx, "AsyncClient", Client)
    plan = plan_at(toy_inputs(pack, toy.name), CAPACITY)
    recorder = DrillRecorder("http://127.0.0.1:9", plan, 0, 0.5, routed=True)
    done = asyncio.run(recorder._router_action("inject"))
    assert sent == [("POST", "/cluster/replicas/1/kill")]
    assert done["request"] == "POST /cluster/replicas/1/kill" and done["status"] == 200


def test_the_analysis_reads_a_toy_kinds_events(pack, toy):
    plan = plan_at(toy_inputs(pack, toy.name), CAPACITY)
    events = [
        {"event": "killed", "replica": 0, "t_s": 9.0},
        {"event": "killed", "replica": 1, "t_s": 10.5},
        {"event": "ready", "replica": 0, "t_s": 14.0},
    ]
    injection = injection_time(toy, plan, events, None, 10 * NS)
    assert injection == {"t_s": 10.5, "source": "router event 'killed' (toy kill)"}
    cleared = fault_cleared(toy, plan, events, None, int(10.5 * NS))
    assert cleared == (14 * NS, "router event 'ready': the toy replica is in rotation")
    firing = [
        {"mechanism": "replica_failure", "firing_t_s": 11.0},
        {"mechanism": "queue_saturation", "firing_t_s": 11.5},
        {"mechanism": "cold_start", "firing_t_s": 12.0},
    ]
    detection, own, others = first_detection(firing, toy, 10.5)
    assert (detection, len(own), others) == (11.0, 1, ["cold_start"])
