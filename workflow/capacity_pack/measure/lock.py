"""One measurement per target at a time, across every invocation of this user on this host.

Every stage that sends load holds an exclusive ``flock(2)`` on a lock file named after its
target (:func:`hold_target`, :func:`lock_key`: the normalized ``base_url``, or ``local@localhost``
for a simulated or managed target), from before the target is started or reset until its last
request ends; the kernel drops it with the holder's last descriptor (opened close-on-exec).
Folder: ``$XDG_RUNTIME_DIR/capacity-pack/locks``, else literal ``/tmp/capacity-pack-<uid>/locks``
(Snakemake points ``TMPDIR`` at a per-job folder); each folder made mode 0700 and checked to be
a real directory owned by this user. The file holds its holder as one JSON line. A second
measurement waits (polling every ``POLL_S``, warning every ``REPORT_EVERY_S``, giving up with
:class:`TargetBusy` after ``DEFAULT_TIMEOUT_S``) or, with ``wait`` off, fails at once.
:class:`LockSettings` come from the CLI or the Snakemake config keys ``target_lock_wait`` and
``target_lock_timeout_seconds``: not pack fields, so they rerun nothing.

Method: docs/cluster.md, 'What it does and does not do'.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from capacity_pack.errors import StatedError
from capacity_pack.measure.lifeline import follow_invoker

log = logging.getLogger("capacity_pack.measure.lock")

DEFAULT_TIMEOUT_S = 7200.0
POLL_S = 0.1
REPORT_EVERY_S = 30.0
LOCAL_KEY = "local@localhost"
CONFIG_WAIT = "target_lock_wait"
CONFIG_TIMEOUT = "target_lock_timeout_seconds"
CONFIG_KEYS = (CONFIG_WAIT, CONFIG_TIMEOUT)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
# The keys this thread holds: a nested hold of one key is the same measurement, not a second one
# (another thread's hold of it is a second one, and waits).
_local = threading.local()


class TargetBusy(StatedError, RuntimeError):
    """Another measurement holds the target (and this one does not wait, or waited too long)."""


class LockError(RuntimeError):
    """The lock folder is not usable (not a private directory of this user)."""


def lock_key(target: Any) -> str:
    """The lock key of a pack's ``target`` section (see the module docstring)."""
    if target.kind == "sim" or getattr(target, "managed", None) is not None:
        return LOCAL_KEY
    return normalize_url(target.base_url)


def normalize_url(url: str) -> str:
    """``scheme://host:port/path``, lowercased, the default port filled in, no trailing slash."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    port = parts.port or _DEFAULT_PORTS.get(scheme)
    netloc = f"[{host}]" if ":" in host else host
    path = parts.path.rstrip("/")
    return f"{scheme}://{netloc}:{port}{path}" if port else f"{scheme}://{netloc}{path}"


def lock_dir(environ: Mapping[str, str] | None = None) -> Path:
    """This user's lock folder, created (mode 0700) and checked private."""
    env = os.environ if environ is None else environ
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        base = Path(runtime) / "capacity-pack"
    else:
        base = Path("/tmp") / f"capacity-pack-{os.getuid()}"
    for folder in (base, base / "locks"):
        _private_dir(folder)
    return base / "locks"


def _private_dir(path: Path) -> None:
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
    except OSError as err:
        raise LockError(f"cannot make the lock folder {path}: {err.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise LockError(f"{path} is not a directory of this user: refusing it as a lock folder")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def lock_path(key: str, environ: Mapping[str, str] | None = None) -> Path:
    """The lock file of ``key``: a readable slug of the key (sha256 of it appended)."""
    import hashlib

    slug = re.sub(r"[^A-Za-z0-9.@-]+", "_", key)[:80].strip("_")
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return lock_dir(environ) / f"{slug}-{digest}.lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_holder(path: str | Path) -> dict[str, Any] | None:
    """The holder recorded in a lock file, if it is a live process (else None)."""
    try:
        doc = json.loads(Path(path).read_text() or "null")
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("pid"), int) or doc["pid"] <= 0:
        return None
    return doc if _alive(doc["pid"]) else None


def describe(holder: dict[str, Any] | None) -> str:
    if holder is None:
        return "a process that has not recorded itself yet"
    what = " ".join(str(holder[k]) for k in ("stage", "what") if holder.get(k))
    return (
        f"PID {holder['pid']} (pack {holder.get('pack')!r}{', ' + what if what else ''}, "
        f"since {holder.get('started')})"
    )


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | str) and str(value).strip().lower() in _TRUE | _FALSE:
        return str(value).strip().lower() in _TRUE
    raise ValueError(f"{name} must be true or false, not {value!r}")


@dataclass(frozen=True)
class LockSettings:
    """Whether a measurement waits for a busy target, and for how long (seconds)."""

    wait: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 0 < self.timeout_s < float("inf"):
            raise ValueError(f"the lock timeout must be a positive number, not {self.timeout_s!r}")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LockSettings:
        """From Snakemake config keys ``target_lock_wait`` and ``target_lock_timeout_seconds``
        (a ValueError names the key)."""
        wait = _flag(config.get(CONFIG_WAIT, True), CONFIG_WAIT)
        timeout = config.get(CONFIG_TIMEOUT)
        if timeout is None:
            return cls(wait=wait)
        try:
            return cls(wait=wait, timeout_s=float(timeout))
        except (TypeError, ValueError):
            raise ValueError(
                f"{CONFIG_TIMEOUT} must be a positive number of seconds, not {timeout!r}"
            ) from None

    @classmethod
    def of(cls, value: LockSettings | Mapping[str, Any] | None) -> LockSettings:
        """Settings as given, from a Snakemake config mapping, or the defaults for None."""
        if value is None:
            return cls()
        return value if isinstance(value, LockSettings) else cls.from_config(value)


def without_lock_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` less the target-lock keys: what the pack schema validates."""
    return {k: v for k, v in config.items() if k not in CONFIG_KEYS}


def _announce(message: str) -> None:
    log.warning("%s", message)
    # In a pipeline job stderr is the job's log: say it on the console too, where the person
    # wondering why a job makes no progress looks.
    if sys.stderr is not sys.__stderr__ and sys.__stderr__ is not None:
        with contextlib.suppress(OSError, ValueError):
            print(f"capacity-pack: {message}", file=sys.__stderr__, flush=True)


class TargetLock:
    """The exclusive lock on one target's lock file, held by this process (context manager)."""

    def __init__(
        self,
        key: str,
        *,
        pack: str,
        stage: str,
        what: str = "",
        settings: LockSettings | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.key = key
        self.pack, self.stage, self.what = pack, stage, what
        self.settings = settings or LockSettings()
        self.path = lock_path(key, environ)
        self.waited_s = 0.0
        self._fd: int | None = None

    def _busy(self, holder: dict[str, Any] | None, why: str) -> TargetBusy:
        return TargetBusy(
            f"target {self.key} is being measured by {describe(holder)}: {why} "
            f"(lock file {self.path})"
        )

    def _open(self) -> int:
        return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)

    def acquire(self) -> TargetLock:
        self._fd = self._open()
        try:
            self._wait_for()
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise
        now = datetime.now(UTC)
        record = {
            "key": self.key,
            "pid": os.getpid(),
            "pack": self.pack,
            "stage": self.stage,
            "what": self.what,
            "host": socket.gethostname(),
            "started": now.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "started_unix_ns": time.time_ns(),
        }
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, (json.dumps(record) + "\n").encode(), 0)
        return self

    def _locked(self) -> bool:
        """Take the lock without blocking; False while another process holds it."""
        assert self._fd is not None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                return True
        # The file was deleted (by hand) after we opened it: the lock to hold is the new file's.
        os.close(self._fd)
        self._fd = self._open()
        return self._locked()

    def _wait_for(self) -> None:
        start = time.monotonic()
        next_report = start
        reported = False
        while not self._locked():
            holder = read_holder(self.path)
            if not self.settings.wait:
                raise self._busy(holder, f"not waiting ({CONFIG_WAIT} false / --no-wait)")
            now = time.monotonic()
            self.waited_s = now - start
            if self.waited_s >= self.settings.timeout_s:
                raise self._busy(
                    holder,
                    f"still held after {self.waited_s:.0f} s ({CONFIG_TIMEOUT} / --lock-timeout "
                    f"{self.settings.timeout_s:g} s)",
                )
            # The holder writes its record just after it locks: give it a moment to be named.
            if now >= next_report and (holder is not None or self.waited_s >= 1.0):
                waiting = f"still waiting ({self.waited_s:.0f} s)" if reported else "waiting"
                _announce(
                    f"{self.stage} {self.what} of pack {self.pack!r}: {waiting} for target "
                    f"{self.key}, being measured by {describe(holder)}; lock file {self.path}"
                )
                reported = True
                next_report = now + REPORT_EVERY_S
            time.sleep(POLL_S)
        self.waited_s = time.monotonic() - start
        if reported:
            free = f"target {self.key} is free after {self.waited_s:.0f} s; measuring"
            _announce(f"{self.stage} {self.what}: {free}")

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # no holder any more: a reader never names this process
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> TargetLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


@contextlib.contextmanager
def hold_target(
    target: Any,
    *,
    pack: str,
    stage: str,
    what: str = "",
    settings: LockSettings | Mapping[str, Any] | None = None,
) -> Iterator[TargetLock | None]:
    """Hold ``target``'s lock for the block (waiting or failing per ``settings``).

    A pipeline job first starts following the Snakemake process that started it
    (:func:`capacity_pack.measure.lifeline.follow_invoker`), so that neither a waiting job nor a
    measuring one outlives its invocation. A nested hold of the same key in one thread holds
    nothing more (yields None).
    """
    follow_invoker()
    key = lock_key(target)
    held_here: set[str] = _local.__dict__.setdefault("keys", set())
    if key in held_here:
        yield None
        return
    lock = TargetLock(key, pack=pack, stage=stage, what=what, settings=LockSettings.of(settings))
    with lock as held:
        held_here.add(key)
        try:
            yield held
        finally:
            held_here.discard(key)
