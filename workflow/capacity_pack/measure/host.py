"""The host a point is measured on: who else used its CPUs, how late the simulated engine ran,
and where the target and the load generator were placed.

- other processes' CPU (:func:`cpu_snapshot` before and after): other = delta(busy of
  /proc/stat) - delta(utime + stime + cutime + cstime of the job's process tree);
  other_cpu_share = (other - niced) / (wall seconds x host CPUs), niced work reported but not
  counted (a nice-19 task gets about 1.5 % of a CPU against nice 0);
- step lateness of the simulated engine (:func:`step_lateness`): the run's delta of its
  ``sim:step_lateness_seconds`` histogram;
- :func:`judge`: disturbed beyond ``client.other_cpu_bound`` or ``client.step_lateness_bound_ms``;
- :class:`Placement`: with at least :data:`MIN_SPLIT_CPUS` CPUs the target gets the upper half
  of the CPU set and the load generator the lower.

Method: docs/metrics.md, 'The host: disturbed points'.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from capacity_pack.engines.exposition import samples

#: Fewer CPUs than this: target and load generator are not split (each side needs two: the
#: client's event loop and its dispatcher thread; the engine's loop and its deadline timer).
MIN_SPLIT_CPUS = 4
STEP_LATENESS = "sim:step_lateness_seconds"


def _ticks() -> int:
    return os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stat() -> dict[str, int] | None:
    """The aggregate ``cpu`` line of /proc/stat in clock ticks, or None off Linux."""
    try:
        with open("/proc/stat") as fh:
            line = fh.readline().split()
    except OSError:
        return None
    if not line or line[0] != "cpu":
        return None
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    values = [int(v) for v in line[1 : 1 + len(names)]]
    return dict(zip(names, values + [0] * (len(names) - len(values)), strict=True))


def _processes() -> dict[int, tuple[int, int]]:
    """Every readable process: pid -> (parent pid, utime + stime + cutime + cstime in ticks)."""
    out: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                text = fh.read()
        except OSError:  # gone between the listing and the read
            continue
        # The command name is in parentheses and may hold spaces: split after its last ')'.
        fields = text[text.rfind(")") + 2 :].split()
        # After the name: state ppid ... utime(14) stime(15) cutime(16) cstime(17), 1-based
        # fields of proc(5); here index 0 is field 3 (state).
        out[int(name)] = (int(fields[1]), sum(int(v) for v in fields[11:15]))
    return out


def _tree(procs: dict[int, tuple[int, int]], root: int) -> dict[int, int]:
    """The CPU ticks of ``root`` and every descendant still in ``procs``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in procs and pid not in out:
            out[pid] = procs[pid][1]
            todo.extend(children.get(pid, ()))
    return out


@dataclass(frozen=True)
class CpuSnapshot:
    """The host's CPU counters and the measuring tree's at one instant (ticks)."""

    wall_ns: int
    host: dict[str, int] | None
    tree: dict[int, int]


def cpu_snapshot(roots: Iterable[int] = ()) -> CpuSnapshot:
    """The counters now: the host's, and the trees of this process and of ``roots`` (a
    target's processes that are not this process's descendants)."""
    host = _proc_stat()
    tree: dict[int, int] = {}
    if host is not None:
        procs = _processes()
        for root in (os.getpid(), *roots):
            tree.update(_tree(procs, root))
    return CpuSnapshot(time.monotonic_ns(), host, tree)


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on ``port`` (TCP over IPv4 or IPv6, /proc/net)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN; inode is the 10th field.
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    return inodes


def listening_pids(port: int) -> list[int]:
    """The processes that hold a socket listening on ``port`` of this host (those whose file
    descriptors this user may read: another user's server is not found)."""
    wanted = {f"socket:[{i}]" for i in _listening_inodes(port)}
    if not wanted:
        return []
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") in wanted:
                    found.append(int(name))
                    break
            except OSError:
                continue
    return found


def other_cpu(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, Any]:
    """Other processes' CPU over the span between two snapshots (the module docstring)."""
    wall_s = (after.wall_ns - before.wall_ns) / 1e9
    cpus = os.cpu_count() or 1
    out: dict[str, Any] = {"host_cpus": cpus, "window_s": round(wall_s, 3)}
    if before.host is None or after.host is None:
        return {**out, "measured": False, "detail": "no /proc/stat on this platform"}
    hz = _ticks()
    d = {k: after.host[k] - before.host[k] for k in after.host}
    busy = sum(d[k] for k in ("user", "nice", "system", "irq", "softirq", "steal"))
    own = sum(after.tree.values()) - sum(before.tree.values())
    other = max(0, busy - own)
    niced = 0 if _niced() else min(other, d["nice"])
    share = (other - niced) / hz / (wall_s * cpus) if wall_s > 0 else None
    return {
        **out,
        "measured": True,
        "own_cpu_s": round(own / hz, 3),
        "other_cpu_s": round(other / hz, 3),
        "other_niced_cpu_s": round(niced / hz, 3),
        "other_cpu_share": round(share, 4) if share is not None else None,
        "own_processes": len(after.tree),
    }


def _niced() -> bool:
    """Whether this process runs niced (its own CPU then lands in /proc/stat's nice column)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, 0) > 0
    except (AttributeError, OSError):
        return False


def lateness_buckets(text: str | None) -> dict[float, float] | None:
    """The simulated engine's cumulative step-lateness buckets (upper bound s -> steps), summed
    over replicas; None when the text has none (not a simulated engine, or no scrape)."""
    if not text:
        return None
    out: dict[float, float] = {}
    for s in samples(text):
        if s.name == f"{STEP_LATENESS}_bucket" and "le" in s.labels:
            le = float(s.labels["le"])
            out[le] = out.get(le, 0.0) + s.value
    return out or None


def step_lateness(
    before: dict[float, float] | None, after: dict[float, float] | None, bound_ms: float | None
) -> dict[str, Any] | None:
    """Steps, p99 (the upper bound of the bucket holding the 99th percentile; inf beyond the
    last finite bucket) and, with a bound, the share of steps later than it (those in buckets
    above the largest bucket bound <= ``bound_ms``), from two cumulative bucket readings."""
    if after is None:
        return None
    bounds = sorted(after)
    counts = [after[b] - (before or {}).get(b, 0.0) for b in bounds]
    steps = counts[-1] if counts else 0.0
    if steps <= 0:
        return {"steps": 0, "p99_ms": None, "late_share": None, "bound_ms": bound_ms}
    p99 = next(b for b, c in zip(bounds, counts, strict=True) if c >= 0.99 * steps)
    within = (
        max((c for b, c in zip(bounds, counts, strict=True) if b * 1e3 <= bound_ms), default=0)
        if bound_ms is not None
        else None
    )
    return {
        "steps": int(steps),
        "p99_ms": p99 * 1e3 if math.isfinite(p99) else None,
        "p99_beyond_buckets": not math.isfinite(p99),
        "late_share": round(1.0 - within / steps, 5) if within is not None else None,
        "bound_ms": bound_ms,
    }


def judge(
    cpu: dict[str, Any],
    steps: dict[str, Any] | None,
    other_cpu_bound: float | None,
    step_bound_ms: float | None,
) -> list[str]:
    """Why the point is disturbed (empty: it is not), each reason a sentence with its figure;
    a bound of None is not checked."""
    why = []
    share = cpu.get("other_cpu_share")
    if other_cpu_bound is not None and share is not None and share > other_cpu_bound:
        why.append(
            f"other processes used {share:.0%} of the host's {cpu['host_cpus']} CPU(s) over "
            f"the point ({cpu['other_cpu_s']:.1f} CPU-s in {cpu['window_s']:.0f} s; bound "
            f"{other_cpu_bound:.0%}, client.other_cpu_bound)"
        )
    if step_bound_ms is not None and steps and steps.get("steps"):
        late = steps["p99_ms"] is None or steps["p99_ms"] > step_bound_ms
        if late:
            p99 = "beyond the last bucket" if steps["p99_ms"] is None else f"{steps['p99_ms']:g} ms"
            why.append(
                f"the simulated engine's steps ran late: p99 {p99} over {steps['steps']} steps "
                f"(bound {step_bound_ms:g} ms, client.step_lateness_bound_ms)"
            )
    return why


@dataclass(frozen=True)
class Placement:
    """The CPUs of the load generator and of the target for one point (None: not split)."""

    allowed: frozenset[int] | None
    client: frozenset[int] | None
    target: frozenset[int] | None
    detail: str

    @classmethod
    def plan(cls, starts_target: bool) -> Placement:
        """Split this process's CPU set when the pack starts the target and it is big enough."""
        if not hasattr(os, "sched_getaffinity"):
            return cls(None, None, None, "not pinned: this platform has no CPU affinity")
        allowed = frozenset(os.sched_getaffinity(0))
        if not starts_target:
            return cls(allowed, None, None, "not pinned: the pack does not start the target")
        if len(allowed) < MIN_SPLIT_CPUS:
            return cls(
                allowed,
                None,
                None,
                f"not pinned: {len(allowed)} CPU(s) in this process's set, target and load "
                f"generator each need two ({MIN_SPLIT_CPUS} to split)",
            )
        cpus = sorted(allowed)
        half = len(cpus) // 2
        client, target = frozenset(cpus[:half]), frozenset(cpus[half:])
        return cls(
            allowed,
            client,
            target,
            f"target on CPUs {_span(target)}, load generator on CPUs {_span(client)}",
        )

    def bind_target(self) -> None:
        """Bind the calling thread to the target's CPUs: the processes it starts inherit them."""
        if self.target is not None:
            os.sched_setaffinity(0, self.target)

    def bind_client(self) -> None:
        """Bind the calling thread to the load generator's CPUs: the client's threads (its
        event loop, its dispatcher, its shards) are started from it and inherit them."""
        if self.client is not None:
            os.sched_setaffinity(0, self.client)

    def restore(self) -> None:
        if self.target is not None and self.allowed is not None:
            os.sched_setaffinity(0, self.allowed)

    def report(self) -> dict[str, Any]:
        return {
            "pinned": self.target is not None,
            "client_cpus": sorted(self.client) if self.client else None,
            "target_cpus": sorted(self.target) if self.target else None,
            "detail": self.detail,
        }


def _span(cpus: frozenset[int]) -> str:
    s = sorted(cpus)
    return (
        f"{s[0]}-{s[-1]}"
        if s == list(range(s[0], s[-1] + 1)) and len(s) > 1
        else ",".join(map(str, s))
    )
