"""Calibration: a profile's free parameters fitted to the pack's measured closed-loop points.

The engine model (:mod:`capacity_pack.sim.perf`) prices a step as
``max(FLOPs / F, bytes / B) + o + n_seqs p``: achieved FLOP/s ``F`` (``tp x peak x mfu``),
achieved bandwidth ``B`` (``tp x peak x mbu``), a fixed step overhead ``o`` and a per-sequence
overhead ``p``. The model shape (parameters, bytes per parameter, KV bytes per token) and the
engine's batching limits (``max_num_seqs``, token budget, KV blocks) are taken as declared, never
fitted. A client-observed TTFT also holds the request's way to the engine and back (HTTP,
tokenization, the client): a fixed per-request latency ``d`` is fitted beside the four, as a
nuisance parameter reported but not part of the profile (the engine model starts a request's
clock at its arrival).

Data. Each measured closed-loop point (the requests table of ``normalize``, cold cache state:
unique prompts, which the replay reproduces with random token IDs) is replayed request for request
in virtual time (:func:`capacity_pack.sim.virtual.simulate_closed_loop`): the point's workers are
rebuilt from the client's stamps (in send order, each request goes to the worker that ended its
previous request last before it was sent: the closed loop's shared queue), each worker sends its
own requests (their prompt and output lengths) back to back, ``client gap`` apart (the median
measured gap between a worker's end and its next send). Warm-up rows are replayed (they load the
engine) but not fitted.

Method: a robust nonlinear regression (``scipy.optimize.least_squares``, trust-region reflective,
bounds ``o, p, d >= 0``) on log residuals

- ``log(TTFT_measured / (TTFT_replayed + d))`` of every measured ``ok`` request at concurrency 1
  (TTFT against prompt length: prefill FLOP/s against the fixed costs), and
- ``log(TPOT_measured / TPOT_replayed)`` of every measured ``ok`` request with two or more output
  tokens at every concurrency (decode against batch size and context: bandwidth, KV reads and
  the per-step and per-sequence costs),

over ``x = (ln F/F0, ln B/B0, o [ms], p [10 us], d [ms])`` (``F0``, ``B0``: starting values from
the data, so every coordinate is of order one and one finite-difference step, ``DIFF_STEP``,
moves each by about 1 %: the replay is piecewise constant at the scale of a nanosecond rounding
and a batch boundary, so a smaller step would differentiate noise), in two stages: ordinary
least squares, then Huber's M-estimate (``loss="huber"``, ``K = HUBER_K``) from there on the
residuals standardized per kind, ``z = r / s_kind`` with ``s_kind = 1.4826 x MAD`` of the first
stage's TTFT (or TPOT) residuals. A live measurement's outliers are one-sided: a host that
preempts the engine or the client for 10-30 ms (steal time on a shared VM) makes a TTFT late,
never early, and in squares a few such requests pulled the prefill rate below its truth by more
than its interval (mfu 0.468 [0.442, 0.496] against 0.5 on 2026-12-03); beyond ``K`` robust
standard deviations a residual counts linearly, and the count of such residuals is reported.

Uncertainty: from the Jacobian ``J`` of the standardized residuals at the optimum (Bates &
Watts; forward differences), as Huber's sandwich with White's HC1 scaling:
``cov = n / (n - k) A^-1 B A^-1``, ``A = J^T diag(psi'(z)) J``, ``B = J^T diag(psi(z)^2) J``,
``psi(z) = clip(z, -K, K)`` (Huber 1967; with every residual inside ``K`` this is
``(J^T J)^-1 J^T diag(z^2) J (J^T J)^-1``, the HC1 sandwich); standard errors are the square roots
of its diagonal, 95 % intervals ``estimate +- t(0.975, n - k) se`` (for ``F`` and ``B`` on the
log scale: ``exp(ln F +- t se)``). Not the textbook ``s^2 (J^T J)^-1``: TTFT and TPOT residuals
differ in spread by an order of magnitude (a TTFT holds one step and the request's way in, a TPOT
averages dozens of steps), and one pooled ``s^2`` would understate the uncertainty of the
TTFT-borne parameters (``F``, ``d``). Not a bootstrap over requests: each resample is a full fit
(hundreds of replays); the sandwich costs one Jacobian (five replays). Both assume
independent residuals: neighbours in a batch share their steps, and a systematic miss of the
model (a cost it does not have) is bias, not variance; the per-point residual summaries show
when the replay misses the measurement.

Systematic allowance: the intervals above hold the scatter of independent residuals, not a
cost the live server has and the engine model lacks. The known one is per prompt token outside
the model's clock (reading, parsing, tokenizing), which reads as a slower prefill; its stated
allowance ``s = SYSTEMATIC_PREFILL_REL`` on ``ln F`` is carried into every coordinate ``x_i``
along the fitted ridge by its regression on ``ln F``: ``delta_i = s |cov[i, F] / cov[F, F]|``
(for ``F`` itself ``s``). Where TPOT replays within 0.03 % (a quiet host), TPOT at concurrency
8 and 32 ties ``B``, ``o`` and ``p`` to ``F`` through the prefills interleaved with decode, and
a 1 % bias of ``F`` moves ``o`` some 30 %: that is what this allowance says. Each parameter is
reported with ``ci95`` (statistical) and ``ci95_with_systematic`` (``ci95`` widened by
``delta_i`` on each side).

Identifiability (reported, never hidden): a parameter whose relative standard error or
systematic allowance exceeds ``POOR_REL_SE`` (or, for ``o``, ``p`` and ``d``, whose interval
with the systematic allowance reaches 0), or that is the
less precisely known member (larger relative standard error) of a pair correlated beyond
``COLLINEAR_CORRELATION``, is listed as poorly identified; each pair correlated beyond
``POOR_CORRELATION`` is listed as confounded. In a nearly collinear pair the data fix the
combination and the weaker member follows the better one, so a small bias in the better one
moves it by about the ratio of their relative errors, beyond its linearized interval; the
better one keeps its own (small) interval. What the data do fix of the
usual collinear pair is reported as a derived quantity with its own interval: the batch-1
decode step ``(W + k c) / B + o + p`` at the median context ``c`` of the concurrency-1 requests
(delta method). Typical
cases: the step overhead against weight-read time (at batch 1 both are a constant per step: ``o``
is told from ``W / B`` only through the KV-read slope of TPOT against context), the per-sequence
overhead against KV reads (both grow with the batch), and ``d`` against ``o`` at concurrency 1.

A fit that cannot run says which measurement is missing (:func:`missing_measurements`).
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
#: A live server's own work per prompt token outside the engine model's clock (reading, parsing
#: and tokenizing the prompt) reads as a slower prefill: a systematic error of the prefill rate
#: that no interval of independent residuals holds. Its stated allowance, from the simulator's
#: live runs (mfu 0.468-0.511 against 0.5; docs/twin.md), is carried along the fit's covariance
#: into every parameter (see the module docstring).
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
        if row.status == "ok" and row.phase in ("measure", "extension"):
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
    prof = profile_at(
        base,
        params["flops_per_s"],
        params["bytes_per_s"],
        params["step_overhead_ms"],
        params["per_sequence_overhead_us"],
    )
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


def _residual_kinds(points: list[MeasuredPoint]) -> list[str]:
    """Each residual's kind, "ttft" or "tpot", in :func:`_residuals`' order (which does not
    depend on the parameters)."""
    kinds = []
    for p in points:
        for _, (_, _, _, n_out) in sorted(p.measured.items()):
            if p.concurrency == 1:
                kinds.append("ttft")
            if n_out > 1:
                kinds.append("tpot")
    return kinds


def fit(base: Profile, points: list[MeasuredPoint], *, seed: int = 0) -> Fit:
    """Fit ``F``, ``B``, ``o``, ``p`` and ``d`` to ``points`` (see the module docstring);
    raises :class:`CalibrationError` naming what is missing."""
    from scipy.optimize import least_squares
    from scipy.stats import t as student_t

    if problems := missing_measurements(points):
        raise CalibrationError("calibration cannot run: " + "; ".join(problems))
    f0, b0 = _starting_values(base, points)

    def natural(x: np.ndarray) -> dict[str, float]:
        return {
            "flops_per_s": f0 * math.exp(x[0]),
            "bytes_per_s": b0 * math.exp(x[1]),
            "step_overhead_ms": float(x[2]),
            "per_sequence_overhead_us": float(x[3]) * _SCALE_P_US,
            "request_latency_ms": float(x[4]),
        }

    def residuals(x: np.ndarray) -> np.ndarray:
        params = natural(x)
        return _residuals(
            points, _replay(base, points, params, seed), params["request_latency_ms"]
        )[0]

    x0 = np.array([0.0, 0.0, 0.5, 0.1, 0.5])
    # F and B within a factor e^12 (about 160,000) of their starting values: where the memory
    # term never binds (a CPU engine's decode is compute- and overhead-bound) B runs off to
    # that bound instead of overflowing, and the fit lists it as poorly identified.
    lower = np.array([-LOG_RANGE, -LOG_RANGE, 0.0, 0.0, 0.0])
    upper = np.array([LOG_RANGE, LOG_RANGE, np.inf, np.inf, np.inf])
    common = {"method": "trf", "diff_step": DIFF_STEP, "x_scale": 1.0, "max_nfev": 200}
    # Stage 1: ordinary least squares, for a start and the residuals' robust scale.
    sol0 = least_squares(residuals, x0, bounds=(lower, upper), **common)
    kinds = np.array([kind == "ttft" for kind in _residual_kinds(points)])
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
    x = sol.x
    z = standardized(x)
    jac = _forward_jacobian(standardized, x, z)
    n, k = jac.shape
    dof = max(1, n - k)
    s2 = float(np.sum((z * sigma) ** 2)) / dof
    # Huber's sandwich (Huber 1967; HC1 scaling): psi(z) = clip(z, -K, K), psi'(z) = [|z| <= K];
    # cov = n / (n - k) A^-1 B A^-1 with A = J^T diag(psi') J, B = J^T diag(psi^2) J. With every
    # residual inside K it is White's HC1 sandwich of the weighted least squares.
    psi = np.clip(z, -HUBER_K, HUBER_K)
    inside = (np.abs(z) <= HUBER_K).astype(float)
    bread = np.linalg.pinv((jac * inside[:, None]).T @ jac)
    meat = (jac * (psi**2)[:, None]).T @ jac
    cov = n / dof * bread @ meat @ bread
    downweighted = int(np.sum(inside == 0))
    se_x = np.sqrt(np.clip(np.diag(cov), 0, None))
    tq = float(student_t.ppf(0.975, dof))
    est = natural(x)
    # Standard errors in natural units (delta method: F and B are exp of their coordinate).
    scale = [est["flops_per_s"], est["bytes_per_s"], 1.0, _SCALE_P_US, 1.0]
    se = {name: float(se_x[i] * scale[i]) for i, name in enumerate(PARAMETERS)}
    intervals = {
        "flops_per_s": (f0 * math.exp(x[0] - tq * se_x[0]), f0 * math.exp(x[0] + tq * se_x[0])),
        "bytes_per_s": (b0 * math.exp(x[1] - tq * se_x[1]), b0 * math.exp(x[1] + tq * se_x[1])),
    }
    for name in PARAMETERS[2:]:
        intervals[name] = (est[name] - tq * se[name], est[name] + tq * se[name])
    # At its bound, or moving no replayed time at all (a memory term that never binds): its
    # near-zero variance says nothing, and rounding in that variance would make its
    # correlations meaningless (even beyond +-1), so they are not reported.
    idle = [(i < 2 and abs(x[i]) >= LOG_RANGE - 1e-6) or not np.any(jac[:, i]) for i in range(k)]
    d = np.sqrt(np.clip(np.diag(cov), 1e-300, None))
    corr = np.clip(cov / np.outer(d, d), -1.0, 1.0)
    # The prefill rate's systematic allowance along the fitted ridge: a shift of ln F by
    # SYSTEMATIC_PREFILL_REL moves each coordinate by its regression on ln F,
    # cov[i, 0] / cov[0, 0] (the conditional mean given ln F; the coordinate itself for F).
    slope = cov[:, 0] / cov[0, 0] if cov[0, 0] > 0 and not idle[0] else np.eye(k)[0]
    shift_x = np.abs(slope) * SYSTEMATIC_PREFILL_REL
    systematic: dict[str, float] = {}
    widened: dict[str, tuple[float, float]] = {}
    for i, name in enumerate(PARAMETERS):
        if idle[i]:
            systematic[name] = 0.0
            widened[name] = intervals[name]
        elif i < 2:
            base_rate = f0 if i == 0 else b0
            systematic[name] = float(est[name] * (math.exp(shift_x[i]) - 1))
            widened[name] = (
                base_rate * math.exp(x[i] - tq * se_x[i] - shift_x[i]),
                base_rate * math.exp(x[i] + tq * se_x[i] + shift_x[i]),
            )
        else:
            systematic[name] = float(shift_x[i] * scale[i])
            lo, hi = intervals[name]
            widened[name] = (lo - systematic[name], hi + systematic[name])
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
    # Nearly collinear: the data fix the pair's combination (see ``derived``), and the member
    # known less precisely follows the other along that ridge: a small bias in the better one
    # moves it by about the ratio of their relative errors (on the simulator the step overhead
    # moves some 30 % for 1 % of the prefill rate), beyond its linearized interval. That member
    # is listed; the better-determined one is not for this reason alone (on a quiet host every
    # TPOT replays within 0.03 %, which ties F, B, o and p into one ridge that TTFT pins
    # through F, F within 0.3 %).
    for a, b, c in confounded:
        if abs(c) > COLLINEAR_CORRELATION:
            weaker = a if rel[a] >= rel[b] else b
            if weaker not in poor:
                poor.append(weaker)
    poor = [name for name in PARAMETERS if name in poor]
    # The batch-1 decode step at the median context c of the concurrency-1 requests,
    # (W + k c) / B + o + p: what TPOT at concurrency 1 measures, identified even where B and o
    # are not apart (delta method on the scaled coordinates).
    ones = [m for p in points if p.concurrency == 1 for m in p.measured.values()]
    ctx = float(np.median([m[2] + m[3] / 2 for m in ones]))
    read_ms = (base.model.weight_bytes + base.model.kv_bytes_per_token * ctx) / est["bytes_per_s"]
    read_ms *= 1e3
    grad = np.array([0.0, -read_ms, 1.0, _SCALE_P_US / 1e3, 0.0])
    step1 = read_ms + est["step_overhead_ms"] + est["per_sequence_overhead_us"] / 1e3
    step1_se = float(math.sqrt(max(0.0, grad @ cov @ grad)))
    derived = {
        "decode_step_ms_at_batch_1": {
            "estimate": step1,
            "std_error": step1_se,
            "ci95": [step1 - tq * step1_se, step1 + tq * step1_se],
            "unit": "ms",
            "context_tokens": ctx,
            "meaning": "one decode step alone at the median context of the concurrency-1 "
            "requests: weights and KV read once ((W + k c) / B) + step overhead + one "
            "sequence's overhead",
        }
    }
    replayed = _replay(base, points, est, seed)
    res, tags = _residuals(points, replayed, est["request_latency_ms"])
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
    prof = profile_at(
        base,
        est["flops_per_s"],
        est["bytes_per_s"],
        est["step_overhead_ms"],
        est["per_sequence_overhead_us"],
    )
    return Fit(
        est,
        se,
        intervals,
        [[None if idle[i] or idle[j] else float(corr[i, j]) for j in range(k)] for i in range(k)],
        math.sqrt(s2),
        n,
        poor,
        confounded,
        summaries,
        int(sol0.nfev + sol.nfev + k),
        prof,
        derived,
        downweighted,
        systematic,
        widened,
    )


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
