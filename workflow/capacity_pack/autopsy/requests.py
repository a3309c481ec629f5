"""Request autopsy: why each request that missed its SLO missed it.

A miss is an ``ok`` measured request outside its class SLO; its cause comes from the server's
ground truth (``ground_truth``: TTFT = transport_in + queueing + prefill + emit +
transport_out, the component with the largest excess over the class's SLO-meeting median),
from the scraped series (``server_series``), or from the client alone (``client_only``).
Shares (:func:`miss_shares`) count primary causes. Method: docs/metrics.md, 'Request autopsy'.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as paj

from capacity_pack.evidence.analysis import MEASURED_PHASES
from capacity_pack.vocab import slo

NS_PER_MS = 1e6
POINT_KEYS = ("point", "cache_state", "repeat")
TTFT_CAUSES = ("queueing", "prefill", "transport", "client_scheduling")
TPOT_CAUSES = ("preemption", "decode")
CAUSES = (*TTFT_CAUSES, *TPOT_CAUSES, "unattributed")
METHODS = ("ground_truth", "server_series", "client_only")
LATENESS_BOUND_MS = 5.0
QUEUE_METRIC = "queue_depth"
PREEMPTION_METRIC = "preemptions"

COMPONENTS = (
    "client_scheduling_ms",
    "transport_in_ms",
    "queueing_ms",
    "prefill_ms",
    "emit_ms",
    "transport_out_ms",
    "transport_ms",
    "decode_ms",
)
ATTRIBUTION_COLUMNS = [
    "request_id",
    *POINT_KEYS,
    "class",
    "method",
    "miss",
    "cause",
    "cause_excess_ms",
    "secondary_cause",
    "secondary_excess_ms",
    "ttft_ms",
    "tpot_ms",
    "ttft_cutoff_ms",
    "tpot_cutoff_ms",
    *COMPONENTS,
    "preemptions",
    "preempted",
    "queue_depth_at_send",
]

_GT_STAMPS = ("arrival_ns", "scheduled_ns", "first_token_ns", "first_token_sent_ns")
GROUND_TRUTH_SCHEMA = pa.schema(
    [("request_id", pa.string()), ("clock_offset_ns", pa.int64()), ("preemptions", pa.int64())]
    + [(c, pa.int64()) for c in _GT_STAMPS]
)

ADVICE = {
    "queueing": "requests waited in the engine's queue: add replicas or lower the offered rate",
    "prefill": "prompt processing was slow: shorten prompts, raise the prefill budget "
    "(max batched tokens, chunked prefill) or use the prefix cache",
    "transport": "the path between client and engine dominates: co-locate the load generator "
    "or fix the link",
    "client_scheduling": "the load generator was client-bound (late sends), so this is not a "
    "server result: rerun with more client capacity",
    "decode": "batch interference slowed decoding: cap generation length or reduce the batch "
    "size (max concurrent sequences)",
    "preemption": "requests were preempted for KV cache: give the engine more KV memory or "
    "lower the concurrency",
    "unattributed": "neither ground truth nor a server series was recorded: scrape the server's "
    "metrics to attribute these misses",
}


def read_ground_truth(path: str | Path) -> pd.DataFrame:
    """The simulator's per-request log, stamps as nullable Int64 (exact: epoch ns overflow a
    float's 53 bits). A torn last line (the server killed mid-write) is ignored."""
    data = Path(path).read_bytes()
    data = data[: data.rfind(b"\n") + 1]
    if not data.strip():
        return pd.DataFrame({f.name: pd.Series(dtype="Int64") for f in GROUND_TRUTH_SCHEMA})
    parse = paj.ParseOptions(
        explicit_schema=GROUND_TRUTH_SCHEMA, unexpected_field_behavior="ignore"
    )
    table = paj.read_json(io.BytesIO(data), parse_options=parse)
    df = table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    df["request_id"] = df["request_id"].astype(str)
    return df


def _ms(x: pd.Series) -> np.ndarray:
    """Nullable integer ns -> float ms (NaN for missing)."""
    return x.astype("Float64").to_numpy(dtype=float, na_value=np.nan) / NS_PER_MS


def _ground_truth_components(m: pd.DataFrame, gt: pd.DataFrame | None) -> pd.DataFrame:
    """Server-side components of each row of ``m`` (NaN where the request has no record)."""
    out = pd.DataFrame(index=m.index)
    if gt is None or gt.empty:
        for c in ("transport_in_ms", "queueing_ms", "prefill_ms", "emit_ms", "transport_out_ms"):
            out[c] = np.nan
        out["preemptions"] = pd.array([pd.NA] * len(m), dtype="Int64")
        return out
    g = gt.drop_duplicates("request_id", keep="last").set_index("request_id")
    off = g["clock_offset_ns"].astype("Int64")
    mono = pd.DataFrame({c: g[c].astype("Int64") - off for c in _GT_STAMPS})
    mono["preemptions"] = g["preemptions"].astype("Int64")
    j = mono.reindex(m["request_id"].to_numpy())
    j.index = m.index
    sent = m["sent_ns"].astype("Int64")
    out["transport_in_ms"] = _ms(j["arrival_ns"] - sent)
    out["queueing_ms"] = _ms(j["scheduled_ns"] - j["arrival_ns"])
    out["prefill_ms"] = _ms(j["first_token_ns"] - j["scheduled_ns"])
    out["emit_ms"] = _ms(j["first_token_sent_ns"] - j["first_token_ns"])
    # The client's first-token stamp is sent + TTFT; the residual keeps the identity exact.
    out["transport_out_ms"] = m["ttft_ms"].to_numpy(float) - _ms(j["first_token_sent_ns"] - sent)
    out["preemptions"] = j["preemptions"]
    return out


def _asof(times: np.ndarray, series: pd.DataFrame, direction: str) -> np.ndarray:
    """Value of ``series`` (t_offset_ns, value) at each time, in the order of ``times``."""
    if series.empty:
        return np.full(len(times), np.nan)
    left = pd.DataFrame({"t": times.astype(np.int64), "i": np.arange(len(times))})
    left = left.sort_values("t", kind="stable")
    right = series.rename(columns={"t_offset_ns": "t"})[["t", "value"]].astype({"t": np.int64})
    right = right.sort_values("t", kind="stable")
    j = pd.merge_asof(left, right, on="t", direction=direction)
    vals = np.full(len(times), np.nan)
    vals[j["i"].to_numpy()] = j["value"].to_numpy(float)
    return vals


def _series_signals(m: pd.DataFrame, series: pd.DataFrame | None) -> pd.DataFrame:
    """Queue depth at the send, whether it was above the series' floor, and whether the
    preemption counter rose over the request's lifetime."""
    out = pd.DataFrame(index=m.index)
    out["queue_depth_at_send"] = np.nan
    out["queued"] = False
    out["series_preempted"] = False
    out["has_series"] = False
    if series is None or series.empty or m.empty:
        return out
    server = series[series["source"] == "server"]
    q = server[server["metric"] == QUEUE_METRIC]
    p = server[server["metric"] == PREEMPTION_METRIC]
    if q.empty and p.empty:
        return out
    t0 = m["sent_ns"].to_numpy(np.int64) - m["sent_offset_ns"].to_numpy(np.int64)
    send = m["sent_offset_ns"].to_numpy(np.int64)
    end = m["end_ns"].to_numpy(np.int64) - t0
    depth = _asof(send, q, "backward")
    window = q[(q["t_offset_ns"] >= send.min()) & (q["t_offset_ns"] <= end.max())]
    # An engine that reports a standing queue (never drains) has a non-zero floor.
    floor = float(window["value"].min()) if len(window) else 0.0
    out["queue_depth_at_send"] = depth
    out["queued"] = np.nan_to_num(depth, nan=-np.inf) > max(floor, 0.0)
    before = _asof(send, p, "backward")
    before = np.where(np.isnan(before), _asof(send, p, "forward"), before)
    after = _asof(end, p, "forward")
    after = np.where(np.isnan(after), _asof(end, p, "backward"), after)
    # A counter reset (restarted engine) reads as a drop, never as a preemption.
    out["series_preempted"] = np.nan_to_num(after - before, nan=0.0) > 0
    out["has_series"] = True
    return out


def _empty_attribution() -> pd.DataFrame:
    df = pd.DataFrame({c: pd.Series(dtype=float) for c in ATTRIBUTION_COLUMNS})
    for c in ("request_id", "point", "cache_state", "class", "method", "miss", "cause"):
        df[c] = df[c].astype(object)
    df["secondary_cause"] = df["secondary_cause"].astype(object)
    df["repeat"] = df["repeat"].astype("Int64")
    df["preemptions"] = df["preemptions"].astype("Int64")
    df["preempted"] = df["preempted"].astype(bool)
    return df


def attribute_misses(
    requests: pd.DataFrame,
    cutoffs: Any,
    ground_truth: pd.DataFrame | None = None,
    server_series: pd.DataFrame | None = None,
    *,
    lateness_bound_ms: float = LATENESS_BOUND_MS,
) -> pd.DataFrame:
    """One row per missed request: its components (ms), cause, excess and method.

    ``requests``: a requests table (columns used: request_id, class, phase, status, ttft_ms,
    tpot_ms, client_delay_ms, sent_ns, sent_offset_ns, end_ns; point, cache_state and repeat
    when present). ``cutoffs``: anything :func:`capacity_pack.vocab.slo.class_cutoffs` reads.
    ``ground_truth``: the simulator's log (:func:`read_ground_truth`); ``server_series``: the
    scraped series of the same point. Rows come in the table's order (module docstring: rules).
    """
    cut = slo.class_cutoffs(cutoffs)
    m = requests[requests["phase"].isin(MEASURED_PHASES) & (requests["status"] == "ok")]
    unknown = sorted(set(m["class"]) - set(cut))
    if unknown:
        raise ValueError(f"requests of classes without cutoffs: {unknown}")
    if m.empty:
        return _empty_attribution()
    keys = [k for k in POINT_KEYS if k in m.columns]
    if server_series is not None and keys and len(m[keys].drop_duplicates()) > 1:
        raise ValueError("a server series belongs to one point; pass one point's requests")
    m = m.copy()
    m["ttft_cutoff_ms"] = m["class"].map({k: v[0] for k, v in cut.items()}).astype(float)
    m["tpot_cutoff_ms"] = m["class"].map({k: v[1] for k, v in cut.items()}).astype(float)
    within = slo.cutoff_checks(m["ttft_ms"], m["tpot_ms"], m["ttft_cutoff_ms"], m["tpot_cutoff_ms"])
    miss_ttft, miss_tpot, meets = ~within.ttft, ~within.tpot, within.met
    if meets.all():
        return _empty_attribution()

    comp, sig, excess = _excess_over_reference(m, keys, meets, ground_truth, server_series)
    slots = _assign_causes(comp, sig, excess, miss_ttft, miss_tpot, lateness_bound_ms)
    return _attribution_table(m, comp, sig, slots, miss_ttft | miss_tpot)


def _excess_over_reference(
    m: pd.DataFrame,
    keys: list[str],
    meets: np.ndarray,
    ground_truth: pd.DataFrame | None,
    server_series: pd.DataFrame | None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Each request's components, server signals, and components' excess over the medians of
    the SLO-meeting requests of the same point and class."""
    comp = _ground_truth_components(m, ground_truth)
    comp["client_scheduling_ms"] = m["client_delay_ms"].to_numpy(float)
    comp["transport_ms"] = comp["transport_in_ms"] + comp["emit_ms"] + comp["transport_out_ms"]
    comp["decode_ms"] = m["tpot_ms"].to_numpy(float)
    comp["ttft_ms"] = m["ttft_ms"].to_numpy(float)
    sig = _series_signals(m, server_series)
    group = [*keys, "class"]
    ref_cols = ["client_scheduling_ms", "queueing_ms", "prefill_ms", "transport_ms"]
    ref_cols += ["decode_ms", "ttft_ms"]
    frame = pd.concat([m[group], comp[ref_cols]], axis=1)
    ref = frame[meets].groupby(group, dropna=False)[ref_cols].median()
    ref = frame[group].join(ref, on=group)[ref_cols].fillna(0.0)
    return comp, sig, comp[ref_cols] - ref


def _assign_causes(
    comp: pd.DataFrame,
    sig: pd.DataFrame,
    excess: pd.DataFrame,
    miss_ttft: np.ndarray,
    miss_tpot: np.ndarray,
    lateness_bound_ms: float,
) -> dict[str, np.ndarray]:
    """Per request: its method, the cause and secondary cause with their excess (module
    docstring's rules), and whether it was preempted."""
    n = len(comp)
    has_gt = comp[["transport_in_ms", "queueing_ms", "prefill_ms", "transport_out_ms"]]
    has_gt = has_gt.notna().all(axis=1).to_numpy()
    has_series = sig["has_series"].to_numpy()
    method = np.where(has_gt, "ground_truth", np.where(has_series, "server_series", "client_only"))
    late = np.nan_to_num(comp["client_scheduling_ms"].to_numpy(float), nan=0.0) > (
        lateness_bound_ms
    )

    # Ground truth: the TTFT component with the largest excess over its reference.
    cand = np.array(TTFT_CAUSES, dtype=object)
    cand_excess = excess[[f"{c}_ms" for c in TTFT_CAUSES]].to_numpy(float)
    best = np.argmax(np.nan_to_num(cand_excess, nan=-np.inf), axis=1)
    gt_ttft_cause = cand[best]
    gt_ttft_excess = cand_excess[np.arange(n), best]
    preempted = np.where(
        has_gt,
        comp["preemptions"].fillna(0).to_numpy(dtype=np.int64) > 0,
        sig["series_preempted"].to_numpy(bool),
    )
    tpot_cause = np.where(preempted, "preemption", "decode").astype(object)
    tpot_excess = excess["decode_ms"].to_numpy(float)

    # Estimates: one flag decides the TTFT cause; the whole TTFT excess goes to it.
    est_ttft_cause = np.where(sig["queued"].to_numpy(bool), "queueing", "prefill").astype(object)
    est_ttft_excess = excess["ttft_ms"].to_numpy(float)
    late_excess = excess["client_scheduling_ms"].to_numpy(float)

    none = np.full(n, None, dtype=object)
    nan = np.full(n, np.nan)
    # First slot: the TTFT cause (estimates: the client first when it was late, for any miss).
    slot_gt = np.where(miss_ttft, gt_ttft_cause, none)
    slot_est = np.where(late, "client_scheduling", np.where(miss_ttft, est_ttft_cause, none))
    slot_est_x = np.where(late, late_excess, np.where(miss_ttft, est_ttft_excess, nan))
    slot_none = np.where(late, "client_scheduling", np.where(miss_ttft, "unattributed", none))
    slot_none_x = np.where(late, late_excess, nan)
    slot = np.select(
        [method == "ground_truth", method == "server_series"], [slot_gt, slot_est], slot_none
    )
    slot_x = np.select(
        [method == "ground_truth", method == "server_series"],
        [np.where(miss_ttft, gt_ttft_excess, nan), slot_est_x],
        slot_none_x,
    )
    tpot_slot = np.where(
        miss_tpot, np.where(method == "client_only", "unattributed", tpot_cause), none
    )
    tpot_slot_x = np.where(miss_tpot & (method != "client_only"), tpot_excess, nan)
    has_slot = pd.notna(slot)
    cause = np.where(has_slot, slot, tpot_slot)
    cause_x = np.where(has_slot, slot_x, tpot_slot_x)
    secondary = np.where(has_slot & miss_tpot, tpot_slot, none)
    secondary_x = np.where(has_slot & miss_tpot, tpot_slot_x, nan)

    return {
        "method": method,
        "miss": np.select([miss_ttft & miss_tpot, miss_ttft], ["ttft+tpot", "ttft"], "tpot").astype(
            object
        ),
        "cause": cause,
        "cause_excess_ms": cause_x,
        "secondary_cause": secondary,
        "secondary_excess_ms": secondary_x,
        "preempted": preempted,
    }


def _attribution_table(
    m: pd.DataFrame,
    comp: pd.DataFrame,
    sig: pd.DataFrame,
    slots: dict[str, np.ndarray],
    missed: np.ndarray,
) -> pd.DataFrame:
    """The attribution rows of the missed requests, in the table's order."""
    out = pd.DataFrame(index=m.index)
    out["request_id"] = m["request_id"]
    for k in POINT_KEYS:
        out[k] = m[k] if k in m.columns else None
    out["class"] = m["class"]
    out["method"] = slots["method"]
    out["miss"] = slots["miss"]
    out["cause"] = slots["cause"]
    out["cause_excess_ms"] = slots["cause_excess_ms"].astype(float)
    out["secondary_cause"] = slots["secondary_cause"]
    out["secondary_excess_ms"] = slots["secondary_excess_ms"].astype(float)
    for c in ("ttft_ms", "tpot_ms", "ttft_cutoff_ms", "tpot_cutoff_ms"):
        out[c] = m[c].astype(float)
    for c in COMPONENTS:
        out[c] = comp[c].astype(float)
    out["preemptions"] = comp["preemptions"].astype("Int64")
    out["preempted"] = slots["preempted"]
    out["queue_depth_at_send"] = sig["queue_depth_at_send"].astype(float)
    out = out[missed].reset_index(drop=True)
    out["repeat"] = out["repeat"].astype("Int64")
    return out[ATTRIBUTION_COLUMNS]


def _shares_entry(successful: int, failed: dict[str, int], att: pd.DataFrame) -> dict[str, Any]:
    missed = int(len(att))
    counts = att["cause"].value_counts()
    excess = att.groupby("cause")["cause_excess_ms"].mean()
    share = {c: (int(counts.get(c, 0)) / missed if missed else 0.0) for c in CAUSES}
    mean_excess = {
        c: (float(excess[c]) if c in excess.index and pd.notna(excess[c]) else None) for c in CAUSES
    }
    methods = {k: int(v) for k, v in att["method"].value_counts().items()}
    return {
        "successful": int(successful),
        "missed": missed,
        "attainment": (successful - missed) / successful if successful else None,
        "failed": int(sum(failed.values())),
        "failed_by_status": failed,
        "cause_counts": {c: int(counts.get(c, 0)) for c in CAUSES},
        "cause_share": share,
        "mean_excess_ms": mean_excess,
        "secondary_counts": {
            k: int(v) for k, v in att["secondary_cause"].dropna().value_counts().items()
        },
        "methods": methods,
    }


def miss_shares(attributed: pd.DataFrame, requests: pd.DataFrame) -> dict[str, Any]:
    """Per class and overall: successful, missed, failed by status, the share of misses each
    primary cause explains (summing to 1 when there are misses, all 0 otherwise) and the mean
    excess ms per cause. ``requests`` and ``attributed`` cover the same point(s)."""
    m = requests[requests["phase"].isin(MEASURED_PHASES)]
    ok = m["status"] == "ok"
    classes = list(dict.fromkeys([*pd.unique(m["class"]), *pd.unique(attributed["class"])]))
    succ = m.loc[ok, "class"].value_counts()
    fail = m[~ok].groupby(["class", "status"]).size()
    per_class = {}
    for c in classes:
        failed = {str(s): int(n) for (k, s), n in fail.items() if k == c}
        per_class[str(c)] = _shares_entry(
            int(succ.get(c, 0)), failed, attributed[attributed["class"] == c]
        )
    overall_failed = {str(s): int(n) for s, n in m.loc[~ok, "status"].value_counts().items()}
    return {
        "classes": per_class,
        "overall": _shares_entry(int(ok.sum()), overall_failed, attributed),
    }


def request_autopsy(
    tables_dir: str | Path,
    raw_dir: str | Path | None,
    pack: Any,
    *,
    lateness_bound_ms: float | None = None,
    keys: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Miss attribution of every point under ``tables_dir`` (``<point>/<cache>/rep<k>/``),
    with the simulator's ground truth from ``raw_dir`` where it exists (JSON-able).
    ``keys`` (``point/cache/repK``) keeps only the pack's current points: a folder left by an
    earlier configuration is not part of this run."""
    tables_dir = Path(tables_dir)
    cut = slo.class_cutoffs(pack)
    if lateness_bound_ms is None:
        client = getattr(pack, "client", None)
        lateness_bound_ms = float(getattr(client, "lateness_bound_ms", LATENESS_BOUND_MS))
    points: dict[str, Any] = {}
    for path in sorted(tables_dir.glob("*/*/rep*/requests.parquet")):
        rel = path.parent.relative_to(tables_dir)
        if keys is not None and rel.as_posix() not in set(keys):
            continue
        point, cache, rep = rel.parts
        requests = pd.read_parquet(path)
        metrics_path = path.parent / "server_metrics.parquet"
        series = pd.read_parquet(metrics_path) if metrics_path.exists() else None
        gt_path = Path(raw_dir) / rel / "ground_truth.jsonl" if raw_dir is not None else None
        gt = read_ground_truth(gt_path) if gt_path is not None and gt_path.exists() else None
        att = attribute_misses(requests, cut, gt, series, lateness_bound_ms=lateness_bound_ms)
        points[rel.as_posix()] = {
            "point": point,
            "cache_state": cache,
            "repeat": int(rep.removeprefix("rep")),
            "ground_truth": gt is not None,
            "server_series": series is not None,
            **miss_shares(att, requests),
        }
    return {
        "cutoffs": {k: {"ttft_ms": v[0], "tpot_ms": v[1]} for k, v in cut.items()},
        "lateness_bound_ms": lateness_bound_ms,
        "causes": list(CAUSES),
        "points": points,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x else "-"


def _class_sentence(name: str, entry: dict[str, Any]) -> str:
    failed = ""
    if entry["failed"]:
        by = ", ".join(f"{s}: {n}" for s, n in sorted(entry["failed_by_status"].items()))
        failed = f" {entry['failed']} failed requests ({by}) are counted apart, not attributed."
    if not entry["missed"]:
        return f"- **{name}**: no SLO misses among {entry['successful']} successful.{failed}"
    share = entry["cause_share"]
    top = max(CAUSES, key=lambda c: share[c])
    x = entry["mean_excess_ms"][top]
    over = f", {x:+.1f} ms over the class's typical on average" if x is not None else ""
    rest = sorted((c for c in CAUSES if c != top and share[c]), key=lambda c: -share[c])
    also = "; then " + ", ".join(f"{c} {_pct(share[c])}" for c in rest) if rest else ""
    return (
        f"- **{name}**: {top} explains {_pct(share[top])} of {entry['missed']} misses{over}"
        f"{also}. {ADVICE[top][0].upper()}{ADVICE[top][1:]}.{failed}"
    )


def request_autopsy_markdown(doc: dict[str, Any]) -> str:
    """Per point a class x cause share table, then one sentence per class on what to do."""
    used = {c for p in doc["points"].values() for c in CAUSES if p["overall"]["cause_counts"][c]}
    causes = [c for c in CAUSES if c != "unattributed" or c in used]
    lines = [
        "# Request autopsy: why requests missed their SLO",
        "",
        "A miss is an `ok` measured request over its class's TTFT or TPOT cutoff; each is "
        "attributed to the component with the largest excess over the class's SLO-meeting "
        "median (`ground_truth`: the engine's own stamps, measured) or from the scraped queue "
        "and preemption series (`server_series`: estimated). Shares count primary causes.",
        "",
    ]
    lines += [
        "| point | successful | missed | failed | attribution | dominant cause |",
        "|---|---:|---:|---:|---|---|",
    ]
    for key, p in doc["points"].items():
        ov = p["overall"]
        methods = ", ".join(sorted(ov["methods"])) or "-"
        top = max(causes, key=lambda c: ov["cause_share"][c]) if ov["missed"] else None
        dominant = f"{top} ({_pct(ov['cause_share'][top])})" if top else "-"
        lines.append(
            f"| {key} | {ov['successful']} | {ov['missed']} | {ov['failed']} | {methods} | "
            f"{dominant} |"
        )
    lines += ["", "Points with misses, by class:", ""]
    header = ["class", "successful", "missed", "failed", *causes]
    for key, p in doc["points"].items():
        ov = p["overall"]
        if not ov["missed"]:
            continue  # the summary table above says all there is
        methods = ", ".join(f"{k} {v}" for k, v in sorted(ov["methods"].items())) or "none"
        lines += [
            f"## {key}",
            "",
            f"{ov['successful']} successful, {ov['missed']} missed, {ov['failed']} failed; "
            f"attribution method: {methods}.",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
        ]
        rows = [*p["classes"].items(), ("all", ov)]
        for name, e in rows:
            cells = [name, str(e["successful"]), str(e["missed"]), str(e["failed"])]
            cells += [_pct(e["cause_share"][c]) for c in causes]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines += [_class_sentence(name, e) for name, e in p["classes"].items()]
        lines.append("")
    return "\n".join(lines)
