"""The engine model as a control variate: a point's attainment corrected for its schedule's luck.

Per class, over the point's measured successful requests: y_i = 1 when request i met its SLO
live, x_i = 1 when it met it in the model run of the very same schedule (:func:`model_outcomes`),
mu the model's long-run attainment at the rate (:func:`long_run`), and

    attainment_cv = mu + (sum y_i - sum x_i) / n

(coefficient 1; Law, *Simulation Modeling and Analysis*, 5th ed., 11.3), its variance that of
the mean difference by batch means (:func:`capacity_pack.binomial.control_variate_interval`)
plus mu's. Why: one seeded schedule's short window lies well away from the long run; where the
target behaves as its model on the same requests, the schedule's luck cancels. Applies to a
simulated target of one replica with independent requests (:func:`applies`); the predictions
(preflight, twin) do not use it (it cost them ten times the CPU for the same first rounds).

mu depends only on the engine model, the classes, the warm prefixes and the rate, so each long
run is kept on disk (``long-run/<sha256>.json`` in :func:`capacity_pack.io.user_cache_dir`, the
hash of those and of the code hash of this module's import closure): a re-analysis, the
preflight and another pack of the same workload read it back instead of simulating 600 s of
arrivals again.

Method: docs/metrics.md, "The engine model as control variate"; cost: docs/performance.md,
"The engine model as control variate (2026-12-06)".
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack import codehash
from capacity_pack.binomial import block_counts
from capacity_pack.decide.bracket import centred_resolution
from capacity_pack.evidence.analysis import MEASURED_PHASES
from capacity_pack.io import canonical_json, sha256_hex, user_cache_dir, write_json_atomic
from capacity_pack.plan.manifest import Pack, SimTarget, judged_by_engine_model
from capacity_pack.plan.schedule import Point, ScheduleInputs, build_schedule, prewarm_rows
from capacity_pack.sim.profile import Profile, load_profile
from capacity_pack.sim.virtual import (
    SharedPrefixes,
    VirtualClass,
    VirtualRequest,
    meets_slo,
    poisson_runs,
    simulate,
)
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
    key = {
        "profile": json.loads(profile_json),
        "classes": [asdict(c) for c in classes],
        "prefixes": asdict(prefixes) if prefixes is not None else None,
        "rate_rps": rate_rps,
        "run": [LONG_RUN_S, list(LONG_RUN_SEEDS), LONG_RUN_WARMUP_S, BLOCK_S],
        "code": _model_code(),
    }
    path = user_cache_dir() / "long-run" / f"{sha256_hex(canonical_json(key))}.json"
    with contextlib.suppress(OSError, ValueError, TypeError):
        return tuple((label, dict(v)) for label, v in json.loads(path.read_text()))
    out = _long_run_of(profile, classes, prefixes, rate_rps, BLOCK_S)
    with contextlib.suppress(OSError, ValueError):  # a cache not written only costs time
        write_json_atomic(path, [list(pair) for pair in out])
    return out


@cache
def _model_code() -> str:
    """The code hash of what a long run runs: this module's import closure
    (:func:`capacity_pack.codehash.code_hash`, the stages' own rerun rule: the engine model,
    the SLO predicate, the block counts...), so an edit there computes every long run again.
    Parsed files' hashes come from the account's cache, as the Snakefile's do."""
    if codehash.cache_file() is None:
        codehash.use_cache_file(user_cache_dir() / "codehash.json")
    return codehash.code_hash(__name__)


def _long_run_of(
    profile: Profile,
    classes: list[VirtualClass],
    prefixes: SharedPrefixes | None,
    rate_rps: float,
    block_s: float,
) -> tuple[tuple[str, dict], ...]:
    n_j: dict[str, list[int]] = {c.label: [] for c in classes}
    k_j: dict[str, list[int]] = {c.label: [] for c in classes}
    runs = poisson_runs(profile, classes, rate_rps, LONG_RUN_S, LONG_RUN_SEEDS, prefixes)
    for run in runs:
        for c in classes:
            rs = [r for r in run.results if r.label == c.label and r.arrival_s >= LONG_RUN_WARMUP_S]
            block = np.asarray([int(r.arrival_s // block_s) for r in rs], dtype=np.int64)
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
    """The search's first bracket for a pack whose points get a control variate (:func:`applies`):
    mu's worst-class crossing of the gate, stepped out from [``low``, ``high``) by its width and
    narrowed by regula falsi, interpolated, put on a quarter-resolution grid, and that rate -+
    half the resolution (:func:`capacity_pack.decide.bracket.centred_resolution` with
    ``resolution_rel``), its ends rounded inwards to 4 significant digits. None when
    ``max_evaluations`` rates do not bracket the gate or the bracket would reach 0 RPS.

    Why and how: docs/search.md (the control-variate paragraph), docs/metrics.md."""
    if not applies(pack) or not 0 < low < high or (resolution_rps is None and not resolution_rel):
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

    return _centred_bracket(mu, seen, gate, low, high, width_at, max_evaluations)


def _centred_bracket(
    mu: Callable, seen: dict, gate: float, low: float, high: float, width_at: Callable, most: int
) -> LongRunBracket | None:
    """From ends that straddle the gate, the bracket centred on mu's crossing (the steps of
    :func:`long_run_bracket` after its first), narrowed while under ``most`` rates are ``seen``."""

    def interpolated() -> float:
        return low + (mu(low) - gate) / (mu(low) - mu(high)) * (high - low)

    # Regula falsi while the ends are further apart than a resolution (mu bends over wider
    # brackets: from [34, 38) the line crosses at 36.0, from [35, 36.5) at 36.5).
    while high - low > width_at(interpolated()) + 1e-9 and len(seen) < most:
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
