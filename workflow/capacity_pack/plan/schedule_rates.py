"""Rate profiles: the piecewise-linear offered rate of a load-shape experiment.

An experiment's rate (:func:`experiment_profile`) is its segments (steps and ramps) plus its
optional spike on top. Its integral Lambda(t) and the inverse give arrival times: a schedule
draws arrivals in *operational time* (unit rate) and maps each to real time t = Lambda^-1(u)
(:mod:`capacity_pack.plan.schedule`).
"""

from __future__ import annotations

import numpy as np

from capacity_pack.plan.sweep import Experiment


class RateProfile:
    """A piecewise-linear rate r(t) on [0, T] with its integral Lambda and inverse."""

    def __init__(self, times: np.ndarray, rates_start: np.ndarray, rates_end: np.ndarray):
        # Interval i spans [times[i], times[i+1]], rate linear from rates_start[i] to rates_end[i].
        self.times = times
        self.r0 = rates_start
        self.r1 = rates_end
        widths = np.diff(times)
        self.cum = np.concatenate([[0.0], np.cumsum((rates_start + rates_end) / 2 * widths)])

    @property
    def duration_s(self) -> float:
        return float(self.times[-1])

    @property
    def total(self) -> float:
        return float(self.cum[-1])

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        i = np.clip(np.searchsorted(self.times, t, side="right") - 1, 0, len(self.r0) - 1)
        w = self.times[i + 1] - self.times[i]
        frac = np.where(w > 0, (t - self.times[i]) / np.where(w > 0, w, 1), 0)
        return self.r0[i] + (self.r1[i] - self.r0[i]) * frac

    def inverse(self, u: np.ndarray) -> np.ndarray:
        """t with Lambda(t) = u (u clipped to [0, Lambda(T)])."""
        u = np.clip(np.asarray(u, dtype=float), 0, self.total)
        i = np.clip(np.searchsorted(self.cum, u, side="right") - 1, 0, len(self.r0) - 1)
        w = self.times[i + 1] - self.times[i]
        slope = np.where(w > 0, (self.r1[i] - self.r0[i]) / np.where(w > 0, w, 1), 0)
        d = u - self.cum[i]
        r0 = self.r0[i]
        with np.errstate(divide="ignore", invalid="ignore"):
            # Solve slope/2 tau^2 + r0 tau = d for tau >= 0 (linear when the slope is ~0).
            quad = (-r0 + np.sqrt(np.maximum(r0 * r0 + 2 * slope * d, 0))) / slope
            lin = np.where(r0 > 0, d / r0, 0)
        tau = np.where(np.abs(slope) > 1e-12, quad, lin)
        return self.times[i] + np.clip(np.nan_to_num(tau), 0, w)


def experiment_profile(exp: Experiment) -> RateProfile:
    """The experiment's rate profile: segments, plus its spike added on top."""
    bounds = [0.0]
    for seg in exp.segments:
        bounds.append(bounds[-1] + seg.duration_s)
    cuts = set(bounds)
    if exp.spike is not None:
        cuts.update({exp.spike.at_s, min(bounds[-1], exp.spike.at_s + exp.spike.duration_s)})
    times = np.array(sorted(cuts))

    def base(t: float, *, left: bool) -> float:
        # Rate of the segment containing t; `left` takes the limit from the left at a boundary.
        for k, seg in enumerate(exp.segments):
            a, b = bounds[k], bounds[k + 1]
            if (a < t <= b) if left else (a <= t < b):
                if seg.rate_rps is not None:
                    return seg.rate_rps
                frac = (t - a) / (b - a)
                return seg.from_rps + (seg.to_rps - seg.from_rps) * frac  # type: ignore[operator]
        return 0.0

    def spike(t: float, *, left: bool) -> float:
        s = exp.spike
        if s is None:
            return 0.0
        lo, hi = s.at_s, s.at_s + s.duration_s
        inside = (lo < t <= hi) if left else (lo <= t < hi)
        return s.rate_rps if inside else 0.0

    r0 = np.array([base(t, left=False) + spike(t, left=False) for t in times[:-1]])
    r1 = np.array([base(t, left=True) + spike(t, left=True) for t in times[1:]])
    return RateProfile(times, r0, r1)


def warmup_rate(profile: RateProfile) -> float:
    """Warm-up runs at the profile's starting rate, or its mean rate when it starts from zero."""
    start = float(profile.rate_at(np.array([0.0]))[0])
    return start if start > 0 else profile.total / profile.duration_s


def constant_profile(rate: float, duration_s: float) -> RateProfile:
    return RateProfile(np.array([0.0, duration_s]), np.array([rate]), np.array([rate]))
