"""The engine model as a control variate: a point's attainment corrected for its schedule's luck.

**Why.** A point measures a few hundred requests over tens of seconds, and the SLO outcomes of
requests sharing a queue are correlated (a burst fills the queue and the next requests miss
together), so the attainment of one seeded schedule lies well away from the target's long-run
attainment at that rate: on the default pack two schedule seeds put the cold capacity 3 RPS
apart, on either side of the engine model's own long-run boundary. Where the target's engine
model is known (a simulated target: the model is its profile), the same schedule run through the
model in virtual time tells how lucky the schedule was, and the model's long run at the rate
tells what luck averages to.

**The estimator** (a control variate with coefficient 1; e.g. Law, *Simulation Modeling and
Analysis*, 5th ed., section 11.3; Glasserman, *Monte Carlo Methods in Financial Engineering*,
section 4.1). Per class, over the point's measured successful requests i = 1..n: y_i = 1 when
request i met its SLO live (the analysis's predicate), x_i = 1 when it met it in the model run
of the very same schedule (same arrivals, lengths and shared prefixes, sent on time, one engine
of the profile: :func:`model_outcomes`), and mu = the model's long-run attainment at the rate
(:func:`long_run`: :data:`LONG_RUN_SEEDS` runs of :data:`LONG_RUN_S` seconds of Poisson
arrivals, :func:`capacity_pack.sim.virtual.attainment_at`'s runs, the same reference the
seed-robustness benchmark computes). Then

    attainment_cv = mu + (sum y_i - sum x_i) / n.

E[attainment_cv] = mu + E[y] - E[x]: the target's attainment on the point's kind of window,
moved by what the model says separates such a window from the long run; when the target departs
from the model by the same amount in a window as in the long run (it does where the target *is*
the model, up to the host's lateness), it is the target's long-run attainment. Its variance is
that of the mean difference d_i = y_i - x_i, estimated by batch means over the attainment's own
time blocks (:func:`capacity_pack.binomial.control_variate_interval`), plus mu's: where the
target behaves as its model on the same requests, d is 0 almost everywhere and the schedule's
luck cancels. A rate's repeats pool their differences' blocks.

**Where it applies.** A simulated target of one replica (the model's long run is computed for
one engine), open-loop points of independent requests (no trace replay, no sessions:
:func:`capacity_pack.plan.manifest.judged_by_engine_model`). Such points measure to their
maximum duration (no in-run stop: the in-run looks judge the live attainment, not this
estimate; :func:`capacity_pack.measure.inputs.sequential_settings`), and the search's first
rates are centred on mu's boundary (:func:`long_run_bracket`). A real target has no model of
its own and keeps the plain pooled attainment; a calibrated twin could play the model's part
there (not yet done).

**Cost.** The point's own schedule in virtual time (0.2 s of CPU for 500 requests) and the
long run at the rate (:data:`LONG_RUN_SEEDS` x :data:`LONG_RUN_S` s: 3.9 s of CPU at 36 RPS on
the default pack, more above the boundary, where the model's queue grows), in each point's
analysis; the long run is a fixed function of the rate and the pack, so two repeats of a rate
see the same mu. The predictions (preflight, twin) do not apply it: they probe ten or more
rates per cache state, and with it the default pack's preflight took 89 s of CPU and its
twin prediction 87 s, against about 9 s each without (2026-12-06), for first rounds that
landed where they had without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.binomial import block_counts
from capacity_pack.decide.bracket import centred_resolution
from capacity_pack.evidence.analysis import MEASURED_PHASES
from capacity_pack.plan.manifest import Pack, SimTarget, judged_by_engine_model
from capacity_pack.plan.schedule import Point, ScheduleInputs, build_schedule, prewarm_rows
from capacity_pack.sim.profile import Profile, load_profile
from capacity_pack.sim.virtual import VirtualRequest, meets_slo, poisson_runs, simulate
from capacity_pack.twin.boundary import shared_prefixes, virtual_classes
from capacity_pack.twin.requests import fleet_requests
from capacity_pack.vocab.slo import cutoff_checks

#: Seconds of Poisson arrivals per long run, and the runs' seeds (fixed: every pack run, every
#: schedule seed, sees the same mu at a rate).
LONG_RUN_S = 300.0
LONG_RUN_SEEDS = (0, 1)
#: Arrivals in the first seconds of a long run are left out (an empty engine's transient).
LONG_RUN_WARMUP_S = 2.0
METHOD = (
    "control variate: mu + mean(y - x), y the live SLO outcome, x the engine model's on the same "
    "schedule in virtual time, mu the model's long-run attainment at the rate "
    f"({len(LONG_RUN_SEEDS)} x {LONG_RUN_S:g} s of Poisson arrivals)"
)


class ControlInputs(BaseModel):
    """Exactly what a point's control variate depends on: its schedule's inputs and the engine
    model (the profile's content, so that a changed profile re-analyzes)."""

    model_config = ConfigDict(extra="forbid")

    schedule: ScheduleInputs = Field(description="The point's schedule inputs.")
    profile: Profile = Field(description="The simulated target's engine model.")
    profile_name: str = Field(description="The profile's name in the pack.")

    @classmethod
    def for_point(cls, pack: Pack, point: Point) -> ControlInputs | None:
        """The inputs, or None where the control variate does not apply (module docstring)."""
        if not applies(pack) or point.mode != "open":
            return None
        assert isinstance(pack.target, SimTarget)
        return cls(
            schedule=ScheduleInputs.for_point(pack, point),
            profile=load_profile(pack.target.profile),
            profile_name=pack.target.profile,
        )

    def canonical_json(self) -> str:
        return self.model_dump_json()


def applies(pack: Pack) -> bool:
    """Whether a pack's open-loop points get a control variate: a simulated target of one
    replica, independent requests (:func:`capacity_pack.plan.manifest.judged_by_engine_model`)."""
    return judged_by_engine_model(pack.target, pack.client, pack.workload)


def long_run(inputs: ControlInputs, rate_rps: float, cache_state: str) -> dict[str, dict]:
    """Per class, the model's long-run attainment at ``rate_rps`` (``mean``), the variance of
    that mean by batch means over 5-s blocks of arrival time pooled across the runs (``var``),
    and the requests it is over."""
    return dict(
        _long_run(
            inputs.profile.model_dump_json(),
            inputs.schedule.model_dump_json(),
            float(rate_rps),
            cache_state,
        )
    )


@lru_cache(maxsize=64)
def _long_run(profile_json: str, schedule_json: str, rate_rps: float, cache_state: str):
    from capacity_pack.binomial import BLOCK_S

    profile = Profile.model_validate_json(profile_json)
    schedule = ScheduleInputs.model_validate_json(schedule_json)
    classes = virtual_classes(schedule)
    prefixes = shared_prefixes(schedule, cache_state)
    n_j: dict[str, list[int]] = {c.label: [] for c in classes}
    k_j: dict[str, list[int]] = {c.label: [] for c in classes}
    runs = poisson_runs(profile, classes, rate_rps, LONG_RUN_S, LONG_RUN_SEEDS, prefixes)
    for run in runs:
        for c in classes:
            rs = [r for r in run.results if r.label == c.label and r.arrival_s >= LONG_RUN_WARMUP_S]
            block = np.asarray([int(r.arrival_s // BLOCK_S) for r in rs], dtype=np.int64)
            met = np.asarray([meets_slo(r, c) for r in rs], dtype=float)
            if block.size == 0:
                continue
            n = np.bincount(block)
            k = np.bincount(block, weights=met)
            keep = n > 0
            n_j[c.label] += n[keep].tolist()
            k_j[c.label] += k[keep].astype(int).tolist()
    out = []
    for label in n_j:
        n, k = np.asarray(n_j[label], float), np.asarray(k_j[label], float)
        total = float(n.sum())
        if total <= 0:
            out.append((label, {"mean": None, "var": None, "requests": 0}))
            continue
        mean = float(k.sum()) / total
        m = n.size
        var = m / (m - 1) * float(((k - mean * n) ** 2).sum()) / total**2 if m > 1 else 0.0
        out.append((label, {"mean": mean, "var": var, "requests": int(total)}))
    return tuple(out)


def worst_long_run(inputs: ControlInputs, rate_rps: float, cache_state: str) -> float:
    """The lowest class long-run attainment at ``rate_rps`` (a class without requests: 0)."""
    runs = long_run(inputs, rate_rps, cache_state)
    return min((v["mean"] if v["mean"] is not None else 0.0) for v in runs.values())


@dataclass(frozen=True)
class LongRunBracket:
    """Where the first measured rates of a cache state go when its points are judged by the
    control variate: [pass_rps, fail_rps), one resolution wide, centred on ``boundary_rps``
    (the rate where the model's long-run worst-class attainment crosses the gate)."""

    pass_rps: float
    fail_rps: float
    boundary_rps: float
    attainment: tuple[tuple[float, float], ...]
    why: str


def long_run_bracket(
    pack: Pack,
    profile: Profile,
    cache_state: str,
    low: float,
    high: float,
    resolution_rps: float | None,
    resolution_rel: float | None = None,
    *,
    max_evaluations: int = 6,
) -> LongRunBracket | None:
    """The search's first bracket for a pack whose points get a control variate (:func:`applies`).

    **Why.** Such a point's attainment is mu + mean(live - model), and live and model disagree
    on a few requests in hundreds on a simulated target, so each measured rate lands on the
    side of the gate that mu (the model's long run, :func:`long_run`) puts it. A first round
    at the short-window prediction's ends [``low``, ``high``) can land both ends on one side of
    the long-run boundary (one schedule seed's windows are luckier than the long run) and cost
    a round per cache state. Rates half a resolution either side of mu's boundary are clear of
    the gate by about 0.012 of attainment each on the default pack (mu falls about 0.012 per
    RPS there, and its resolution is 2 RPS), where live and model disagree by 0.002-0.006.

    **How.** mu's worst class at ``low`` and ``high``; while both meet the gate (miss it) the
    bracket steps up (down) by its width; while it is wider than a resolution, mu at the
    interpolated crossing narrows it (regula falsi); then the crossing is the linear
    interpolation of mu between the ends (mu is smooth in the rate), put on
    a grid of a quarter resolution, and the bracket is that rate -+ half the resolution
    (``resolution_rps``, or with ``resolution_rel`` the width w = rel x pass_rps, so
    w = rel x centre / (1 + rel / 2): :func:`capacity_pack.decide.bracket.centred_resolution`;
    a centred bracket, not the search's, whose ends are its statuses' walk), its ends rounded
    inwards to 4 significant digits. None
    when ``max_evaluations`` rates do not bracket the gate or the bracket would reach 0 RPS.
    Each evaluation costs 2-5 s of CPU on the default pack."""
    if not applies(pack) or not 0 < low < high:
        return None
    if resolution_rps is None and not resolution_rel:
        return None
    point = Point(mode="open", rate_rps=low, cache_state=cache_state, repeat=0)
    inputs = ControlInputs(
        schedule=ScheduleInputs.for_point(pack, point),
        profile=profile,
        profile_name=getattr(pack.target, "profile", ""),
    )
    gate = pack.acceptance.class_slo_attainment_min
    seen: dict[float, float] = {}

    def mu(rate: float) -> float:
        if rate not in seen:
            seen[rate] = worst_long_run(inputs, rate, cache_state)
        return seen[rate]

    width = high - low
    while len(seen) < max_evaluations:
        if mu(low) < gate:
            if low - width <= 0:
                return None
            low, high = low - width, low
        elif mu(high) >= gate:
            low, high = high, high + width
        else:
            break
    if not (mu(low) >= gate > mu(high)):
        return None

    resolution = {"resolution_rps": resolution_rps, "resolution_rel": resolution_rel}

    def width_at(centre: float) -> float:
        # Not a search bracket's resolution at its passing end but the same one solved for a
        # bracket centred on the rate (capacity_pack.decide.bracket.centred_resolution).
        width = centred_resolution(resolution, centre)
        assert width is not None
        return width

    def interpolated() -> float:
        return low + (mu(low) - gate) / (mu(low) - mu(high)) * (high - low)

    # Regula falsi while the ends are further apart than a resolution (mu bends over wider
    # brackets: from [34, 38) the line crosses at 36.0, from [35, 36.5) at 36.5).
    while high - low > width_at(interpolated()) + 1e-9 and len(seen) < max_evaluations:
        grid = width_at(interpolated()) / 4
        probe = round(interpolated() / grid) * grid
        if not low < probe < high:
            break
        if mu(probe) >= gate:
            low = probe
        else:
            high = probe
    crossing = interpolated()
    grid = width_at(crossing) / 4
    centre = round(crossing / grid) * grid
    width = width_at(centre)
    if centre - width / 2 <= 0:
        return None
    curve = ", ".join(f"{r:g} RPS {a:.4f}" for r, a in sorted(seen.items()))
    return LongRunBracket(
        pass_rps=_significant(centre - width / 2, math.ceil),
        fail_rps=_significant(centre + width / 2, math.floor),
        boundary_rps=round(crossing, 3),
        attainment=tuple(sorted(seen.items())),
        why=(
            f"centred on the engine model's long-run boundary {crossing:.2f} RPS (worst-class "
            f"long-run attainment {curve}; gate {gate:g})"
        ),
    )


def _significant(x: float, direction: Any, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits, rounded by ``direction`` (math.ceil or floor)."""
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(abs(x))))
    return round(direction(round(x * scale, 6)) / scale, 9)


def model_outcomes(inputs: ControlInputs, point: Point, extension_blocks: int = 0) -> pd.DataFrame:
    """Every scheduled request of the point (warm-up, measured, ``extension_blocks`` blocks)
    run in virtual time on one engine of the profile, sent on time (a warm point's prewarm
    requests first, its clock starting when they have ended, as live): ``request_id``,
    ``class``, ``ttft_ms``, ``tpot_ms``."""
    schedule = build_schedule(inputs.schedule, point, extension_blocks=extension_blocks)
    schedule = schedule.sort_values("scheduled_offset_ns", kind="stable").reset_index(drop=True)
    seed = inputs.schedule.client.request_schedule_seed
    prewarm = prewarm_rows(inputs.schedule, point)
    head = fleet_requests(prewarm, seed) if len(prewarm) else []
    body = fleet_requests(schedule, seed)
    shift_s = 0.0
    if head:
        warm = simulate(inputs.profile, [_virtual(r, "") for r in head], seed)
        shift_s = warm.end_s
    ids = schedule["request_id"].astype(str).tolist()
    requests = [
        *(_virtual(r, "", 0.0) for r in head),
        *(_virtual(r, rid, shift_s) for r, rid in zip(body, ids, strict=True)),
    ]
    run = simulate(inputs.profile, requests, seed)
    done = {r.label: r for r in run.results if r.label}
    rows = [done.get(rid) for rid in ids]
    return pd.DataFrame(
        {
            "request_id": ids,
            "class": schedule["class"].to_numpy(),
            "ttft_ms": [r.ttft_s * 1e3 if r else np.nan for r in rows],
            "tpot_ms": [r.tpot_s * 1e3 if r else np.nan for r in rows],
        }
    )


def _virtual(r: Any, label: str, shift_s: float = 0.0) -> VirtualRequest:
    return VirtualRequest(r.due_s + shift_s, tuple(r.prompt_ids), int(r.max_tokens), label)


def annotate(
    doc: dict[str, Any],
    table: pd.DataFrame,
    inputs: ControlInputs,
    point: Point,
    extension_blocks: int = 0,
) -> None:
    """Each class entry of the point's report ``doc`` gets ``control_variate``: the model's
    passing count over the class's measured successful requests (``model_passing``), the
    difference live - model summed per time block of the attainment (``diff_blocks``, aligned
    with ``attainment_blocks``), the requests the two disagree on, and the model's long run
    (``long_run``, ``long_run_var``). Nothing is added to a class without successes."""
    assert point.rate_rps is not None
    model = model_outcomes(inputs, point, extension_blocks).set_index("request_id")
    measured = table[table["phase"].isin(MEASURED_PHASES) & (table["status"] == "ok")]
    runs = long_run(inputs, point.rate_rps, point.cache_state)
    for c in inputs.schedule.workload:
        entry = doc["classes"].get(c.name)
        okc = measured[measured["class"] == c.name]
        if entry is None or okc.empty or "attainment_blocks" not in entry:
            continue
        live = cutoff_checks(
            okc["ttft_ms"], okc["tpot_ms"], c.request_ttft_cutoff_ms, c.request_tpot_cutoff_ms
        ).met
        virt = model.reindex(okc["request_id"].astype(str))
        sim = cutoff_checks(
            virt["ttft_ms"], virt["tpot_ms"], c.request_ttft_cutoff_ms, c.request_tpot_cutoff_ms
        ).met
        diff = live.astype(float) - sim.astype(float)
        block_s = float(entry["attainment_blocks"]["block_s"])
        sent = okc["sent_ns"].to_numpy(np.int64)
        _, n_j, _ = block_counts(live, sent, block_s)
        block = ((sent - sent.min()) / 1e9 // block_s).astype(np.int64)
        d_j = np.bincount(block, weights=diff)[np.bincount(block) > 0]
        if n_j.tolist() != entry["attainment_blocks"]["successful"]:
            continue  # not the analysis's blocks: no control variate rather than a wrong one
        lr = runs.get(c.name) or {}
        if lr.get("mean") is None:
            continue
        entry["control_variate"] = {
            "model_passing": int(sim.sum()),
            "diff_blocks": [float(v) for v in d_j],
            "disagreements": int(np.count_nonzero(diff)),
            "long_run": lr["mean"],
            "long_run_var": lr["var"],
            "long_run_requests": lr["requests"],
            "model": f"profile {inputs.profile_name}, one engine, in virtual time",
            "method": METHOD,
        }
