"""A drill's alert episodes from Prometheus' own rule engine: ``promtool test rules``.

Series on a grid of ``step`` (the coarsest of :data:`GRID_STEPS_MS` at which no two scrapes
share a slot; ``stale`` where a series vanishes), the pack's rules plus a ``<alert>_cp_active``
copy each (``for: 0s``, no ``keep_firing_for``, annotation ``value``) so pending shows, one
``alert_rule_test`` per evaluation time and alert expecting nothing; episodes per alert and
label set (``{a="1",b="x"}``, sorted) with ``pending_t_ns``, ``firing_t_ns``,
``resolved_t_ns`` and ``max_value``. Without promtool: :data:`NOT_FOUND`; a rejected file:
:class:`PromtoolError`.

Method: docs/failure-drills.md, "Alert evaluation".
"""

from __future__ import annotations

import ast
import json
import math
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from capacity_pack.engines.exposition import format_labels
from capacity_pack.errors import StatedError

NOT_FOUND = "promtool not found; install the Debian package prometheus"
EPISODE_COLUMNS = ["alert", "labels", "pending_t_ns", "firing_t_ns", "resolved_t_ns",
                   "max_value", "mechanism"]  # fmt: skip
# Input-series grid steps tried, coarsest first (each divides 1 s, so whole-second evaluation
# times fall on slots).
GRID_STEPS_MS = (1000, 500, 250, 200, 100, 50, 20, 10, 5, 2, 1)
COPY_SUFFIX = "_cp_active"
DEFAULT_INTERVAL_S = 60.0
_DURATION = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
            "w": 604_800_000, "y": 31_536_000_000}  # fmt: skip
_HEADER = re.compile(r"^\s*alertname: (\S+), time: (\S+),\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_STRUCTURE = re.compile(r"^\s*(exp:\[\],?|got:\[|\d+:|\]|FAILED:|Unit Testing:.*|SUCCESS)?\s*$")


class PromtoolError(StatedError, ValueError):
    """promtool rejected the rule file (or failed to evaluate it): its message, in one line."""


@dataclass
class AlertEvaluation:
    """Episodes (columns :data:`EPISODE_COLUMNS`), or why the rules were not evaluated."""

    evaluated: bool
    note: str
    episodes: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=EPISODE_COLUMNS))


def parse_duration_ms(text: str) -> int:
    """Milliseconds of a Prometheus duration (``1m5s``, ``250ms``, ``0s``)."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _UNIT_MS[u] for n, u in parts)


def parse_go_labels(text: str) -> dict[str, str]:
    """A Go label set as promtool prints it: ``{a="1", b="x\\"y"}`` (values Go-quoted)."""
    return {k: ast.literal_eval(f'"{v}"') for k, v in _LABEL.findall(text)}


def _promql_number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Inf" if v > 0 else "-Inf"
    return repr(float(v))


def grid_step_ms(scrape_t_ns: Sequence[int] | np.ndarray) -> int:
    """The coarsest step of :data:`GRID_STEPS_MS` giving every scrape a slot of its own."""
    t = np.asarray(scrape_t_ns, dtype=np.int64)
    rel = t - t[0]
    for step in GRID_STEPS_MS:
        slots = np.round(rel / (step * 1_000_000)).astype(np.int64)
        if len(np.unique(slots)) == len(slots):
            return step
    return GRID_STEPS_MS[-1]


def _series_values(present: np.ndarray, values: np.ndarray, scrape_slot: np.ndarray) -> str:
    """One series in promtool's notation: ``vxN`` is N+1 copies of v, ``_xN`` N gaps."""
    tokens: list[str] = []
    live = False
    for j in range(len(present)):
        if present[j]:
            tokens.append(_promql_number(values[j]))
            live = True
        elif scrape_slot[j] and live:
            tokens.append("stale")
            live = False
        else:
            tokens.append("_")
    while tokens and tokens[-1] == "_":
        tokens.pop()
    out: list[str] = []
    i = 0
    while i < len(tokens):
        j = i
        while j + 1 < len(tokens) and tokens[j + 1] == tokens[i] and tokens[i] != "stale":
            j += 1
        run = j - i + 1
        if tokens[i] == "_":
            out.append("_" if run == 1 else f"_x{run}")
        else:
            out.append(tokens[i] if run == 1 else f"{tokens[i]}x{run - 1}")
        i = j + 1
    return " ".join(out)


def input_series(samples: pd.DataFrame, slot_of: dict[int, int], n_slots: int) -> list[dict]:
    """Every series of ``samples`` as a promtool ``input_series`` entry on the slot grid."""
    s = samples[samples["t_ns"].isin(slot_of.keys())]
    s = s.drop_duplicates(["metric", "labels", "t_ns"], keep="first")
    scrape_slot = np.zeros(n_slots, dtype=bool)
    scrape_slot[list(slot_of.values())] = True
    out = []
    slot = s["t_ns"].map(slot_of).to_numpy(dtype=np.int64)
    vals = s["value"].to_numpy(dtype=float)
    for (metric, labels), idx in s.groupby(["metric", "labels"], sort=True).indices.items():
        present = np.zeros(n_slots, dtype=bool)
        values = np.zeros(n_slots, dtype=float)
        present[slot[idx]] = True
        values[slot[idx]] = vals[idx]
        text = _series_values(present, values, scrape_slot)
        label_text = labels if labels not in ("", "{}") else ""
        out.append({"series": f"{metric}{label_text}", "values": text})
    return out


def _rules_doc(rules_path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(rules_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}  # promtool reads it too and names the problem
    return doc if isinstance(doc, dict) else {}


def active_copies(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], float]:
    """(the copies' rule file, copy name -> alert, the smallest group interval in seconds)."""
    names = {
        r.get("alert")
        for g in doc.get("groups") or []
        for r in g.get("rules") or []
        if isinstance(r, dict)
    }
    groups, copies, intervals = [], {}, []
    for g in doc.get("groups") or []:
        if not isinstance(g, dict):
            continue
        try:
            if g.get("interval"):
                intervals.append(parse_duration_ms(str(g["interval"])) / 1000)
        except ValueError:
            pass  # promtool rejects the file and names the field
        rules = []
        for r in g.get("rules") or []:
            if not isinstance(r, dict) or "alert" not in r:
                continue
            name = f"{r['alert']}{COPY_SUFFIX}"
            while name in names:
                name += "_"
            copies[name] = r["alert"]
            rules.append(
                {
                    "alert": name,
                    "expr": r.get("expr"),
                    "for": "0s",
                    "labels": r.get("labels") or {},
                    "annotations": {"value": "{{ $value }}"},
                }
            )
        groups.append({"name": f"{g.get('name')}{COPY_SUFFIX}", "rules": rules})
    return {"groups": groups}, copies, min(intervals, default=DEFAULT_INTERVAL_S)


def run_promtool(
    promtool: str,
    rules_path: Path,
    copies_doc: dict,
    series: list[dict],
    eval_ms: list[int],
    interval_ms: int,
    step_ms: int,
    alerts: list[str],
) -> str:
    """Write the unit-test file and run it; promtool's stdout and stderr together."""
    with tempfile.TemporaryDirectory(prefix="promtool-") as tmp:
        d = Path(tmp)
        # JSON is YAML, and writes 20x faster than PyYAML's emitter.
        (d / "copies.yml").write_text(json.dumps(copies_doc))
        cases = [{"eval_time": f"{t}ms", "alertname": a} for t in eval_ms for a in alerts]
        unit = {
            "rule_files": [str(rules_path.resolve()), "copies.yml"],
            "evaluation_interval": f"{interval_ms}ms",
            "tests": [
                {"interval": f"{step_ms}ms", "input_series": series, "alert_rule_test": cases}
            ],
        }
        (d / "unit.yml").write_text(json.dumps(unit))
        proc = subprocess.run(
            [promtool, "test", "rules", "unit.yml"],
            cwd=d,
            capture_output=True,
            text=True,
            check=False,
        )
    text = proc.stdout + "\n" + proc.stderr
    if proc.returncode not in (0, 1) or (proc.returncode and "FAILED:" not in text):
        # Not a test report: promtool itself failed (a crash, a bad argument).
        text += f"\nexit status {proc.returncode}"
    return text


def parse_report(text: str) -> tuple[list[tuple[str, int, dict, dict]], list[str]]:
    """promtool's failed alert tests: (alert, eval ms, labels, annotations) per alert it got,
    and the lines that are not part of that report (its errors)."""
    got: list[tuple[str, int, dict, dict]] = []
    other: list[str] = []
    current: tuple[str, int] | None = None
    for line in text.splitlines():
        s = line.strip()
        if m := _HEADER.match(line):
            current = (m[1], parse_duration_ms(m[2]))
        elif s.startswith("Labels:{") and current is not None:
            got.append((*current, parse_go_labels(s[len("Labels:") :]), {}))
        elif s.startswith("Annotations:{") and got:
            got[-1][3].update(parse_go_labels(s[len("Annotations:") :].rstrip(",")))
        elif not _STRUCTURE.match(line):
            other.append(s)
    return got, other


def episodes(
    got: list[tuple[str, int, dict, dict]],
    copies: dict[str, str],
    eval_ms: list[int],
    origin_ns: int,
    mechanism: dict[str, str | None],
) -> pd.DataFrame:
    """Runs of pending/firing evaluations per alert and label set (the module docstring)."""
    k_of = {t: k for k, t in enumerate(eval_ms)}
    state: dict[tuple[str, str], dict[int, list]] = {}
    for name, t, labels, ann in got:
        alert = copies.get(name, name)
        key = (alert, format_labels({k: v for k, v in labels.items() if k != "alertname"}))
        cell = state.setdefault(key, {}).setdefault(k_of[t], [False, math.nan])
        if name in copies:
            cell[1] = float(ann.get("value", "NaN"))
        else:
            cell[0] = True
    rows = []
    for (alert, labels), cells in state.items():
        ks = sorted(cells)
        runs = np.split(ks, np.flatnonzero(np.diff(ks) > 1) + 1)
        for run in runs:
            fired = [k for k in run if cells[k][0]]
            values = [cells[k][1] for k in run if not math.isnan(cells[k][1])]
            end = int(run[-1]) + 1
            rows.append(
                {
                    "alert": alert,
                    "labels": labels,
                    "pending_t_ns": origin_ns + eval_ms[run[0]] * 1_000_000,
                    "firing_t_ns": origin_ns + eval_ms[fired[0]] * 1_000_000 if fired else None,
                    "resolved_t_ns": origin_ns + eval_ms[end] * 1_000_000
                    if end < len(eval_ms)
                    else None,
                    "max_value": max(values, default=math.nan),
                    "mechanism": mechanism.get(alert),
                }
            )
    df = pd.DataFrame(rows, columns=EPISODE_COLUMNS)
    for col in ("pending_t_ns", "firing_t_ns", "resolved_t_ns"):
        df[col] = df[col].astype("Int64")
    df["max_value"] = df["max_value"].astype(float)
    return df.sort_values(["pending_t_ns", "alert", "labels"], kind="stable").reset_index(drop=True)


def evaluate_alert_rules(
    rules_path: str | Path,
    samples: pd.DataFrame,
    scrapes: pd.DataFrame,
    promtool: str | None = None,
) -> AlertEvaluation:
    """The pack's alert rules over a drill's successful scrapes, by ``promtool test rules``."""
    promtool = promtool or shutil.which("promtool")
    if promtool is None:
        return AlertEvaluation(False, NOT_FOUND)
    rules_path = Path(rules_path)
    ok = scrapes[scrapes["ok"]] if len(scrapes) else scrapes
    times = np.unique(ok["t_ns"].to_numpy(dtype=np.int64)) if len(ok) else np.empty(0, np.int64)
    if not len(times):
        return AlertEvaluation(True, "no successful scrape: nothing to evaluate")
    doc = _rules_doc(rules_path)
    copies_doc, copies, interval_s = active_copies(doc)
    mechanism = {
        r["alert"]: (r.get("labels") or {}).get("mechanism")
        for g in copies_doc["groups"]
        for r in g["rules"]
    }
    mechanism = {copies[k]: v for k, v in mechanism.items()}
    step_ms = grid_step_ms(times)
    slots = np.round((times - times[0]) / (step_ms * 1_000_000)).astype(np.int64)
    slot_of = dict(zip(times.tolist(), slots.tolist(), strict=True))
    interval_ms = max(1, round(interval_s * 1000))
    last_ms = int(slots[-1]) * step_ms
    eval_ms = list(range(0, -(-last_ms // interval_ms) * interval_ms + 1, interval_ms))
    series = input_series(samples, slot_of, int(slots[-1]) + 1)
    alerts = sorted(set(copies) | set(copies.values()))
    text = run_promtool(
        promtool, rules_path, copies_doc, series, eval_ms, interval_ms, step_ms, alerts
    )
    got, other = parse_report(text)
    if other:
        # Errors in a copy are its rule's errors: name the rule, once.
        for copy, alert in sorted(copies.items(), key=lambda c: -len(c[0])):
            other = [line.replace(copy, alert) for line in other]
        message = "; ".join(dict.fromkeys(other))
        raise PromtoolError(f"{rules_path}: promtool test rules failed: {message}")
    note = (
        f"evaluated by Prometheus' rule engine (promtool test rules) every "
        f"{interval_ms / 1000:g} s over the scraped series on a {step_ms / 1000:g} s grid"
    )
    return AlertEvaluation(True, note, episodes(got, copies, eval_ms, int(times[0]), mechanism))
