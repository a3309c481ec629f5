"""Two capacity packs side by side: what differs, and whether it exceeds run-to-run variation.

``capacity-pack compare A B`` reads two finished packs (a results folder, its ``pack/``, or an
MLflow parent run) and reports B against A. Only three tests may call a difference "beyond
run-to-run variation": capacity per cache state by disjoint evidence brackets
(:func:`capacity_pack.decide.bracket.evidence_bracket`: U_B <= L_A or U_A <= L_B); attainment at
matched rates by Newcombe's hybrid score interval of p_B - p_A at the effective sample (Statist.
Med. 17, 1998, method 10); P95 latencies at matched rates by t = (m_B - m_A) / (s sqrt(1/n_A +
1/n_B)) on log P95 with s pooled over the repeats (from a range: ln(max / min) / d2(n), d2 after
Tippett 1925). The attainment and latency tests are one Bonferroni family at c' = 1 - (1 - c) / m.
The plan, the drills and the closed loop are shown, flagged, not tested.

Method: docs/metrics.md, "Comparing two packs".
"""

from __future__ import annotations

import math
import os
from typing import Any

from capacity_pack.decide.bracket import evidence_bracket, evidence_disjoint
from capacity_pack.decide.compare_render import jsonable, to_html, to_markdown
from capacity_pack.decide.compare_sources import CompareError, Source, open_sources
from capacity_pack.decide.compare_stats import (
    LATENCY_METRICS,
    LogSample,
    excludes_zero,
    log_difference,
    log_ratio_test,
    log_sample,
    newcombe_interval,
    pooled_log_variance,
)
from capacity_pack.io import sha256_of_obj, write_json_atomic, write_text_atomic
from capacity_pack.vocab.words import bracket_text, decision_sentence

BEYOND = "beyond run-to-run variation"
WITHIN = "within run-to-run variation"
NO_DIFFERENCE = "no difference beyond run-to-run variation"
#: The most differing fields listed per manifest section.
MAX_FIELDS_PER_SECTION = 25

# --- Capacity ---


def compare_capacity(a: Source, b: Source) -> list[dict[str, Any]]:
    states = sorted(set(a.capacity["open_loop"]) | set(b.capacity["open_loop"]))
    rows = []
    for state in states:
        sa, sb = a.capacity["open_loop"].get(state), b.capacity["open_loop"].get(state)
        ea, eb = evidence_bracket(sa), evidence_bracket(sb)
        ca = sa.get("capacity_rps") if sa else None
        cb = sb.get("capacity_rps") if sb else None
        change = (cb - ca) / ca if ca and cb is not None else None
        search = [s.get("bracket") if s else None for s in (sa, sb)]
        search_disjoint = all(search) and evidence_disjoint(*map(_search_ends, search))
        beyond = evidence_disjoint(ea, eb)
        rows.append(
            {
                "cache_state": state,
                "capacity_rps": [ca, cb],
                "change": change,
                "search_bracket": search,
                "evidence_bracket": [ea, eb],
                "per_replica_rps": [
                    s.get("capacity_per_replica_rps") if s else None for s in (sa, sb)
                ],  # fmt: skip
                "goodput_per_gpu_rps": [
                    s.get("goodput_per_gpu_rps") if s else None for s in (sa, sb)
                ],  # fmt: skip
                "decision": [s.get("decision") if s else None for s in (sa, sb)],
                "sentences": [side_sentence(state, s) for s in (sa, sb)],
                "beyond": beyond,
                "in_both": sa is not None and sb is not None,
                "note": _capacity_note(beyond, bool(search_disjoint), sa, sb, ea, eb),
            }
        )
    return rows


def _search_ends(x: dict[str, Any]) -> dict[str, float]:
    """A search bracket as :func:`evidence_disjoint` reads one (open ends: 0 and infinity)."""
    lo, hi = x.get("pass_rps"), x.get("fail_rps")
    return {"low": 0.0 if lo is None else lo, "high": math.inf if hi is None else hi}


def _capacity_note(beyond, search_disjoint, sa, sb, ea, eb) -> str:
    if sa is None or sb is None:
        return f"measured only in {'A' if sb is None else 'B'}: not compared"
    if beyond:
        worse, better = (eb, ea) if eb["high"] <= ea["low"] else (ea, eb)
        name = "B" if worse is eb else "A"
        return (f"{name} fails {worse['high']:g} RPS, at or below a rate the other passes "
                f"({better['low']:g} RPS)")  # fmt: skip
    if search_disjoint:
        return ("the search brackets do not overlap, but the rates between them are not shown "
                "to fail (misses, inconclusive, marginal or inconsistent) in at least one "
                "pack")  # fmt: skip
    return "the evidence brackets overlap"


# --- Matched rates: attainment and latency ---


def _rows_by_rate(sel: dict[str, Any] | None) -> dict[float, dict[str, Any]]:
    return {float(r["offered_rps"]): r for r in (sel or {}).get("rates", [])}


def _deciding_repeats(row: dict[str, Any]) -> list[int]:
    return [int(p["repeat"]) for p in row.get("per_repeat", [])]


def _class_reports(src: Source, state: str, rate: float, row: dict[str, Any], cls: str):
    out = []
    for k in _deciding_repeats(row):
        rep = src.reports.get((state, rate, k))
        if rep is not None and cls in rep.get("classes", {}):
            out.append(rep["classes"][cls])
    return out


def matched_rates(a: Source, b: Source) -> list[tuple[str, float, dict, dict]]:
    out = []
    for state in sorted(set(a.capacity["open_loop"]) & set(b.capacity["open_loop"])):
        ra = _rows_by_rate(a.capacity["open_loop"][state])
        rb = _rows_by_rate(b.capacity["open_loop"][state])
        out.extend((state, rate, ra[rate], rb[rate]) for rate in sorted(set(ra) & set(rb)))
    return out


def _status(row: dict[str, Any]) -> str | None:
    """The rate's status, marked when a deciding repeat was client-bound: its requests are the
    server's answers, but the load was not sent as scheduled, so the reader should know."""
    status = row.get("status")
    if any(str(r).startswith("client-bound") for r in row.get("reasons", [])):
        return f"{status}, client-bound"
    return status


def _classes(row: dict[str, Any]) -> dict[str, Any]:
    return ((row.get("variation") or {}).get("classes")) or {}


def attainment_rows(a: Source, b: Source) -> list[dict[str, Any]]:
    """Per matched (state, rate, class): counts, effective counts; the test comes later."""
    rows = []
    for state, rate, ra, rb in matched_rates(a, b):
        ca, cb = _classes(ra), _classes(rb)
        for cls in [c for c in ca if c in cb]:
            sides = []
            for src, row, cv in ((a, ra, ca), (b, rb, cb)):
                pooled = (cv[cls].get("attainment") or {}).get("pooled") or {}
                reps = _class_reports(src, state, rate, row, cls)
                deffs = [r.get("attainment_design_effect") for r in reps]
                deffs = [float(d) for d in deffs if d is not None]
                sides.append(
                    {
                        "passing": pooled.get("count"),
                        "successful": pooled.get("trials"),
                        "attainment": pooled.get("value"),
                        "design_effect": max(deffs, default=1.0),
                        "design_effect_known": bool(deffs),
                        "status": _status(row),
                        "repeats": row.get("repeats"),
                    }
                )
            rows.append({"cache_state": state, "offered_rps": rate, "class": cls, "sides": sides})
    return rows


def _test_attainment(row: dict[str, Any], confidence: float) -> None:
    a, b = row["sides"]
    if not a["successful"] or not b["successful"]:
        row.update(difference=None, interval=None, beyond=False, tested=False,
                   why="no successful requests on one side")  # fmt: skip
        return
    # One design effect for both sides, the larger: under the null hypothesis both runs are the
    # same process, and a run without misses cannot estimate its own (its batch means do not
    # vary, so its estimate is 1 however bursty the misses would be).
    deff = max(a["design_effect"], b["design_effect"])
    row["design_effect"] = deff
    ka, na = a["passing"] / deff, a["successful"] / deff
    kb, nb = b["passing"] / deff, b["successful"] / deff
    ci = newcombe_interval(ka, na, kb, nb, confidence)
    row.update(
        difference=b["passing"] / b["successful"] - a["passing"] / a["successful"],
        interval=list(ci) if ci else None,
        beyond=excludes_zero(ci),
        tested=True,
        why=None,
    )


def _p95_sample(src: Source, state: str, rate: float, row: dict[str, Any], cls: str, metric: str):
    reps = _class_reports(src, state, rate, row, cls)
    # Per-repeat values only when every deciding repeat's report is there.
    values = [r.get(metric) for r in reps] if len(reps) == len(_deciding_repeats(row)) else None
    return log_sample(values, _classes(row)[cls].get(metric))


def latency_variation(sources: tuple[Source, ...]) -> dict[str, Any]:
    """Per metric: the between-repeat variance of log P95 pooled over every repeated point of
    every source at a rate it does not fail (matched with the other pack or not: the variation
    of a point's repeats needs no partner)."""
    out = {}
    for m in LATENCY_METRICS:
        samples = [
            _p95_sample(src, state, float(row["offered_rps"]), row, cls, m)
            for src in sources
            for state, sel in src.capacity["open_loop"].items()
            for row in sel.get("rates", [])
            if row.get("status") != "fail" and len(_deciding_repeats(row)) >= 2
            for cls in _classes(row)
        ]  # fmt: skip
        samples = [x for x in samples if x is not None]
        var, df = pooled_log_variance(samples)
        out[m] = {"var_log": var, "sd_log": math.sqrt(var) if var is not None else None,
                  "df": df, "points": sum(x.var_log is not None for x in samples)}  # fmt: skip
    return out


def latency_rows(a: Source, b: Source) -> list[dict[str, Any]]:
    """Per matched (state, rate, class): each metric's log samples of A and B."""
    rows = []
    for state, rate, ra, rb in matched_rates(a, b):
        ca, cb = _classes(ra), _classes(rb)
        for cls in [c for c in ca if c in cb]:
            metrics = {
                m: {"samples": [_p95_sample(a, state, rate, ra, cls, m),
                                _p95_sample(b, state, rate, rb, cls, m)]}
                for m in LATENCY_METRICS
            }  # fmt: skip
            rows.append({"cache_state": state, "offered_rps": rate, "class": cls,
                         "eligible": "fail" not in (ra.get("status"), rb.get("status")),
                         "statuses": [_status(ra), _status(rb)],
                         "metrics": metrics})  # fmt: skip
    return rows


def _test_latency(row: dict[str, Any], pooled: dict[str, Any], confidence: float) -> None:
    for m, entry in row["metrics"].items():
        sa, sb = entry["samples"]
        if not row["eligible"]:
            entry.update(tested=False, beyond=False, ratio=_ratio(sa, sb), interval=None,
                         why="a pack fails this rate: past capacity a percentile measures the "
                         "run's length")  # fmt: skip
        elif sa is None or sb is None:
            entry.update(tested=False, beyond=False, ratio=None, interval=None, why="no value")
        else:
            p = pooled[m]
            entry.update(tested=True, **log_ratio_test(sa, sb, p["var_log"], p["df"], confidence))


def _ratio(a: LogSample | None, b: LogSample | None) -> float | None:
    return math.exp(log_difference(a, b)) if a is not None and b is not None else None


# --- Plan, drills, closed loop, manifests ---


PLAN_FIELDS = (
    ("required_replicas", "replicas", ("required_replicas",)),
    ("required_gpus", "GPUs", ("required_gpus",)),
    ("bound_by", "bound by", ("bound_by",)),
    ("capacity_cache_state", "sized on cache state", ("capacity_cache_state",)),
    ("capacity_per_replica_rps", "capacity per replica (RPS)",
     ("throughput", "capacity_per_replica_rps")),
    ("peak_rps", "peak (RPS)", ("throughput", "peak_rps")),
    ("planned_utilization", "planned utilization", ("throughput", "planned_utilization")),
    ("cost_per_hour", "cost per hour", ("cost", "cost_per_hour")),
    ("cost_per_request", "cost per request", ("cost", "cost_per_request")),
    ("reason", "no plan because", ("reason",)),
)  # fmt: skip


def _dig(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def compare_plan(a: Source, b: Source, capacity: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for key, label, path in PLAN_FIELDS:
        va, vb = _dig(a.plan, path), _dig(b.plan, path)
        if va is None and vb is None:
            continue
        rows.append({"field": key, "label": label, "values": [va, vb], "differs": va != vb})
    differs = any(r["differs"] for r in rows if r["field"] in ("required_replicas",
                                                                "required_gpus"))  # fmt: skip
    state = _dig(a.plan, ("capacity_cache_state",)) or _dig(b.plan, ("capacity_cache_state",))
    cap = next((c for c in capacity if c["cache_state"] == state), None)
    if a.plan is None or b.plan is None:
        note = f"no plan.json in {'A' if a.plan is None else 'B'}"
    elif not differs:
        note = "the same fleet"
    elif cap is not None and not cap["beyond"]:
        note = (f"the fleets differ, but the {state} capacity they are sized from is within "
                "run-to-run variation, so this difference is too")  # fmt: skip
    else:
        note = f"the fleets differ, following a {state} capacity that differs beyond variation"
    return {"rows": rows, "differs": differs, "note": note}


def drill_facts(r: dict[str, Any]) -> dict[str, Any]:
    if r.get("skipped"):
        return {"outcome": f"skipped: {r['skipped']}"}
    inj, det, rec = r.get("injection_time_s"), r.get("detection_time_s"), r.get("recovery_time_s")
    n = r.get("n_plus_one") or {}
    return {
        "outcome": n.get("verdict")
        or (
            "alerts not evaluated"
            if not r.get("alerts_evaluated", True)
            else "alert fired"
            if r.get("expected_alert_fired")
            else "expected alert NOT fired"
        ),
        "recovered": rec is not None,
        "detected_after_s": det - inj if det is not None and inj is not None else None,
        "recovered_after_s": rec - inj if rec is not None and inj is not None else None,
        "rejected": r.get("requests_rejected"),
        "lost": r.get("requests_lost"),
    }


def compare_drills(a: Source, b: Source) -> dict[str, Any]:
    if a.failure is None or b.failure is None:
        missing = " and ".join(s.label for s in (a, b) if s.failure is None)
        return {"rows": [], "plan_drill": None, "differs": False,
                "note": f"no failure-test.json in {missing}: drills not compared"}  # fmt: skip
    plans = [s.failure.get("plan_drill") for s in (a, b)]
    by_name = [{r["drill"]: r for r in s.failure.get("drills", [])} for s in (a, b)]
    names = list(dict.fromkeys([*by_name[0], *by_name[1]]))
    rows = []
    for name in names:
        facts = [drill_facts(d[name]) if name in d else None for d in by_name]
        verdict = [(f or {}).get("outcome") for f in facts], [(f or {}).get("recovered")
                                                              for f in facts]  # fmt: skip
        differs = verdict[0][0] != verdict[0][1] or verdict[1][0] != verdict[1][1]
        rows.append({"drill": name, "facts": facts, "differs": differs})
    plan_differs = (plans[0] or {}).get("verdict") != (plans[1] or {}).get("verdict")
    return {
        "rows": rows,
        "plan_drill": plans,
        "differs": plan_differs or any(r["differs"] for r in rows),
        "note": "one run of each drill per pack: no run-to-run variation to judge a difference "
        "against; differing outcomes are flagged, not tested",
    }


def compare_closed_loop(a: Source, b: Source) -> list[dict[str, Any]]:
    rows = []
    ca, cb = a.capacity.get("closed_loop") or {}, b.capacity.get("closed_loop") or {}
    for state in sorted(set(ca) & set(cb)):
        pa = {p["concurrency"]: p for p in ca[state].get("curve", [])}
        pb = {p["concurrency"]: p for p in cb[state].get("curve", [])}
        for n in sorted(set(pa) & set(pb)):
            tps = [p[n].get("output_throughput_tps") for p in (pa, pb)]
            rows.append({"cache_state": state, "concurrency": n, "output_tps": tps,
                         "status": [pa[n].get("status"), pb[n].get("status")]})  # fmt: skip
        ops = [c[state].get("operating_point") or {} for c in (ca, cb)]
        rows.append({
            "cache_state": state, "concurrency": "operating point",
            "output_tps": [o.get("output_throughput_tps") for o in ops],
            "status": [f"c{o['concurrency']}" if o.get("concurrency") else "none" for o in ops],
        })  # fmt: skip
    return rows


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    return {prefix: obj}


def compare_manifests(a: Source, b: Source) -> dict[str, Any]:
    ma, mb = a.manifest, b.manifest
    out: dict[str, Any] = {"sha256": [a.manifest_sha256, b.manifest_sha256],
                           "from": [a.manifest_from, b.manifest_from]}  # fmt: skip
    if ma is None or mb is None:
        out.update(sections=[], fields=[], note="a manifest is missing: sections not compared")
        return out
    from capacity_pack.plan.manifest import SECTIONS

    names = [s for s in SECTIONS if s in ma or s in mb]
    names += sorted((set(ma) | set(mb)) - set(names))
    sections, fields = [], []
    for name in names:
        ha = sha256_of_obj(ma[name]) if name in ma else None
        hb = sha256_of_obj(mb[name]) if name in mb else None
        if ha == hb:
            continue
        sections.append({"section": name, "sha256": [ha, hb]})
        fa, fb = _flatten(ma.get(name), name), _flatten(mb.get(name), name)
        keys = [k for k in dict.fromkeys([*fa, *fb]) if fa.get(k) != fb.get(k)]
        fields.extend({"field": k, "values": [fa.get(k), fb.get(k)]}
                      for k in keys[:MAX_FIELDS_PER_SECTION])  # fmt: skip
        if len(keys) > MAX_FIELDS_PER_SECTION:
            fields.append({"field": f"{name}: {len(keys) - MAX_FIELDS_PER_SECTION} more",
                           "values": ["...", "..."]})  # fmt: skip
    out.update(sections=sections, fields=fields, note=None)
    return out


def identity(src: Source) -> dict[str, Any]:
    m = src.manifest or {}
    holds = src.capacity.get("holds_for") or {}
    engine = m.get("engine") or holds.get("engine") or {}
    model = m.get("model") or holds.get("model") or {}
    target = m.get("target") or {}
    tgt = target.get("profile") if target.get("kind") == "sim" else target.get("base_url")
    return {
        "origin": src.origin,
        "pack": src.name,
        "manifest_sha256": src.manifest_sha256,
        "engine": f"{engine.get('name', '?')} {engine.get('version', '?')}",
        "model": f"{model.get('id', '?')} @ {model.get('revision', '?')}",
        "target": f"{target.get('kind', '?')}: {tgt}" if target else None,
        "primary_cache_state": src.capacity.get("primary_cache_state"),
        "reports": src.reports_from or "none (capacity.json only)",
    }


# --- The comparison ---


def compare_sources(a: Source, b: Source, confidence: float = 0.95) -> dict[str, Any]:
    """The whole comparison as data (rendered by :func:`to_markdown` and :func:`to_html`)."""
    if not 0.5 <= confidence < 1:
        raise CompareError(f"--confidence {confidence}: expected a value in [0.5, 1)")
    capacity = compare_capacity(a, b)
    att = attainment_rows(a, b)
    lat, pooled = latency_rows(a, b), latency_variation((a, b))
    tests = sum(1 for r in att if r["sides"][0]["successful"] and r["sides"][1]["successful"])
    tests += sum(
        1 for r in lat if r["eligible"]
        for m in r["metrics"].values() if None not in m["samples"]
    )  # fmt: skip
    each = 1 - (1 - confidence) / max(tests, 1)
    for r in att:
        _test_attainment(r, each)
    for r in lat:
        _test_latency(r, pooled, each)
    doc = {
        "a": identity(a),
        "b": identity(b),
        "confidence": confidence,
        "tests": tests,
        "per_test_confidence": each,
        "capacity": capacity,
        "attainment": att,
        "latency": lat,
        "latency_variation": pooled,
        "closed_loop": compare_closed_loop(a, b),
        "plan": compare_plan(a, b, capacity),
        "drills": compare_drills(a, b),
        "manifest": compare_manifests(a, b),
        "design_effect_known": [bool(a.reports), bool(b.reports)],
    }
    doc.update(verdict(doc, a, b))
    return doc


def _primary(doc: dict[str, Any], a: Source, b: Source) -> dict[str, Any] | None:
    both = [c for c in doc["capacity"] if c["in_both"]]
    for state in (a.capacity.get("primary_cache_state"), b.capacity.get("primary_cache_state")):
        hit = next((c for c in both if c["cache_state"] == state), None)
        if hit is not None:
            return hit
    return both[0] if both else None


def side_sentence(state: str, sel: dict[str, Any] | None) -> str | None:
    """One pack's decision sentence for ``state`` (:func:`capacity_pack.vocab.words.
    decision_sentence`, as its console and README state it); None when it did not measure it.
    A capacity.json without a bracket (written before brackets) gives its capacity and the
    next rate up."""
    if sel is None:
        return None
    b = sel.get("bracket") or {
        "pass_rps": sel.get("capacity_rps"),
        "fail_rps": (sel.get("next_rate_up") or {}).get("offered_rps"),
    }
    return decision_sentence(state, b.get("pass_rps"), b.get("fail_rps"), b.get("reached"))


def _carries(c: dict[str, Any]) -> str:
    """'B carries 30 % less than A (cold: 21 vs 30 RPS)' and its variants."""
    ca, cb = c["capacity_rps"]
    state = c["cache_state"]
    below = [bracket_text(None, (s or {}).get("fail_rps")) for s in c["search_bracket"]]
    if ca is None and cb is None:
        return f"neither pack carries its SLOs at any rate tested ({state})"
    if cb is None:
        return (f"B carries nothing within its SLOs at the rates tested ({state}: {below[1]}) "
                f"where A carries {ca:g} RPS")  # fmt: skip
    if ca is None:
        return (f"B carries {cb:g} RPS where A carries nothing within its SLOs ({state}: "
                f"{below[0]})")  # fmt: skip
    change = c["change"]
    if abs(change) < 0.005:
        return f"B carries as much as A ({state}: {ca:g} RPS each)"
    word = "more" if change > 0 else "less"
    return f"B carries {abs(change) * 100:.0f} % {word} than A ({state}: {cb:g} vs {ca:g} RPS)"


def verdict(doc: dict[str, Any], a: Source, b: Source) -> dict[str, Any]:
    """The one-line summary, the list of what differs beyond run-to-run variation, and each
    pack's decision sentence for the state the summary compares."""
    primary = _primary(doc, a, b)
    found = [f"{c['cache_state']} capacity" for c in doc["capacity"] if c["beyond"]]
    n_att = sum(r["beyond"] for r in doc["attainment"])
    n_lat = sum(m["beyond"] for r in doc["latency"] for m in r["metrics"].values())
    if n_att:
        found.append(f"{n_att} attainment{'s' if n_att > 1 else ''} at matched rates")
    if n_lat:
        found.append(f"{n_lat} P95 latenc{'ies' if n_lat > 1 else 'y'} at matched rates")
    carries = _carries(primary) if primary else "no cache state measured in both packs"
    if primary is not None and primary["beyond"]:
        line = f"{carries}: {BEYOND}"
    elif found:
        line = f"{carries}, {WITHIN}; beyond it: {', '.join(found)}"
    else:
        line = f"{NO_DIFFERENCE}: {carries}"
    # Each pack's own decision, in the words its console and README state it.
    decisions = [
        f"{side}, {sentence}"
        for c in ([primary] if primary is not None else doc["capacity"])
        for side, sentence in zip("AB", c["sentences"], strict=True)
        if sentence is not None
    ]
    return {"summary": line[0].upper() + line[1:], "beyond": bool(found),
            "beyond_what": found, "decisions": decisions}  # fmt: skip


# --- The entry point ---


def run_compare(
    a: str,
    b: str,
    *,
    tracking: str | None = None,
    confidence: float = 0.95,
    markdown: str | os.PathLike[str] | None = None,
    html_path: str | os.PathLike[str] | None = None,
    json_path: str | os.PathLike[str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Compare pack ``b`` against pack ``a`` (folders or ``mlflow:<run id>``); write the
    Markdown, HTML and JSON where asked. Returns the Markdown and the comparison."""
    with open_sources(a, b, tracking) as (sa, sb):
        doc = compare_sources(sa, sb, confidence)
    text = to_markdown(doc)
    if markdown is not None:
        write_text_atomic(markdown, text)
    if html_path is not None:
        write_text_atomic(html_path, to_html(doc))
    if json_path is not None:
        write_json_atomic(json_path, jsonable(doc))
    return text, doc
