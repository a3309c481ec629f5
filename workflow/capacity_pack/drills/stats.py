"""A drill's statistics, from its records and scrapes: what the analysis reads and computes.

:class:`DrillAnalysisSpec` and :data:`DRILL_GATES`; the requests table (a request lands when it
ended), windows and phases, the timeline, the queue, counters, alert episodes and the clock
check. Definitions: docs/failure-drills.md, "How the fields are computed".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.drills.plan import NS
from capacity_pack.drills.prometheus import AlertEvaluation, evaluate_alert_rules
from capacity_pack.evidence.gates import CLASS_ATTAINMENT, ERROR_RATE, Gate
from capacity_pack.io import canonical_json
from capacity_pack.plan.manifest import Failure, Pack, PackInfo, WorkloadClass
from capacity_pack.vocab.percentile import nearest_rank
from capacity_pack.vocab.slo import class_cutoffs, requests_meeting_slo

# The gates a drill holds its windows and its after phase to: (gate, the window column and the
# phase key of the statistic it reads there, the statistic in words). All classes are pooled (a
# window is too short for per-class samples), and a statistic with nothing to measure reads as 0:
# no successful request is attainment 0 (a failure), no judged request a failure share of 0.
DRILL_GATES: tuple[tuple[Gate, str, str, str], ...] = (
    (CLASS_ATTAINMENT, "attainment", "attainment", "attainment"),
    (ERROR_RATE, "failure_share", "error_rate", "failure share"),
)


class DrillAnalysisSpec(BaseModel):
    """What analysing a drill reads from the manifest (the analysis rule's params)."""

    model_config = ConfigDict(extra="forbid")

    workload: list[WorkloadClass]
    gates: dict[str, float] = Field(
        description="Thresholds of the gates of DRILL_GATES, by acceptance field."
    )
    window_s: float
    warmup_s: float
    pack: PackInfo
    engine_name: str = Field(description="The engine's metric-name map (queue depth).")

    @classmethod
    def of(cls, pack: Pack) -> DrillAnalysisSpec:
        from capacity_pack.drills.queries import metric_map_name

        f = pack.failure or Failure()
        return cls(
            workload=pack.workload,
            gates={g.field: g.threshold(pack.acceptance) for g, *_ in DRILL_GATES},
            window_s=f.window_s,
            warmup_s=f.warmup_s,
            pack=pack.pack,
            engine_name=metric_map_name(pack),
        )

    def threshold(self, gate: Gate) -> float:
        return self.gates[gate.field]

    def canonical_json(self) -> str:
        return canonical_json(self.model_dump(mode="json"))


def _pct(values: np.ndarray, p: float) -> float | None:
    return nearest_rank(np.sort(values), p / 100)


def drill_seconds(t_ns: Any) -> float | None:
    """Nanoseconds on the drill clock as seconds; None for a missing time (None, NaN, NA)."""
    return None if t_ns is None or pd.isna(t_ns) else float(t_ns) / NS


def request_frame(records_path: Path, spec: DrillAnalysisSpec, name: str) -> pd.DataFrame:
    """The drill's requests table (pandera-validated like a sweep point's), with SLO columns."""
    from capacity_pack.evidence.normalize import normalize
    from capacity_pack.measure.records import records_frame

    recs = records_frame(records_path)
    fixed = {c.name: c.output_tokens if isinstance(c.output_tokens, int) else None
             for c in spec.workload}  # fmt: skip
    if not len(recs) or "sent_ns" not in recs:
        return pd.DataFrame()
    req, _ = normalize(
        recs,
        point=f"drill-{name}",
        cache_state="warm",
        repeat=0,
        class_names=[c.name for c in spec.workload],
        fixed_output=fixed,
        source=str(records_path),
    )
    req["meets_slo"] = requests_meeting_slo(req, class_cutoffs(spec.workload))
    req["failed"] = req["status"].isin(["error", "timeout", "rejected"])
    # Where a request lands in time: when it ended. A request cut by the fault belongs to the
    # incident, not to the healthy window in which it happened to be sent.
    req["end_offset_ns"] = req["sent_offset_ns"] + (req["end_ns"] - req["sent_ns"])
    return req


def windows(req: pd.DataFrame, start_ns: int, end_ns: int, width_s: float) -> pd.DataFrame:
    """Per-window counts and latencies by terminal time (vectorized; the P95s nearest-rank)."""
    width = int(width_s * NS)
    edges = np.arange(start_ns, end_ns + width, width)
    r = req[(req["end_offset_ns"] >= start_ns) & (req["end_offset_ns"] < edges[-1])].copy()
    r["w"] = ((r["end_offset_ns"] - start_ns) // width).astype(int)
    ok = r[r["status"] == "ok"]
    g = r.groupby("w")
    frame = pd.DataFrame(
        {
            "attempted": g.size(),
            "ok": g["status"].apply(lambda s: int((s == "ok").sum())),
            "failed": g["failed"].sum(),
            "rejected": g["status"].apply(lambda s: int((s == "rejected").sum())),
            "cancelled": g["status"].apply(lambda s: int((s == "cancelled").sum())),
            "meets_slo": g["meets_slo"].sum(),
        }
    ).reindex(range(len(edges) - 1), fill_value=0)
    og = ok.groupby("w")

    # The pack's one percentile (a window's P95 is the statistic a point's P95 is).
    def p95(x: pd.Series) -> float:
        value = _pct(x.dropna().to_numpy(float), 95)
        return np.nan if value is None else value

    for metric in ("ttft", "tpot"):
        frame[f"{metric}_p95_ms"] = og[f"{metric}_ms"].agg(p95).astype(float)
    frame["start_s"] = edges[:-1] / NS
    judged = frame["attempted"] - frame["cancelled"]
    frame["attainment"] = np.where(frame["ok"] > 0, frame["meets_slo"] / frame["ok"].clip(lower=1),
                                   np.nan)  # fmt: skip
    frame["all_attempt_attainment"] = np.where(
        judged > 0, frame["meets_slo"] / judged.clip(lower=1), np.nan
    )
    frame["failure_share"] = np.where(judged > 0, frame["failed"] / judged.clip(lower=1), np.nan)
    return frame.reset_index(drop=True)


def phase_stats(req: pd.DataFrame, lo_ns: int, hi_ns: int, spec: DrillAnalysisSpec) -> dict:
    """TTFT/TPOT/attainment of the requests that ended in [lo, hi), per class and joint."""
    r = req[(req["end_offset_ns"] >= lo_ns) & (req["end_offset_ns"] < hi_ns)]
    out: dict[str, Any] = {
        "from_s": lo_ns / NS,
        "to_s": hi_ns / NS,
        "attempted": int(len(r)),
        "ok": int((r["status"] == "ok").sum()),
        "failed": int(r["failed"].sum()),
        "rejected": int((r["status"] == "rejected").sum()),
        "cancelled": int((r["status"] == "cancelled").sum()),
    }
    judged = out["attempted"] - out["cancelled"]
    out["error_rate"] = out["failed"] / judged if judged else None
    ok = r[r["status"] == "ok"]
    out["attainment"] = float(ok["meets_slo"].mean()) if len(ok) else None
    out["all_attempt_attainment"] = all_attempt_attainment(r)
    dur = max(1e-9, (hi_ns - lo_ns) / NS)
    out["goodput_rps"] = float(ok["meets_slo"].sum()) / dur
    classes = {}
    for c in spec.workload:
        k = ok[ok["class"] == c.name]
        classes[c.name] = {
            "attempted": int((r["class"] == c.name).sum()),
            "ok": int(len(k)),
            "ttft_p50_ms": _pct(k["ttft_ms"].to_numpy(), 50),
            "ttft_p95_ms": _pct(k["ttft_ms"].to_numpy(), 95),
            "tpot_p50_ms": _pct(k["tpot_ms"].to_numpy(), 50),
            "tpot_p95_ms": _pct(k["tpot_ms"].to_numpy(), 95),
            "attainment": float(k["meets_slo"].mean()) if len(k) else None,
            "all_attempt_attainment": all_attempt_attainment(r[r["class"] == c.name]),
        }
    out["classes"] = classes
    return out


def timeline(
    req: pd.DataFrame,
    samples: pd.DataFrame,
    scrapes: pd.DataFrame,
    spec: DrillAnalysisSpec,
    waiting_metric: str,
    start_ns: int,
    end_ns: int,
    step_s: float = 0.5,
) -> dict[str, Any]:
    """The drill over time, for its picture: per ``step_s`` bin from the end of the warm-up,
    the offered rate (requests sent / s), the completed rate (successes ended / s), errors and
    rejections ended / s; per class the attainment over all attempts of the requests that
    ended in the trailing ``window_s`` (a sliding window, so a short incident is not averaged
    away); and at every successful scrape the client's in-flight count and the engines'
    waiting queue."""
    step = int(step_s * NS)
    edges = np.arange(start_ns, end_ns + step, step)
    t = edges[:-1]
    out: dict[str, Any] = {"t_s": (t / NS).tolist(), "step_s": step_s, "window_s": spec.window_s}
    if not len(req) or len(edges) < 2:
        return out

    def per_s(times: pd.Series) -> list[float]:
        counts, _ = np.histogram(times.to_numpy(), bins=edges)
        return (counts / step_s).tolist()

    out["offered_rps"] = per_s(req["sent_offset_ns"])
    ended = req["end_offset_ns"]
    out["completed_rps"] = per_s(ended[req["status"] == "ok"])
    out["errors_per_s"] = per_s(ended[req["status"].isin(["error", "timeout"])])
    out["rejected_per_s"] = per_s(ended[req["status"] == "rejected"])
    width = int(spec.window_s * NS)
    classes = {}
    judged = req[req["status"] != "cancelled"]
    for c in spec.workload:
        k = judged[judged["class"] == c.name].sort_values("end_offset_ns")
        e = k["end_offset_ns"].to_numpy()
        met = np.concatenate([[0], np.cumsum(k["meets_slo"].to_numpy(dtype=np.int64))])
        hi = np.searchsorted(e, t + step, side="left")
        lo = np.searchsorted(e, t + step - width, side="left")
        n = hi - lo
        share = np.where(n > 0, (met[hi] - met[lo]) / np.maximum(n, 1), np.nan)
        classes[c.name] = [None if np.isnan(v) else float(v) for v in share]
    out["all_attempt_attainment"] = classes
    ok = scrapes[scrapes["ok"]] if len(scrapes) else scrapes
    out["scrape_t_s"] = (ok["t_ns"] / NS).tolist() if len(ok) else []
    out["client_in_flight"] = ok["client_in_flight"].tolist() if len(ok) else []
    wait = _series(samples, waiting_metric) if len(samples) else pd.DataFrame()
    if len(ok) and len(wait):
        merged = ok[["t_ns"]].merge(wait, on="t_ns", how="left")
        out["server_waiting"] = [None if pd.isna(v) else float(v) for v in merged["value"]]
    return out


def all_attempt_attainment(req: pd.DataFrame) -> float | None:
    """Requests meeting their SLO / requests attempted, policy cancellations left out: a failed,
    rejected, lost or timed-out request is a miss (None: nothing attempted)."""
    judged = int((req["status"] != "cancelled").sum()) if len(req) else 0
    return float(req["meets_slo"].sum()) / judged if judged else None


def clock_check(req: pd.DataFrame) -> dict[str, Any]:
    """Divergence of CLOCK_MONOTONIC from CLOCK_REALTIME over the run, on every request."""
    if not len(req):
        return {"requests": 0}
    rt0 = req["sent_realtime_ns"] - req["sent_ns"]
    drift = (rt0 - rt0.iloc[0]).abs()
    return {
        "requests": int(len(req)),
        "max_divergence_us": float(drift.max() / 1e3),
        "note": "realtime - monotonic on each request's send; router events are mapped with it",
    }


def _series(samples: pd.DataFrame, metric: str) -> pd.DataFrame:
    s = samples[samples["metric"] == metric]
    return s.groupby("t_ns", as_index=False)["value"].sum()


def queue_evidence(
    samples: pd.DataFrame, scrapes: pd.DataFrame, inject_ns: int, base_lo_ns: int,
    waiting_metric: str, incident_end_ns: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Queue peak after the injection and when it came back to its baseline."""
    sc = scrapes[scrapes["ok"]] if len(scrapes) else scrapes
    wait = (
        _series(samples, waiting_metric)
        if len(samples)
        else pd.DataFrame(columns=["t_ns", "value"])
    )
    q = sc[["t_ns", "client_in_flight"]].merge(wait, on="t_ns", how="left").fillna({"value": 0.0})
    q = q.rename(columns={"value": "server_waiting"})
    base = q[(q["t_ns"] >= base_lo_ns) & (q["t_ns"] < inject_ns)]
    inc = q[(q["t_ns"] >= inject_ns) & (q["t_ns"] <= (incident_end_ns or q["t_ns"].max()))]
    out: dict[str, Any] = {"waiting_metric": waiting_metric, "scrapes": int(len(q))}
    if not len(base) or not len(inc):
        out["note"] = "too few scrapes around the injection"
        return out
    b_wait, b_fl = float(base["server_waiting"].max()), float(base["client_in_flight"].max())
    peak_i = (inc["server_waiting"] + inc["client_in_flight"]).idxmax()
    peak = inc.loc[peak_i]
    after = q[q["t_ns"] > peak["t_ns"]]
    back = after[(after["server_waiting"] <= b_wait) & (after["client_in_flight"] <= 1.2 * b_fl)]
    out.update(
        baseline_server_waiting_max=b_wait,
        baseline_client_in_flight_max=b_fl,
        peak_t_s=drill_seconds(int(peak["t_ns"])),
        peak_server_waiting=float(inc["server_waiting"].max()),
        peak_client_in_flight=float(inc["client_in_flight"].max()),
        recovered_t_s=drill_seconds(int(back["t_ns"].iloc[0])) if len(back) else None,
    )
    return out


def counter_increase(samples: pd.DataFrame, metric: str) -> float | None:
    """Increase of a counter summed over its series across the run (resets counted)."""
    s = samples[samples["metric"] == metric]
    if not len(s):
        return None
    total = 0.0
    for _, g in s.groupby("labels"):
        v = g.sort_values("t_ns")["value"].to_numpy()
        d = np.diff(v)
        total += float(np.where(d < 0, v[1:], d).sum())
    return total


def alert_episodes(
    rules_path: Path, samples: pd.DataFrame, scrapes: pd.DataFrame
) -> AlertEvaluation:
    """The pack's alert rules over the drill's scrapes, by Prometheus' own rule engine
    (:func:`capacity_pack.drills.prometheus.evaluate_alert_rules`): episodes, or why none."""
    return evaluate_alert_rules(rules_path, samples, scrapes)
