"""Token-length distributions of a workload class: a fixed count, lognormal or empirical.

Formulas held here:

- lognormal lengths from a stated p50 and p95:  mu = ln p50,  sigma = (ln p95 - ln p50) / z_0.95
  with z_0.95 = 1.6448536; draws are rounded and clipped to [min, max], and the reported mean is
  that of the clipped distribution: E[clip(X, a, b)] = a Phi(la) + b (1 - Phi(lb))
  + e^(mu + sigma^2/2) (Phi(lb - sigma) - Phi(la - sigma)), with lx = (ln x - mu) / sigma.
- empirical lengths: resampled with replacement from the file's column; its percentiles are
  nearest ranks (:func:`capacity_pack.vocab.percentile.rank_index`).
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, PrivateAttr, model_validator

from capacity_pack.io import file_sha256
from capacity_pack.plan.limits import MAX_TOKENS
from capacity_pack.plan.section import Section
from capacity_pack.vocab.percentile import rank_index

Z_95 = NormalDist().inv_cdf(0.95)


class LengthStats(Section):
    """Summary of a token-length distribution, as reported in the frozen manifest."""

    mean: float = Field(description="Expected tokens per request (after rounding and clipping).")
    p50: int = Field(description="Median tokens (nearest rank for empirical data).")
    p95: int = Field(description="95th percentile tokens.")
    p99: int = Field(description="99th percentile tokens.")
    max: int = Field(description="Largest possible (or observed) tokens.")
    fixed: bool = Field(description="True when every request has exactly this length.")


class LognormalLength(Section):
    """Lognormal token lengths parameterised by their median and 95th percentile."""

    distribution: Literal["lognormal"] = Field(description="Distribution kind.")
    p50: float = Field(gt=0, le=MAX_TOKENS, description="Median length in tokens.")
    p95: float = Field(
        gt=0, le=MAX_TOKENS, description="95th percentile length in tokens; must exceed p50."
    )
    min: int = Field(default=1, ge=1, le=MAX_TOKENS, description="Draws below this are raised.")
    max: int = Field(
        ge=1, le=MAX_TOKENS, description="Draws above this are clipped to it (context limit)."
    )

    @model_validator(mode="after")
    def _check(self) -> LognormalLength:
        if self.p95 <= self.p50:
            raise ValueError(f"p95 ({self.p95}) must be greater than p50 ({self.p50})")
        if self.max < self.p95:
            raise ValueError(f"max ({self.max}) must be at least p95 ({self.p95})")
        if self.min > self.p50:
            raise ValueError(f"min ({self.min}) must not exceed p50 ({self.p50})")
        return self

    @property
    def mu(self) -> float:
        return math.log(self.p50)

    @property
    def sigma(self) -> float:
        return (math.log(self.p95) - math.log(self.p50)) / Z_95

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        draws = rng.lognormal(self.mu, self.sigma, size=n)
        return np.clip(np.rint(draws), self.min, self.max).astype(np.int64)

    def stats(self) -> LengthStats:
        nd = NormalDist()
        mu, s, hi, lo = self.mu, self.sigma, self.max, self.min

        def q(p: float) -> int:
            return int(min(hi, max(lo, round(math.exp(mu + s * nd.inv_cdf(p))))))

        def cdf(x: float, shift: float = 0.0) -> float:
            return nd.cdf((math.log(x) - mu - shift) / s)

        # E[clip(X, lo, hi)] = lo P(X<lo) + E[X; lo<=X<=hi] + hi P(X>hi)
        partial = math.exp(mu + s * s / 2) * (cdf(hi, s * s) - cdf(lo, s * s))
        mean = lo * cdf(lo) + partial + hi * (1 - cdf(hi))
        return LengthStats(mean=mean, p50=q(0.5), p95=q(0.95), p99=q(0.99), max=hi, fixed=False)


class EmpiricalLength(Section):
    """Token lengths resampled from a file of observed lengths (CSV or parquet column)."""

    distribution: Literal["empirical"] = Field(description="Distribution kind.")
    path: str = Field(description="CSV or parquet file, relative to the working directory.")
    column: str = Field(default="tokens", description="Column holding one length per row.")
    sha256: str | None = Field(
        default=None,
        description="sha256 of the file; filled in at freeze, verified when given.",
    )
    _values: np.ndarray | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _load(self) -> EmpiricalLength:
        path = Path(self.path)
        if not path.is_file():
            raise ValueError(f"empirical length file {self.path!r} does not exist")
        digest = file_sha256(path)
        if self.sha256 is not None and self.sha256 != digest:
            raise ValueError(
                f"empirical length file {self.path!r} has sha256 {digest}, "
                f"but the manifest pins {self.sha256}: the file changed"
            )
        self.sha256 = digest
        values = _read_column(path, self.column)
        if values.size == 0:
            raise ValueError(f"empirical length file {self.path!r} has no rows")
        if not np.all(np.isfinite(values)) or np.any(values < 1) or np.any(values % 1 != 0):
            bad = int(np.argmax(~np.isfinite(values) | (values < 1) | (values % 1 != 0)))
            raise ValueError(
                f"{self.path}: row {bad + 1} of column {self.column!r} is {values[bad]!r}; "
                "expected a positive whole number of tokens"
            )
        self._values = values.astype(np.int64)
        return self

    @property
    def values(self) -> np.ndarray:
        assert self._values is not None
        return self._values

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(self.values, size=n, replace=True)

    def stats(self) -> LengthStats:
        v = np.sort(self.values)

        def q(p: float) -> int:
            return int(v[rank_index(p, v.size)])

        return LengthStats(
            mean=float(v.mean()), p50=q(0.5), p95=q(0.95), p99=q(0.99), max=int(v[-1]), fixed=False
        )


def _read_column(path: Path, column: str) -> np.ndarray:
    import pandas as pd

    if path.suffix in {".parquet", ".pq"}:
        frame = pd.read_parquet(path, columns=[column])
    else:
        frame = pd.read_csv(path)
        if column not in frame.columns:
            raise ValueError(f"{path}: no column {column!r} (columns: {list(frame.columns)})")
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)


LengthSpec = Annotated[
    int | LognormalLength | EmpiricalLength,
    Field(description="A fixed token count, or a lognormal/empirical distribution."),
]


def length_stats(spec: int | LognormalLength | EmpiricalLength) -> LengthStats:
    if isinstance(spec, int):
        return LengthStats(mean=float(spec), p50=spec, p95=spec, p99=spec, max=spec, fixed=True)
    return spec.stats()


def sample_lengths(
    spec: int | LognormalLength | EmpiricalLength, rng: np.random.Generator, n: int
) -> np.ndarray:
    if isinstance(spec, int):
        return np.full(n, spec, dtype=np.int64)
    return spec.sample(rng, n)
