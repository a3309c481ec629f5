"""The cross-invocation target lock: its key, folder, file, waiting and failing (real processes).

Every test points ``XDG_RUNTIME_DIR`` at its own folder, so it never meets a real measurement's
lock on this host.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from capacity_pack.cli import main
from capacity_pack.measure.lock import (
    LOCAL_KEY,
    LockError,
    LockSettings,
    TargetBusy,
    TargetLock,
    hold_target,
    lock_dir,
    lock_key,
    lock_path,
    normalize_url,
    read_holder,
)
from tests.paths import DEFAULT_CONFIG

HOLDER = textwrap.dedent(
    """
    import subprocess, sys, time
    from capacity_pack.measure.lock import TargetLock
    with TargetLock(sys.argv[1], pack="pack-one", stage="sweep", what="open-r8/cold/rep0"):
        # A child that outlives this process (as a simulator without PR_SET_PDEATHSIG would),
        # given every inheritable descriptor.
        child = subprocess.Popen(["sleep", "30"], start_new_session=True, close_fds=False)
        print("locked", child.pid, flush=True)
        time.sleep(120)
    """
)


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    return folder


@pytest.fixture
def holder(runtime):
    """A function that starts a process holding a key's lock (and a child of its own)."""

    def start(key: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, key], stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout is not None
        word, child = proc.stdout.readline().split()
        assert word == "locked"
        children.append(int(child))
        return proc

    procs: list[subprocess.Popen] = []
    children: list[int] = []
    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# -- the key ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("http://10.0.0.5:8000/v1", "http://10.0.0.5:8000/v1"),
        ("http://10.0.0.5:8000/v1/", "http://10.0.0.5:8000/v1"),
        ("HTTP://GPU-7.Example.NET", "http://gpu-7.example.net:80"),
        ("https://gpu-7.example.net/", "https://gpu-7.example.net:443"),
        ("https://gpu-7.example.net.:443//", "https://gpu-7.example.net:443"),
        ("http://alice:secret@host:9000/Path/?q=1#f", "http://host:9000/Path"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        (" http://127.0.0.1:8000 ", "http://127.0.0.1:8000"),
    ],
)
def test_an_endpoint_is_keyed_by_its_normalized_url(url, key):
    assert normalize_url(url) == key
    assert lock_key(SimpleNamespace(kind="openai", base_url=url, managed=None)) == key


def test_local_servers_are_one_target_whatever_their_port_or_pack():
    sim = SimpleNamespace(kind="sim")
    managed = SimpleNamespace(kind="openai", base_url="http://127.0.0.1:1", managed=object())
    assert lock_key(sim) == lock_key(managed) == LOCAL_KEY == "local@localhost"


def test_the_lock_file_is_named_after_its_key_in_a_private_folder(runtime):
    path = lock_path("http://alice-gpu:8000/v1")
    assert path.parent == runtime / "capacity-pack" / "locks"
    assert path.name.startswith("http_alice-gpu_8000_v1-") and path.suffix == ".lock"
    assert lock_path("http://alice-gpu:8000/v1") == path != lock_path("http://alice-gpu:8000/v2")
    for folder in (path.parent, path.parent.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_without_a_runtime_folder_locks_live_in_a_per_user_tmp_folder(monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert lock_dir() == Path(f"/tmp/capacity-pack-{os.getuid()}/locks")


def test_a_lock_folder_that_is_not_a_private_directory_is_refused(runtime, tmp_path):
    (runtime / "capacity-pack").symlink_to(tmp_path)
    with pytest.raises(LockError, match="not a directory of this user"):
        lock_dir()


def test_settings_come_from_the_snakemake_config():
    assert LockSettings.from_config({}) == LockSettings(wait=True, timeout_s=7200.0)
    # `snakemake --config target_lock_wait=false` passes the string "false".
    got = LockSettings.from_config({"target_lock_wait": "false", "target_lock_timeout_seconds": 60})
    assert got == LockSettings(wait=False, timeout_s=60.0)
    with pytest.raises(ValueError, match="target_lock_wait must be true or false"):
        LockSettings.from_config({"target_lock_wait": "maybe"})
    with pytest.raises(ValueError, match="target_lock_timeout_seconds must be a positive"):
        LockSettings.from_config({"target_lock_timeout_seconds": -1})


# -- holding, waiting, failing ------------------------------------------------------------------


def test_the_lock_file_names_its_holder_while_held_and_nothing_after(runtime):
    key = "http://h:8000"
    with TargetLock(key, pack="pack-one", stage="sweep", what="open-r8/cold/rep0") as held:
        doc = json.loads(held.path.read_text())
        assert read_holder(held.path) == doc
    assert {k: doc[k] for k in ("key", "pid", "pack", "stage", "what")} == {
        "key": key,
        "pid": os.getpid(),
        "pack": "pack-one",
        "stage": "sweep",
        "what": "open-r8/cold/rep0",
    }
    started = datetime.fromisoformat(doc["started"])
    assert abs(started.timestamp() - doc["started_unix_ns"] / 1e9) < 2
    assert abs(time.time() - started.timestamp()) < 60
    assert held.path.read_text() == "" and read_holder(held.path) is None
    assert stat.S_IMODE(held.path.stat().st_mode) == 0o600


def test_a_second_holder_waits_and_gets_the_lock_when_the_first_is_sigkilled(
    holder, caplog, monkeypatch
):
    first = holder(LOCAL_KEY)
    monkeypatch.setattr("capacity_pack.measure.lock.REPORT_EVERY_S", 0.5)
    threading.Timer(1.5, first.kill).start()
    caplog.set_level(logging.WARNING, logger="capacity_pack.measure.lock")
    t = time.monotonic()
    with TargetLock(LOCAL_KEY, pack="pack-two", stage="sweep", what="open-r9/cold/rep0") as held:
        waited = time.monotonic() - t
        assert json.loads(held.path.read_text())["pid"] == os.getpid()
    assert 1.4 < waited < 10 and held.waited_s == pytest.approx(waited, abs=0.2)
    messages = [r.getMessage() for r in caplog.records]
    waits = [m for m in messages if "waiting" in m]
    assert waits[0].startswith("sweep open-r9/cold/rep0 of pack 'pack-two': waiting for target")
    assert f"PID {first.pid} (pack 'pack-one', sweep open-r8/cold/rep0, since " in waits[0]
    assert len(waits) >= 2 and waits[1].count("still waiting") == 1  # again, every REPORT_EVERY_S
    assert "is free after" in messages[-1]


def test_a_killed_holder_frees_the_lock_at_once_whatever_its_children_do(holder):
    first = holder("http://h:8000")
    first.kill()
    first.wait()
    # Its child (started while it held the lock, sharing its descriptors) still runs; the lock
    # file was close-on-exec, so the child never held the lock.
    with TargetLock("http://h:8000", pack="p", stage="sweep", settings=LockSettings(wait=False)):
        pass


def test_a_nested_hold_of_one_target_is_one_measurement(runtime):
    sim = SimpleNamespace(kind="sim")
    with hold_target(sim, pack="p", stage="sweep", what="open-r1/cold/rep0") as outer:
        assert outer is not None and outer.path == lock_path(LOCAL_KEY)
        with hold_target(sim, pack="p", stage="sweep") as inner:
            assert inner is None
        # Still held: another lock on the key (another process's, in effect) is refused.
        with pytest.raises(TargetBusy, match=rf"PID {os.getpid()} \(pack 'p', sweep open-r1"):
            TargetLock(LOCAL_KEY, pack="q", stage="x", settings=LockSettings(wait=False)).acquire()
    with hold_target(sim, pack="p", stage="sweep") as again:
        assert again is not None


def test_no_wait_fails_at_once_naming_the_holder(holder):
    first = holder("http://h:8000/v1")
    t = time.monotonic()
    with pytest.raises(TargetBusy) as err:
        TargetLock(
            "http://h:8000/v1", pack="p", stage="sweep", settings=LockSettings(wait=False)
        ).acquire()
    assert time.monotonic() - t < 1
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"target http://h:8000/v1 is being measured by PID {first.pid} ")
    assert "pack 'pack-one'" in text and "not waiting (target_lock_wait false / --no-wait)" in text
    # The holder is untouched, and its record too.
    assert first.poll() is None and read_holder(lock_path("http://h:8000/v1"))["pid"] == first.pid


def test_a_wait_gives_up_after_its_timeout(holder):
    first = holder(LOCAL_KEY)
    with pytest.raises(TargetBusy, match=rf"PID {first.pid} .*still held after 0 s"):
        TargetLock(
            LOCAL_KEY, pack="p", stage="sweep", settings=LockSettings(timeout_s=0.3)
        ).acquire()


def test_cli_load_no_wait_fails_in_one_line_naming_the_holder(holder, tmp_path):
    first = holder(LOCAL_KEY)
    args = ["load", str(DEFAULT_CONFIG), "--point", "open-r20", "--cache-state", "cold"]
    res = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "out"), "--no-wait"])
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: target local@localhost is being ")
    assert f"PID {first.pid} (pack 'pack-one'" in lines[0]
    assert not (tmp_path / "out" / "records.jsonl").exists()
