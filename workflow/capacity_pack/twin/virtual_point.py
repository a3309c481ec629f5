"""One open-loop point of a pack run in virtual time and judged as a measured point is judged.

The point's own seeded schedule (warm-up rows, and a warm point's prewarm rows, included) is
sent on time to :class:`capacity_pack.sim.fleet.Fleet` (the pack's replicas and router policy,
no failure); an undecided point is run again with the extension blocks that fit
``client.maximum_duration_seconds``. The requests become the requests table the analyzer reads
(TTFT = first token - send, E2E = last token - send, TPOT = (E2E - TTFT) / (O - 1)), the queue
series the count sent and not yet streaming, and
:func:`capacity_pack.evidence.analysis.analyze_point` and
:func:`capacity_pack.decide.capacity.rate_status` judge them. ``max_requests`` caps the measured
rows simulated; the sample gate is then ``ceil(min_successful_samples_per_class x s)``, s the
least class share the cap holds.

Method, what is left out and the cap's cost: docs/twin.md, "Preflight prediction".
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from capacity_pack.decide.capacity import rate_status
from capacity_pack.evidence.analysis import AnalysisSpec, analyze_point
from capacity_pack.plan.manifest import Pack, SimTarget
from capacity_pack.plan.schedule import (
    Point,
    ScheduleInputs,
    build_schedule,
    extension_block_size,
    prewarm_rows,
)
from capacity_pack.twin.requests import NS, fleet_requests
from capacity_pack.vocab import latency

#: At most this many samples of the queue-depth series: the trend test (Mann-Kendall and the
#: Theil-Sen slope) builds n x n pairwise matrices, 32 MB at 2,000 samples.
MAX_QUEUE_SAMPLES = 2000
#: The default cap on simulated measured requests (a lint's prediction costs seconds of CPU).
DEFAULT_MAX_REQUESTS = 1000


class VirtualPointError(ValueError):
    """A point the engine model cannot predict; the message says why."""


@dataclass(frozen=True)
class ClassPrediction:
    """One class of a virtual point: its attainment's point estimate and the confidence
    sequence the verdict reads, its successful and attempted requests and its error rate."""

    name: str
    attainment: float | None
    attainment_ci: tuple[float, float] | None
    successful: int
    attempted: int
    error_rate: float | None


@dataclass(frozen=True)
class PointPrediction:
    """The predicted verdict of one open-loop point (see the module docstring)."""

    rate_rps: float
    cache_state: str
    status: str
    reasons: tuple[str, ...]
    classes: tuple[ClassPrediction, ...]
    queue_trend: str
    error_rate: float | None
    simulated_requests: int
    scheduled_requests: int
    min_samples_used: int
    virtual_s: float
    cpu_s: float

    @property
    def capped(self) -> bool:
        return self.simulated_requests < self.scheduled_requests

    def worst_class(self) -> ClassPrediction:
        """The class with the lowest attainment (a class without successes counts as 0)."""
        return min(self.classes, key=lambda c: c.attainment or 0.0)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["capped"] = self.capped
        return doc


def fleet_settings(pack: Pack, replicas: int | None = None):
    """The fleet of a virtual point: the target's replicas and router (a real target: the
    placement's replicas, least outstanding), the client's timeout, no failure."""
    from capacity_pack.sim.fleet import FleetSettings

    target = pack.target
    if replicas is None:
        replicas = (
            target.replicas if isinstance(target, SimTarget) else pack.engine.placement.replicas
        )
    policy = target.router if isinstance(target, SimTarget) else "least_outstanding"
    return FleetSettings(
        replicas=replicas,
        policy=policy,
        retries=0,
        health_interval_s=1.0,
        restart_after_s=None,
        request_timeout_s=pack.client.request_timeout_seconds,
        # One scrape at the start: the queue series is taken from the requests (module doc).
        scrape_interval_s=1e9,
        model_name=pack.model.served_name or pack.model.id,
    )


def capped_schedule(schedule: pd.DataFrame, max_requests: int | None) -> pd.DataFrame:
    """The warm-up rows and the first ``max_requests`` measured rows, in arrival order."""
    schedule = schedule.sort_values("scheduled_offset_ns", kind="stable")
    if max_requests is None:
        return schedule
    measured = (schedule["phase"] != "warmup").cumsum()
    return schedule[measured <= max_requests]


def cap_share(full: pd.DataFrame, capped: pd.DataFrame) -> float:
    """The least share of a class's planned measured block that the capped schedule holds."""

    def counts(frame: pd.DataFrame) -> pd.Series:
        return frame.loc[frame["phase"] == "measure", "class"].value_counts()

    planned, kept = counts(full), counts(capped)
    return float((kept.reindex(planned.index, fill_value=0) / planned).min())


def extension_blocks_for(pack: Pack, inputs: ScheduleInputs, rate_rps: float, measured: int) -> int:
    """The extension blocks that fill ``client.maximum_duration_seconds`` at ``rate_rps`` after
    a measured block of ``measured`` requests (the schedule cuts the last at that duration)."""
    room = rate_rps * pack.client.maximum_duration_seconds - measured
    return max(0, math.ceil(room / extension_block_size(inputs)))


def predict_point(
    pack: Pack,
    rate_rps: float,
    cache_state: str,
    profile: Any,
    *,
    max_requests: int | None = DEFAULT_MAX_REQUESTS,
    replicas: int | None = None,
    repeat: int = 0,
    extend: bool = True,
) -> PointPrediction:
    """Run the pack's open-loop point at ``rate_rps`` and ``cache_state`` in virtual time on
    ``profile`` (a :class:`capacity_pack.sim.profile.Profile`) and judge it; with ``extend``,
    a point its measured block leaves undecided is run again with its extension blocks."""
    cpu0 = time.process_time()
    if pack.client.arrival_pattern == "trace" or any(c.session is not None for c in pack.workload):
        raise VirtualPointError(
            "preflight predicts schedules of independent requests; trace replay and "
            "multi-turn sessions are not simulated"
        )
    point = Point(mode="open", rate_rps=rate_rps, cache_state=cache_state, repeat=repeat)
    inputs = ScheduleInputs.for_point(pack, point)
    full = build_schedule(inputs, point)
    scheduled = int((full["phase"] == "measure").sum())
    judged = _judge(pack, inputs, point, full, profile, max_requests, replicas)
    blocks = extension_blocks_for(pack, inputs, rate_rps, scheduled)
    room = max_requests is None or judged[1] < max_requests
    if extend and rate_status([judged[0]]) not in ("pass", "fail") and blocks and room:
        longer = build_schedule(inputs, point, extension_blocks=blocks)
        judged = _judge(pack, inputs, point, longer, profile, max_requests, replicas)
    report, simulated, gate_n, virtual_s = judged
    classes = tuple(
        ClassPrediction(
            name=c.name,
            attainment=(e := report["classes"][c.name])["attainment"],
            attainment_ci=tuple(e["attainment_ci"]) if e.get("attainment_ci") else None,
            successful=int(e["successful_count"]),
            attempted=int(e["attempted"]),
            error_rate=e["error_rate"],
        )
        for c in pack.workload
    )
    return PointPrediction(
        rate_rps=float(rate_rps),
        cache_state=cache_state,
        status=rate_status([report]),
        reasons=tuple(report["verdict_reasons"]),
        classes=classes,
        queue_trend=report["queue_trend"],
        error_rate=report["error_rate"],
        simulated_requests=simulated,
        scheduled_requests=scheduled,
        min_samples_used=gate_n,
        virtual_s=virtual_s,
        cpu_s=time.process_time() - cpu0,
    )


def _judge(
    pack: Pack,
    inputs: ScheduleInputs,
    point: Point,
    full: pd.DataFrame,
    profile: Any,
    max_requests: int | None,
    replicas: int | None,
) -> tuple[dict[str, Any], int, int, float]:
    """(the analyzer's report, measured requests simulated, the sample gate used, virtual
    seconds) of ``full`` capped at ``max_requests``."""
    from capacity_pack.sim.fleet import Fleet

    schedule = capped_schedule(full, max_requests)
    seed = pack.client.request_schedule_seed
    settings = fleet_settings(pack, replicas)
    shift_s = 0.0
    prewarm = prewarm_rows(inputs, point)
    head = []
    if len(prewarm):
        head = fleet_requests(prewarm, seed)
        warmup_run = Fleet(profile, settings, seed=seed).run(head)
        shift_s = max(r.end_ns for r in warmup_run.results) / NS
    body = fleet_requests(schedule, seed, shift_s)
    run = Fleet(profile, settings, seed=seed).run(head + body)
    table = requests_table(schedule, run.results[len(head) :], shift_s)
    simulated = int((schedule["phase"] != "warmup").sum())
    spec = AnalysisSpec.of(pack)
    gate_n = pack.acceptance.min_successful_samples_per_class
    share = cap_share(full, schedule)
    if share < 1:
        gate_n = math.ceil(gate_n * share)
        acceptance = spec.acceptance.model_copy(update={"min_successful_samples_per_class": gate_n})
        spec = spec.model_copy(update={"acceptance": acceptance})
    report = analyze_point(
        table,
        pd.DataFrame({"request_id": pd.Series(dtype=str), "tokens": [], "gap_ms": []}),
        queue_series(table, pack.client.metrics_interval_seconds),
        {},
        spec.classes(),
        spec.gates(),
    )
    ends = [r.end_ns for r in run.results if r.end_ns]
    return report, simulated, gate_n, max(ends, default=0) / NS


def requests_table(schedule: pd.DataFrame, results: list[Any], shift_s: float) -> pd.DataFrame:
    """The analyzer's requests table of the simulated requests (offsets from the clock's start,
    the send being the due time)."""
    shift = round(shift_s * NS)
    n = len(results)
    first = np.array([r.token_ns[0] if r.token_ns else -1 for r in results], dtype=np.int64)
    last = np.array([r.token_ns[-1] if r.token_ns else -1 for r in results], dtype=np.int64)
    out = np.array([len(r.token_ns) for r in results], dtype=np.int64)
    status = np.array([r.status for r in results], dtype=object)
    sent = np.array([r.sent_ns for r in results], dtype=np.int64) - shift
    end = np.array([r.end_ns for r in results], dtype=np.int64) - shift
    ok = status == "ok"
    ttft = np.where(ok, latency.ttft_ms(sent, first - shift), 0.0)
    e2e = np.where(ok, latency.e2e_ms(sent, last - shift), 0.0)
    tpot = np.where(ok, latency.tpot_ms(e2e, ttft, out), 0.0)
    due = schedule["scheduled_offset_ns"].to_numpy(np.int64)
    return pd.DataFrame(
        {
            "request_id": schedule["request_id"].to_numpy(),
            "class": schedule["class"].to_numpy(),
            "phase": schedule["phase"].to_numpy(),
            "status": status,
            "output_tokens": out,
            "first_token_offset_ns": np.where(first >= 0, first - shift, -1),
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2e_ms": e2e,
            "ttft_from_scheduled_ms": ttft,
            "e2e_from_scheduled_ms": e2e,
            "client_delay_ms": np.zeros(n),
            "due_offset_ns": due,
            "sent_offset_ns": sent,
            "sent_ns": sent,
            "end_ns": end,
            "sent_realtime_ns": sent,
            "end_realtime_ns": end,
        }
    )


def queue_series(table: pd.DataFrame, interval_s: float = 1.0) -> pd.DataFrame:
    """The server queue-depth series of the trend test: requests sent and not yet streaming,
    every ``interval_s`` seconds (the client's metrics interval), widened so that the series
    holds at most :data:`MAX_QUEUE_SAMPLES` samples (module docstring)."""
    sent = np.sort(table["sent_offset_ns"].to_numpy(np.int64))
    started = table["first_token_offset_ns"].to_numpy(np.int64)
    started = np.sort(np.where(started >= 0, started, table["end_ns"].to_numpy(np.int64)))
    span = int(started.max(initial=0))
    step = max(round(interval_s * NS), -(-span // (MAX_QUEUE_SAMPLES - 1)), 1)
    t = np.arange(0, span + step, step, dtype=np.int64)
    depth = np.searchsorted(sent, t, side="right") - np.searchsorted(started, t, side="right")
    return pd.DataFrame(
        {"source": "server", "metric": "queue_depth", "t_offset_ns": t, "value": depth}
    )
