"""Real drills against the targets a user brings: an `openai` target whose drill runs the
pack's configured commands, and a managed target the drill starts behind the router.

Apart from tests/integration/test_failure.py, whose drills at 40 RPS run alone (`exclusive`):
these two run beside the other workers at 10 RPS and check what a drill does with the target
(the command's argv and result, the managed process killed and started again, no contact with
the placeholder address), not alert timing that other work on the host would move. In the
same module as the exclusive drills they ran last, alone, while the other workers idled
(about 40 s of a CI run on 2026-12-08).
"""

from __future__ import annotations

import json
import sys

import pytest

from capacity_pack.drills.render import failure_test, failure_test_markdown
from tests.drills import make_pack, run_all

NS = 1_000_000_000


@pytest.mark.slow
def test_real_target_drill_runs_the_configured_commands(tmp_path):
    """An `openai` target: the drill runs the configured argv at the injection time."""
    from capacity_pack.sim.process import SimProcess

    with SimProcess("--replicas", "2", "--health-interval-s", "0.2", command="cluster") as sim:
        # The command reads the router's control token from its 0600 file, as a user's would.
        kill = [
            sys.executable,
            "-c",
            f"import httpx; t = open({str(sim.token_file)!r}).read().strip(); "
            f"print(httpx.post('{sim.url}/cluster/replicas/1/kill', "
            "headers={'X-Sim-Control-Token': t}).status_code)",
        ]

        def real(d):
            d["model"]["id"] = "sim-small"
            d["target"] = {"kind": "openai", "base_url": sim.url, "cache_reset": "none"}
            d["failure"].update(rate_rps=10, duration_s=6, baseline_s=3, warmup_s=1)
            d["failure"]["drills"] = [
                {"name": "replica_kill", "kind": "replica_kill", "replica": 1,
                 "commands": {"inject": kill}},
                {"name": "kv_pressure", "kind": "kv_pressure", "fault_s": 2},
            ]  # fmt: skip

        reports = run_all(make_pack(real), tmp_path)
    kill_report = reports["replica_kill"]
    facts = json.loads((tmp_path / "replica_kill" / "drill.json").read_text())
    act = facts["actions"][0]
    assert act["command"] == kill and act["returncode"] == 0 and "202" in act["stdout_tail"]
    assert kill_report["injection_source"].startswith("injector action started")
    assert "ReplicaDown" in kill_report["alerts_fired"]
    assert "needs failure.drills[].commands" in reports["kv_pressure"]["skipped"]
    md = failure_test_markdown(failure_test(list(reports.values()), {"name": "real"}))
    assert "`kv_pressure` skipped: drill 'kv_pressure' (kv_pressure) needs" in md


class _Listener:
    """A TCP listener on 127.0.0.1 that counts the connections made to it (the placeholder
    address of a managed target: nothing may connect there)."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def managed_sim_pack(placeholder_port: int, drills: list[dict]):
    """A managed target whose command is a real OpenAI-compatible server (the simulated engine
    started as a plain process on the port the router gives it), placeholder base_url at a
    listener that must never be contacted."""

    def managed(d):
        d["model"]["id"] = "sim-small"
        d["target"] = {
            "kind": "openai",
            "base_url": f"http://127.0.0.1:{placeholder_port}",
            "cache_reset": "none",
            "managed": {
                "command": [sys.executable, "-m", "capacity_pack.sim", "serve", "--profile",
                            "small-fast", "--model-name", "sim-small", "--host", "{host}",
                            "--port", "{port}"],
                "startup_timeout_s": 60,
            },
        }  # fmt: skip
        d["failure"].update(
            rate_rps=10, duration_s=10, baseline_s=3, warmup_s=1, window_s=1, restart_after_s=2.5
        )
        d["failure"].pop("replicas", None)  # follows the target: its replicas under test
        d["failure"]["drills"] = drills

    return make_pack(managed)


@pytest.mark.slow
def test_a_drill_against_a_managed_target_starts_it_and_never_contacts_the_placeholder(tmp_path):
    """`failure.replicas` follows the target (1: the replicas under test); the drill starts the
    managed command behind the router, kills the process it started, and the router's
    supervisor starts it again; the cancellation drill runs on the same target."""
    listener = _Listener()
    try:
        pack = managed_sim_pack(
            listener.port,
            [
                {"name": "replica_kill", "kind": "replica_kill", "replica": 0},
                {"name": "cancellation", "kind": "cancellation", "fault_s": 3},
                {"name": "kv_pressure", "kind": "kv_pressure", "fault_s": 2},
            ],
        )
        reports = run_all(pack, tmp_path)
    finally:
        listener.close()
    assert listener.accepted == 0, "the placeholder base_url was contacted"
    facts = json.loads((tmp_path / "replica_kill" / "drill.json").read_text())
    assert facts["plan"]["replicas"] == 1
    assert facts["base_url"].startswith("http://127.0.0.1:")
    assert facts["base_url"] != f"http://127.0.0.1:{listener.port}"
    assert "managed command" in facts["replicas_started_by"]
    events = json.loads((tmp_path / "replica_kill" / "events.json").read_text())["events"]
    kinds = [e["event"] for e in events]
    # Killed, noticed dead, restarted by the supervisor, serving again.
    for event in ("killed", "removed", "restart_scheduled", "restarted"):
        assert event in kinds, (event, kinds)
    assert kinds.count("ready") >= 2  # the first start and the restart
    kill = reports["replica_kill"]
    assert kill["injection_source"].startswith("router event")
    assert "ReplicaDown" in kill["alerts_fired"]
    records = [json.loads(line) for line in (tmp_path / "replica_kill" / "records.jsonl").open()]
    measured = [r for r in records if r["phase"] != "warmup"]
    # With the only replica down, requests fail (as data) and then succeed again.
    assert any(r["status"] != "ok" for r in measured)
    last = max(r["sent_ns"] for r in measured)
    assert any(r["status"] == "ok" and r["sent_ns"] > last - 2 * NS for r in measured)
    cancelled = [json.loads(line) for line in (tmp_path / "cancellation" / "records.jsonl").open()]
    assert any(r["status"] == "cancelled" for r in cancelled)
    assert (
        "needs failure.drills[].commands for a managed target"
        in (reports["kv_pressure"]["skipped"])
    )
