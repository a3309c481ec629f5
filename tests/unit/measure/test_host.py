"""capacity_pack.measure.host: other processes' CPU, the engine's step lateness, placement."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from capacity_pack.measure import host

# Spins until it has used {cpu} s of CPU (or {wall} s have passed): CPU time, not wall time,
# so that a busy host (the suite's other workers) does not leave it short of what is asserted.
BUSY = (
    "import time\nwall = time.monotonic() + {wall}\n"
    "while time.process_time() < {cpu} and time.monotonic() < wall: pass\n"
)

linux = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc")


@linux
def test_a_busy_child_is_the_measuring_trees_own_cpu():
    before = host.cpu_snapshot()
    subprocess.run([sys.executable, "-c", BUSY.format(cpu=0.8, wall=30)], check=True)
    cpu = host.other_cpu(before, host.cpu_snapshot())
    assert cpu["measured"] and cpu["own_cpu_s"] >= 0.6, cpu
    assert 0 <= cpu["other_cpu_share"] <= 1


@linux
def test_a_process_outside_the_tree_is_other_cpu():
    # Orphaned by its shell at once, so it is no descendant of this process.
    subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -c "{BUSY.format(cpu=2.0, wall=30)}" >/dev/null 2>&1 &'],
        check=True,
    )
    before = host.cpu_snapshot()
    # At least a second, longer while a busy host leaves the orphan less than half a core.
    deadline = time.monotonic() + 20
    time.sleep(1.0)
    cpu = host.other_cpu(before, host.cpu_snapshot())
    while cpu["other_cpu_s"] < 0.5 and time.monotonic() < deadline:
        time.sleep(0.2)
        cpu = host.other_cpu(before, host.cpu_snapshot())
    assert cpu["other_cpu_s"] >= 0.5, cpu
    assert cpu["own_cpu_s"] < 0.3, cpu
    assert cpu["other_cpu_share"] >= 0.5 / os.cpu_count(), cpu


METRICS = """\
# HELP sim:step_lateness_seconds Wake-up time of the engine loop minus the step's deadline.
# TYPE sim:step_lateness_seconds histogram
sim:step_lateness_seconds_bucket{{engine="0",le="0.001"}} {a}
sim:step_lateness_seconds_bucket{{engine="0",le="0.01"}} {b}
sim:step_lateness_seconds_bucket{{engine="0",le="0.025"}} {c}
sim:step_lateness_seconds_bucket{{engine="0",le="+Inf"}} {d}
sim:step_lateness_seconds_count{{engine="0"}} {d}
vllm:num_requests_running{{engine="0"}} 3
"""


def test_step_lateness_is_read_from_the_delta_of_two_scrapes():
    before = host.lateness_buckets(METRICS.format(a=100, b=100, c=100, d=100))
    after = host.lateness_buckets(METRICS.format(a=1050, b=1095, c=1099, d=1100))
    steps = host.step_lateness(before, after, bound_ms=10)
    # 1000 steps: 950 under 1 ms, 995 under 10 ms, 999 under 25 ms, one beyond.
    assert steps["steps"] == 1000
    assert steps["p99_ms"] == 10.0
    assert steps["late_share"] == pytest.approx(0.005)
    assert host.judge({}, steps, None, 10) == []
    (why,) = host.judge({}, steps, None, 5)
    assert "p99 10 ms over 1000 steps" in why and "bound 5 ms" in why


def test_steps_beyond_the_last_bucket_have_no_finite_p99_and_are_late():
    after = host.lateness_buckets(METRICS.format(a=0, b=0, c=0, d=50))
    steps = host.step_lateness(None, after, bound_ms=25)
    assert steps["p99_ms"] is None and steps["p99_beyond_buckets"]
    assert "beyond the last bucket" in host.judge({}, steps, None, 25)[0]


def test_no_simulated_engine_no_step_lateness():
    assert host.lateness_buckets("vllm:num_requests_running 1\n") is None
    assert host.step_lateness(None, None, 25) is None


def test_other_cpu_over_its_bound_is_a_disturbance_with_its_figures():
    cpu = {"other_cpu_share": 0.42, "host_cpus": 2, "other_cpu_s": 16.8, "window_s": 20.0}
    (why,) = host.judge(cpu, None, 0.10, 25)
    assert why.startswith("other processes used 42% of the host's 2 CPU(s)")
    assert "16.8 CPU-s in 20 s" in why and "bound 10%" in why
    assert host.judge(cpu, None, 0.5, 25) == []
    assert host.judge(cpu, None, None, 25) == []


def test_placement_splits_a_big_enough_cpu_set(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    p = host.Placement.plan(starts_target=True)
    assert p.client == frozenset(range(4)) and p.target == frozenset(range(4, 8))
    assert p.report()["detail"] == "target on CPUs 4-7, load generator on CPUs 0-3"
    assert not host.Placement.plan(starts_target=False).report()["pinned"]


def test_placement_leaves_a_small_host_to_the_scheduler_and_says_so(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    p = host.Placement.plan(starts_target=True)
    assert p.client is None and p.target is None
    assert p.report() == {
        "pinned": False,
        "client_cpus": None,
        "target_cpus": None,
        "detail": "not pinned: 2 CPU(s) in this process's set, target and load generator "
        "each need two (4 to split)",
    }
    p.bind_target(), p.bind_client(), p.restore()  # nothing to bind: no-ops


@linux
def test_a_server_on_a_loopback_port_is_found_by_its_listening_socket():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert host.listening_pids(port) == [os.getpid()]
    assert host.listening_pids(port) == []
