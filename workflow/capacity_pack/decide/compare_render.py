"""``capacity-pack compare``'s report: one document model (:func:`blocks`), written as Markdown
(:func:`to_markdown`) or a self-contained HTML page (:func:`to_html`, in the pack's page shell
:mod:`capacity_pack.decide.page`), and the comparison as JSON (:func:`jsonable`). Decision
sentences and brackets are written by :mod:`capacity_pack.vocab.words`, as the console's.
"""

from __future__ import annotations

import json
import math
from typing import Any

from capacity_pack.decide.compare_stats import LATENCY_METRICS, LogSample
from capacity_pack.decide.page import escape, page
from capacity_pack.vocab.words import bracket_text


def _rps(x: Any) -> str:
    if x is None:
        return "none"
    if x == math.inf:
        return "∞"
    return f"{float(x):g}"


def _num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return str(x)


def _ms(x: float | None) -> str:
    return "—" if x is None else (f"{x:.0f}" if x >= 100 else f"{x:.3g}")


def _evidence(e: dict[str, Any] | None) -> str:
    """An evidence bracket in the bracket's words (no passing rate: below U; nothing failing:
    at least L)."""
    if e is None:
        return "—"
    return bracket_text(e["capacity_rps"], e["high"] if math.isfinite(e["high"]) else None)


def _search(b: dict[str, Any] | None) -> str:
    return "—" if b is None else bracket_text(b.get("pass_rps"), b.get("fail_rps"))


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:+.0f} %"


# A block is ("h2", text) | ("p", text) | ("table", headers, rows, flags) | ("list", items);
# ``flags`` marks the rows whose difference is beyond variation (bold in Markdown, red in HTML).


def blocks(doc: dict[str, Any]) -> list[tuple]:
    """The whole report as blocks, section by section."""
    return [
        *_head_blocks(doc),
        *_manifest_blocks(doc),
        *_capacity_blocks(doc),
        *_attainment_blocks(doc),
        *_latency_blocks(doc),
        *_closed_loop_blocks(doc),
        *_plan_blocks(doc),
        *_drill_blocks(doc),
        ("h2", "Method"),
        ("list", METHOD_LINES),
    ]


def _head_blocks(doc: dict[str, Any]) -> list[tuple]:
    """The title, the verdict, each pack's decision sentence and the identities."""
    out: list[tuple] = [("h1", "Capacity pack comparison: B against A"),
                        ("verdict", doc["summary"])]  # fmt: skip
    if doc.get("decisions"):
        out.append(("list", doc["decisions"]))
    a, b = doc["a"], doc["b"]
    ident = [
        [label, _num(a[key]), _num(b[key])]
        for key, label in (("origin", "source"), ("pack", "pack"),
                           ("manifest_sha256", "manifest sha256"), ("engine", "engine"),
                           ("model", "model"), ("target", "target"),
                           ("primary_cache_state", "primary cache state"),
                           ("reports", "per-point reports"))
    ]  # fmt: skip
    out.append(("table", ["", "A", "B"], ident, [False] * len(ident)))
    if doc["beyond_what"]:
        out.append(("p", "Beyond run-to-run variation: " + "; ".join(doc["beyond_what"]) + "."))
    return out


def _manifest_blocks(doc: dict[str, Any]) -> list[tuple]:
    """What differs in the manifests."""
    out: list[tuple] = []
    man = doc["manifest"]
    out.append(("h2", "What differs in the manifests"))
    if man["note"]:
        out.append(("p", man["note"]))
    elif not man["sections"]:
        same = ("The two packs' manifests are identical (every section's sha256 matches): "
                "any difference below is the runs', not the packs'.")  # fmt: skip
        out.append(("p", same))
    else:
        out.append(("p", "Sections whose sha256 differs: "
                    + ", ".join(f"`{s['section']}`" for s in man["sections"]) + "."))  # fmt: skip
        rows = [[f"`{f['field']}`", _short(f["values"][0]), _short(f["values"][1])]
                for f in man["fields"]]  # fmt: skip
        out.append(("table", ["field", "A", "B"], rows, [False] * len(rows)))
    return out


def _capacity_blocks(doc: dict[str, Any]) -> list[tuple]:
    """The capacity per cache state: both brackets, per replica and per GPU."""
    out: list[tuple] = []
    out.append(("h2", "Capacity"))
    out.append(("p", "Evidence bracket [L, U): L the capacity (the highest rate meeting every "
                "gate on its pooled estimate, every lower rate meeting them), U the lowest rate "
                "above it that fails; disjoint evidence brackets are a difference beyond "
                "run-to-run variation. The search bracket is the pack's own [capacity, next "
                "tested rate)."))  # fmt: skip
    rows, flags = [], []
    for c in doc["capacity"]:
        ea, eb = c["evidence_bracket"]
        rows.append([c["cache_state"], _rps(c["capacity_rps"][0]), _rps(c["capacity_rps"][1]),
                     _pct(c["change"]), f"{_search(c['search_bracket'][0])} / "
                     f"{_search(c['search_bracket'][1])}", f"{_evidence(ea)} / {_evidence(eb)}",
                     _yes(c["beyond"]), c["note"]])  # fmt: skip
        flags.append(c["beyond"])
    out.append(("table", ["cache state", "A (RPS)", "B (RPS)", "B vs A", "search A / B",
                          "evidence A / B", "beyond variation", "why"], rows, flags))  # fmt: skip
    per = [[c["cache_state"], _num(c["per_replica_rps"][0]), _num(c["per_replica_rps"][1]),
            _num(c["goodput_per_gpu_rps"][0]), _num(c["goodput_per_gpu_rps"][1])]
           for c in doc["capacity"]]  # fmt: skip
    heads = ["cache state", "per replica A", "per replica B", "goodput per GPU A",
             "goodput per GPU B"]  # fmt: skip
    out.append(("table", heads, per, [False] * len(per)))
    return out


def _attainment_blocks(doc: dict[str, Any]) -> list[tuple]:
    """Each class's attainment at the rates both packs measured."""
    out: list[tuple] = []
    out.append(("h2", "SLO attainment at matched rates"))
    known = doc["design_effect_known"]
    note = ("Attainment = requests meeting the class SLO / successful requests, pooled over the "
            "rate's deciding repeats; B − A with Newcombe's hybrid score interval at "
            f"{doc['per_test_confidence']:.4g} each ({doc['confidence']:g} over the "
            f"{doc['tests']} attainment and latency tests, Bonferroni), on effective samples "
            "(counts / the largest design effect of the rate's repeats).")  # fmt: skip
    if not all(known):
        which = " and ".join(x for x, k in zip("AB", known, strict=True) if not k)
        note += (f" No per-point reports for {which}: its design effect is taken as 1, which "
                 "overstates its precision when misses come in bursts.")  # fmt: skip
    out.append(("p", note))
    rows, flags = [], []
    for r in doc["attainment"]:
        sa, sb = r["sides"]
        rows.append([r["cache_state"], _rps(r["offered_rps"]), r["class"], _att(sa), _att(sb),
                     _pct_pts(r.get("difference")), _interval_pts(r.get("interval")),
                     _yes(r["beyond"]) if r.get("tested") else r.get("why") or "—"])  # fmt: skip
        flags.append(r["beyond"])
    if rows:
        out.append(("table", ["cache state", "RPS", "class", "A: met / ok (deff, status)",
                              "B: met / ok (deff, status)", "B − A", "interval",
                              "beyond variation"], rows, flags))  # fmt: skip
    else:
        out.append(("p", "No offered rate was measured by both packs."))
    return out


def _latency_blocks(doc: dict[str, Any]) -> list[tuple]:
    """The P95 latencies at the rates both packs measured."""
    out: list[tuple] = []
    out.append(("h2", "P95 latencies at matched rates"))
    pv = doc["latency_variation"]
    out.append(("p", "B / A of each class's P95 (mean of its repeats), against the "
                "between-repeat variation of log P95 pooled over both packs' repeated points "
                "(at rates that pack does not fail; tested where neither fails): "
                + "; ".join(f"{LATENCY_METRICS[m]} s = {_num(p['sd_log'])} over {p['df']} df"
                            if p["df"] else f"{LATENCY_METRICS[m]}: no repeated point"
                            for m, p in pv.items())
                + ". Cells: A → B ms (B / A, interval); beyond variation in bold."))  # fmt: skip
    rows, flags = [], []
    for r in doc["latency"]:
        cells = [_lat_cell(r["metrics"][m]) for m in LATENCY_METRICS]
        flag = any(r["metrics"][m]["beyond"] for m in LATENCY_METRICS)
        status = "/".join(s or "—" for s in r["statuses"])
        rows.append([r["cache_state"], _rps(r["offered_rps"]), r["class"], status, *cells])
        flags.append(flag)
    if rows:
        out.append(("table", ["cache state", "RPS", "class", "status A/B",
                              *LATENCY_METRICS.values()], rows, flags))  # fmt: skip
    return out


def _closed_loop_blocks(doc: dict[str, Any]) -> list[tuple]:
    """The closed-loop curves side by side."""
    out: list[tuple] = []
    if doc["closed_loop"]:
        out.append(("h2", "Closed loop"))
        out.append(("p", "Output tokens/s per concurrency, side by side (not tested)."))
        rows = [[r["cache_state"], str(r["concurrency"]), _num(r["output_tps"][0], 4),
                 _num(r["output_tps"][1], 4), _ratio_text(*r["output_tps"]),
                 f"{r['status'][0]} / {r['status'][1]}"] for r in doc["closed_loop"]]  # fmt: skip
        out.append(("table", ["cache state", "concurrency", "A tok/s", "B tok/s", "B / A",
                              "status A / B"], rows, [False] * len(rows)))  # fmt: skip
    return out


def _plan_blocks(doc: dict[str, Any]) -> list[tuple]:
    """The replica plans side by side."""
    out: list[tuple] = []
    plan = doc["plan"]
    out.append(("h2", "Replica plan"))
    out.append(("p", plan["note"][0].upper() + plan["note"][1:] + "."))
    rows = [[r["label"], _num(r["values"][0], 4), _num(r["values"][1], 4),
             "differs" if r["differs"] else ""] for r in plan["rows"]]  # fmt: skip
    if rows:
        out.append(("table", ["", "A", "B", ""], rows, [False] * len(rows)))
    return out


def _drill_blocks(doc: dict[str, Any]) -> list[tuple]:
    """The failure drills side by side."""
    out: list[tuple] = []
    dr = doc["drills"]
    out.append(("h2", "Failure drills"))
    out.append(("p", dr["note"][0].upper() + dr["note"][1:] + "."))
    if dr["plan_drill"] is not None:
        pa, pb = ((p or {}) for p in dr["plan_drill"])
        out.append(("table", ["plan drill (N+1)", "A", "B"],
                    [["verdict", pa.get("verdict", "none"), pb.get("verdict", "none")],
                     ["sentence", pa.get("sentence", "—"), pb.get("sentence", "—")]],
                    [False, False]))  # fmt: skip
    rows = []
    for r in dr["rows"]:
        fa, fb = (f or {} for f in r["facts"])
        rows.append([f"`{r['drill']}`", _drill(fa), _drill(fb), "differs" if r["differs"] else ""])
    if rows:
        out.append(("table", ["drill", "A", "B", ""], rows, [False] * len(rows)))
    return out


METHOD_LINES = [
    "Capacity: disjoint evidence brackets [capacity, lowest fail) per cache state; a rate "
    "left misses, inconclusive, marginal or inconsistent bounds nothing.",
    "Attainment: Newcombe's hybrid score interval (Wilson intervals of each side) for the "
    "difference of proportions, at effective samples (design effect).",
    "P95 latency: log-ratio against the pooled between-repeat standard deviation of log P95 "
    "(Student t); only at rates neither pack fails.",
    "All attainment and latency tests together hold the family-wise confidence (Bonferroni).",
    "Plan and drills are compared side by side and flagged when they differ; they are not "
    "tested (the plan follows from the capacity; each drill runs once).",
    "docs/metrics.md, 'Comparing two packs', states the method in full.",
]


def _short(v: Any, limit: int = 80) -> str:
    text = "—" if v is None else (json.dumps(v) if not isinstance(v, str) else v)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _yes(flag: bool) -> str:
    return "**yes**" if flag else "no"


def _att(s: dict[str, Any]) -> str:
    if not s["successful"]:
        return f"— ({s['status']})"
    deff = f"deff {s['design_effect']:.2g}" if s["design_effect_known"] else "deff 1 (assumed)"
    return f"{s['passing']} / {s['successful']} = {s['passing'] / s['successful']:.3f} " \
           f"({deff}, {s['status']})"  # fmt: skip


def _pct_pts(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:+.1f} pts"


def _interval_pts(ci: list[float] | None) -> str:
    return "—" if ci is None else f"[{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}] pts"


def _lat_cell(m: dict[str, Any]) -> str:
    sa, sb = m["samples"]
    if sa is None or sb is None:
        return "—"
    text = f"{_ms(sa.mean)} → {_ms(sb.mean)} (×{m['ratio']:.2f}"
    if m.get("interval"):
        text += f", [{m['interval'][0]:.2f}, {m['interval'][1]:.2f}]"
    text += ")"
    if not m["tested"]:
        text += " untested"
    return f"**{text}**" if m["beyond"] else text


def _ratio_text(a: float | None, b: float | None) -> str:
    return "—" if not a or b is None else f"×{b / a:.2f}"


def _drill(f: dict[str, Any]) -> str:
    if not f:
        return "not run"
    if "recovered" not in f:
        return f["outcome"]
    parts = [f["outcome"], "recovered" if f["recovered"] else "not recovered"]
    if f.get("detected_after_s") is not None:
        parts.append(f"detected +{f['detected_after_s']:.1f} s")
    parts.append(f"{_num(f.get('rejected'))} rejected, {_num(f.get('lost'))} lost")
    return ", ".join(parts)


def to_markdown(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    for block in blocks(doc):
        kind = block[0]
        if kind == "h1":
            lines += [f"# {block[1]}", ""]
        elif kind == "verdict":
            lines += [f"**{block[1]}**", ""]
        elif kind == "h2":
            lines += [f"## {block[1]}", ""]
        elif kind == "p":
            lines += [block[1], ""]
        elif kind == "list":
            lines += [f"- {item}" for item in block[1]] + [""]
        elif kind == "table":
            _, headers, rows, _flags = block
            lines.append("| " + " | ".join(headers) + " |")
            lines.append("|" + "---|" * len(headers))
            lines += ["| " + " | ".join(_cell_md(c) for c in row) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


def _cell_md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


#: Compare's own rules, after the shell's (:data:`capacity_pack.decide.page.BASE_CSS`).
_CSS = """
.verdict { font-size:1.15em; font-weight:600; padding:.7em 1em; border-radius:6px;
  background:#eef6ee; border:1px solid #9c9; }
.verdict.beyond { background:#fdeeee; border-color:#d99; }
tr.beyond td { background:#fdeeee; }
"""


def _inline_html(text: str) -> str:
    """Escape, then render the two Markdown marks the blocks use: **bold** and `code`."""
    out = escape(text)
    parts = out.split("**")
    out = "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))
    parts = out.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def to_html(doc: dict[str, Any]) -> str:
    """A self-contained page in the pack's page shell (:func:`capacity_pack.decide.page.page`):
    inline CSS, no script, nothing fetched."""
    body: list[str] = []
    for block in blocks(doc):
        kind = block[0]
        if kind == "h1":
            body.append(f"<h1>{_inline_html(block[1])}</h1>")
        elif kind == "verdict":
            cls = "verdict beyond" if doc["beyond"] else "verdict"
            body.append(f'<p class="{cls}" id="verdict">{escape(block[1])}</p>')
        elif kind == "h2":
            body.append(f"<h2>{_inline_html(block[1])}</h2>")
        elif kind == "p":
            body.append(f"<p>{_inline_html(block[1])}</p>")
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in block[1]) + "</ul>")
        elif kind == "table":
            _, headers, rows, flags = block
            head = "".join(f"<th>{_inline_html(h)}</th>" for h in headers)
            trs = [
                ('<tr class="beyond">' if flag else "<tr>")
                + "".join(f"<td>{_inline_html(c)}</td>" for c in row) + "</tr>"
                for row, flag in zip(rows, flags, strict=True)
            ]  # fmt: skip
            body.append(
                f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(trs)}</tbody></table>"
            )
    title = f"capacity-pack compare: {doc['a']['pack']} vs {doc['b']['pack']}"
    return page(title, "\n".join(body), _CSS)


def jsonable(obj: Any) -> Any:
    """The comparison as JSON values: log samples as objects, infinities as strings."""
    if isinstance(obj, LogSample):
        return jsonable(obj.__dict__)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj
