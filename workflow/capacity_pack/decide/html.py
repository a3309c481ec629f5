"""The capacity pack as one page: ``pack/index.html``.

One self-contained HTML file (inline CSS, plots as base64 PNG data URIs, no script, nothing
fetched), built only from the pack's own files. Its sections are :data:`PAGE_SECTIONS`, in
order; each plot of :data:`capacity_pack.decide.plots.PLOTS` shows in the section it names (an
unregistered PNG under "Other figures"). Its sentences are the README's
(:mod:`capacity_pack.decide.report`), its definitions :mod:`capacity_pack.decide.glossary`'s, its
shell :mod:`capacity_pack.decide.page`'s. Presentation only: no measurement imports this module.
Docs: docs/reading.md, "index.html"; a new section: docs/architecture.md, "Where to change…".
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capacity_pack.artifacts import Artifact, Capacity, FailureTest, Plan, SloReport
from capacity_pack.decide import sessions
from capacity_pack.decide import shapes as load_shapes
from capacity_pack.decide.glossary import METRICS
from capacity_pack.decide.page import escape, page
from capacity_pack.decide.plots import PLOTS
from capacity_pack.decide.registry import Registry, Section
from capacity_pack.decide.report import (
    README_SECTIONS,
    PackDocs,
    decision_headline,
    decision_section,
    evidence_section,
    failure_answer_section,
    failure_section,
    fmt,
    gates_section,
    limits_section,
    plan_section,
    section_lines,
    title_section,
    verdict_words_section,
)
from capacity_pack.io import write_text_atomic
from capacity_pack.plan.words import target_words
from capacity_pack.vocab.words import STATUS_WORDS

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


@dataclass(kw_only=True)
class PackFiles(PackDocs):
    """What the page is built from: the pack folder's documents (None where absent) and the
    per-point SLO reports."""

    folder: Path
    reports: list[dict[str, Any]]
    failure_md: str | None = None
    autopsy: dict[str, Any] | None = None
    autopsy_md: str | None = None
    plots: dict[str, bytes] = field(default_factory=dict)


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _artifact(model: type[Artifact], path: Path) -> dict[str, Any] | None:
    return model.read(path).dump() if path.is_file() else None


def _text(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def load_pack(folder: str | Path, reports: Iterable[str | Path] = ()) -> PackFiles:
    """The pack folder's files and the given per-point ``slo-report.json`` files (none given:
    the selected point's report in the folder, where there is one)."""
    import yaml

    folder = Path(folder)
    manifest = yaml.safe_load((folder / "workload-manifest.yaml").read_text())
    sha = manifest.pop("frozen_sha256", None)
    selected = _artifact(SloReport, folder / "slo-report.json")
    docs = [SloReport.read(p).dump() for p in reports]
    return PackFiles(
        folder=folder,
        frozen={"sha256": sha, "manifest": manifest},
        capacity=Capacity.read(folder / "capacity.json").dump(),
        plan=Plan.read(folder / "plan.json").dump(),
        reports=docs or ([selected] if selected else []),
        selected=selected,
        failure=_artifact(FailureTest, folder / "failure-test.json"),
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


def _md(lines: list[str] | None) -> str:
    """A README section's Markdown lines (no heading) as one string."""
    return "\n".join(lines or [])


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def verdict_badge(word: Any) -> str:
    w = str(word or "n/a")
    cls = f"v-{w}" if w in STATUS_WORDS else "v-inconclusive"
    return f'<span class="v {cls}">{escape(w)}</span>'


def _th(key: str, label: str | None = None) -> str:
    """A column header linked to its metric's definition."""
    return f'<th scope="col"><a href="#def-{key}">{escape(label or METRICS[key][0])}</a></th>'


def _ths(*cols: str | tuple[str, str]) -> str:
    """Column headers linked to their metrics' definitions, each a key or (key, label)."""
    return "".join(_th(*c) if isinstance(c, tuple) else _th(c) for c in cols)


def _table(head: str, rows: Iterable[str], attrs: str = "") -> str:
    """A table that scrolls on its own when wide."""
    return (f'<div class="scroll"><table{attrs}><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")  # fmt: skip


def _num(v: Any, over: bool = False) -> str:
    cls = "num over" if over else "num"
    return f'<td class="{cls}">{escape(fmt(v))}</td>'


def figure(name: str, data: bytes, caption: str) -> str:
    """One plot, embedded: the page needs no file beside it."""
    alt = f"{name}: {caption}"
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return (
        f'<figure id="fig-{_slug(name)}"><img src="{uri}" alt="{escape(alt)}">'
        f"<figcaption><code>{escape(name)}</code>: {escape(caption)}</figcaption></figure>"
    )


# --- The sections ------------------------------------------------------------------------------

#: The page's sections, in order: each renders its HTML parts from the pack's files (None:
#: the section is left out), under ``<section id=name>`` and its ``<h2>`` title, its plots after.
PAGE_SECTIONS: Registry[Section] = Registry("page section", Section)


@PAGE_SECTIONS.register("decision", "Decision", order=10)
def _decision(p: PackFiles) -> list[str]:
    head, _, rest = _md(decision_section(p)).partition("\n\n")
    return [f'<div class="decision" id="decision-sentence">{markdown(head)}</div>', markdown(rest)]


@PAGE_SECTIONS.register("bracket", "The capacity bracket", order=20, nav="Bracket")
def _bracket(p: PackFiles) -> list[str]:
    unit = target_words(p.manifest).unit
    head = _ths("cache_state", "capacity", "next_rate_up", ("status", "its status"), "width",
                "resolution", ("resolution", "reached"), "confidence", "per_replica",
                ("goodput_per_unit", f"goodput per {unit}"))  # fmt: skip
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
    return [markdown("\n".join(sentences)), _table(head, rows)]


@PAGE_SECTIONS.register("plan", "Replica plan", order=30, nav="Plan")
def _plan(p: PackFiles) -> list[str]:
    return [markdown(_md(plan_section(p)) or "No replica plan in this pack.")]


@PAGE_SECTIONS.register("failure", "When a replica fails", order=40, nav="When a replica fails")
def _failure(p: PackFiles) -> list[str]:
    if p.failure is None:
        return ["<p>This pack ran no failure drills.</p>"]
    return [markdown(_md(failure_answer_section(p))), markdown(_md(failure_section(p)))]


@PAGE_SECTIONS.register("gates", "Gates", order=50, nav="Gates")
def _gates(p: PackFiles) -> list[str]:
    return [markdown(_md(gates_section(p)))]


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
    head = '<th scope="col">class</th>' + _ths(
        "attempted", "successful", "attainment", "attainment_bound", "all_attempt_attainment",
        ("p95", "P95 TTFT ms"), ("cutoff", "TTFT cutoff ms"), ("p95", "P95 TPOT ms"),
        ("cutoff", "TPOT cutoff ms"), ("p95", "P99 TTFT ms"), "class_error_rate", "class_pass",
    )  # fmt: skip
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
    return _table(head, rows, ' class="classes"')


@PAGE_SECTIONS.register("evidence", "Evidence per point", order=60, nav="Evidence per point")
def _evidence(p: PackFiles) -> list[str]:
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
        selected = section_lines(README_SECTIONS["selected"], p)
        parts.append(markdown("\n".join(selected), shift=1))
    return parts


@PAGE_SECTIONS.register("shapes", "Load shapes", order=70, nav="Load shapes")
def _shapes(p: PackFiles) -> list[str]:
    """Each load-shape experiment's question, answers and picture (``shapes.json``)."""
    doc = _json(p.folder / "shapes.json")
    lines = load_shapes.readme_lines(doc)
    if not lines:
        return ["<p>This pack ran no load-shape experiments.</p>"]
    parts = [markdown("\n".join(lines[2:4]))]
    for e in doc["experiments"]:
        parts.append(markdown("\n".join(load_shapes.experiment_lines(e))))
        if e["plot"] in p.plots:
            parts.append(figure(e["plot"], p.plots[e["plot"]], e["question"]))
    return parts


def _mean(values: Iterable[Any]) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float))]
    return sum(vals) / len(vals) if vals else None


@PAGE_SECTIONS.register("cache", "Cold vs warm cache", order=80, nav="Cold vs warm")
def _cache(p: PackFiles) -> list[str]:
    open_loop = p.capacity["open_loop"]
    states = list(open_loop)
    head = _ths("cache_state", "capacity", ("goodput", "goodput at capacity"),
                ("server_hit_rate", "server hit rate (mean over its points)"),
                ("client_cached_share", "client cached share (mean)"))  # fmt: skip
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
    summary = _table(head, rows, ' id="cache-summary"')
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
    side = _table(head, rows, ' id="cache-by-rate"')
    per_repeat = markdown(_md(evidence_section(p)), shift=1)
    by_turn = sessions.readme_lines(p.reports)
    return [
        "<p>The same rates measured with an empty prefix cache (cold) and with the pack's "
        "shared prefixes cached (warm): what the cache buys, and how often it hit.</p>",
        summary,
        side,
        "<h3>Per repeat and closed loop</h3>",
        per_repeat,
        markdown("\n".join(by_turn), shift=1) if by_turn else "",
    ]


def _folded(sid: str, text: str | None, absent: str) -> str:
    if text is None:
        return f"<p>{escape(absent)}</p>"
    return (
        f'<details id="{sid}-full"><summary>Open the full text</summary>'
        f'<div class="body">{markdown(text, shift=2)}</div></details>'
    )


PAGE_SECTIONS.register("failure-test", "Failure test in full", order=90, nav="Failure test")(
    lambda p: [_folded("failure-test", p.failure_md, "No failure drills ran.")]
)


@PAGE_SECTIONS.register("autopsy", "Performance autopsy", order=100, nav="Autopsy")
def _autopsy(p: PackFiles) -> list[str]:
    """Where the run's wall clock went (the autopsy's buckets), then the whole autopsy, folded."""
    folded = _folded(
        "autopsy", p.autopsy_md, "No autopsy in this pack (the autopsy job writes autopsy.md)."
    )
    buckets = ((p.autopsy or {}).get("run") or {}).get("buckets") or {}
    rows = "".join(
        f"<tr><td>{escape(b.get('bucket'))}</td>{_num(b.get('seconds'))}{_num(b.get('share'))}"
        f"<td>{escape(b.get('provenance'))}</td><td>{escape(b.get('contributors') or '')}</td></tr>"
        for b in buckets.get("rows") or []
    )
    if not rows:
        return [folded]
    cols = ("bucket", "seconds", "share", "provenance", "largest contributors")
    head = "".join(f'<th scope="col">{c}</th>' for c in cols)
    return [
        "<p>The run's wall clock by bucket (the critical path's split; autopsy.md defines "
        "each bucket and each provenance word):</p>"
        + _table(head, [rows], ' id="autopsy-buckets"'),
        folded,
    ]


@PAGE_SECTIONS.register("definitions", "Definitions", order=110, nav="Definitions")
def _definitions(p: PackFiles) -> list[str]:
    verdicts = markdown(_md(verdict_words_section(p)))
    metrics = "".join(
        f'<dt id="def-{k}">{escape(term)}</dt><dd>{escape(text)}</dd>'
        for k, (term, text) in METRICS.items()
    )
    return [
        '<h3 id="verdict-words">Verdict words</h3>',
        verdicts,
        '<h3 id="metrics">Metrics</h3>',
        f'<dl class="defs">{metrics}</dl>',
    ]


PAGE_SECTIONS.register("limits", "Limits", order=120, nav="Limits")(
    lambda p: [markdown(_md(limits_section(p)))]
)
# Figures only: the pack folder's plots that no registered plot names.
PAGE_SECTIONS.register("other-figures", "Other figures", order=130)(lambda p: [])


@PAGE_SECTIONS.register("files", "Files", order=140, nav="Files")
def _files(p: PackFiles) -> list[str]:
    names = sorted(
        x.relative_to(p.folder).as_posix()
        for x in p.folder.rglob("*")
        if x.is_file() and x.name != "index.html" and not x.name.startswith(".")
    )
    items = "".join(f'<li><a href="{escape(n)}">{escape(n)}</a></li>' for n in names)
    return [
        f"<p>Beside this page in the pack folder (relative links):</p><ul>{items}</ul>",
        f"<p>Frozen manifest sha256 <code>{escape(p.frozen.get('sha256'))}</code>.</p>",
    ]


def _figures(p: PackFiles) -> dict[str, str]:
    """The pack folder's plots as figures, by the id of the section that shows them."""
    placed: dict[str, list[str]] = {}
    for name, data in p.plots.items():
        if name in PLOTS:
            where, caption = PLOTS[name].section, PLOTS[name].caption
        elif name.startswith("shape-"):
            continue  # in the load-shapes section, beside its answer
        elif name.startswith("failure-timeline-"):
            drill = name.removeprefix("failure-timeline-").removesuffix(".png")
            where = "failure"
            caption = f"Drill {drill} over time: injection, errors, queue, recovery."
        else:
            where, caption = "other-figures", "A plot of the pack."
        where = where if where in PAGE_SECTIONS else "other-figures"
        placed.setdefault(where, []).append(figure(name, data, caption))
    return {k: "\n".join(v) for k, v in placed.items()}


def _render(section: Section, p: PackFiles, figures: str) -> str:
    """One section, its plots last; "" when it has neither content nor plots."""
    parts = section.render(p)
    if not parts and not figures:
        return ""
    inner = "\n".join(x for x in [*(parts or []), figures] if x)
    title = escape(section.title or section.name)
    return f'<section id="{section.name}">\n<h2>{title}</h2>\n{inner}\n</section>'


def render_page(p: PackFiles) -> str:
    """The whole page, as one string: the title, the first section (the decision), the links
    to the others, then the others in order."""
    figures = _figures(p)
    title = p.manifest["pack"]["title"]
    banner = "\n".join(title_section(p)[1:])
    sections = [_render(s, p, figures.get(s.name, "")) for s in PAGE_SECTIONS]
    links = "".join(f'<a href="#{s.name}">{escape(s.nav)}</a>' for s in PAGE_SECTIONS if s.nav)
    body = [
        f"<header><h1>Capacity pack: {escape(title)}</h1>{markdown(banner)}</header>",
        sections[0],
        f"<nav>{links}</nav>",
        *sections[1:],
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
