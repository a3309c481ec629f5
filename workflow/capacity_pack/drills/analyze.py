"""Failure drills, analysed: the failure-test fields of one drill from its records and series.

Everything is computed from the drill's own files (see :mod:`capacity_pack.drills.run`), on
the load generator's clock (seconds from its t0); router events are mapped onto it through the
run's (t0, t0_realtime) anchor, and :func:`clock_check` reports the divergence of
CLOCK_MONOTONIC from CLOCK_REALTIME over the run, measured on every request's
(sent, sent_realtime) pair.

What a drill measures:

- Injection time: the router's event for the fault (``killed`` for ``replica_kill``, ``added``
  for ``cold_replica``), else the injector's action, else the planned time.
- SLO attainment: requests are binned by when they ended (``window_s`` wide windows, from the
  end of the warm-up), so a request cut by the fault counts in the incident, not in the healthy
  window it was sent in. A request meets its SLO when it succeeded with TTFT <= its class's
  ``request_ttft_cutoff_ms`` and TPOT <= ``request_tpot_cutoff_ms`` (the one predicate,
  :func:`capacity_pack.vocab.slo.requests_meeting_slo`); a window's attainment is
  meets / successful requests (``attainment``, among successful requests), its
  ``all_attempt_attainment`` meets / (attempted - cancelled) (over all attempts: a failed,
  rejected, lost or timed-out request is a miss), its failure share (errors + timeouts +
  rejections) / (attempted - cancelled): policy cancellations are neither successes nor
  failures.
- Phases: before = [warm-up end, injection), during = [injection, recovery), after =
  [recovery, last request's end]; per phase and per class: counts, error rate, both attainments,
  goodput (requests meeting their SLO per second of the phase) and nearest-rank p50/p95 of TTFT
  and TPOT.
- Fault cleared: for ``replica_kill``/``cold_replica`` the router's ``ready`` event after the
  injection (the replica back in rotation), else when the drill lifted the fault.
- Recovery time = max(fault cleared, injection, start of the first window, from one window
  before the injection on, from which every later window passes :data:`DRILL_GATES`: attainment
  >= ``class_slo_attainment_min`` and failure share <= ``error_rate_max``, all classes pooled);
  none if either never happened during the run.
- Queue recovery: the first scrape after the incident's peak (engines' waiting queue + client's
  in-flight count) at which the engines' waiting queue is back at or under its baseline maximum
  and the client's in-flight count at or under 1.2 x its baseline maximum (baseline = scrapes
  in [warm-up end, injection)).
- Counters (router retries, admission rejections): increase summed over series, a counter
  reset counting the new value as the increase (as PromQL's ``increase`` does).
- Alert timing: the pack's alert rules are evaluated by :mod:`capacity_pack.drills.promql` at
  every successful scrape time over the scraped series; each episode has its pending, firing
  and resolved times. Detection time = the first firing at or after the injection of an alert
  naming the drill's mechanism, else of any alert. Mechanisms other than the drill's own, its
  allowed consequences and the generic symptoms are reported as unexpected.
- Capacity returned without manual repair: the ``after`` phase passes both gates and recovery
  was reached, with no action beyond lifting the injected fault.
- Timeline (:func:`timeline`): the series of the drill's picture.
- The plan drill's N+1 verdict: :func:`n_plus_one`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.drills.plan import CONSEQUENCES, MECHANISM, NS, SYMPTOMS, DrillPlan
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


def _s(t_ns: Any) -> float | None:
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
        peak_t_s=_s(int(peak["t_ns"])),
        peak_server_waiting=float(inc["server_waiting"].max()),
        peak_client_in_flight=float(inc["client_in_flight"].max()),
        recovered_t_s=_s(int(back["t_ns"].iloc[0])) if len(back) else None,
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


def alert_episodes(rules_path: Path, samples: pd.DataFrame, scrapes: pd.DataFrame) -> pd.DataFrame:
    """The pack's alert rules evaluated at every scrape (capacity_pack.drills.promql)."""
    from capacity_pack.drills import promql

    rules = promql.load_rules(rules_path)
    ok = scrapes[scrapes["ok"]] if len(scrapes) else scrapes
    if not len(ok):
        return pd.DataFrame(columns=["alert", "labels", "pending_t_ns", "firing_t_ns",
                                     "resolved_t_ns", "max_value", "mechanism"])  # fmt: skip
    store = promql.SeriesStore.from_frame(samples, ok["t_ns"].to_numpy(dtype=np.int64))
    ep = promql.evaluate_alerts(rules, store, ok["t_ns"].to_numpy(dtype=np.int64))
    mech = {r.alert: r.labels.get("mechanism") for r in rules}
    ep["mechanism"] = ep["alert"].map(mech)
    return ep


def analyze_drill(
    drill_dir: str | Path, rules_path: str | Path, spec: DrillAnalysisSpec
) -> dict[str, Any]:
    """The failure-test fields of one drill, all from its records, scrapes and events."""
    d = Path(drill_dir)
    facts = json.loads((d / "drill.json").read_text())
    plan = DrillPlan.model_validate(facts["plan"])
    name, kind = plan.drill.name, plan.drill.kind
    report: dict[str, Any] = {
        "drill": name,
        "kind": kind,
        "mechanism": MECHANISM[kind],
        "plan": facts["plan"],
    }
    if facts.get("skipped"):
        report["skipped"] = facts["skipped"]
        return report
    from capacity_pack.drills.queries import engine_metrics

    req = request_frame(d / "records.jsonl", spec, name)
    samples = pd.read_parquet(d / "samples.parquet")
    scrapes = pd.read_parquet(d / "scrapes.parquet")
    events = _router_events(d / "events.json", int(facts["t0_realtime_ns"]))
    start = int(facts["profile_start_s"] * NS)
    inject_planned = start + int(plan.inject_at_s * NS)
    actions = facts.get("actions") or []
    inject_act = next((a for a in actions if a["action"] == "inject"), None)
    restore_act = next((a for a in actions if a["action"] == "restore"), None)
    injection = _injection_time(kind, plan, events, inject_act, inject_planned)
    completeness = _completeness(d, req)
    last_due = int(req["end_offset_ns"].max()) if len(req) else start
    base_lo = start + int(spec.warmup_s * NS)
    wins = windows(req, base_lo, last_due + 1, spec.window_s)
    # round, not int: t_s came from integer ns, and a truncated ns would move a request that
    # ended at the injection into the healthy window before it.
    inj_ns = round(injection["t_s"] * NS)
    cleared_ns, cleared_how = _fault_cleared(kind, plan, events, restore_act, inj_ns, start)
    recovered_ns, recovery_how = _recovery(wins, inj_ns, cleared_ns, spec, start_s=base_lo)
    waiting = engine_metrics(spec.engine_name).waiting or "vllm:num_requests_waiting"
    queue = queue_evidence(samples, scrapes, inj_ns, base_lo, waiting, recovered_ns)
    # Alerts over the same scrapes, on the same clock.
    fired = _alerts_fired(alert_episodes(Path(rules_path), samples, scrapes))
    firing = [a for a in fired if a["firing_t_s"] is not None]
    detection, own, others = _detection(firing, kind, injection["t_s"])
    router_removal = _router_removal(events, plan, injection["t_s"])
    fails_after = _failures_after(req, inj_ns)
    end_off = fails_after["sent_offset_ns"] + (fails_after["end_ns"] - fails_after["sent_ns"])
    end_ns = last_due + 1
    lost = fails_after[fails_after["status"].isin(["error", "timeout"])]
    report.update(
        clock=facts["clock"] + "; router events mapped from CLOCK_REALTIME via t0_realtime_ns",
        clock_check=clock_check(req),
        schedule_completeness=completeness,
        terminal_statuses=req["status"].value_counts().to_dict() if len(req) else {},
        rate_rps=plan.rate_rps,
        rate_after_rps=plan.rate_after_rps,
        replicas=plan.replicas,
        admission_max_outstanding=plan.admission_max_outstanding,
        injection_time_s=injection["t_s"],
        injection_source=injection["source"],
        detection_time_s=detection,
        detection_source="first firing of the alert naming the mechanism (else of any alert)",
        router_removal_time_s=router_removal,
        router_events=[e for e in events if e["t_s"] >= -1.0],
        fault_cleared_time_s=_s(cleared_ns),
        fault_cleared_by=cleared_how,
        first_error_time_s=float(end_off.min() / NS) if len(end_off) else None,
        last_error_time_s=float(end_off.max() / NS) if len(end_off) else None,
        recovery_time_s=_s(recovered_ns),
        recovery_rule=recovery_how,
        phases={
            "before": phase_stats(req, base_lo, inj_ns, spec),
            "during": phase_stats(req, inj_ns, recovered_ns or end_ns, spec),
            "after": phase_stats(req, recovered_ns, end_ns, spec) if recovered_ns else None,
        },
        queue=queue,
        requests_retried=counter_increase(samples, "router:retries_total"),
        retried_source="router:retries_total increase (the client does not retry: "
        "automatic_retries is false)",
        requests_rejected=int((fails_after["status"] == "rejected").sum()),
        requests_lost=int(len(lost)),
        requests_cancelled=int((req["status"] == "cancelled").sum()) if len(req) else 0,
        admission_rejected=counter_increase(samples, "router:admission_rejected_total"),
        alerts=fired,
        alerts_fired=sorted({a["alert"] for a in firing}),
        expected_alert_fired=bool(own),
        unexpected_mechanisms_fired=others,
        windows=wins.replace({np.nan: None}).to_dict("records"),
    )
    report["capacity_returned_without_manual_repair"] = _capacity_returned(
        report, kind, events, plan, spec
    )
    report["timeline"] = timeline(req, samples, scrapes, spec, waiting, base_lo, end_ns)
    report["scope"] = plan.scope
    report["execution"] = facts.get("execution", "live")
    report["execution_reason"] = plan.execution_reason
    if plan.scope == "plan":
        report["n_plus_one"] = n_plus_one(
            req, report, plan, spec, inj_ns, cleared_ns, end_ns, base_lo
        )
    return report


def n_plus_one(
    req: pd.DataFrame,
    report: dict[str, Any],
    plan: DrillPlan,
    spec: DrillAnalysisSpec,
    inj_ns: int,
    cleared_ns: int | None,
    end_ns: int,
    base_lo_ns: int,
) -> dict[str, Any]:
    """The plan drill's verdict: does the recommended fleet, one replica down, carry its peak?

    PASS when all four hold:

    0. the plan holds before the failure: among the requests that ended between the end of the
       warm-up and the injection, the same per-class and failure-share gates as in 1 (a plan
       that misses its SLO with every replica up has nothing to lose a replica from: its linear
       scaling does not hold on this target);
    1. the survivors carry the peak: among the requests *sent* while the fleet is one replica
       short (from the injection until the killed replica is back in rotation, else the end of
       the run), every class's attainment over all attempts (failures count as misses) is at
       least ``class_slo_attainment_min``, and the pooled failure share is at most
       ``error_rate_max``;
    2. the blast radius is the failed replica's: every request lost (error or timeout after the
       injection) was sent before the router took the replica out of rotation, i.e. was in
       flight on it (a request sent after its removal and lost would be the router's failure);
    3. the fleet recovered: the replica came back and every window from then on passed the
       drill gates (``recovery_time_s``) before the run ended.

    Point estimates over one drill (no confidence bound): a few hundred requests per class at
    a rehearsal pack's peak; the counts are reported with every share.

    UNDECIDED (instead of PASS) when nothing failed but 0 or 1 has nothing to judge: a class
    with no request in its window, or a window with no request at all (a low peak over a short
    baseline, e.g. 0.5 RPS for 3 s). An empty window is no evidence either way; FAIL is kept
    for a check that failed on requests it saw. Each check is ``True``, ``False`` or ``None``
    (nothing to judge).
    """
    lo, hi = inj_ns, cleared_ns if cleared_ns is not None else end_ns
    att_min, err_max = spec.threshold(CLASS_ATTAINMENT), spec.threshold(ERROR_RATE)
    # Before the failure, by end time: a request sent before the kill but cut by it is the
    # blast radius (check 2), not the healthy fleet's.
    base = _sent_window(req, base_lo_ns, inj_ns, spec, att_min, err_max, by="end_offset_ns")
    one_short = _sent_window(req, lo, hi, spec, att_min, err_max)
    classes, share = one_short["classes"], one_short["failure_share"]
    error_holds = one_short["failure_share_holds"]
    removal = report.get("router_removal_time_s")
    lost = req[req["status"].isin(["error", "timeout"]) & (req["end_offset_ns"] >= inj_ns)]
    after_removal = (
        int((lost["sent_offset_ns"] >= int(removal * NS)).sum()) if removal is not None else None
    )
    blast_holds = after_removal == 0
    rec = report.get("recovery_time_s")
    inj_s = inj_ns / NS
    base_check, base_empty = _judged(base)
    short_check, short_empty = _judged(one_short)
    checks = {
        "plan_holds_before_the_failure": base_check,
        "survivors_carry_the_peak": short_check,
        "blast_radius_is_the_failed_replica": blast_holds,
        "recovered": rec is not None,
    }
    why = []
    if base_check is False:
        why.append(
            "before the failure the planned fleet already missed its gates ("
            + ", ".join(
                f"{name} {_fmt_share(c['all_attempt_attainment'])} of {c['attempted']}"
                for name, c in base["classes"].items()
            )
            + f"; failure share {_fmt_share(base['failure_share'])}): the plan's linear "
            "scaling does not hold here"
        )
    if base_empty:
        why.append(
            f"before the failure no {' or '.join(base_empty)} request ended "
            f"({base['from_s']:.1f}-{base['to_s']:.1f} s), nothing to judge the healthy fleet by"
        )
    for name, c in classes.items():
        if c["attempted"] and not c["holds"]:
            why.append(
                f"class {name}: {_fmt_share(c['all_attempt_attainment'])} of "
                f"{c['attempted']} attempts met the SLO (gate {att_min:g})"
            )
    if short_empty:
        why.append(
            f"no {' or '.join(short_empty)} request sent while one replica short, nothing to "
            "judge the survivors by"
        )
    if share is not None and not error_holds:
        why.append(
            f"failure share {_fmt_share(share)} of {one_short['requests_sent']} (gate {err_max:g})"
        )
    if not blast_holds:
        why.append(
            "the router's removal time is unknown"
            if after_removal is None
            else f"{after_removal} request(s) sent after the router removed the replica were lost"
        )
    if rec is None:
        why.append("the fleet did not recover before the run ended")
    if any(v is False for v in checks.values()):
        verdict = "FAIL"
    elif any(v is None for v in checks.values()):
        verdict = "UNDECIDED"
    else:
        verdict = "PASS"
    planned = plan.planned or {}
    n = plan.replicas
    sentence = (
        f"Losing 1 of {n} replica{'s' if n != 1 else ''} at the {plan.rate_rps:g} RPS peak: "
        f"{verdict}"
        + (
            f", recovered in {rec - inj_s:.1f} s"
            if rec is not None
            else ", not recovered during the run"
        )
        + f", {report['requests_rejected']} requests rejected, {report['requests_lost']} lost"
    )
    predicted = plan.twin is not None and report["execution"] == "virtual"
    if predicted:
        # A real target's plan, too large to run live: the calibrated twin's prediction.
        sentence += f"; {plan.twin['label']}"
    return {
        "verdict": verdict,
        "sentence": sentence,
        "checks": checks,
        "why_fail": why,
        "window": {
            "from_s": lo / NS,
            "to_s": hi / NS,
            "to": "the killed replica back in rotation"
            if cleared_ns is not None
            else "the end of the run (the replica never came back)",
            "requests_sent": one_short["requests_sent"],
        },
        "classes": classes,
        "failure_share": share,
        "failed": one_short["failed"],
        "before_the_failure": base,
        "gates": {"class_slo_attainment_min": att_min, "error_rate_max": err_max},
        "requests_lost": report["requests_lost"],
        "lost_sent_after_removal": after_removal,
        "requests_rejected": report["requests_rejected"],
        "recovery_after_injection_s": rec - inj_s if rec is not None else None,
        "replicas": n,
        "peak_rps": plan.rate_rps,
        "planned": planned,
        "execution": report["execution"],
        # A real target's virtual plan drill: the calibrated twin's label (None: measured, or
        # a simulated target's exact engine model).
        "prediction": plan.twin["label"] if predicted else None,
    }


def _sent_window(
    req: pd.DataFrame,
    lo_ns: int,
    hi_ns: int,
    spec: DrillAnalysisSpec,
    att_min: float,
    err_max: float,
    by: str = "sent_offset_ns",
) -> dict[str, Any]:
    """The requests sent (``by``: or ended) in [lo, hi): per class attainment over all
    attempts against the attainment gate, pooled failure share against the error gate."""
    sent = req[(req[by] >= lo_ns) & (req[by] < hi_ns)]
    classes: dict[str, Any] = {}
    for c in spec.workload:
        k = sent[sent["class"] == c.name]
        att = all_attempt_attainment(k) if len(k) else None
        classes[c.name] = {
            "attempted": int(len(k)),
            "met_slo": int(k["meets_slo"].sum()),
            "failed": int(k["failed"].sum()),
            "all_attempt_attainment": att,
            "holds": bool(att is not None and CLASS_ATTAINMENT.holds(att, att_min)),
        }
    judged = sent[sent["status"] != "cancelled"]
    failed = int(judged["failed"].sum())
    share = failed / len(judged) if len(judged) else None
    share_holds = bool(share is not None and ERROR_RATE.holds(share, err_max))
    return {
        "from_s": lo_ns / NS,
        "to_s": hi_ns / NS,
        "requests_sent": int(len(sent)),
        "window_by": "send time" if by == "sent_offset_ns" else "end time",
        "classes": classes,
        "failed": failed,
        "failure_share": share,
        "failure_share_holds": share_holds,
        "holds": share_holds and all(c["holds"] for c in classes.values()),
    }


def _judged(window: dict[str, Any]) -> tuple[bool | None, list[str]]:
    """A window's check (False: a class or the failure share failed on requests it saw; None:
    none failed but some class had no request, so there is nothing to judge it by) and the
    classes with no request."""
    empty = [name for name, c in window["classes"].items() if not c["attempted"]]
    failed = any(c["attempted"] and not c["holds"] for c in window["classes"].values()) or (
        window["failure_share"] is not None and not window["failure_share_holds"]
    )
    if failed:
        return False, empty
    return (None if empty else True), empty


def _fmt_share(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _router_events(path: Path, t0_realtime_ns: int) -> list[dict[str, Any]]:
    """The router's events, each with ``t_s`` on the drill clock (mapped from CLOCK_REALTIME)."""
    events = json.loads(path.read_text()).get("events") or []
    for e in events:
        e["t_s"] = (int(e["unix_ns"]) - t0_realtime_ns) / NS
    return events


def _completeness(d: Path, req: pd.DataFrame) -> dict[str, Any]:
    """The schedule must be complete: every scheduled request recorded exactly once, terminal."""
    sched = pd.read_parquet(d / "schedule.parquet")
    from capacity_pack.evidence.normalize import reconcile

    rec_ids = req[["request_id"]] if len(req) else pd.DataFrame(columns=["request_id"])
    return reconcile(rec_ids, sched, f"{d}/records.jsonl")


def _alerts_fired(ep: pd.DataFrame) -> list[dict[str, Any]]:
    """Alert episodes with their times in seconds on the drill clock."""
    fired = []
    for row in ep.itertuples():
        first = row.firing_t_ns
        fired.append(
            {
                "alert": row.alert,
                "mechanism": row.mechanism,
                "labels": row.labels,
                "pending_t_s": _s(row.pending_t_ns),
                "firing_t_s": None if pd.isna(first) else _s(first),
                "resolved_t_s": None if pd.isna(row.resolved_t_ns) else _s(row.resolved_t_ns),
                "max_value": float(row.max_value),
            }
        )
    return fired


def _detection(
    firing: list[dict[str, Any]], kind: str, inj_s: float
) -> tuple[float | None, list[dict[str, Any]], list[str]]:
    """(detection time, the drill's own alerts fired after the injection, unexpected mechanisms).

    Detection is the first firing at or after the injection of the alert naming the drill's
    mechanism, else of any alert; unexpected mechanisms are those fired that are neither the
    drill's own, its allowed consequences nor generic symptoms.
    """
    after_inj = [a for a in firing if a["firing_t_s"] >= inj_s]
    own = [a for a in after_inj if a["mechanism"] == MECHANISM[kind]]
    detection = min((a["firing_t_s"] for a in own), default=None)
    if detection is None:
        detection = min((a["firing_t_s"] for a in after_inj), default=None)
    mech_fired = {a["mechanism"] for a in firing}
    others = sorted(mech_fired - {MECHANISM[kind]} - CONSEQUENCES[kind] - SYMPTOMS)
    return detection, own, others


def _router_removal(events: list[dict[str, Any]], plan: DrillPlan, inj_s: float) -> float | None:
    """When the router took the killed replica out of rotation (``replica_kill`` only)."""
    removed = [
        e for e in events
        if e["event"] == "removed" and e.get("replica") == plan.drill.replica
        and e["t_s"] >= inj_s - 1e-3
    ]  # fmt: skip
    return removed[0]["t_s"] if removed and plan.drill.kind == "replica_kill" else None


def _failures_after(req: pd.DataFrame, inj_ns: int) -> pd.DataFrame:
    """Failed requests (errors, timeouts, rejections) that ended at or after the injection."""
    fails = req[req["failed"]] if len(req) else req
    return fails[fails["end_ns"] - fails["sent_ns"] + fails["sent_offset_ns"] >= inj_ns]


def _injection_time(kind, plan, events, act, planned_ns) -> dict[str, Any]:
    if kind == "replica_kill":
        ev = [
            e for e in events if e["event"] == "killed" and e.get("replica") == plan.drill.replica
        ]
        if ev:
            return {"t_s": ev[0]["t_s"], "source": "router event 'killed' (SIGKILL sent)"}
    if kind == "cold_replica":
        ev = [e for e in events if e["event"] == "added"]
        if ev:
            return {"t_s": ev[0]["t_s"], "source": "router event 'added' (replica spawned)"}
    if act is not None:
        return {
            "t_s": act["t_s"],
            "source": "injector action started "
            f"({act.get('request') or act.get('command') or 'client side'})",
        }
    return {"t_s": planned_ns / NS, "source": "planned injection time (no action recorded)"}


def _fault_cleared(kind, plan, events, restore_act, inj_ns, start_ns) -> tuple[int | None, str]:
    if kind in ("replica_kill", "cold_replica"):
        want = plan.drill.replica if kind == "replica_kill" else None
        ready = [
            e for e in events
            if e["event"] == "ready" and e["t_s"] * NS > inj_ns
            and (want is None or e.get("replica") == want)
        ]  # fmt: skip
        if ready:
            what = "restarted replica" if kind == "replica_kill" else "added replica"
            return int(ready[0]["t_s"] * NS), f"router event 'ready': the {what} is in rotation"
        if kind == "replica_kill" and plan.drill.commands is not None and not events:
            return None, "unknown: a real target exposes no router events"
        return None, "never: the replica did not come back into rotation during the run"
    if restore_act is not None:
        return int(restore_act["done_t_s"] * NS), "the drill lifted the fault"
    return None, "never: the fault was not lifted"


def _recovery(wins: pd.DataFrame, inj_ns: int, cleared_ns, spec, start_s: int):
    width = int(spec.window_s * NS)
    after = wins[(wins["start_s"] * NS) >= inj_ns - width]
    ok = pd.Series(True, index=after.index)
    for gate, column, _, _ in DRILL_GATES:
        ok &= gate.holds(after[column].fillna(0), spec.threshold(gate))
    # The first window from which every later one passes.
    tail_ok = ok[::-1].cummin()[::-1]
    first = after.loc[tail_ok[tail_ok].index, "start_s"]
    rule = (
        "later of: fault cleared, and the start of the first window from which every window has "
        + " and ".join(f"{words} {g.op} {spec.threshold(g)}" for g, _, _, words in DRILL_GATES)
    )
    if not len(first) or cleared_ns is None:
        return None, rule + " (not reached during the run)"
    return max(int(first.iloc[0] * NS), int(cleared_ns), inj_ns), rule


def _capacity_returned(report, kind, events, plan, spec) -> dict[str, Any]:
    """Did the service get back to passing its gates with nobody repairing anything?"""
    after = (report["phases"] or {}).get("after")
    evidence = []
    passing = bool(
        after and all(g.holds(after[key] or 0.0, spec.threshold(g)) for g, _, key, _ in DRILL_GATES)
    )
    if kind == "replica_kill":
        restarted = [e for e in events if e["event"] == "restarted"]
        evidence.append(
            f"supervisor restarts: {len(restarted)}; the replica was back in rotation at "
            f"{report['fault_cleared_time_s']} s (router event)"
        )
    elif report["fault_cleared_by"]:
        evidence.append(f"fault cleared: {report['fault_cleared_by']}")
    if after:
        evidence.append(
            f"after recovery ({after['from_s']:.1f}-{after['to_s']:.1f} s): attainment "
            f"{after['attainment']}, error rate {after['error_rate']}"
        )
    else:
        evidence.append("no recovered window during the run")
    return {
        "value": bool(passing and report["recovery_time_s"] is not None),
        # The drill only lifts the fault it injected; nothing touches data or replicas by hand.
        "manual_actions": 0,
        "evidence": evidence,
    }
