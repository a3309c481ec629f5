"""The capacity pack a person reads: decision, plan, plots, manifest, requests and SLO report.

:func:`write_pack` writes ``results/<pack>/pack/`` (the frozen manifest, the selected point's
``requests.csv`` and ``slo-report.json``, ``capacity.json``, ``plan.json``, every plot of
:data:`capacity_pack.decide.plots.PLOTS`); :func:`render_readme` the README, the sections of
:data:`README_SECTIONS` in order, each a function of :class:`PackDocs` that the HTML page renders
too. A cache state's capacity is stated by :func:`decision_headline`. Docs: docs/reading.md,
"The pack README"; a new section: docs/architecture.md, "Where to change…".
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from capacity_pack.artifacts import Capacity, Plan, SloReport
from capacity_pack.decide import sessions
from capacity_pack.decide.capacity import tail_fit_sentences

# pyplot and save_figure: drills/timeline.py imports them from here.
from capacity_pack.decide.plots import PLOTS, PlotInputs, pyplot, save_figure  # noqa: F401
from capacity_pack.decide.registry import Registry, Section
from capacity_pack.decide.traffic import manifest_lines, selected_lines
from capacity_pack.evidence.gates import Gates
from capacity_pack.io import atomic_path, write_text_atomic
from capacity_pack.plan.words import target_words
from capacity_pack.vocab.words import decision_sentence, rate_status_words


def write_pack(
    out_dir: Path,
    *,
    frozen: dict[str, Any],
    capacity: dict[str, Any],
    plan: dict[str, Any],
    reports: list[dict[str, Any]],
    selected_tables: Path | None,
    selected_report: dict[str, Any] | None,
    series: dict[str, pd.DataFrame],
    extra_files: list[Path] | None = None,
    failure: dict[str, Any] | None = None,
    shapes: tuple[list[str], list[str]] | None = None,
    twin: tuple[list[str], Path] | None = None,
) -> list[Path]:
    """Write the pack folder; returns the files written. ``failure``: failure-test.json;
    ``shapes``: the load shapes' README section and its files, written beside it; ``twin``: the
    twin's README section (predicted vs measured capacity) and its validation file, copied."""
    import yaml

    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = frozen["manifest"]
    files = []
    text = yaml.safe_dump(
        {"frozen_sha256": frozen["sha256"], **manifest}, sort_keys=False, width=100
    )
    write_text_atomic(out_dir / "workload-manifest.yaml", text)
    files.append(out_dir / "workload-manifest.yaml")
    files += [out_dir / "capacity.json", out_dir / "plan.json"]
    Capacity.parse(capacity, files[-2]).write(files[-2])
    Plan.parse(plan, files[-1]).write(files[-1])
    if selected_report is not None:
        files.append(out_dir / "slo-report.json")
        SloReport.parse(selected_report, files[-1]).write(files[-1])
    if selected_tables is not None and (selected_tables / "requests.csv").exists():
        with atomic_path(out_dir / "requests.csv") as tmp:
            shutil.copyfile(selected_tables / "requests.csv", tmp)
        files.append(out_dir / "requests.csv")
    inputs = PlotInputs(manifest, capacity, reports, series)
    for plot in (p for p in PLOTS if p.when is None or p.when(inputs)):
        plot.draw(inputs, out_dir / plot.name)
        files.append(out_dir / plot.name)
    for f in extra_files or []:
        if f.exists():
            with atomic_path(out_dir / f.name) as tmp:
                shutil.copyfile(f, tmp)
            files.append(out_dir / f.name)
    if failure is not None:
        # Written beside the README by the failure test: listed (and MLflow artifacts of the
        # parent run), not copied.
        written = ["failure-test.md", "failure-test.json"]
        written += [f"failure-timeline-{r['drill']}.png" for r in failure["drills"]]
        files += [out_dir / n for n in written if (out_dir / n).exists()]
    if shapes is not None:
        files += [out_dir / n for n in shapes[1] if (out_dir / n).exists()]
    if twin is not None:
        with atomic_path(out_dir / "twin-validation.json") as tmp:
            shutil.copyfile(twin[1], tmp)
        files.append(out_dir / "twin-validation.json")
    readme = render_readme(
        frozen,
        capacity,
        plan,
        selected_report,
        [f.name for f in files],
        failure,
        shapes[0] if shapes else None,
        sessions.readme_lines(reports),
        twin[0] if twin is not None else None,
    )
    write_text_atomic(out_dir / "README.md", readme)
    files.append(out_dir / "README.md")
    return files


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e3 else f"{v:,.0f}"
    return str(v)


def gate_sentence(acceptance: dict[str, Any]) -> str:
    """The pass rule of a rate in words: every gate the pack's acceptance turns on."""
    gates = Gates.of(acceptance)
    rules = [
        ", ".join(g.phrase.format(threshold=g.threshold(gates)) for g in gates.active(scope))
        for scope in ("class", "point")
    ]
    return (
        f"A rate passes when, in **every repeat**, every class has {rules[0]}, {rules[1]}, and the "
        "client kept its schedule (dispatch lateness under its bound)."
    )


@dataclass(kw_only=True)
class PackDocs:
    """The pack's documents a section reads: the frozen manifest, ``capacity.json``,
    ``plan.json``, the selected point's ``slo-report.json`` and ``failure-test.json`` (None where
    absent). The page's :class:`capacity_pack.decide.html.PackFiles` is one too."""

    frozen: dict[str, Any]
    capacity: dict[str, Any]
    plan: dict[str, Any]
    selected: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None

    @property
    def manifest(self) -> dict[str, Any]:
        return self.frozen["manifest"]


@dataclass(kw_only=True)
class Readme(PackDocs):
    """The README's documents: the pack's, its file names, and the sections other modules
    write (the load shapes', sessions by turn, the twin's), each with its own heading."""

    files: list[str]
    shapes: list[str] | None = None
    sessions: list[str] | None = None
    twin: list[str] | None = None


#: The README's sections, in order: each renders its lines under ``## title`` (None: lines
#: with their own heading); a render that returns None leaves its section out.
README_SECTIONS: Registry[Section] = Registry("README section", Section)


def section_lines(section: Section, docs: PackDocs) -> list[str]:
    """One section's Markdown lines, its heading first."""
    lines = section.render(docs)
    if lines is None:
        return []
    return [f"## {section.title}", "", *lines] if section.title else list(lines)


def render_readme(
    frozen: dict[str, Any],
    capacity: dict[str, Any],
    plan: dict[str, Any],
    selected: dict[str, Any] | None,
    files: list[str],
    failure: dict[str, Any] | None = None,
    shapes: list[str] | None = None,
    session_lines: list[str] | None = None,
    twin_lines: list[str] | None = None,
) -> str:
    """The pack's README.md: the sections of :data:`README_SECTIONS` in order, ``shapes``,
    ``session_lines`` (:mod:`capacity_pack.decide.sessions`) and ``twin_lines``
    (:mod:`capacity_pack.twin.validate`) among them as their modules wrote them."""
    docs = Readme(
        frozen=frozen, capacity=capacity, plan=plan, selected=selected, failure=failure,
        files=files, shapes=shapes, sessions=session_lines, twin=twin_lines,
    )  # fmt: skip
    return "\n".join(line for s in README_SECTIONS for line in section_lines(s, docs))


@README_SECTIONS.register("title", None, order=10)
def title_section(docs: PackDocs) -> list[str]:
    pack = docs.manifest["pack"]
    lines = [f"# Capacity pack: {pack['title']}", ""]
    if pack["size"] == "rehearsal":
        lines += [
            "> **REHEARSAL-SIZE PACK.** Its sample gates and durations are scaled down so the",
            "> whole pipeline runs in minutes; its numbers exercise the method and are **not a",
            "> capacity claim**.",
            "",
        ]
    return lines


def bracket_evidence(sel: dict[str, Any]) -> str:
    """What each end of a cache state's bracket showed, the resolution and the confidence:
    '34 RPS is shown to pass; 36 RPS fails: interactive TTFT (repeat 0); resolution 2 RPS
    reached; verdicts at 95 % confidence'. The detail after the decision sentence
    (:func:`capacity_pack.vocab.words.decision_sentence`, which states the bracket itself)."""
    b = sel["bracket"]
    lo, hi = b["pass_rps"], b["fail_rps"]
    ends = []
    if lo is not None:
        status = b.get("pass_status") or "pass"
        ends.append(
            rate_status_words(lo, status, b.get("pass_evidence") if status == "marginal" else None)
        )
    if hi is not None:
        status = b["fail_status"]
        why = (
            b.get("fail_evidence")
            if status in ("misses", "marginal") and b.get("fail_evidence")
            else b["fail_summary"] or "see its reports"
        )
        ends.append(rate_status_words(hi, status, why))
    if lo is None:
        return "; ".join(ends) or "no open-loop points"
    text = "; ".join(ends)
    res = b["resolution_rps"]
    if res is None:
        text += "; no search resolution declared (no `sweep.search`)" + (
            f": the width, {b['width_rps']:g} RPS, is the tested grid's step"
            if b["width_rps"] is not None else ""
        )  # fmt: skip
    elif b["reached"]:
        text += f"; resolution {res:g} RPS reached"
    elif b["reached"] is False:
        text += f"; resolution {res:g} RPS **not reached** (width {b['width_rps']:g} RPS)"
    else:
        text += f"; resolution {res:g} RPS (no upper end to measure the width against)"
    return text + f"; verdicts at {b['confidence'] * 100:g} % confidence"


def decision_headline(state: str, sel: dict[str, Any]) -> str:
    """A cache state's decision sentence in bold, then the evidence at its bracket's ends
    (:func:`bracket_evidence`): the README's and the HTML page's statement of a capacity."""
    b = sel.get("bracket") or {}
    sentence = decision_sentence(state, b.get("pass_rps"), b.get("fail_rps"), b.get("reached"))
    return f"**{sentence}.**" + (f" {bracket_evidence(sel)}." if b else "")


@README_SECTIONS.register("decision", "Decision", order=20)
def decision_section(docs: PackDocs) -> list[str]:
    m, capacity = docs.manifest, docs.capacity
    w = target_words(m)
    primary = capacity["primary_cache_state"]
    sel = capacity["open_loop"].get(primary, {})
    cap = sel.get("capacity_rps")
    headline = decision_headline(primary, sel)
    if cap is not None:
        goodput = sel["goodput_at_capacity_rps"]
        headline += (
            f" For {m['engine']['placement']['replicas']} replica(s) that is "
            f"**{sel['capacity_per_replica_rps']:g} RPS per replica** (the plan's figure). "
            f"Measured goodput at {cap:g} RPS: {fmt(goodput)} RPS (the least over its repeats), "
            f"i.e. {fmt(sel['goodput_per_gpu_rps'])} RPS per {w.unit} (goodput per {w.unit}"
            + (", DistServe's sense" if w.unit == "GPU" else "")
            + f", as measured; nominally {fmt(sel['capacity_per_gpu_nominal_rps'])})."
        )
    lines = [headline, "", *[f"- {s['decision']}" for s in capacity["open_loop"].values()], ""]
    if faults := capacity.get("measurement_faults"):
        lines += [
            "**Measurement faults** (results that contradict how a server works: the pack "
            "measured something besides the target; not findings):",
            "",
            *[f"- {f['message']}" for f in faults],
            "",
        ]
    if notes := capacity.get("measurement_notes"):
        lines += ["**Checks the brackets cannot settle** (at this resolution):", "",
                  *[f"- {n['message']}" for n in notes], ""]  # fmt: skip
    return lines


@README_SECTIONS.register("plan", "Replica plan", order=40)
def plan_section(docs: PackDocs) -> list[str] | None:
    m, plan = docs.manifest, docs.plan
    w = target_words(m)
    if plan.get("required_replicas") is None:
        return [plan["reason"], ""] if plan.get("reason") else None
    lines = [
        f"For a peak of **{m['plan']['peak_rps']:g} RPS** at a target utilization of "
        f"{plan['throughput']['target_utilization']:g}: "
        f"**{plan['required_replicas']} replicas, {plan['required_gpus']} {w.units}** "
        f"(bound by {plan['bound_by']}; {plan['throughput']['replicas_for_load']} replicas "
        f"for the load by throughput"
        + (f", {plan['memory']['replicas_for_memory']} by KV memory" if plan.get("memory")
           else "")
        + f", + {plan['throughput']['redundancy_replicas']} redundancy, "
        f"+ {plan['throughput']['warm_pool_replicas']} warm pool).",
        "",
        "required_replicas = ceil(peak_rps / (capacity_per_replica x target_utilization)); "
        "the memory bound comes from Little's Law (peak x P95 latency in flight) and KV bytes "
        "per request at the P95 context of the requests sent.",
        "",
        *tail_fit_sentences(plan),
    ]  # fmt: skip
    if plan.get("cost"):
        c = plan["cost"]
        price = m["plan"].get("price_per_gpu_hour")
        lines += [f"Cost, in the currency of plan.price_per_gpu_hour ({fmt(price)} per "
                  f"{w.unit}-hour): {fmt(c['cost_per_hour'])} per hour for "
                  f"{plan['required_gpus']} {w.units}; "
                  f"{fmt(c['cost_per_request'])} per successful request; "
                  f"{fmt(c['cost_per_task'])} per completed task.", ""]  # fmt: skip
    if plan.get("effective_bandwidth"):
        b = plan["effective_bandwidth"]
        lines += [f"Effective bandwidth (from the single-user TPOT): "
                  f"{fmt(b['effective_bandwidth_gbps'])} GB/s for "
                  f"{fmt(b['tokens_per_second'])} tokens/s at "
                  f"{fmt(b['bytes_per_token_gb'])} GB per token"
                  + (f"; MBU {fmt(b['mbu'])} of the spec" if b.get("mbu") else "") + ".",
                  ""]  # fmt: skip
    return lines


@README_SECTIONS.register("gates", "Gates", order=50)
def gates_section(docs: PackDocs) -> list[str]:
    m = docs.manifest
    return [
        gate_sentence(m["acceptance"]),
        "",
        "| class | TTFT cutoff (ms) | TPOT cutoff (ms) |",
        "|---|---:|---:|",
        *[f"| {c['name']} | {c['request_ttft_cutoff_ms']:g} | {c['request_tpot_cutoff_ms']:g} |"
          for c in m["workload"]],
        "",
    ]  # fmt: skip


@README_SECTIONS.register("verdict-words", "Verdict words", order=70)
def verdict_words_section(docs: PackDocs) -> list[str]:
    """What each verdict word in this README means (one repeat's, then a rate's)."""
    acc = docs.manifest["acceptance"]
    gate, conf = acc["class_slo_attainment_min"], acc.get("attainment_confidence", 0.95)
    return [
        "One measured repeat of a rate gets one verdict:",
        "",
        f"- **pass**: every class's attainment is proven >= {gate:g}: the lower end of its "
        f"{conf:.0%} confidence sequence is at or over the gate, on at least the minimum "
        "successful requests per class; the error rate is within its cap, the queue did not "
        "grow, and the client kept its schedule;",
        f"- **marginal**: every gate passes on its point estimate, but some class's attainment "
        f"is not proven >= {gate:g} at {conf:.0%} (too few requests to tell);",
        f"- **fail**: a gate fails on its point estimate, or some class's attainment is proven "
        f"under {gate:g} (the upper end of its confidence sequence is below the gate);",
        "- **inconclusive**: the measurement cannot decide: a class is under-sampled, the queue "
        "trend is undecided, or the client fell behind its schedule (client-bound: the client "
        "was measured, not the target).",
        "",
        "A rate's status is taken on its repeats pooled (each a different schedule seed: "
        "their requests together per class, their time blocks together for the design "
        "effect, one confidence sequence): **pass** when every class is shown to pass; "
        "**marginal** when every class meets the gate on the pooled estimate but some is not "
        "shown at the confidence; **misses** when some class is under the gate on the pooled "
        "estimate but not shown to fail (cannot decide at this sample size); **fail** when a "
        "class is shown to fail pooled or another gate failed in a repeat; **inconclusive** "
        "when no repeat is a server result, or when every class meets the gate but a repeat's "
        "queue trend is undecided or a class is under its sample gate even pooled. (Repeats "
        "analyzed before pooling: **inconsistent** when some pass and others do not.) "
        "The capacity is the highest rate meeting every gate on its pooled estimate "
        "(pass or marginal) with every lower rate meeting them; the highest rate shown to "
        "pass is given beside it.",
        "",
    ]


def _per_repeat(row: dict[str, Any], key: str) -> str:
    return " / ".join(fmt(p[key]) for p in row.get("per_repeat", [])) or "n/a"


def _cache_sources(capacity: dict[str, Any]) -> dict[str, Any] | None:
    """The first repeat's record of where the prefix-cache figures came from (one engine, one
    map: every repeat's is the same)."""
    for s in capacity["open_loop"].values():
        for r in s["rates"]:
            for p in r.get("per_repeat", []):
                if p.get("prefix_cache_sources"):
                    return p["prefix_cache_sources"]
    return None


@README_SECTIONS.register("evidence", "Evidence", order=80)
def evidence_section(docs: PackDocs) -> list[str]:
    capacity = docs.capacity
    lines = [
        "Per repeat (separated by /): the offered rate the schedule's measured requests arrived "
        "at (attempted / T) and the achieved rate (successful / T), T being the measured window "
        "(first measured send to last terminal event, the drain included). Ranges are min-max "
        "over the repeats.",
        "",
    ]
    sources = _cache_sources(capacity)
    if sources:
        lines += [
            "Prefix cache, per repeat: the server's hit rate "
            f"({sources.get('server') or 'not exposed by this engine'}) and the client's cached "
            f"share of prompt tokens ({sources.get('client') or 'not reported by this engine'}); "
            "n/a where the side has no figure.",
            "",
        ]
    for state, s in capacity["open_loop"].items():
        lines += [f"### Open loop, {state} cache", "",
                  "| nominal RPS | offered RPS | achieved RPS | server hit rate | client cached "
                  "share | status | verdicts | goodput RPS (mean, min-max) | limited by |",
                  "|---:|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in s["rates"]:
            g = r["variation"]["observed_goodput_rps"]
            why = r.get("failure_summary") or "; ".join(r["reasons"][:3]) or "-"
            verdicts = ", ".join(r["verdicts"])
            if aside := r.get("set_aside_repeats"):
                why = r.get("set_aside_why") or {}
                listed = ", ".join(f"{k} {why.get(str(k), 'client-bound')}" for k in aside)
                verdicts += f" (repeat {listed} set aside: decides nothing)"
            lines.append(
                f"| {r['offered_rps']:g} | {_per_repeat(r, 'offered_measured_rps')} | "
                f"{_per_repeat(r, 'achieved_rps')} | {_per_repeat(r, 'prefix_cache_hit_rate')} | "
                f"{_per_repeat(r, 'client_cached_token_fraction')} | {r['status']} | {verdicts} | "
                f"{fmt(g['mean'])} ({fmt(g['min'])}-{fmt(g['max'])}) | {why} |"
            )
        lines.append("")
    for state, cur in capacity["closed_loop"].items():
        op = cur["operating_point"]
        single = cur["single_user"]
        lines += [f"### Closed loop, {state} cache", ""]
        note = cur.get("operating_point_note")
        lines.append(
            f"Operating point: concurrency {op['concurrency']} at "
            f"{fmt(op['output_throughput_tps'])} output tokens/s, the highest throughput "
            "meeting every class's attainment gate"
            + (f": {note}." if note else ".") if op else
            "No concurrency level met the latency gates."
        )  # fmt: skip
        if single:
            ttft = ", ".join(f"{k} {fmt(v)} ms" for k, v in single["p95_ttft_ms"].items())
            tpot = ", ".join(f"{k} {fmt(v)} ms" for k, v in single["p95_tpot_ms"].items())
            lines.append(f"Single user (concurrency 1): P95 TTFT {ttft}; P95 TPOT {tpot}.")
        lines.append("")
    return lines


@README_SECTIONS.register("selected", "The selected point", order=120)
def selected_section(docs: PackDocs) -> list[str] | None:
    selected = docs.selected
    if selected is None:
        return None
    return [
        f"`slo-report.json` and `requests.csv` are point `{selected['key']}` "
        f"(verdict {selected['verdict']}): {selected['attempted']} attempted, "
        f"{selected['successful']} successful, error rate {fmt(selected['error_rate'])}, "
        f"observed goodput {fmt(selected['observed_goodput_rps'])} RPS, queue trend "
        f"{selected['queue_trend']}, prefix-cache hit rate "
        f"{fmt(selected.get('prefix_cache_hit_rate'))}.",
        "",
        *selected_lines(selected),
    ]


@README_SECTIONS.register("failure-answer", "When a replica fails", order=30)
def failure_answer_section(docs: PackDocs) -> list[str] | None:
    """The second headline question, answered for the recommended plan, then one line per
    mechanism drill."""
    failure = docs.failure
    if failure is None:
        return None
    lines: list[str] = []
    plan = failure.get("plan_drill")
    if plan is not None:
        lines.append(f"**{plan['sentence']}.**")
        if plan.get("why_fail"):
            lines.append(f"Why: {'; '.join(plan['why_fail'])}.")
        if plan.get("execution"):
            lines.append(
                f"Run {plan['execution']} ({plan.get('execution_reason')}); the verdict's "
                "checks, their numbers and `failure-timeline-plan_replica_kill.png` are in "
                "`failure-test.md`."
            )
        lines.append("")
    mechanism = failure["summary"].get("mechanism_lines") or []
    if mechanism:
        lines += [
            "Mechanism tests (replicas behind the router at the selected capacity per replica, "
            "not the plan):",
            "",
            *[f"- {line}" for line in mechanism],
            "",
        ]
    return lines


@README_SECTIONS.register("failure-test", "Failure test, alerts and dashboard", order=130)
def failure_section(docs: PackDocs) -> list[str] | None:
    m = docs.manifest
    if not m.get("failure"):
        return None
    drills = ", ".join(f"`{d['name']}` ({d['kind']})" for d in m["failure"]["drills"])
    plan = (m["failure"].get("plan_drill") or {}).get("enabled", True)
    return [
        "`failure-test.md` (and `failure-test.json`) hold "
        + (
            "the plan drill (one replica of the recommended fleet killed at the planned peak, "
            "with its N+1 verdict) and "
            if plan
            else ""
        )
        + f"the mechanism drills {drills}, each run "
        "against replicas behind the router at the selected capacity point: injection, "
        "detection, router removal, errors, queue and recovery on one clock, and which "
        "alerts fired; `failure-timeline-<drill>.png` draws each over time. "
        "`alerts/alert-rules.yaml` holds the Prometheus alerting rules the "
        "drills were judged by; `dashboard/grafana-dashboard.json` is an importable Grafana "
        "dashboard of the same signals.",
        "",
    ]


@README_SECTIONS.register("limits", "Limits", order=140)
def limits_section(docs: PackDocs) -> list[str]:
    m = docs.manifest
    return [
        "- The capacity holds only for this workload mix, cache state, placement, engine "
        "configuration and scaling regime; the per-replica figure is not a universal constant.",
        "- The replica plan assumes linear scaling: validate the planned topology with a live "
        "benchmark before procurement (load balancing, network paths and cache locality can "
        "prevent it).",
        "- Percentiles are nearest-rank; P99 is withheld below "
        f"{m['acceptance']['p99_min_samples']} successful requests per class, and the "
        "2,000/10,000 sample thresholds are reporting policies, not statistical guarantees.",
        f"- Target: {m['target']['kind']}"
        + (f" (simulated engine, profile `{m['target']['profile']}`): latencies come from a "
           "performance model, not hardware." if m["target"]["kind"] == "sim" else "."),
        "",
    ]  # fmt: skip


@README_SECTIONS.register("files", "Files", order=150)
def files_section(docs: Readme) -> list[str]:
    return [
        *[f"- `{f}`" for f in docs.files],
        "",
        f"Frozen manifest sha256 `{docs.frozen['sha256']}`.",
        "",
    ]


# The sections other modules write, each with its own heading.
README_SECTIONS.register("workload-lengths", None, order=60)(lambda d: manifest_lines(d.frozen))
README_SECTIONS.register("twin", None, order=90)(lambda d: d.twin)
README_SECTIONS.register("shapes", None, order=100)(lambda d: d.shapes)
README_SECTIONS.register("sessions", None, order=110)(lambda d: d.sessions)


def load_reports(paths: list[Path]) -> list[dict[str, Any]]:
    return [SloReport.read(p).dump() for p in paths]


def selected_point(
    capacity: dict[str, Any], reports: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The report of the selected capacity point (primary cache state, repeat 0); without a
    capacity, the lowest tested rate, so the pack still shows why it failed."""
    state = capacity["primary_cache_state"]
    sel = capacity["open_loop"].get(state)
    if not sel or not sel["rates"]:
        return None
    rate = (
        sel["capacity_rps"] if sel["capacity_rps"] is not None else sel["rates"][0]["offered_rps"]
    )
    candidates = [
        r for r in reports
        if r.get("mode") == "open" and r["cache_state"] == state and r["offered_rps"] == rate
    ]  # fmt: skip
    return min(candidates, key=lambda r: r["repeat"]) if candidates else None
