"""Interrupts and timeouts of the load generator.

SIGINT/SIGTERM during a real load (the CLI against the simulated engine): every scheduled request
is recorded (the ones in flight as ``cancelled``, with their stamps) or counted as never sent,
the summary says so, the exit status is 130/143, and there is no traceback. A request that does
not finish within the request timeout, in any phase, is a ``timeout``; a refused connection is
an ``error``: for both transports, against tiny misbehaving servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import yaml

from capacity_pack.measure.dispatcher import SHORT_SLICE_NS, short_slice, thread_slice_ns
from capacity_pack.measure.records import read_records
from capacity_pack.measure.run import run_point
from capacity_pack.plan import schedule as S
from capacity_pack.plan.manifest import ManifestError, validate_pack
from tests.conftest import pack_data
from tests.paths import ROOT
from tests.unit.measure.test_loadgen import constant_schedule, settings

# ---------------------------------------------------------------------------------------------
# SIGINT / SIGTERM during a real load
# ---------------------------------------------------------------------------------------------


def long_stream_pack() -> dict:
    """The default pack with ~26 s streams (3,000 tokens at ~8.7 ms each): many in flight."""
    data = pack_data()
    for c in data["workload"]:
        c["output_tokens"] = 3000
        c["request_tpot_cutoff_ms"] = 30
    data["sweep"].update(open_loop_rps=[10], closed_loop_concurrency=[1], repeats=1)
    data["experiments"] = []
    return data


@pytest.mark.parametrize(
    ("sig", "status", "shards"),
    [
        (signal.SIGINT, 130, 1),
        (signal.SIGTERM, 143, 1),
        pytest.param(signal.SIGINT, 130, 2, marks=pytest.mark.slow),
    ],
)
@pytest.mark.slow
def test_interrupt_records_every_request_in_flight(tmp_path, sig, status, shards):
    """The signal goes to the measuring process alone (with two shards, to their parent, which
    hands it on)."""
    data = long_stream_pack()
    config = tmp_path / "pack.yaml"
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "capacity_pack", "load", str(config), "--point", "open-r10",
         "--cache-state", "cold", "-o", str(out), "--no-progress", "--shards", str(shards)],
        cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        # Running: the records file is open (with shards: every shard is ready, and the shared
        # start comes client.shard_start_lead_seconds, 1 s, later).
        def started() -> bool:
            if shards == 1:
                return (out / "records.jsonl").exists()
            return len(list((out / "shards" / "rendezvous").glob("ready-*.json"))) == shards

        deadline = time.monotonic() + 120
        while not started() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert started(), proc.communicate(timeout=30)
        time.sleep(3.0 if shards == 1 else 4.0)  # ~30 sent, none of their 26 s streams finished
        assert proc.poll() is None
        os.kill(proc.pid, sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the simulator too, whatever happened
    text = stderr.decode(errors="replace")
    assert proc.returncode == status, text
    assert "Traceback" not in text and "I/O operation on closed file" not in text, text
    name = signal.Signals(sig).name
    assert f"interrupted by {name}" in text

    pack = validate_pack(data)
    point = S.find_point(pack, "open-r10", "cold", 0)
    scheduled = set(S.build_schedule(pack, point)["request_id"])
    recs = read_records(out / "records.jsonl")
    ids = [r["request_id"] for r in recs]
    assert len(ids) == len(set(ids)) and set(ids) <= scheduled
    cancelled = [r for r in recs if r["status"] == "cancelled"]
    assert len(cancelled) >= 10, [r["status"] for r in recs]
    for r in cancelled:
        assert f"interrupted by {name}" in r["error"]
        assert r["sent_ns"] > 0 and r["sent_realtime_ns"] > 0 and r["end_ns"] >= r["sent_ns"]
    # The streams were under way: their stamps so far are kept.
    assert sum(r["first_token_ns"] is not None for r in cancelled) >= len(cancelled) // 2
    assert all(r["first_token_ns"] >= r["sent_ns"] for r in cancelled if r["first_token_ns"])

    summary = json.loads((out / "summary.json").read_text())
    stopped = summary["interrupted"]
    assert stopped["signal"] == name
    assert stopped["scheduled"] == len(scheduled)
    assert stopped["recorded"] == len(recs) == summary["requests_recorded"]
    assert stopped["cancelled_in_flight"] == len(cancelled)
    assert stopped["recorded"] + stopped["never_sent"] == len(scheduled)
    assert stopped["never_sent"] > 0
    if shards > 1:
        assert summary["shards"]["count"] == 2
        assert {r["shard"] for r in cancelled} == {0, 1}


def test_interrupted_helpers():
    from capacity_pack.measure.interrupt import Interrupted, exit_status, merge_interruptions

    assert exit_status("SIGINT") == 130 and exit_status("SIGTERM") == 143
    stop = Interrupted("SIGTERM", {"interrupted": {"cancelled_in_flight": 3, "never_sent": 5,
                                                    "scheduled": 9}})  # fmt: skip
    assert stop.code == 143 and isinstance(stop, SystemExit)
    assert "3 requests in flight recorded as cancelled, 5 of 9 scheduled never sent" in str(stop)
    merged = merge_interruptions([
        {"signal": "SIGINT", "scheduled": 4, "recorded": 3, "cancelled_in_flight": 2,
         "never_sent": 1},
        None,
        {"signal": "SIGINT", "scheduled": 5, "recorded": 5, "cancelled_in_flight": 1,
         "never_sent": 0},
    ])  # fmt: skip
    assert merged == {"signal": "SIGINT", "scheduled": 9, "recorded": 8,
                      "cancelled_in_flight": 3, "never_sent": 1}  # fmt: skip
    assert merge_interruptions([None, None]) is None


# ---------------------------------------------------------------------------------------------
# Timeouts in every phase; connection failures stay errors
# ---------------------------------------------------------------------------------------------

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
FIRST_EVENT = (
    b'data: {"id":"c1","object":"text_completion","model":"sim-small",'
    b'"choices":[{"index":0,"text":" a","finish_reason":null}]}\n\n'
)


@contextlib.contextmanager
def misbehaving_server(mode: str) -> Iterator[str]:
    """A tiny asyncio HTTP server on 127.0.0.1 that reads each request, then ``mode``:
    ``no_head`` answers nothing, ``stall_body`` sends a streaming head and one event, then
    nothing. Yields its base URL."""
    ready = threading.Event()
    box: dict = {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            if mode == "stall_body":
                writer.write(SSE_HEAD + b"%x\r\n" % len(FIRST_EVENT) + FIRST_EVENT + b"\r\n")
                await writer.drain()
            await reader.read()  # until the client gives up and closes
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        box["port"] = server.sockets[0].getsockname()[1]
        box["stop"] = stop = asyncio.Event()
        ready.set()
        async with server:
            await stop.wait()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{box['port']}"
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(10)


@contextlib.contextmanager
def full_backlog() -> Iterator[str]:
    """A listening socket whose accept queue is full: a new connection's SYN is dropped, so
    connecting hangs (Linux drops SYNs to a full accept queue)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
            fillers.append(s)
        time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        for s in fillers:
            s.close()
        listener.close()


def refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there now


def run_against(base_url: str, tmp_path, transport: str, timeout_s: float = 0.6) -> list[dict]:
    out = tmp_path / f"{transport}.jsonl"
    run_point(
        constant_schedule(3, 20),
        settings(base_url, transport=transport, request_timeout_s=timeout_s, scrape_metrics=False),
        out,
    )
    return read_records(out)


@pytest.mark.parametrize("transport", ["capacity_pack", "httpx"])
@pytest.mark.parametrize(
    ("mode", "phase"),
    [("no_head", "no response head yet"), ("stall_body", "reading the body, 1 tokens received")],
)
def test_a_silent_server_is_a_timeout_in_every_phase(tmp_path, transport, mode, phase):
    with misbehaving_server(mode) as url:
        t = time.monotonic()
        recs = run_against(url, tmp_path, transport)
        took = time.monotonic() - t
    assert [r["status"] for r in recs] == ["timeout"] * 3, [r["error"] for r in recs]
    assert all("no complete response within 0.600 s" in r["error"] for r in recs)
    assert all(phase in r["error"] for r in recs)
    # Ended by the request's deadline, not by a per-read timeout after it.
    assert all(0.55 < (r["end_ns"] - r["sent_ns"]) / 1e9 < 1.2 for r in recs)
    assert took < 10
    if mode == "stall_body":
        assert all(r["http_status"] == 200 and r["first_token_ns"] for r in recs)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SYN drop is Linux's")
@pytest.mark.parametrize("transport", ["capacity_pack", "httpx"])
def test_a_connection_that_never_opens_is_a_timeout(tmp_path, transport):
    with full_backlog() as url:
        recs = run_against(url, tmp_path, transport)
    assert [r["status"] for r in recs] == ["timeout"] * 3, [r["error"] for r in recs]
    assert all("no complete response within 0.600 s" in r["error"] for r in recs)


@pytest.mark.parametrize("transport", ["capacity_pack", "httpx"])
def test_a_refused_connection_stays_an_error_with_its_cause(tmp_path, transport):
    recs = run_against(refused_url(), tmp_path, transport)
    assert [r["status"] for r in recs] == ["error"] * 3
    assert all(r["error"].startswith("ConnectError") for r in recs), [r["error"] for r in recs]


# ---------------------------------------------------------------------------------------------
# Real-time dispatch is opt-in
# ---------------------------------------------------------------------------------------------


def test_realtime_dispatch_is_off_unless_asked_and_reported(tmp_path):
    summary = run_point(
        constant_schedule(2, 50), settings(refused_url(), scrape_metrics=False), tmp_path / "r"
    )
    assert summary["dispatcher_scheduling"] == "normal"
    assert summary["realtime_dispatch"]["requested"] is False
    assert summary["realtime_dispatch"]["in_effect"] is False
    assert "not requested" in summary["realtime_dispatch"]["detail"]
    assert summary["interrupted"] is None
    asked = run_point(
        constant_schedule(2, 50),
        settings(refused_url(), scrape_metrics=False, realtime_dispatch=True),
        tmp_path / "s",
    )
    rt = asked["realtime_dispatch"]
    assert rt["requested"] is True
    # In effect exactly when the process may (root / CAP_SYS_NICE); either way it says which.
    assert rt["in_effect"] == (asked["dispatcher_scheduling"] == "SCHED_FIFO")
    assert rt["detail"].startswith("requested")


def test_the_dispatcher_thread_asks_for_a_short_time_slice_and_says_so(tmp_path):
    before = thread_slice_ns()
    # Unpinned: the thread shares the CPUs with the loop, and asks for the short slice.
    unpinned = settings(refused_url(), scrape_metrics=False, pin_threads=False)
    summary = run_point(constant_schedule(2, 50), unpinned, tmp_path / "r")
    assert summary["thread_placement"]["pinned"] is False
    detail = summary["realtime_dispatch"]["detail"]
    probe: dict = {}

    def ask() -> None:
        probe["took"], probe["slice"] = short_slice(), thread_slice_ns()

    t = threading.Thread(target=ask)
    t.start()
    t.join()
    # The summary says a slice was taken exactly where the kernel takes one, at 0.1 ms.
    assert ("time slice 0.1 ms" in detail) == probe["took"], detail
    if probe["took"]:
        assert probe["slice"] == SHORT_SLICE_NS
    # Linux 6.12 and later (EEVDF) take a SCHED_OTHER thread's slice request, unprivileged.
    release = re.match(r"(\d+)\.(\d+)", platform.release())
    kernel = tuple(map(int, release.groups())) if release else (0, 0)
    if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "aarch64"):
        assert probe["took"] == (kernel >= (6, 12)), (platform.release(), detail)
    # Only the dispatcher's own thread: the caller's slice is as it was.
    assert thread_slice_ns() == before
    # On a CPU of its own (the default, given two CPUs) it keeps the kernel's default slice.
    pinned = run_point(
        constant_schedule(2, 50), settings(refused_url(), scrape_metrics=False), tmp_path / "p"
    )
    if pinned["thread_placement"]["pinned"]:
        assert "time slice" not in pinned["realtime_dispatch"]["detail"]
    else:
        assert ("time slice 0.1 ms" in pinned["realtime_dispatch"]["detail"]) == probe["took"]


def test_realtime_dispatch_setting_is_validated():
    data = pack_data()
    assert validate_pack(data).client.realtime_dispatch is False
    data["client"]["realtime_dispatch"] = True
    assert validate_pack(data).client.realtime_dispatch is True
    for bad in ("yes", 1, "sometimes"):
        data["client"]["realtime_dispatch"] = bad
        with pytest.raises(ManifestError, match="realtime_dispatch"):
            validate_pack(data)


def test_normalization_refuses_an_interrupted_point(tmp_path):
    from capacity_pack.evidence.normalize import NormalizeError, normalize_point

    stopped = {"interrupted": {"signal": "SIGINT", "scheduled": 10, "never_sent": 4}}
    with pytest.raises(NormalizeError, match="interrupted by SIGINT .*4 of 10 requests never sent"):
        normalize_point(tmp_path / "records.jsonl", "s", "m", stopped, None, None)
