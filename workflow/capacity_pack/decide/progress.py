"""What the console says about the whole pack while it is measured: one plan line when the run
starts (``pack plan: 24 measurement points, 3 measured before and reused, about 20 min of load
left``), then one line each time a measurement point finishes.

A point's load is its schedule's ``duration_s`` (the written summary, else the schedule built
from the pack: the same seeded arrivals); a closed-loop point counts at the mean ``wall_s`` of
the closed-loop points measured so far, or is untimed. A searching pack counts "at least" until
every cache state's search is done. Presentation only, never a rule's: the Snakefile's
``onstart`` handler builds a :class:`PackProgress` over the job graph, so no measurement's
params, inputs or code hash depend on the other points.

Method: docs/quickstart.md, "While it runs".
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capacity_pack.decide import search as search_lib
from capacity_pack.plan.manifest import Pack
from capacity_pack.plan.schedule import NS_PER_S, Point, build_schedule


@dataclass(frozen=True)
class PointStatus:
    """One measurement point of the run: its planned load (None: untimed), whether it is
    measured, and whether that measurement predates this run (reused, not measured again)."""

    key: str
    mode: str
    load_s: float | None
    done: bool
    reused: bool = False


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def planned_load_s(
    pack: Pack, point: Point, schedule_summary: dict[str, Any] | None = None
) -> float | None:
    """Seconds of load ``point``'s schedule plans (warm-up and measured window): the written
    schedule's ``duration_s``, else that of the schedule built from ``pack``; None for a
    closed-loop point, or a schedule that cannot be built (a trace file missing, say)."""
    if point.mode == "closed":
        return None
    if schedule_summary is not None and isinstance(schedule_summary.get("duration_s"), int | float):
        return float(schedule_summary["duration_s"])
    try:
        frame = build_schedule(pack, point)
    except Exception:  # progress is best effort: an unbuildable schedule is an untimed point
        return None
    return float(frame["scheduled_offset_ns"].max()) / NS_PER_S if len(frame) else 0.0


def duration_words(seconds: float) -> str:
    """``40 s``, ``14 min``, ``2 h 5 min``: a load time as a person reads it."""
    s = max(0, round(seconds))
    if s < 90:
        return f"{s} s"
    minutes = round(s / 60)
    if minutes < 90:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


def load_left(
    points: Sequence[PointStatus], closed_wall_s: Sequence[float] = ()
) -> tuple[float, int]:
    """(seconds of load in the points not measured yet, how many of them are untimed): an
    untimed closed-loop point counts at the mean of ``closed_wall_s`` (the pack's measured
    closed-loop points) when there is one."""
    closed_mean = sum(closed_wall_s) / len(closed_wall_s) if closed_wall_s else None
    seconds, untimed = 0.0, 0
    for p in points:
        if p.done:
            continue
        load = p.load_s if p.load_s is not None else closed_mean if p.mode == "closed" else None
        if load is None:
            untimed += 1
        else:
            seconds += load
    return seconds, untimed


def _left_words(seconds: float, untimed: int, *, left: bool) -> str:
    words = f"about {duration_words(seconds)} of load" + (" left" if left else "")
    if untimed:
        words += f" and {untimed} untimed point{'s' if untimed != 1 else ''}"
    return words


def plan_line(
    points: Sequence[PointStatus], *, searching: bool, closed_wall_s: Sequence[float] = ()
) -> str:
    """The line the run starts with: the points planned, those reused, the load ahead."""
    n = len(points)
    reused = sum(p.reused for p in points)
    seconds, untimed = load_left(points, closed_wall_s)
    count = f"at least {n}" if searching else f"{n}"
    line = f"pack plan: {count} measurement point{'s' if n != 1 else ''}"
    if reused:
        line += f", {reused} measured before and reused"
    if reused < n:
        line += ", " + _left_words(seconds, untimed, left=bool(reused))
    else:
        line += ", nothing to measure"
    if searching:
        line += "; the search adds rounds as it goes"
    return line


def pack_line(
    points: Sequence[PointStatus], *, searching: bool, closed_wall_s: Sequence[float] = ()
) -> str:
    """The line after a finished point: points measured of planned, reused, load left."""
    n = len(points)
    done = sum(p.done for p in points)
    reused = sum(p.reused for p in points)
    line = f"pack: {done} of {'at least ' if searching else ''}{n} points measured"
    if reused:
        line += f" ({reused} reused)"
    if done < n:
        seconds, untimed = load_left(points, closed_wall_s)
        line += ", " + _left_words(seconds, untimed, left=True)
    if searching:
        line += "; the search may add more"
    return line


def search_done(pack: Pack, round_file: Callable[[str, int], Path]) -> bool:
    """Whether every cache state's search is done by its round files on disk (True without a
    search; False when a file is missing or unreadable: the search may still add points)."""
    search = pack.sweep.search
    if search is None:
        return True
    inputs = search_lib.SearchInputs.of(pack)
    for cache in pack.sweep.cache_states:
        docs: list[dict[str, Any]] = []
        while True:
            plans = search_lib.plan_rounds(docs, inputs, search.max_rounds, cache)
            if len(plans) == len(docs):
                break
            doc = _read(round_file(cache, len(docs) + 1))
            if doc is None:
                return False
            docs.append(doc)
    return True


class PackProgress:
    """The pack's progress over the measurement jobs Snakemake knows: ``jobs`` gives each job's
    point, whether its measurement is already there and whether it finished in this invocation;
    ``rounds_pending`` whether a search round is still to run; the path callables are the stage
    table's (not imported here). Best effort: a missing file only makes the estimate rougher."""

    def __init__(
        self,
        pack: Pack,
        jobs: Callable[[], Iterable[tuple[Point, bool, bool]]],
        *,
        schedule_summary: Callable[[Point], Path],
        sweep_summary: Callable[[Point], Path],
        round_file: Callable[[str, int], Path],
        rounds_pending: Callable[[], bool] = lambda: False,
    ) -> None:
        self.pack = pack
        self.jobs = jobs
        self.schedule_summary = schedule_summary
        self.sweep_summary = sweep_summary
        self.round_file = round_file
        self.rounds_pending = rounds_pending
        self._written: dict[str, float | None] = {}
        self._built: dict[str, float | None] = {}
        self._measured: set[str] = set()
        self._search_done = pack.sweep.search is None

    def _load_of(self, point: Point) -> float | None:
        # A written schedule's span is final; a built one is kept until the schedule is written,
        # so no schedule is built twice (the full-size ones take tens of milliseconds each).
        key = point.key
        if key not in self._written:
            summary = _read(self.schedule_summary(point))
            if summary is None:
                if key not in self._built:
                    self._built[key] = planned_load_s(self.pack, point)
                return self._built[key]
            self._written[key] = planned_load_s(self.pack, point, summary)
        return self._written[key]

    def _closed_wall_s(self, points: Iterable[Point]) -> list[float]:
        out = []
        for p in points:
            wall = (_read(self.sweep_summary(p)) or {}).get("wall_s")
            if isinstance(wall, int | float) and math.isfinite(wall):
                out.append(float(wall))
        return out

    def statuses(self, finished: Point | None = None) -> tuple[list[PointStatus], list[float]]:
        """Every known point's status and the measured closed-loop points' load times;
        ``finished``: the point whose job has just finished (Snakemake tells its log handlers
        before it records the job as finished)."""
        if finished is not None:
            self._measured.add(finished.key)
        out, closed_done = [], []
        for point, kept, done in sorted(self.jobs(), key=lambda j: j[0].key):
            # Once a search round has run, Snakemake rebuilds the graph around it and a point
            # measured earlier in this run reads as one it need not run: reused only if this run
            # did not measure it.
            reused = kept and point.key not in self._measured
            done = done or kept or point.key in self._measured
            if point.mode == "closed" and done:
                closed_done.append(point)
            load = None if done else self._load_of(point)
            out.append(PointStatus(point.key, point.mode, load, done, reused))
        return out, self._closed_wall_s(closed_done)

    def searching(self) -> bool:
        """Whether the search may still add points: a round is still to run, or the round files
        do not show every cache state's search done."""
        if self._search_done:
            return False
        if not self.rounds_pending():
            self._search_done = search_done(self.pack, self.round_file)
        return not self._search_done

    def plan_line(self) -> str:
        points, closed = self.statuses()
        return plan_line(points, searching=self.searching(), closed_wall_s=closed)

    def pack_line(self, finished: Point) -> str:
        points, closed = self.statuses(finished)
        return pack_line(points, searching=self.searching(), closed_wall_s=closed)
