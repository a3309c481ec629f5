"""Calibration: a profile's free parameters fitted to the pack's measured closed-loop points.

Free: achieved FLOP/s ``F``, bandwidth ``B``, step overhead ``o`` and per-sequence overhead
``p`` of the step time ``max(FLOPs / F, bytes / B) + o + n_seqs p`` (:mod:`capacity_pack.sim.perf`),
plus a nuisance per-request latency ``d``; the model shape and batching limits are declared.
Each cold closed-loop point is replayed in virtual time; the fit is least squares, then Huber
(``HUBER_K``) on log TTFT (concurrency 1) and TPOT residuals standardized per kind, with
HC1-sandwich intervals, a systematic allowance ``SYSTEMATIC_PREFILL_REL`` on ``ln F`` carried
along the covariance, and poorly identified / confounded parameters listed. A fit that cannot
run names the missing measurement (:func:`missing_measurements`).

Method: docs/twin.md, "Calibration from the closed loop".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict

from capacity_pack.errors import StatedError
from capacity_pack.sim.profile import Profile
from capacity_pack.sim.virtual import ClosedLoopRequest, simulate_closed_loop
from capacity_pack.vocab.phases import MEASURED_PHASES

#: Finite-difference step of the Jacobian, in the scaled coordinates (about 1 % of each).
DIFF_STEP = 1e-2
#: Huber's tuning constant (95 % efficiency under normal errors): a standardized residual beyond
#: it counts linearly, not squared, so a host's hiccup (a TTFT tens of ms late) cannot pull the
#: fit.
HUBER_K = 1.345
#: The fitted F and B stay within e^LOG_RANGE of their starting values.
LOG_RANGE = 12.0
#: Median absolute deviation to a normal standard deviation.
MAD_TO_SD = 1.4826
#: Smallest robust scale of a residual kind (log units): a replay can match a measurement exactly.
MIN_SCALE = 1e-4
#: Stated systematic allowance on ln F (work per prompt token outside the model's clock;
#: docs/twin.md, "Systematic allowance, stated").
SYSTEMATIC_PREFILL_REL = 0.03
#: A relative standard error (or systematic allowance) above this marks a parameter poorly
#: identified.
POOR_REL_SE = 0.25
#: A correlation above this (in magnitude) marks a pair of parameters confounded.
POOR_CORRELATION = 0.9
#: ... and above this, nearly collinear: both are then listed as poorly identified.
COLLINEAR_CORRELATION = 0.99
#: Distinct prompt lengths at concurrency 1 must span at least this ratio (max / min) for the
#: prefill slope to be told from the fixed per-step cost.
MIN_PROMPT_SPREAD = 4.0
#: Fewest fitted requests at concurrency 1 (TTFT) and in all (TPOT).
MIN_TTFT_REQUESTS = 5
MIN_TPOT_REQUESTS = 10

PARAMETERS = (
    "flops_per_s",
    "bytes_per_s",
    "step_overhead_ms",
    "per_sequence_overhead_us",
    "request_latency_ms",
)
_SCALE_P_US = 10.0  # the per-sequence coordinate is in units of 10 us


class CalibrationError(StatedError, ValueError):
    """Measurements a fit cannot be made from; the message names what is missing."""


@dataclass
class MeasuredPoint:
    """One measured closed-loop point, ready to replay: its workers' request sequences and, per
    fitted request, the measured TTFT and TPOT."""

    name: str
    concurrency: int
    workers: list[list[ClosedLoopRequest]]
    client_gap_s: float
    # (worker, order) -> (ttft_ms, tpot_ms, prompt_tokens, output_tokens), measured ok rows only.
    measured: dict[tuple[int, int], tuple[float, float, int, int]] = field(default_factory=dict)


def load_point(table: str | Path | pd.DataFrame, name: str, concurrency: int) -> MeasuredPoint:
    """A closed-loop point from its requests table (``normalize``'s ``requests.parquet``)."""
    frame = table if isinstance(table, pd.DataFrame) else pd.read_parquet(table)
    need = {
        "phase",
        "status",
        "input_tokens",
        "output_tokens",
        "ttft_ms",
        "tpot_ms",
        "sent_ns",
        "end_ns",
    }
    if missing := sorted(need - set(frame.columns)):
        raise CalibrationError(
            f"{table if not isinstance(table, pd.DataFrame) else name}: "
            f"requests table lacks column(s) {', '.join(missing)}"
        )
    frame = frame.sort_values("sent_ns", kind="stable").reset_index(drop=True)
    ends: list[int] = []  # each worker's last end stamp
    workers: list[list[ClosedLoopRequest]] = []
    gaps: list[float] = []
    measured: dict[tuple[int, int], tuple[float, float, int, int]] = {}
    prompt = frame["input_tokens"].astype("int64")
    if "prompt_tokens" in frame.columns:
        server = frame["prompt_tokens"]
        prompt = server.where(server.notna(), prompt).astype("int64")
    for i, row in enumerate(frame.itertuples(index=False)):
        sent, end = int(row.sent_ns), int(row.end_ns)
        if len(workers) < concurrency:
            w = len(workers)
            workers.append([])
            ends.append(end)
        else:
            # The worker freed last before this send took it (the closed loop's shared queue).
            free = [k for k in range(len(ends)) if ends[k] <= sent]
            w = (
                max(free, key=lambda k: ends[k])
                if free
                else min(range(len(ends)), key=ends.__getitem__)
            )
            gaps.append((sent - ends[w]) / 1e9)
            ends[w] = end
        n_out = max(1, int(row.output_tokens))
        workers[w].append(ClosedLoopRequest(int(prompt.iloc[i]), n_out, str(row.phase)))
        if row.status == "ok" and row.phase in MEASURED_PHASES:
            measured[(w, len(workers[w]) - 1)] = (
                float(row.ttft_ms),
                float(row.tpot_ms),
                int(prompt.iloc[i]),
                n_out,
            )
    gap = float(np.median([g for g in gaps if g >= 0])) if gaps else 0.0
    return MeasuredPoint(name, concurrency, workers, max(0.0, gap), measured)


def missing_measurements(points: list[MeasuredPoint]) -> list[str]:
    """What the fit needs and the points lack, one sentence each (empty: it can run)."""
    out = []
    ones = [p for p in points if p.concurrency == 1]
    if not ones:
        out.append(
            "no closed-loop point at concurrency 1: TTFT against prompt length cannot be fitted"
        )
    else:
        prompts = [m[2] for p in ones for m in p.measured.values()]
        if len(prompts) < MIN_TTFT_REQUESTS:
            out.append(
                f"{len(prompts)} successful measured requests at concurrency 1 (need "
                f"{MIN_TTFT_REQUESTS}): TTFT against prompt length cannot be fitted"
            )
        elif max(prompts) < MIN_PROMPT_SPREAD * min(prompts):
            out.append(
                f"prompt lengths at concurrency 1 span only {min(prompts)}..{max(prompts)} "
                f"tokens (need a {MIN_PROMPT_SPREAD:g}x spread): prefill FLOP/s cannot be told "
                "from the fixed per-step cost"
            )
    levels = sorted({p.concurrency for p in points})
    if len(levels) < 2:
        out.append(
            f"only one concurrency level ({', '.join(map(str, levels)) or 'none'}): "
            "per-sequence cost cannot be separated"
        )
    tpot = sum(m[3] > 1 for p in points for m in p.measured.values())
    if tpot < MIN_TPOT_REQUESTS:
        out.append(
            f"{tpot} successful measured requests with 2 or more output tokens (need "
            f"{MIN_TPOT_REQUESTS}): TPOT against concurrency cannot be fitted"
        )
    return out


def profile_at(
    base: Profile,
    flops_per_s: float,
    bytes_per_s: float,
    step_overhead_ms: float,
    per_sequence_overhead_us: float,
) -> Profile:
    """``base`` with the achieved rates as its peaks at efficiency 1 (any positive rate is valid)
    and the given overheads."""
    data = base.model_dump()
    tp = base.engine.tensor_parallel
    data["hardware"].update(
        dense_tflops=flops_per_s / tp / 1e12, bandwidth_tb_s=bytes_per_s / tp / 1e12
    )
    data["efficiency"] = {
        "mfu": 1.0,
        "mbu": 1.0,
        "step_overhead_ms": step_overhead_ms,
        "per_sequence_overhead_us": per_sequence_overhead_us,
    }
    return Profile.model_validate(data)


def _starting_values(base: Profile, points: list[MeasuredPoint]) -> tuple[float, float]:
    """``F0`` from the slope of TTFT against prompt length at concurrency 1 (``2 P`` FLOPs a
    token), ``B0`` from the fastest TPOT there (weights read once a step)."""
    ones = [m for p in points if p.concurrency == 1 for m in p.measured.values()]
    prompts = np.array([m[2] for m in ones], float)
    ttft_s = np.array([m[0] for m in ones]) / 1e3
    slope = np.polyfit(prompts, ttft_s, 1)[0] if len(set(prompts)) > 1 else 0.0
    f0 = 2 * base.model.params / slope if slope > 0 else 1e12
    tpots = [m[1] for p in points for m in p.measured.values() if m[3] > 1 and m[1] > 0]
    b0 = base.model.weight_bytes / (min(tpots) / 1e3) if tpots else 1e11
    return f0, b0


@dataclass
class Fit:
    """The fitted parameters (natural units), their covariance and what the fit saw."""

    estimates: dict[str, float]
    std_errors: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    correlation: list[list[float | None]]
    residual_sd: float
    n_residuals: int
    poorly_identified: list[str]
    confounded: list[tuple[str, str, float]]
    points: list[dict[str, Any]]
    evaluations: int
    profile: Profile
    #: Identified combinations of confounded parameters: name -> estimate, std_error, ci95.
    derived: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Residuals beyond Huber's K robust standard deviations (weighted down in the fit).
    downweighted: int = 0
    #: Each parameter's systematic allowance (natural units, +-): the prefill rate's stated
    #: allowance carried along the covariance.
    systematic: dict[str, float] = field(default_factory=dict)
    #: The 95 % intervals widened by the systematic allowance.
    intervals_with_systematic: dict[str, tuple[float, float]] = field(default_factory=dict)


def _replay(
    base: Profile, points: list[MeasuredPoint], params: dict[str, float], seed: int
) -> list[dict[tuple[int, int], tuple[float, float]]]:
    prof = profile_at(base, *(params[name] for name in PARAMETERS[:4]))
    out = []
    for p in points:
        run = simulate_closed_loop(prof, p.workers, client_gap_s=p.client_gap_s, seed=seed)
        out.append({(r.worker, r.order): (r.ttft_s * 1e3, r.tpot_s * 1e3) for r in run.results})
    return out


def _residuals(
    points: list[MeasuredPoint], replayed: list[dict], latency_ms: float
) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Log residuals and, per residual, (point index, "ttft" | "tpot")."""
    res, tags = [], []
    for i, (p, rep) in enumerate(zip(points, replayed, strict=True)):
        for key, (ttft, tpot, _, n_out) in sorted(p.measured.items()):
            got = rep.get(key)
            if p.concurrency == 1:
                sim = (got[0] if got else 0.0) + latency_ms
                res.append(math.log(max(ttft, 1e-6) / max(sim, 1e-6)))
                tags.append((i, "ttft"))
            if n_out > 1:
                sim = got[1] if got else 0.0
                res.append(math.log(max(tpot, 1e-6) / max(sim, 1e-6)))
                tags.append((i, "tpot"))
    return np.asarray(res), tags


def fit(base: Profile, points: list[MeasuredPoint], *, seed: int = 0) -> Fit:
    """Fit ``F``, ``B``, ``o``, ``p`` and ``d`` to ``points`` (see the module docstring);
    raises :class:`CalibrationError` naming what is missing."""
    from scipy.stats import t as student_t

    if problems := missing_measurements(points):
        raise CalibrationError("calibration cannot run: " + "; ".join(problems))
    f0, b0 = _starting_values(base, points)
    x, standardized, sigma, nfev = _optimize(base, points, seed, f0, b0)
    z = standardized(x)
    jac = _forward_jacobian(standardized, x, z)
    n, k = jac.shape
    dof = max(1, n - k)
    cov, downweighted = _huber_sandwich(jac, z)
    tq = float(student_t.ppf(0.975, dof))
    est = _natural(x, f0, b0)
    # At its bound, or moving no replayed time at all (a memory term that never binds): its
    # near-zero variance says nothing, and rounding in that variance would make its
    # correlations meaningless (even beyond +-1), so they are not reported.
    idle = [(i < 2 and abs(x[i]) >= LOG_RANGE - 1e-6) or not np.any(jac[:, i]) for i in range(k)]
    se, intervals, systematic, widened = _intervals(x, est, cov, idle, tq, (f0, b0))
    corr, poor, confounded = _identifiability(cov, idle, est, se, systematic, widened)
    return Fit(
        est,
        se,
        intervals,
        [[None if idle[i] or idle[j] else float(corr[i, j]) for j in range(k)] for i in range(k)],
        math.sqrt(float(np.sum((z * sigma) ** 2)) / dof),
        n,
        poor,
        confounded,
        _point_summaries(base, points, est, seed),
        nfev + k,
        profile_at(base, *(est[name] for name in PARAMETERS[:4])),
        {"decode_step_ms_at_batch_1": _decode_step_at_batch_1(base, points, est, cov, tq)},
        downweighted,
        systematic,
        widened,
    )


def _natural(x: np.ndarray, f0: float, b0: float) -> dict[str, float]:
    """The parameters in natural units from the scaled coordinates ``x``."""
    return {
        "flops_per_s": f0 * math.exp(x[0]),
        "bytes_per_s": b0 * math.exp(x[1]),
        "step_overhead_ms": float(x[2]),
        "per_sequence_overhead_us": float(x[3]) * _SCALE_P_US,
        "request_latency_ms": float(x[4]),
    }


def _optimize(
    base: Profile, points: list[MeasuredPoint], seed: int, f0: float, b0: float
) -> tuple[np.ndarray, Any, np.ndarray, int]:
    """The two stages (module docstring): the Huber optimum ``x``, its standardized residuals'
    function, the robust scale of each residual and the replays both stages cost."""
    from scipy.optimize import least_squares

    def residuals(x: np.ndarray) -> np.ndarray:
        params = _natural(x, f0, b0)
        replayed = _replay(base, points, params, seed)
        return _residuals(points, replayed, params["request_latency_ms"])[0]

    x0 = np.array([0.0, 0.0, 0.5, 0.1, 0.5])
    # F and B within a factor e^12 (about 160,000) of their starting values: where the memory
    # term never binds (a CPU engine's decode is compute- and overhead-bound) B runs off to
    # that bound instead of overflowing, and the fit lists it as poorly identified.
    lower = np.array([-LOG_RANGE, -LOG_RANGE, 0.0, 0.0, 0.0])
    upper = np.array([LOG_RANGE, LOG_RANGE, np.inf, np.inf, np.inf])
    common = {"method": "trf", "diff_step": DIFF_STEP, "x_scale": 1.0, "max_nfev": 200}
    # Stage 1: ordinary least squares, for a start and the residuals' robust scale.
    sol0 = least_squares(residuals, x0, bounds=(lower, upper), **common)
    # Each residual's kind, in order: it depends on neither the parameters nor the replay.
    kinds = np.array([kind == "ttft" for _, kind in _residuals(points, [{}] * len(points), 0)[1]])
    sigma = np.empty(len(kinds))
    for mask in (kinds, ~kinds):
        if mask.any():
            r = sol0.fun[mask]
            mad = float(np.median(np.abs(r - np.median(r))))
            sigma[mask] = max(MAD_TO_SD * mad, MIN_SCALE)

    def standardized(x: np.ndarray) -> np.ndarray:
        return residuals(x) / sigma

    # Stage 2: Huber's M-estimate on the residuals standardized per kind.
    sol = least_squares(
        standardized, sol0.x, bounds=(lower, upper), loss="huber", f_scale=HUBER_K, **common
    )
    return sol.x, standardized, sigma, int(sol0.nfev + sol.nfev)


def _huber_sandwich(jac: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, int]:
    """The covariance of the scaled coordinates from the standardized residuals ``z`` and
    their Jacobian ``jac`` at the optimum, and the count of residuals it weights down."""
    n, k = jac.shape
    # Huber's sandwich (Huber 1967; HC1 scaling): psi(z) = clip(z, -K, K), psi'(z) = [|z| <= K];
    # cov = n / (n - k) A^-1 B A^-1 with A = J^T diag(psi') J, B = J^T diag(psi^2) J. With every
    # residual inside K it is White's HC1 sandwich of the weighted least squares.
    psi = np.clip(z, -HUBER_K, HUBER_K)
    inside = (np.abs(z) <= HUBER_K).astype(float)
    bread = np.linalg.pinv((jac * inside[:, None]).T @ jac)
    meat = (jac * (psi**2)[:, None]).T @ jac
    return n / max(1, n - k) * bread @ meat @ bread, int(np.sum(inside == 0))


def _intervals(
    x: np.ndarray, est: dict, cov: np.ndarray, idle: list[bool], tq: float, rates0: tuple
) -> tuple[dict, dict, dict, dict]:
    """Standard errors, 95 % intervals, systematic allowances and the intervals they widen,
    each in natural units by parameter."""
    se_x = np.sqrt(np.clip(np.diag(cov), 0, None))
    # Standard errors in natural units (delta method: F and B are exp of their coordinate).
    scale = [est["flops_per_s"], est["bytes_per_s"], 1.0, _SCALE_P_US, 1.0]
    se = {name: float(se_x[i] * scale[i]) for i, name in enumerate(PARAMETERS)}
    # The prefill rate's systematic allowance along the fitted ridge: a shift of ln F by
    # SYSTEMATIC_PREFILL_REL moves each coordinate by its regression on ln F,
    # cov[i, 0] / cov[0, 0] (the conditional mean given ln F; the coordinate itself for F);
    # none for an idle parameter.
    slope = cov[:, 0] / cov[0, 0] if cov[0, 0] > 0 and not idle[0] else np.eye(len(x))[0]
    shift_x = np.where(idle, 0.0, np.abs(slope) * SYSTEMATIC_PREFILL_REL)
    intervals: dict[str, tuple[float, float]] = {}
    systematic: dict[str, float] = {}
    widened: dict[str, tuple[float, float]] = {}
    for i, name in enumerate(PARAMETERS):
        half, shift = tq * se_x[i], shift_x[i]
        if i < 2:  # F and B on the log scale
            rate0 = rates0[i]
            intervals[name] = (rate0 * math.exp(x[i] - half), rate0 * math.exp(x[i] + half))
            systematic[name] = float(est[name] * (math.exp(shift) - 1))
            widened[name] = (
                rate0 * math.exp(x[i] - half - shift),
                rate0 * math.exp(x[i] + half + shift),
            )
        else:
            intervals[name] = (est[name] - tq * se[name], est[name] + tq * se[name])
            systematic[name] = float(shift * scale[i])
            lo, hi = intervals[name]
            widened[name] = (lo - systematic[name], hi + systematic[name])
    return se, intervals, systematic, widened


def _identifiability(
    cov: np.ndarray, idle: list[bool], est: dict, se: dict, systematic: dict, widened: dict
) -> tuple[np.ndarray, list[str], list[tuple[str, str, float]]]:
    """The correlation matrix, the poorly identified parameters and the confounded pairs."""
    k = len(idle)
    d = np.sqrt(np.clip(np.diag(cov), 1e-300, None))
    corr = np.clip(cov / np.outer(d, d), -1.0, 1.0)
    rel = {
        name: max(se[name], systematic[name]) / abs(est[name]) if est[name] else math.inf
        for name in PARAMETERS
    }
    poor = []
    for i, name in enumerate(PARAMETERS):
        if idle[i] or rel[name] > POOR_REL_SE or (i >= 2 and widened[name][0] <= 0):
            poor.append(name)
    confounded = [
        (PARAMETERS[i], PARAMETERS[j], float(corr[i, j]))
        for i in range(k)
        for j in range(i + 1, k)
        if not (idle[i] or idle[j]) and abs(corr[i, j]) > POOR_CORRELATION
    ]
    # Nearly collinear: the less precisely known member follows the other along the ridge and
    # is listed; the better one is not (docs/twin.md, "Identifiability, reported").
    for a, b, c in confounded:
        if abs(c) > COLLINEAR_CORRELATION:
            weaker = a if rel[a] >= rel[b] else b
            if weaker not in poor:
                poor.append(weaker)
    return corr, [name for name in PARAMETERS if name in poor], confounded


def _decode_step_at_batch_1(
    base: Profile, points: list[MeasuredPoint], est: dict[str, float], cov: np.ndarray, tq: float
) -> dict[str, Any]:
    """The batch-1 decode step at the median context c of the concurrency-1 requests,
    (W + k c) / B + o + p: what TPOT at concurrency 1 measures, identified even where B and o
    are not apart (delta method on the scaled coordinates)."""
    ones = [m for p in points if p.concurrency == 1 for m in p.measured.values()]
    ctx = float(np.median([m[2] + m[3] / 2 for m in ones]))
    read_ms = (base.model.weight_bytes + base.model.kv_bytes_per_token * ctx) / est["bytes_per_s"]
    read_ms *= 1e3
    grad = np.array([0.0, -read_ms, 1.0, _SCALE_P_US / 1e3, 0.0])
    step1 = read_ms + est["step_overhead_ms"] + est["per_sequence_overhead_us"] / 1e3
    step1_se = float(math.sqrt(max(0.0, grad @ cov @ grad)))
    return {
        "estimate": step1,
        "std_error": step1_se,
        "ci95": [step1 - tq * step1_se, step1 + tq * step1_se],
        "unit": "ms",
        "context_tokens": ctx,
        "meaning": "one decode step alone at the median context of the concurrency-1 requests: "
        "weights and KV read once ((W + k c) / B) + step overhead + one sequence's overhead",
    }


def _point_summaries(
    base: Profile, points: list[MeasuredPoint], est: dict[str, float], seed: int
) -> list[dict[str, Any]]:
    """Per point, how closely the replay at the estimates ``est`` matches the measured TTFT and
    TPOT."""
    res, tags = _residuals(points, _replay(base, points, est, seed), est["request_latency_ms"])
    summaries = []
    for i, p in enumerate(points):
        row: dict[str, Any] = {
            "point": p.name,
            "concurrency": p.concurrency,
            "requests_replayed": sum(map(len, p.workers)),
            "client_gap_ms": p.client_gap_s * 1e3,
        }
        for metric in ("ttft", "tpot"):
            # Relative error of the replay against the measurement: |sim / measured - 1|.
            errs = np.array(
                [abs(math.exp(-r) - 1) for r, t in zip(res, tags, strict=True) if t == (i, metric)]
            )
            row[f"{metric}_fitted"] = int(len(errs))
            if len(errs):
                row[f"{metric}_median_rel_error"] = float(np.median(errs))
                row[f"{metric}_p90_rel_error"] = float(np.quantile(errs, 0.9))
        summaries.append(row)
    return summaries


def _forward_jacobian(fun: Any, x: np.ndarray, f0: np.ndarray) -> np.ndarray:
    """Forward differences of ``fun`` at ``x`` (every coordinate is of order one, and the
    lower bounds are 0: a forward step stays feasible), step ``DIFF_STEP`` x max(1, |x_i|)."""
    jac = np.empty((len(f0), len(x)))
    for i in range(len(x)):
        h = DIFF_STEP * max(1.0, abs(x[i]))
        step = x.copy()
        step[i] += h
        jac[:, i] = (fun(step) - f0) / h
    return jac


# -- the pack's side: which points, which base profile, what is written ------------------------

#: The cache state calibrated from: unique prompts, which a replay reproduces exactly.
CALIBRATION_CACHE = "cold"


class PointRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    point: str
    concurrency: int
    cache_state: str
    repeat: int


class CalibrationInputs(BaseModel):
    """What the ``calibrate`` stage reads of the manifest: the base profile (the simulated
    target's own, or one built from the declared architecture), whether its hardware peaks are
    known, and the declared closed-loop points it fits (never an open-loop point)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_profile: dict[str, Any]
    peaks_known: bool
    source: str
    points: list[PointRef]

    @classmethod
    def of(cls, pack: Any) -> CalibrationInputs | None:
        """The inputs of ``pack`` (a validated ``plan.manifest.Pack``), or ``None`` when the pack
        cannot be calibrated (:func:`unplanned_reason` says why)."""
        if unplanned_reason(pack) is not None:
            return None
        from capacity_pack.twin.architecture import base_profile

        profile, peaks_known, source = base_profile(pack)
        return cls(
            base_profile=profile.model_dump(mode="json"),
            peaks_known=peaks_known,
            source=source,
            points=declared_points(pack),
        )

    def canonical_json(self) -> str:
        from capacity_pack.io import canonical_json

        return canonical_json(self.model_dump(mode="json"))


def declared_points(pack: Any) -> list[PointRef]:
    """The declared closed-loop levels of the calibration cache state: every repeat of a fixed
    sweep; repeat 0 (round 1) when the levels open a concurrency search."""
    sweep = pack.sweep
    searched = sweep.search is not None and sweep.search.concurrency is not None
    repeats = 1 if searched else sweep.repeats
    if CALIBRATION_CACHE not in sweep.cache_states:
        return []
    return [
        PointRef(point=f"closed-c{c}", concurrency=c, cache_state=CALIBRATION_CACHE, repeat=r)
        for r in range(repeats)
        for c in sweep.closed_loop_concurrency
    ]


def unplanned_reason(pack: Any) -> str | None:
    """Why ``pack`` has no ``calibrate`` job (``None``: it has one)."""
    from capacity_pack.twin.architecture import architecture_missing

    if CALIBRATION_CACHE not in pack.sweep.cache_states:
        return "no cold cache state: calibration replays unique (cold) prompts"
    levels = sorted(set(pack.sweep.closed_loop_concurrency))
    if 1 not in levels:
        return "no closed-loop point at concurrency 1: TTFT against prompt length cannot be fitted"
    if len(levels) < 2:
        return "only one concurrency level: per-sequence cost cannot be separated"
    fixed = [c.input_tokens for c in pack.workload]
    if all(isinstance(n, int) for n in fixed) and max(fixed) < MIN_PROMPT_SPREAD * min(fixed):
        return (
            f"prompt lengths span only {min(fixed)}..{max(fixed)} tokens (fixed-length classes; "
            f"need a {MIN_PROMPT_SPREAD:g}x spread): prefill FLOP/s cannot be told from the "
            "fixed per-step cost"
        )
    return architecture_missing(pack)


def twin_absent_reason(pack: Any) -> str | None:
    """Why ``pack`` has no validated twin, i.e. plans no ``calibrate`` and ``twin_validate`` jobs
    (``None``: it plans both)."""
    why = unplanned_reason(pack)
    if why is not None:
        return f"the pack cannot be calibrated ({why})"
    if not pack.sweep.has_open_loop:
        return "the pack has no open loop to validate a calibrated twin against"
    return None


def efficiency_of(fitted: Fit, base: Profile, peaks_known: bool) -> dict[str, Any] | None:
    """mfu and mbu with their standard errors and intervals against ``base``'s peaks, or
    ``None`` when the peaks are not known (or the fit exceeds them)."""
    if not peaks_known:
        return None
    tp = base.engine.tensor_parallel
    peaks = {
        "mfu": ("flops_per_s", tp * base.hardware.dense_tflops * 1e12),
        "mbu": ("bytes_per_s", tp * base.hardware.bandwidth_tb_s * 1e12),
    }
    out = {}
    for name, (param, peak) in peaks.items():
        lo, hi = fitted.intervals[param]
        wlo, whi = fitted.intervals_with_systematic.get(param, (lo, hi))
        out[name] = {
            "estimate": fitted.estimates[param] / peak,
            "std_error": fitted.std_errors[param] / peak,
            "ci95": [lo / peak, hi / peak],
            "ci95_with_systematic": [wlo / peak, whi / peak],
        }
    if any(v["estimate"] > 1 for v in out.values()):
        return None
    return out


def calibrated_profile(fitted: Fit, base: Profile, peaks_known: bool) -> tuple[Profile, str]:
    """The calibrated profile and a note on its peaks: ``base`` with the fitted efficiencies
    against its own peaks when known, else with the fitted rates as nominal peaks at efficiency
    1.0."""
    eff = efficiency_of(fitted, base, peaks_known)
    est = fitted.estimates
    data = base.model_dump(mode="json")
    data["name"] = f"{base.name}-calibrated"
    data["efficiency"] = {
        "step_overhead_ms": est["step_overhead_ms"],
        "per_sequence_overhead_us": est["per_sequence_overhead_us"],
    }
    if eff is not None:
        data["efficiency"].update(mfu=eff["mfu"]["estimate"], mbu=eff["mbu"]["estimate"])
        note = "efficiencies fitted against the declared hardware peaks"
    else:
        tp = base.engine.tensor_parallel
        data["hardware"].update(
            dense_tflops=est["flops_per_s"] / tp / 1e12,
            bandwidth_tb_s=est["bytes_per_s"] / tp / 1e12,
        )
        data["efficiency"].update(mfu=1.0, mbu=1.0)
        note = (
            "hardware peaks unknown (or exceeded by the fit): dense_tflops and bandwidth_tb_s "
            "are the fitted achieved rates, as nominal peaks at efficiency 1.0"
        )
    data["description"] = f"Calibrated from closed-loop measurements ({note})."
    return Profile.model_validate(data), note


def report(fitted: Fit, inputs: CalibrationInputs) -> tuple[dict[str, Any], str]:
    """The calibration document (``calibration.json``) and the profile's YAML text."""
    base = Profile.model_validate(inputs.base_profile)
    prof, note = calibrated_profile(fitted, base, inputs.peaks_known)
    units = {
        "flops_per_s": "FLOP/s",
        "bytes_per_s": "B/s",
        "step_overhead_ms": "ms",
        "per_sequence_overhead_us": "us",
        "request_latency_ms": "ms",
    }
    doc: dict[str, Any] = {
        "method": "robust nonlinear regression (scipy.optimize.least_squares, trf: least "
        "squares, then Huber's M-estimate, K = 1.345, on residuals standardized per kind by "
        "1.4826 MAD) on log residuals "
        "of per-request TTFT at concurrency 1 and TPOT at every concurrency, each against the "
        "same request replayed in virtual time (closed loop, same workers and lengths); "
        "standard errors from the Jacobian at the optimum as Huber's sandwich, cov = n/(n-k) "
        "A^-1 B A^-1, A = J^T diag(psi') J, B = J^T diag(psi^2) J; 95 % intervals with "
        "Student's t. The intervals ci95 are statistical only (independent residuals): a live "
        "server's own work that the engine model lacks adds systematic error; "
        f"ci95_with_systematic adds a stated {SYSTEMATIC_PREFILL_REL:.0%} allowance on the "
        "prefill rate (the simulator's live runs; docs/twin.md), carried into each parameter "
        "by its regression on ln F in the fitted covariance",
        "source": inputs.source,
        "points": [p.model_dump() for p in inputs.points],
        "parameters": {
            name: {
                "estimate": fitted.estimates[name],
                "std_error": fitted.std_errors[name],
                "ci95": list(fitted.intervals[name]),
                "systematic": fitted.systematic.get(name, 0.0),
                "ci95_with_systematic": list(
                    fitted.intervals_with_systematic.get(name, fitted.intervals[name])
                ),
                "unit": units[name],
            }
            for name in PARAMETERS
        },
        "efficiency": efficiency_of(fitted, base, inputs.peaks_known),
        "nuisance": ["request_latency_ms"],
        "derived": fitted.derived,
        "poorly_identified": fitted.poorly_identified,
        "confounded": [{"pair": [a, b], "correlation": c} for a, b, c in fitted.confounded],
        "correlation": {"parameters": list(PARAMETERS), "matrix": fitted.correlation},
        "residual_sd_log": fitted.residual_sd,
        "residuals_fitted": fitted.n_residuals,
        "residuals_downweighted": fitted.downweighted,
        "evaluations": fitted.evaluations,
        "residuals": fitted.points,
        "profile_note": note,
    }
    header = (
        f"# Calibrated engine-model profile ({inputs.source}).\n# {note}.\n"
        "# Fitted by capacity_pack.twin.calibrate; see calibration.json beside it.\n"
    )
    text = header + yaml.safe_dump(prof.model_dump(mode="json"), sort_keys=False)
    return doc, text
