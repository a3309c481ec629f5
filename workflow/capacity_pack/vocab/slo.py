"""The SLO predicate: when a request meets its class's SLO.

**Formula.** A request meets its class SLO when its status is ``ok`` and, jointly,
TTFT <= the class's ``request_ttft_cutoff_ms`` and TPOT <= its ``request_tpot_cutoff_ms``
(:mod:`.latency`'s TTFT from the send and TPOT = (E2E - TTFT) / (O - 1)). A latency that is not
a number meets no cutoff. The manifest sets no E2E limit, so E2E is not part of it. From it:
attainment_c = requests of class c meeting it / successful requests of c, and goodput = requests
meeting it / T: the rate of requests that meet their SLO, as DistServe defines goodput (Zhong
et al., OSDI 2024).

:func:`cutoff_checks` is the predicate over arrays, :func:`meets_slo` with the status,
:func:`requests_meeting_slo` over a requests table, :func:`class_cutoffs` the {class: (TTFT
cutoff, TPOT cutoff)} map they read, from a pack's workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import pandas as pd  # annotations only: the analyzer's import path stays free of pandas


class CutoffChecks(NamedTuple):
    """Per request: TTFT within its cutoff, TPOT within its cutoff; ``met`` is both."""

    ttft: np.ndarray
    tpot: np.ndarray

    @property
    def met(self) -> np.ndarray:
        return self.ttft & self.tpot


def cutoff_checks(
    ttft_ms: Any, tpot_ms: Any, ttft_cutoff_ms: Any, tpot_cutoff_ms: Any
) -> CutoffChecks:
    """TTFT <= its cutoff and TPOT <= its cutoff, elementwise (scalars or arrays of cutoffs).

    NaN (a missing latency or a missing cutoff) is within no cutoff."""
    with np.errstate(invalid="ignore"):
        return CutoffChecks(
            np.asarray(ttft_ms, dtype=float) <= np.asarray(ttft_cutoff_ms, dtype=float),
            np.asarray(tpot_ms, dtype=float) <= np.asarray(tpot_cutoff_ms, dtype=float),
        )


def within_cutoffs(ttft_ms: float, tpot_ms: float, cutoffs: tuple[float, float]) -> bool:
    """:func:`cutoff_checks`' ``met`` for one request's numbers, in plain Python (the in-run look
    judges every finished request on the load generator's event loop). NaN is within none."""
    return ttft_ms <= cutoffs[0] and tpot_ms <= cutoffs[1]


def meets_slo(
    ttft_ms: Any,
    tpot_ms: Any,
    ttft_cutoff_ms: Any,
    tpot_cutoff_ms: Any,
    ok: Any = None,
) -> np.ndarray:
    """The SLO predicate over arrays: ``ok`` (None: every row succeeded) and both cutoffs met."""
    met = cutoff_checks(ttft_ms, tpot_ms, ttft_cutoff_ms, tpot_cutoff_ms).met
    return met if ok is None else met & np.asarray(ok, dtype=bool)


def class_cutoffs(source: Any) -> dict[str, tuple[float, float]]:
    """{class: (TTFT cutoff ms, TPOT cutoff ms)} from a pack, its workload classes, or a mapping
    of class to a (ttft, tpot) pair or to {"ttft_ms"|"request_ttft_cutoff_ms": .., ...}."""
    workload = getattr(source, "workload", source)
    if not isinstance(workload, Mapping):
        return {
            c.name: (float(c.request_ttft_cutoff_ms), float(c.request_tpot_cutoff_ms))
            for c in workload
        }
    out = {}
    for name, v in workload.items():
        if isinstance(v, Mapping):
            ttft = v.get("ttft_ms", v.get("request_ttft_cutoff_ms"))
            tpot = v.get("tpot_ms", v.get("request_tpot_cutoff_ms"))
        else:
            ttft, tpot = v
        out[str(name)] = (float(ttft), float(tpot))
    return out


def requests_meeting_slo(
    requests: pd.DataFrame, cutoffs: Mapping[str, tuple[float, float]]
) -> np.ndarray:
    """The SLO predicate over a requests table (columns class, status, ttft_ms, tpot_ms);
    ``cutoffs``: {class: (TTFT cutoff ms, TPOT cutoff ms)}. A class without cutoffs meets none."""
    cls = requests["class"]
    return meets_slo(
        requests["ttft_ms"].to_numpy(float),
        requests["tpot_ms"].to_numpy(float),
        cls.map({k: v[0] for k, v in cutoffs.items()}).to_numpy(float),
        cls.map({k: v[1] for k, v in cutoffs.items()}).to_numpy(float),
        ok=(requests["status"] == "ok").to_numpy(),
    )
