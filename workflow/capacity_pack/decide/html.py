"""The capacity pack as one page: ``pack/index.html``.

One self-contained HTML file (inline CSS, every plot embedded as a base64 PNG data URI, no
script, nothing fetched), built only from the pack's own files, so the page and the files it
summarizes never disagree. In order:

1. the decision (``capacity.json``), first and above every plot;
2. the capacity bracket of each cache state and the throughput plot that shades it;
3. the replica plan (``plan.json``);
4. the failure answer: the plan drill's N+1 verdict and each mechanism drill's line
   (``failure-test.json``), with every drill's timeline picture;
5. the gates and the SLO cutoffs per class;
6. the evidence per measured point, one folded ``<details>`` each (its ``slo-report.json``): the
   verdict and its reasons, rates, goodput, queue trend and prefix-cache hit rate, then per
   class the attainment with its confidence bound, P95 TTFT and TPOT against the cutoffs, errors;
   then each load-shape experiment's question and answer with its picture (``shapes.json``);
7. cold against warm cache: capacity, goodput and hit rates side by side, the per-repeat tables,
   the closed loop and the server signals over time;
8. the full failure test and the performance autopsy (``failure-test.md``, ``autopsy.md``),
   folded;
9. the definitions of every verdict word and of every metric the page shows (each table header
   links to its definition);
10. the limits, and the pack's files.

The sentences are the README's (the section builders of :mod:`capacity_pack.decide.report`,
rendered from their Markdown), so the README and the page state one decision in one wording:
each cache state's capacity is the decision sentence
(:func:`capacity_pack.vocab.words.decision_sentence`), each verdict word is
:data:`capacity_pack.vocab.words.STATUS_WORDS`' and each metric is defined in
:mod:`capacity_pack.decide.glossary`. The page shell (doctype, viewport, ``<main>``, the shared
CSS, escaping) is :mod:`capacity_pack.decide.page`'s, as compare's page's. Presentation only:
no measurement imports this module.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capacity_pack.decide import sessions
from capacity_pack.decide import shapes as load_shapes
from capacity_pack.decide.glossary import METRICS
from capacity_pack.decide.page import escape, page
from capacity_pack.decide.report import (
    decision_headline,
    decision_section,
    evidence_section,
    failure_answer_section,
    failure_section,
    fmt,
    gates_section,
    limits_section,
    plan_section,
    selected_section,
    title_section,
    verdict_words_section,
)
from capacity_pack.io import write_text_atomic
from capacity_pack.plan.words import target_words
from capacity_pack.vocab.words import STATUS_WORDS

#: What each plot of the pack answers, and the section it belongs to (failure timelines:
#: ``failure-timeline-<drill>.png``, in the failure section).
PLOTS = {
    "throughput.png": (
        "bracket",
        "How much load is served within the SLOs? Goodput and achieved request rate by offered "
        "rate, each cache state's capacity bracket shaded from its highest passing rate (solid "
        "line) to the next rate up (dashed).",
    ),
    "attainment.png": (
        "evidence",
        "Which rates keep every class within its SLO? Each class's joint TTFT+TPOT attainment "
        "per repeat with its confidence bound, against the gate.",
    ),
    "latency.png": (
        "evidence",
        "P95 TTFT and P95 TPOT per class and repeat against the class's cutoffs.",
    ),
    "closed_loop.png": (
        "cache",
        "How far can concurrency go within the SLOs? The worst class's P95 TTFT and TPOT as a "
        "share of its cutoff against output throughput, cold and warm, the operating point "
        "circled.",
    ),
    "timeseries.png": (
        "cache",
        "The server's queue depth, running requests and KV usage over time, one panel per "
        "open-loop point.",
    ),
    "sessions.png": (
        "cache",
        "Multi-turn sessions: the prefix-cache hit rate and P95 TTFT by turn index, cold and warm.",
    ),
}


#: The pack page's own rules, after the shell's (:data:`capacity_pack.decide.page.BASE_CSS`).
_CSS = """
blockquote { margin:.6rem 0; padding:.5rem .9rem; background:#fff4d6;
  border-left:4px solid #e0a800; }
blockquote p { margin:0; }
.decision { font-size:1.12rem; padding:.9rem 1.1rem; background:#eef4ff;
  border-left:5px solid var(--accent); border-radius:4px; }
.decision p { margin:0; }
.label { color:var(--muted); }
nav { margin:1rem 0; font-size:.92rem; }
nav a { margin-right:.9rem; white-space:nowrap; }
.scroll { overflow-x:auto; }
th a { color:inherit; text-decoration-style:dotted; }
td.num { text-align:right; font-variant-numeric:tabular-nums; }
.over { color:#b00020; font-weight:600; }
.v { display:inline-block; padding:0 .45rem; border-radius:3px; font-weight:600; font-size:.85rem; }
.v-pass { background:#d8f3dc; color:#1b5e20; }
.v-marginal { background:#fff1c2; color:#7a5200; }
.v-fail { background:#fde0e0; color:#9b1c1c; }
.v-inconsistent { background:#ece0fb; color:#4a2a7a; }
.v-misses { background:#fde2cf; color:#7a3300; }
.v-inconclusive { background:#e6e8ec; color:#333; }
figure { margin:1rem 0 1.4rem; }
figure img { display:block; max-width:100%; height:auto; border:1px solid var(--line);
  background:#fff; }
figcaption { color:var(--muted); font-size:.88rem; margin-top:.3rem; }
details { border:1px solid var(--line); border-radius:4px; margin:.35rem 0; background:#fff; }
details > summary { cursor:pointer; padding:.35rem .6rem; }
details[open] > summary { border-bottom:1px solid var(--line); }
details > .body { padding:.3rem .8rem .6rem; }
dl.defs dt { font-weight:600; margin-top:.5rem; }
dl.defs dd { margin:0 0 0 1.2rem; }
"""


@dataclass
class PackFiles:
    """What the page is built from: the pack folder's documents (None where absent) and the
    per-point SLO reports."""

    folder: Path
    frozen: dict[str, Any]
    capacity: dict[str, Any]
    plan: dict[str, Any]
    reports: list[dict[str, Any]]
    selected: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None
    failure_md: str | None = None
    autopsy: dict[str, Any] | None = None
    autopsy_md: str | None = None
    plots: dict[str, bytes] = field(default_factory=dict)

    @property
    def manifest(self) -> dict[str, Any]:
        return self.frozen["manifest"]


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _text(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def load_pack(folder: str | Path, reports: Iterable[str | Path] = ()) -> PackFiles:
    """The pack folder's files and the given per-point ``slo-report.json`` files (none given:
    the selected point's report in the folder, where there is one)."""
    import yaml

    folder = Path(folder)
    manifest = yaml.safe_load((folder / "workload-manifest.yaml").read_text())
    sha = manifest.pop("frozen_sha256", None)
    selected = _json(folder / "slo-report.json")
    docs = [json.loads(Path(p).read_text()) for p in reports]
    return PackFiles(
        folder=folder,
        frozen={"sha256": sha, "manifest": manifest},
        capacity=json.loads((folder / "capacity.json").read_text()),
        plan=json.loads((folder / "plan.json").read_text()),
        reports=docs or ([selected] if selected else []),
        selected=selected,
        failure=_json(folder / "failure-test.json"),
        failure_md=_text(folder / "failure-test.md"),
        autopsy=_json(folder / "autopsy.json"),
        autopsy_md=_text(folder / "autopsy.md"),
        plots={p.name: p.read_bytes() for p in sorted(folder.glob("*.png"))},
    )


# --- Markdown and small HTML pieces ------------------------------------------------------------


@functools.cache
def _markdown_parser():
    from markdown_it import MarkdownIt

    # Raw HTML in the Markdown is escaped, never passed through: the pack's texts hold values
    # from the target (model names, error messages).
    return MarkdownIt("commonmark", {"html": False}).enable("table")


def markdown(text: str, *, shift: int = 0) -> str:
    """``text`` (the pack's Markdown) as HTML, headings ``shift`` levels deeper (at most h6);
    wide tables scroll on their own."""
    parser = _markdown_parser()
    tokens = parser.parse(text)
    for tok in tokens:
        if tok.type in ("heading_open", "heading_close") and shift:
            tok.tag = f"h{min(6, int(tok.tag[1]) + shift)}"
    out = parser.renderer.render(tokens, parser.options, {})
    return out.replace("<table>", '<div class="scroll"><table>').replace(
        "</table>", "</table></div>"
    )


def _body(lines: Sequence[str]) -> str:
    """A README section's Markdown without its ``## heading``, as one string."""
    lines = list(lines)
    while lines and (lines[0].startswith("## ") or not lines[0].strip()):
        lines.pop(0)
    return "\n".join(lines)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def verdict_badge(word: Any) -> str:
    w = str(word or "n/a")
    cls = f"v-{w}" if w in STATUS_WORDS else "v-inconclusive"
    return f'<span class="v {cls}">{escape(w)}</span>'


def _th(key: str, label: str | None = None) -> str:
    """A column header linked to its metric's definition."""
    return f'<th scope="col"><a href="#def-{key}">{escape(label or METRICS[key][0])}</a></th>'


def _num(v: Any, over: bool = False) -> str:
    cls = "num over" if over else "num"
    return f'<td class="{cls}">{escape(fmt(v))}</td>'


def _section(sid: str, title: str, *parts: str) -> str:
    inner = "\n".join(p for p in parts if p)
    return f'<section id="{sid}">\n<h2>{escape(title)}</h2>\n{inner}\n</section>'


def figure(name: str, data: bytes, caption: str) -> str:
    """One plot, embedded: the page needs no file beside it."""
    alt = f"{name}: {caption}"
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return (
        f'<figure id="fig-{_slug(name)}"><img src="{uri}" alt="{escape(alt)}">'
        f"<figcaption><code>{escape(name)}</code>: {escape(caption)}</figcaption></figure>"
    )


# --- The sections ------------------------------------------------------------------------------


def _decision(p: PackFiles) -> str:
    body = _body(decision_section(p.manifest, p.capacity))
    head, _, rest = body.partition("\n\n")
    return _section(
        "decision",
        "Decision",
        f'<div class="decision" id="decision-sentence">{markdown(head)}</div>',
        markdown(rest),
    )


def _nav() -> str:
    links = [
        ("bracket", "Bracket"),
        ("plan", "Plan"),
        ("failure", "When a replica fails"),
        ("gates", "Gates"),
        ("evidence", "Evidence per point"),
        ("shapes", "Load shapes"),
        ("cache", "Cold vs warm"),
        ("failure-test", "Failure test"),
        ("autopsy", "Autopsy"),
        ("definitions", "Definitions"),
        ("limits", "Limits"),
        ("files", "Files"),
    ]
    return "<nav>" + "".join(f'<a href="#{a}">{escape(t)}</a>' for a, t in links) + "</nav>"


def _bracket(p: PackFiles, figures: str) -> str:
    unit = target_words(p.manifest).unit
    head = "".join(
        [
            _th("cache_state"),
            _th("capacity"),
            _th("next_rate_up"),
            _th("status", "its status"),
            _th("width"),
            _th("resolution"),
            _th("resolution", "reached"),
            _th("confidence"),
            _th("per_replica"),
            _th("goodput_per_unit", f"goodput per {unit}"),
        ]
    )
    rows, sentences = [], []
    for state, sel in p.capacity["open_loop"].items():
        b = sel.get("bracket") or {}
        rows.append(
            f"<tr><td>{escape(state)}</td>"
            + _num(b.get("pass_rps"))
            + _num(b.get("fail_rps"))
            + f"<td>{verdict_badge(b['fail_status']) if b.get('fail_status') else 'n/a'}</td>"
            + _num(b.get("width_rps"))
            + _num(b.get("resolution_rps"))
            + f"<td>{escape(fmt(b.get('reached')))}</td>"
            + _num(b.get("confidence"))
            + _num(sel.get("capacity_per_replica_rps"))
            + _num(sel.get("goodput_per_gpu_rps"))
            + "</tr>"
        )
        if sel.get("bracket"):
            sentences.append(f"- {decision_headline(state, sel)}")
    table = (
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )
    return _section(
        "bracket", "The capacity bracket", markdown("\n".join(sentences)), table, figures
    )


def _plan(p: PackFiles) -> str:
    body = _body(plan_section(p.manifest, p.plan))
    return _section("plan", "Replica plan", markdown(body or "No replica plan in this pack."))


def _failure(p: PackFiles, figures: str) -> str:
    if p.failure is None:
        return _section(
            "failure", "When a replica fails", "<p>This pack ran no failure drills.</p>"
        )
    answer = _body(failure_answer_section(p.failure))
    rest = _body(failure_section(p.manifest))
    return _section("failure", "When a replica fails", markdown(answer), markdown(rest), figures)


def _gates(p: PackFiles) -> str:
    return _section("gates", "Gates", markdown(_body(gates_section(p.manifest))))


def _point_order(r: dict[str, Any]) -> tuple:
    mode = {"open": 0, "closed": 1}.get(r.get("mode"), 2)
    return (mode, r.get("offered_rps") or r.get("concurrency") or 0, r.get("point"), r["repeat"])


def point_details(r: dict[str, Any], *, selected: bool = False) -> str:
    """One measured point, folded: the summary line says its verdict, rate, goodput and hit
    rate; opened, its figures and every class's numbers."""
    key = r.get("key") or f"{r.get('point')}/{r.get('cache_state')}/rep{r.get('repeat')}"
    if r.get("mode") == "closed":
        load = f"concurrency {fmt(r.get('concurrency'))}"
    else:
        load = f"{fmt(r.get('offered_rps'))} RPS nominal"
    goodput = fmt(r.get("observed_goodput_rps"))
    summary = (
        f"{verdict_badge(r.get('verdict'))} <strong>{escape(key)}</strong>"
        f' <span class="label">{escape(load)}; goodput {escape(goodput)} '
        f"RPS; server hit rate {escape(fmt(r.get('prefix_cache_hit_rate')))}"
        + ("; the selected point" if selected else "")
        + "</span>"
    )
    point_rows = [
        ("attempted", r.get("attempted"), "requests"),
        ("successful", r.get("successful"), "requests"),
        ("error_rate", r.get("error_rate"), "of attempts"),
        ("offered_rps", r.get("offered_rate_rps"), "RPS"),
        ("achieved_rps", r.get("request_throughput_rps"), "RPS"),
        ("goodput", r.get("observed_goodput_rps"), "RPS"),
        ("output_throughput", r.get("output_throughput_tps"), "tokens/s"),
        ("measured_window", r.get("measured_window_s"), "s"),
        ("queue_trend", r.get("queue_trend"), ""),
        ("server_hit_rate", r.get("prefix_cache_hit_rate"), "of prompt tokens"),
        ("client_cached_share", r.get("client_cached_token_fraction"), "of prompt tokens"),
    ]
    facts = "".join(
        f'<tr><th scope="row"><a href="#def-{k}">{escape(METRICS[k][0])}</a></th>'
        f'{_num(v)}<td class="label">{escape(unit)}</td></tr>'
        for k, v, unit in point_rows
    )
    reasons = r.get("verdict_reasons") or []
    why = (
        "<p>Why not a pass:</p><ul>" + "".join(f"<li>{escape(x)}</li>" for x in reasons) + "</ul>"
        if reasons
        else ""
    )
    return (
        f'<details class="point" id="point-{_slug(key)}" data-key="{escape(key)}">'
        f"<summary>{summary}</summary>"
        f'<div class="body"><table class="facts"><tbody>{facts}</tbody></table>{why}'
        f"{_class_table(r)}</div></details>"
    )


def _class_table(r: dict[str, Any]) -> str:
    """A point's per-class numbers: counts, attainment and its bound, P95s against the cutoffs."""
    head = "".join(
        [
            '<th scope="col">class</th>',
            _th("attempted"),
            _th("successful"),
            _th("attainment"),
            _th("attainment_bound"),
            _th("all_attempt_attainment"),
            _th("p95", "P95 TTFT ms"),
            _th("cutoff", "TTFT cutoff ms"),
            _th("p95", "P95 TPOT ms"),
            _th("cutoff", "TPOT cutoff ms"),
            _th("p95", "P99 TTFT ms"),
            _th("class_error_rate"),
            _th("class_pass"),
        ]
    )
    rows = []
    for name, c in (r.get("classes") or {}).items():
        ci = c.get("attainment_ci") or [None, None]
        ttft, tpot = c.get("p95_ttft_ms"), c.get("p95_tpot_ms")
        ttft_cut, tpot_cut = c.get("request_ttft_cutoff_ms"), c.get("request_tpot_cutoff_ms")
        passed = c.get("class_slo_pass")
        rows.append(
            f'<tr class="class-row" data-class="{escape(name)}"><td>{escape(name)}</td>'
            + _num(c.get("attempted"))
            + _num(c.get("successful_count"))
            + _num(c.get("attainment"))
            + f'<td class="num">{escape(fmt(ci[0]))} to {escape(fmt(ci[1]))}</td>'
            + _num(c.get("all_attempt_attainment"))
            + _num(ttft, over=None not in (ttft, ttft_cut) and ttft > ttft_cut)
            + _num(ttft_cut)
            + _num(tpot, over=None not in (tpot, tpot_cut) and tpot > tpot_cut)
            + _num(tpot_cut)
            + _num(c.get("p99_ttft_ms"))
            + _num(c.get("error_rate"))
            + f"<td>{'yes' if passed else 'no' if passed is not None else 'n/a'}</td></tr>"
        )
    return (
        f'<div class="scroll"><table class="classes"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _evidence(p: PackFiles, figures: str) -> str:
    selected_key = (p.selected or {}).get("key")
    parts = [
        "<p>Every measured point, one line each: open a point for its numbers. A point's "
        'verdict is defined under <a href="#definitions">Definitions</a>.</p>'
    ]
    for state in sorted({r["cache_state"] for r in p.reports}, key=lambda s: s != "cold"):
        points = sorted((r for r in p.reports if r["cache_state"] == state), key=_point_order)
        parts.append(f"<h3>{escape(state.capitalize())} cache</h3>")
        parts += [point_details(r, selected=r.get("key") == selected_key) for r in points]
    if p.selected is not None:
        parts.append(markdown("\n".join(selected_section(p.selected)), shift=1))
    return _section("evidence", "Evidence per point", *parts, figures)


def _shapes(p: PackFiles) -> str:
    """Each load-shape experiment's question, answers and picture (``shapes.json``)."""
    doc = _json(p.folder / "shapes.json")
    lines = load_shapes.readme_lines(doc)
    if not lines:
        return _section("shapes", "Load shapes", "<p>This pack ran no load-shape experiments.</p>")
    parts = [markdown("\n".join(lines[2:4]))]
    for e in doc["experiments"]:
        parts.append(markdown("\n".join(load_shapes.experiment_lines(e))))
        if e["plot"] in p.plots:
            parts.append(figure(e["plot"], p.plots[e["plot"]], e["question"]))
    return _section("shapes", "Load shapes", *parts)


def _mean(values: Iterable[Any]) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float))]
    return sum(vals) / len(vals) if vals else None


def _cache(p: PackFiles, figures: str) -> str:
    open_loop = p.capacity["open_loop"]
    states = list(open_loop)
    head = "".join(
        [
            _th("cache_state"),
            _th("capacity"),
            _th("goodput", "goodput at capacity"),
            _th("server_hit_rate", "server hit rate (mean over its points)"),
            _th("client_cached_share", "client cached share (mean)"),
        ]
    )
    rows = []
    for state, sel in open_loop.items():
        per = [x for r in sel["rates"] for x in r.get("per_repeat", [])]
        rows.append(
            f"<tr><td>{escape(state)}</td>"
            + _num(sel.get("capacity_rps"))
            + _num(sel.get("goodput_at_capacity_rps"))
            + _num(_mean(x.get("prefix_cache_hit_rate") for x in per))
            + _num(_mean(x.get("client_cached_token_fraction") for x in per))
            + "</tr>"
        )
    summary = (
        f'<div class="scroll"><table id="cache-summary"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )
    by_rate: dict[float, dict[str, dict[str, Any]]] = {}
    for state, sel in open_loop.items():
        for r in sel["rates"]:
            by_rate.setdefault(r["offered_rps"], {})[state] = r
    head = _th("nominal_rps") + "".join(
        _th("status", f"{s} status")
        + _th("goodput", f"{s} goodput (mean)")
        + _th("server_hit_rate", f"{s} server hit rate")
        + _th("client_cached_share", f"{s} client cached share")
        for s in states
    )
    rows = []
    for rate in sorted(by_rate):
        cells = _num(rate)
        for s in states:
            r = by_rate[rate].get(s)
            if r is None:
                cells += "<td>not tested</td><td></td><td></td><td></td>"
                continue
            per = r.get("per_repeat", [])
            cells += (
                f"<td>{verdict_badge(r['status'])}</td>"
                + _num(r["variation"]["observed_goodput_rps"]["mean"])
                + _num(_mean(x.get("prefix_cache_hit_rate") for x in per))
                + _num(_mean(x.get("client_cached_token_fraction") for x in per))
            )
        rows.append(f"<tr>{cells}</tr>")
    side = (
        f'<div class="scroll"><table id="cache-by-rate"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )
    per_repeat = markdown(_body(evidence_section(p.capacity)), shift=1)
    by_turn = sessions.readme_lines(p.reports)
    return _section(
        "cache",
        "Cold vs warm cache",
        "<p>The same rates measured with an empty prefix cache (cold) and with the pack's "
        "shared prefixes cached (warm): what the cache buys, and how often it hit.</p>",
        summary,
        side,
        "<h3>Per repeat and closed loop</h3>",
        per_repeat,
        markdown("\n".join(by_turn), shift=1) if by_turn else "",
        figures,
    )


def _folded(sid: str, title: str, text: str | None, absent: str) -> str:
    if text is None:
        return _section(sid, title, f"<p>{escape(absent)}</p>")
    return _section(
        sid,
        title,
        f'<details id="{sid}-full"><summary>Open the full text</summary>'
        f'<div class="body">{markdown(text, shift=2)}</div></details>',
    )


def _autopsy(p: PackFiles) -> str:
    """Where the run's wall clock went (the autopsy's buckets), then the whole autopsy, folded."""
    section = _folded(
        "autopsy",
        "Performance autopsy",
        p.autopsy_md,
        "No autopsy in this pack (the autopsy job writes autopsy.md).",
    )
    buckets = ((p.autopsy or {}).get("run") or {}).get("buckets") or {}
    rows = "".join(
        f"<tr><td>{escape(b.get('bucket'))}</td>{_num(b.get('seconds'))}{_num(b.get('share'))}"
        f"<td>{escape(b.get('provenance'))}</td><td>{escape(b.get('contributors') or '')}</td></tr>"
        for b in buckets.get("rows") or []
    )
    if not rows:
        return section
    table = (
        "<p>The run's wall clock by bucket (the critical path's split; autopsy.md defines "
        "each bucket and each provenance word):</p>"
        '<div class="scroll"><table id="autopsy-buckets"><thead><tr><th scope="col">bucket</th>'
        '<th scope="col">seconds</th><th scope="col">share</th><th scope="col">provenance</th>'
        '<th scope="col">largest contributors</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></div>"
    )
    return section.replace("</h2>\n", "</h2>\n" + table + "\n", 1)


def _definitions(p: PackFiles) -> str:
    verdicts = markdown(_body(verdict_words_section(p.manifest)))
    metrics = "".join(
        f'<dt id="def-{k}">{escape(term)}</dt><dd>{escape(text)}</dd>'
        for k, (term, text) in METRICS.items()
    )
    return _section(
        "definitions",
        "Definitions",
        '<h3 id="verdict-words">Verdict words</h3>',
        verdicts,
        '<h3 id="metrics">Metrics</h3>',
        f'<dl class="defs">{metrics}</dl>',
    )


def _limits(p: PackFiles) -> str:
    return _section("limits", "Limits", markdown(_body(limits_section(p.manifest))))


def _files(p: PackFiles) -> str:
    names = sorted(
        x.relative_to(p.folder).as_posix()
        for x in p.folder.rglob("*")
        if x.is_file() and x.name != "index.html" and not x.name.startswith(".")
    )
    items = "".join(f'<li><a href="{escape(n)}">{escape(n)}</a></li>' for n in names)
    return _section(
        "files",
        "Files",
        f"<p>Beside this page in the pack folder (relative links):</p><ul>{items}</ul>",
        f"<p>Frozen manifest sha256 <code>{escape(p.frozen.get('sha256'))}</code>.</p>",
    )


def render_page(p: PackFiles) -> str:
    """The whole page, as one string."""
    placed: dict[str, list[str]] = {"bracket": [], "evidence": [], "cache": [], "failure": []}
    other = []
    for name, data in p.plots.items():
        if name in PLOTS:
            where, caption = PLOTS[name]
            placed[where].append(figure(name, data, caption))
        elif name.startswith("shape-"):
            continue  # in the load-shapes section, beside its answer
        elif name.startswith("failure-timeline-"):
            drill = name.removeprefix("failure-timeline-").removesuffix(".png")
            placed["failure"].append(
                figure(name, data, f"Drill {drill} over time: injection, errors, queue, recovery.")
            )
        else:
            other.append(figure(name, data, "A plot of the pack."))
    figs = {k: "\n".join(v) for k, v in placed.items()}
    m = p.manifest
    title = m["pack"]["title"]
    banner = "\n".join(title_section(m["pack"])[1:])
    body = [
        f"<header><h1>Capacity pack: {escape(title)}</h1>{markdown(banner)}</header>",
        _decision(p),
        _nav(),
        _bracket(p, figs["bracket"]),
        _plan(p),
        _failure(p, figs["failure"]),
        _gates(p),
        _evidence(p, figs["evidence"]),
        _shapes(p),
        _cache(p, figs["cache"]),
        _folded("failure-test", "Failure test in full", p.failure_md, "No failure drills ran."),
        _autopsy(p),
        _definitions(p),
        _limits(p),
        _section("other-figures", "Other figures", *other) if other else "",
        _files(p),
    ]
    return page(f"Capacity pack: {title}", "\n".join(b for b in body if b), _CSS)


def write_page(
    folder: str | Path, reports: Iterable[str | Path] = (), out: str | Path | None = None
) -> Path:
    """Write ``index.html`` (or ``out``) for the pack in ``folder``; returns its path."""
    pack = load_pack(folder, reports)
    path = Path(out) if out is not None else pack.folder / "index.html"
    write_text_atomic(path, render_page(pack))
    return path
