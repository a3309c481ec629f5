"""The fleet in virtual time: the router's policy, admission, kills, health checks and restarts
on one simulated clock, against what the live router does (capacity_pack.sim.cluster)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from capacity_pack.sim.fleet import CUT_NS, Fleet, FleetRequest, FleetSettings
from capacity_pack.sim.profile import load_profile

NS = 1_000_000_000


@pytest.fixture(scope="module")
def profile():
    return load_profile("small-fast")


def poisson(rate: float, duration_s: float, seed: int = 0, prompt: int = 256, out: int = 32):
    rng = random.Random(seed)
    t, reqs = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return reqs
        ids = tuple(rng.getrandbits(31) for _ in range(prompt))
        reqs.append(FleetRequest(due_s=t, prompt_ids=ids, max_tokens=out))


def value(samples, name: str, **labels: str) -> float | None:
    """The value of the one sample ``name`` with exactly ``labels`` (None: absent)."""
    want = sorted(labels.items())
    found = [v for n, lab, v in samples if n == name and sorted(lab) == want]
    assert len(found) <= 1
    return found[0] if found else None


def events(run, name):
    return [e for e in run.events if e["event"] == name]


def test_healthy_fleet_serves_every_request_and_balances(profile):
    reqs = poisson(40, 10)
    run = Fleet(profile, FleetSettings(replicas=3)).run(reqs)
    assert Counter(r.status for r in run.results) == {"ok": len(reqs)}
    for r in run.results:
        # One token per step end, each streamed after the send; the request ends at its last.
        assert len(r.token_ns) == 32 and r.sent_ns <= r.token_ns[0] <= r.end_ns
        assert r.end_ns == r.token_ns[-1]
    served = Counter(r.replica for r in run.results)
    assert set(served) == {0, 1, 2}
    # least_outstanding: no replica gets much more than its share.
    assert max(served.values()) < 1.3 * len(reqs) / 3


def test_kill_cuts_what_the_replica_held_and_the_supervisor_restarts_it_cold(profile):
    reqs = poisson(60, 20, seed=1)
    s = FleetSettings(
        replicas=2, restart_after_s=3, cold_start_s=4, health_interval_s=0.25, kills=((0, 8.0),)
    )
    run = Fleet(profile, s).run(reqs)
    kill_ns = 8 * NS
    lost = [r for r in run.results if r.status == "error"]
    # Every request lost was in flight on the killed replica at the kill, and ended then.
    assert lost and all(
        r.replica == 0 and r.sent_ns < kill_ns < r.end_ns <= kill_ns + CUT_NS for r in lost
    )
    (removed,) = [e for e in events(run, "removed") if e["replica"] == 0]
    assert removed["t_ns"] == kill_ns and "mid-stream" in removed["detail"]
    # Nothing sent after the removal went to replica 0 until it was back in rotation.
    (restarted,) = events(run, "restarted")
    ready = [e for e in events(run, "ready") if e["replica"] == 0 and e["t_ns"] > kill_ns]
    assert ready, "the restarted replica never came back"
    back = ready[0]["t_ns"]
    # Found dead at the next check (<= 0.25 s), restarted 3 s later, listening 4 s after that,
    # in rotation at the check after.
    assert 7 * NS <= back - kill_ns <= 7.5 * NS and restarted["t_ns"] - kill_ns <= 3.25 * NS
    assert not any(
        r.replica == 0 for r in run.results if kill_ns < r.sent_ns < back and r.status == "ok"
    )
    assert any(r.replica == 0 for r in run.results if r.sent_ns > back)
    # The restarted engine is a new one: its counters start again.
    assert value(run.scrapes[-1][2], "router:replica_starts_total", replica="0") == 2.0


def test_admission_control_sheds_with_429_and_a_dead_fleet_answers_503(profile):
    reqs = poisson(120, 6, seed=2)
    shed = Fleet(profile, FleetSettings(replicas=1, admission_max_outstanding=8)).run(reqs)
    rejected = [r for r in shed.results if r.status == "rejected"]
    assert rejected and all(r.http_status == 429 for r in rejected)
    assert events(shed, "admission_shedding_started")
    assert value(shed.scrapes[-1][2], "router:admission_rejected_total") == len(rejected)
    dead = Fleet(profile, FleetSettings(replicas=1, restart_after_s=None, kills=((0, 2.0),))).run(
        poisson(20, 5, seed=3)
    )
    after = [r for r in dead.results if r.sent_ns > 2 * NS]
    assert after and all(r.status == "rejected" and r.http_status == 503 for r in after)


def test_a_retry_off_a_dead_replica_keeps_the_admission_cap(profile):
    """Replica 0 dies idle (the router has not noticed: no stream of its broke, no health check
    yet) while replica 1 holds its cap of one request. A new request picks the idle dead replica,
    is refused, and its retry finds replica 1 full: shed with 429, not forwarded over the cap
    (on a loaded host a replica_kill drill's survivor once held 39 with a cap of 24: every
    request then in flight to the dead replica retried onto it)."""
    ids = tuple(range(64))
    reqs = [FleetRequest(0.0, ids, 2000), FleetRequest(0.6, ids, 8)]
    settings = FleetSettings(
        replicas=2, admission_max_outstanding=1, health_interval_s=5.0, kills=((0, 0.5),)
    )
    run = Fleet(profile, settings).run(reqs)
    first, second = run.results
    assert first.replica == 1 and first.status == "ok"
    assert second.status == "rejected" and second.http_status == 429
    assert value(run.scrapes[-1][2], "router:retries_total", replica="0") == 1.0
    assert max(v for _, _, samples in run.scrapes for n, lab, v in samples
               if n == "router:replica_outstanding_requests") <= 1  # fmt: skip


def test_scrapes_hold_the_live_routers_families_and_the_engines(profile):
    run = Fleet(profile, FleetSettings(replicas=2, kills=((1, 3.0),), restart_after_s=None)).run(
        poisson(20, 6, seed=4)
    )
    first, last = run.scrapes[1][2], run.scrapes[-1][2]
    assert value(first, "router:replica_up", replica="1") == 1.0
    assert value(last, "router:replica_up", replica="1") == 0.0
    # Replica series merged under the engine label, as vLLM's data-parallel engines are; a
    # replica out of rotation is not scraped.
    running = "vllm:num_requests_running"
    assert value(last, running, engine="0", model_name="sim-small") == 0.0
    assert value(last, running, engine="1", model_name="sim-small") is None
    times = [t for t, _, _ in run.scrapes]
    assert times == sorted(times) and times[1] - times[0] == NS // 2


def test_client_timeout_ends_a_request_and_frees_the_engine(profile):
    # Two seconds far over one replica's capacity (continuous batching slows every request
    # until they all time out), then a trickle from 4 s on.
    burst = poisson(150, 2, seed=5)
    later = [FleetRequest(4 + r.due_s, r.prompt_ids, r.max_tokens) for r in poisson(5, 3, seed=6)]
    run = Fleet(profile, FleetSettings(replicas=1, request_timeout_s=1.0)).run(burst + later)
    timed_out = [r for r in run.results if r.status == "timeout"]
    assert len(timed_out) > len(burst) / 2
    assert all(r.end_ns - r.sent_ns == NS for r in timed_out)
    # The client's timeouts aborted their requests in the engine: the trickle is served.
    assert all(r.status == "ok" for r in run.results[len(burst) :])
