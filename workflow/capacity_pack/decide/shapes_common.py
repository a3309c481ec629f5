"""The common ground of the load-shape answers (:mod:`capacity_pack.decide.shapes`): the registry,
what the answers read, each point on its profile's clock, and the windows the answers share.

Requests on the profile's clock by t = (sent_offset_ns - t_p) / 1e9 s, t_p the warm-up block's
last scheduled arrival; per window [a, b) the nominal rate and its span, the offered rate, the
all-attempt attainment and nearest-rank P95s; a class is judged only with at least
:data:`MIN_CLASS_ATTEMPTS` attempts. Method: docs/metrics.md, "Load shapes".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from capacity_pack.io import canonical_json
from capacity_pack.plan.schedule import RateProfile, experiment_profile
from capacity_pack.plan.sweep import Experiment
from capacity_pack.vocab.phases import MEASURED_PHASES
from capacity_pack.vocab.slo import class_cutoffs, requests_meeting_slo

#: Fewest attempts of a class in a window for its attainment there to be judged.
MIN_CLASS_ATTEMPTS = 10
#: Windows along a stress profile and along a breakpoint's ramp.
RAMP_WINDOWS = 12
#: Windows over a soak; its family-wise significance level (Bonferroni over its four signals).
SOAK_WINDOWS = 10
SOAK_ALPHA = 0.05
#: The smallest drift over the whole soak that counts: latency in shares of the class cutoff,
#: KV usage in shares of the cache; the error rate's is the pack's error-rate gate.
SOAK_MATERIAL = {"p95_ttft_share": 0.1, "p95_tpot_share": 0.1, "kv_usage": 0.05}
#: Spike: attainment windows' width bounds (s) and the step as a share of the width.
SPIKE_WINDOW_S = (2.0, 10.0)
SPIKE_STEP = 0.25
#: The plateau of a stress profile: windows at or over this share of the peak's nominal rate.
PLATEAU_SHARE = 0.95


class ShapesInputs(BaseModel):
    """What the answers read of the manifest: the experiments, cutoffs and two gates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiments: list[Experiment]
    cutoffs: dict[str, tuple[float, float]]
    attainment_gate: float
    error_rate_max: float

    @classmethod
    def of(cls, pack: Any) -> ShapesInputs:
        return cls(
            experiments=list(pack.experiments),
            cutoffs=class_cutoffs(pack.workload),
            attainment_gate=pack.acceptance.class_slo_attainment_min,
            error_rate_max=pack.acceptance.error_rate_max,
        )

    def canonical_json(self) -> str:
        return canonical_json(self.model_dump(mode="json"))

    def experiment(self, name: str) -> Experiment:
        for e in self.experiments:
            if e.name == name:
                return e
        raise ValueError(f"no experiment named {name!r} in the pack")

    @property
    def expected_load_rps(self) -> float | None:
        """The expected load: the held rate of the pack's average-load experiment, if any."""
        for e in self.experiments:
            if e.test_type == "average-load":
                return held_rate(e)
        return None


@dataclass
class PointData:
    """One experiment point: its key (``exp-x/warm/rep0``), tables and SLO report."""

    key: str
    requests: pd.DataFrame
    metrics: pd.DataFrame
    report: dict[str, Any]


@dataclass
class Context:
    """One point on its profile's clock (see the module docstring)."""

    key: str
    experiment: Experiment
    inputs: ShapesInputs
    profile: RateProfile
    requests: pd.DataFrame  # measured: t_s, class, status, error, passing, shares, latencies
    series: pd.DataFrame  # server signals: t_s, metric, value
    report: dict[str, Any]

    @property
    def gate(self) -> float:
        return self.inputs.attainment_gate

    @property
    def classes(self) -> list[str]:
        return list(self.inputs.cutoffs)

    def signal(self, metric: str) -> pd.DataFrame:
        s = self.series[self.series["metric"] == metric]
        return s.sort_values("t_s")


@dataclass(frozen=True)
class Shape:
    test_type: str
    question: str
    answer: Callable[[Context], dict[str, Any]]
    plot: Callable[[Any, dict[str, Any], dict[str, Any]], None]


#: Every load shape by test_type.
SHAPES: dict[str, Shape] = {}


def shape(test_type: str, question: str, plot: Callable[..., None]):
    """Register the decorated function as the answer of ``test_type``, drawn by ``plot``."""

    def register(fn: Callable[[Context], dict[str, Any]]):
        SHAPES[test_type] = Shape(test_type, question, fn, plot)
        return fn

    return register


def held_rate(e: Experiment) -> float:
    """The experiment's highest held (step) rate, else its profile's peak."""
    steps = [s.rate_rps for s in e.segments if s.rate_rps is not None]
    return float(max(steps)) if steps else float(experiment_profile(e).r1.max())


def context(point: PointData, inputs: ShapesInputs) -> Context:
    name = point.key.split("/")[0].removeprefix("exp-")
    exp = inputs.experiment(name)
    req = point.requests
    warm = req.loc[req["phase"] == "warmup", "scheduled_offset_ns"]
    start_ns = int(warm.max()) if len(warm) else 0
    m = req[req["phase"].isin(MEASURED_PHASES)].reset_index(drop=True)
    cls = m["class"]
    ttft_cut = cls.map({k: v[0] for k, v in inputs.cutoffs.items()}).to_numpy(float)
    tpot_cut = cls.map({k: v[1] for k, v in inputs.cutoffs.items()}).to_numpy(float)
    ok = (m["status"] == "ok").to_numpy()
    frame = pd.DataFrame(
        {
            "t_s": (m["sent_offset_ns"].to_numpy(np.int64) - start_ns) / 1e9,
            "class": cls.to_numpy(dtype=object),
            "status": m["status"].to_numpy(dtype=object),
            "http_status": m["http_status"],
            "error": m["error"],
            "ok": ok,
            "passing": requests_meeting_slo(m, inputs.cutoffs),
            "ttft_ms": np.where(ok, m["ttft_ms"].to_numpy(float), np.nan),
            "tpot_ms": np.where(ok, m["tpot_ms"].to_numpy(float), np.nan),
            "ttft_share": np.where(ok, m["ttft_ms"].to_numpy(float) / ttft_cut, np.nan),
            "tpot_share": np.where(ok, m["tpot_ms"].to_numpy(float) / tpot_cut, np.nan),
        }
    ).sort_values("t_s", kind="stable")
    met = point.metrics
    met = met[met["source"] == "server"]
    series = pd.DataFrame(
        {
            "t_s": (met["t_offset_ns"].to_numpy(np.int64) - start_ns) / 1e9,
            "metric": met["metric"].to_numpy(dtype=object),
            "value": met["value"].to_numpy(float),
        }
    )
    return Context(point.key, exp, inputs, experiment_profile(exp), frame, series, point.report)


def rate_span(profile: RateProfile, a: float, b: float) -> tuple[float, float]:
    """[min, max] of the piecewise-linear rate over [a, b): its value at a and at each breakpoint
    inside (from the right), and its limit from the left at each breakpoint inside and at b."""
    inner = profile.times[(profile.times > a) & (profile.times < b)]
    eps = 1e-9 * max(1.0, profile.duration_s)
    right = profile.rate_at(np.concatenate([[a], inner]))
    left = profile.rate_at(np.concatenate([inner, [b]]) - eps)
    v = np.concatenate([right, left])
    return float(v.min()), float(v.max())


def nominal_rate(profile: RateProfile, a: float, b: float) -> float:
    """(Lambda(b) - Lambda(a)) / (b - a): the profile's mean rate over [a, b]."""

    def cum(t: float) -> float:
        t = min(max(t, 0.0), profile.duration_s)
        i = int(
            np.clip(np.searchsorted(profile.times, t, side="right") - 1, 0, len(profile.r0) - 1)
        )
        tau = t - profile.times[i]
        w = profile.times[i + 1] - profile.times[i]
        slope = (profile.r1[i] - profile.r0[i]) / w if w > 0 else 0.0
        return float(profile.cum[i] + profile.r0[i] * tau + slope * tau * tau / 2)

    return (cum(b) - cum(a)) / (b - a) if b > a else float(profile.rate_at(np.array([a]))[0])


def grouped_p95(frame: pd.DataFrame, keys: list[str], col: str) -> pd.Series:
    """Nearest-rank P95 of ``col`` per group (finite values), vectorized: the value at rank
    max(1, ceil(0.95 n)) of each sorted group."""
    d = frame[np.isfinite(frame[col].to_numpy(float))].sort_values([*keys, col])
    if d.empty:
        return pd.Series(dtype=float)
    g = d.groupby(keys, sort=False)[col]
    n = g.transform("size").to_numpy()
    rank = g.cumcount().to_numpy()
    k = np.maximum(np.ceil(0.95 * n - 1e-9) - 1, 0)
    return d[rank == k].set_index(keys)[col]


def window_table(ctx: Context, edges: np.ndarray) -> list[dict[str, Any]]:
    """Per window [edges[i], edges[i+1]): rates, attempts, all-attempt attainment (overall and
    per class, None under :data:`MIN_CLASS_ATTEMPTS`), P95 TTFT/TPOT per class, error rate."""
    r = ctx.requests
    w = np.searchsorted(edges, r["t_s"].to_numpy(), side="right") - 1
    r = r.assign(w=w)[(w >= 0) & (w < len(edges) - 1)]
    by = r.groupby(["w", "class"])
    counts = by.agg(attempted=("passing", "size"), passing=("passing", "sum"), ok=("ok", "sum"))
    p95 = {col: grouped_p95(r, ["w", "class"], col) for col in ("ttft_ms", "tpot_ms")}
    rows = []
    for i in range(len(edges) - 1):
        a, b = float(edges[i]), float(edges[i + 1])
        here = r[r["w"] == i]
        lo, hi = rate_span(ctx.profile, a, b)
        row: dict[str, Any] = {
            "start_s": a,
            "end_s": b,
            "nominal_rps": nominal_rate(ctx.profile, a, b),
            "rate_span_rps": [lo, hi],
            "attempted": int(len(here)),
            "offered_rps": len(here) / (b - a),
            "attainment": float(here["passing"].mean()) if len(here) else None,
            "error_rate": float(1 - here["ok"].mean()) if len(here) else None,
            "classes": {},
        }
        for c in ctx.classes:
            n = int(counts["attempted"].get((i, c), 0))
            row["classes"][c] = {
                "attempted": n,
                "attainment": (
                    float(counts["passing"][(i, c)] / n) if n >= MIN_CLASS_ATTEMPTS else None
                ),
                "p95_ttft_ms": _cell(p95["ttft_ms"], (i, c)),
                "p95_tpot_ms": _cell(p95["tpot_ms"], (i, c)),
            }
        rows.append(row)
    return rows


def _cell(s: pd.Series, key: tuple) -> float | None:
    v = s.get(key)
    return None if v is None or not np.isfinite(v) else float(v)


def under_gate(row: dict[str, Any], gate: float) -> list[str]:
    """The judged classes of a window whose all-attempt attainment is under the gate."""
    return [
        c
        for c, v in row["classes"].items()
        if v["attainment"] is not None and v["attainment"] < gate
    ]


def caveat(report: dict[str, Any]) -> str | None:
    if report.get("client_bound"):
        return (
            "the client fell behind its schedule at this point (client-bound): the shape "
            "measured the load generator as much as the target"
        )
    return None


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def fmt_rps(v: float) -> str:
    return f"{v:.3g}"
