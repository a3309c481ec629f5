"""Alert episodes from Prometheus' rule engine (drills.prometheus), against the real promtool.

Every expected time and value below is computed by hand from the series and Prometheus' rules:
an instance is pending from the first evaluation that returns it, fires at the first evaluation
``for`` or more after that, and resolves at the first evaluation without it; rules are evaluated
every group ``interval`` (1 s here) from the first successful scrape.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from capacity_pack.drills.prometheus import (
    NOT_FOUND,
    PromtoolError,
    evaluate_alert_rules,
    grid_step_ms,
    parse_go_labels,
)
from tests.promql import needs_promtool, require_promtool

S = 1_000_000_000
T0 = 7 * S  # the first scrape, on the drill clock: episode times are on that clock too


def rules_file(tmp_path: Path, *rules: dict, interval: str = "1s") -> Path:
    path = tmp_path / "rules.yml"
    doc = {"groups": [{"name": "g", "interval": interval, "rules": list(rules)}]}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def rule(alert: str, expr: str, for_: str = "0s", **labels: str) -> dict:
    summary = "{{ $labels.a }} at {{ $value | humanizePercentage }}"
    return {"alert": alert, "expr": expr, "for": for_, "labels": labels or {"mechanism": "m"},
            "annotations": {"summary": summary}}  # fmt: skip


def drill(series: dict[tuple[str, str], dict[float, float]], scrape_s: list[float]):
    """(samples, scrapes) as a drill records them: ``series[(metric, labels)] = {t_s: value}``,
    every listed scrape successful."""
    rows = [
        {"t_ns": T0 + round(t * S), "metric": m, "labels": lab, "value": v}
        for (m, lab), points in series.items()
        for t, v in points.items()
    ]
    samples = pd.DataFrame(rows, columns=["t_ns", "metric", "labels", "value"])
    scrapes = pd.DataFrame({"t_ns": [T0 + round(t * S) for t in scrape_s], "ok": True})
    return samples, scrapes


def half_seconds(lo: float, hi: float) -> list[float]:
    return [lo + k / 2 for k in range(int((hi - lo) * 2) + 1)]


def one(ep: pd.DataFrame, alert: str) -> dict:
    rows = ep[ep["alert"] == alert].to_dict("records")
    assert len(rows) == 1, ep
    return rows[0]


def at(t_s: float) -> int:
    return T0 + round(t_s * S)


@needs_promtool
def test_for_2s_pends_fires_and_resolves_at_the_hand_computed_times(tmp_path):
    require_promtool()
    scrapes = half_seconds(0, 10)
    # m is t on [2, 5.5] and 0 elsewhere: "m > 1" holds at the evaluations 2, 3, 4 and 5 s
    # (the 6 s evaluation sees the 0 scraped at 6 s), with values 2, 3, 4, 5.
    m = {t: (t if 2 <= t <= 5.5 else 0.0) for t in scrapes}
    samples, sc = drill({("m", '{a="1"}'): m}, scrapes)
    ev = evaluate_alert_rules(rules_file(tmp_path, rule("High", "m > 1", "2s")), samples, sc)
    assert ev.evaluated and "promtool test rules" in ev.note
    got = one(ev.episodes, "High")
    assert got["pending_t_ns"] == at(2)  # first evaluation returning it
    assert got["firing_t_ns"] == at(4)  # 4 - 2 >= 2 s
    assert got["resolved_t_ns"] == at(6)  # first evaluation without it
    assert got["max_value"] == 5.0  # the 5.5 sample is never an evaluation's latest
    assert got["mechanism"] == "m"


@needs_promtool
def test_an_instance_shorter_than_for_pends_and_never_fires(tmp_path):
    require_promtool()
    scrapes = half_seconds(0, 6)
    m = {t: (3.0 if 2 <= t < 3 else 0.0) for t in scrapes}  # true at the 2 s evaluation only
    samples, sc = drill({("m", ""): m}, scrapes)
    ev = evaluate_alert_rules(rules_file(tmp_path, rule("High", "m > 1", "2s")), samples, sc)
    got = one(ev.episodes, "High")
    assert (got["pending_t_ns"], got["resolved_t_ns"]) == (at(2), at(3))
    assert pd.isna(got["firing_t_ns"])


@needs_promtool
def test_a_vanished_series_is_stale_at_once_and_a_return_is_a_new_episode(tmp_path):
    require_promtool()
    scrapes = half_seconds(0, 10)
    # gone from the scrapes at 3.0-5.5 s (the other series keeps them successful), back at 6 s:
    # without a staleness marker the 2.5 s sample would stay visible for 5 minutes.
    gone = {t: 5.0 for t in scrapes if not 3 <= t < 6}
    other = {t: 0.0 for t in scrapes}
    samples, sc = drill({("m", '{a="1"}'): gone, ("other", ""): other}, scrapes)
    ev = evaluate_alert_rules(rules_file(tmp_path, rule("Up", "m > 1")), samples, sc)
    first, second = ev.episodes[ev.episodes["alert"] == "Up"].to_dict("records")
    assert (first["pending_t_ns"], first["firing_t_ns"], first["resolved_t_ns"]) == (
        at(0), at(0), at(3))  # fmt: skip
    assert (second["pending_t_ns"], second["firing_t_ns"]) == (at(6), at(6))
    assert pd.isna(second["resolved_t_ns"])  # still firing at the last evaluation (10 s)


@needs_promtool
def test_labels_are_the_instance_labels_and_values_are_exact(tmp_path):
    require_promtool()
    scrapes = half_seconds(0, 4)
    q = '{a="1",b="x,y\\"z"}'  # exposition text: a quote, a comma
    samples, sc = drill(
        {("hits", q): {t: 0.1 for t in scrapes}, ("hits", '{a="2",b="w"}'):
         {t: 0.2 for t in scrapes}},
        scrapes,
    )  # fmt: skip
    path = rules_file(
        tmp_path,
        rule("PerA", "sum by (a, b) (hits) > 0", mechanism="m", severity="page"),
        rule("Sum", "sum(hits) > 0", mechanism="s", pack=""),  # empty value: no such label
    )
    ep = evaluate_alert_rules(path, samples, sc).episodes
    per_a = ep[ep["alert"] == "PerA"].set_index("labels")
    assert sorted(per_a.index) == [
        '{a="1",b="x,y\\"z",mechanism="m",severity="page"}',
        '{a="2",b="w",mechanism="m",severity="page"}',
    ]
    assert per_a["max_value"].tolist() == [0.1, 0.2]
    total = one(ep, "Sum")
    assert total["labels"] == '{mechanism="s"}' and total["mechanism"] == "s"
    assert total["max_value"] == 0.1 + 0.2  # 0.30000000000000004: Go prints it exactly


@needs_promtool
def test_jittered_scrapes_land_on_a_grid_of_their_own(tmp_path):
    require_promtool()
    # Scrapes every 0.5 s with up to 40 ms of jitter and one 0.23 s gap: at 500 ms the scrapes
    # at 1.51 and 1.74 s would share slot 3, at 250 ms they are slots 6 and 7.
    scrapes = [0.0, 0.52, 0.98, 1.51, 1.74, 2.47, 3.04, 3.49, 4.02]
    assert grid_step_ms([round(t * S) for t in scrapes]) == 250
    assert grid_step_ms([k * S for k in range(5)]) == 1000
    m = {t: (9.0 if t >= 1.5 else 0.0) for t in scrapes}
    samples, sc = drill({("m", ""): m}, scrapes)
    ev = evaluate_alert_rules(rules_file(tmp_path, rule("High", "m > 1", "1s")), samples, sc)
    assert "0.25 s grid" in ev.note
    got = one(ev.episodes, "High")
    assert (got["pending_t_ns"], got["firing_t_ns"]) == (at(2), at(3))
    assert pd.isna(got["resolved_t_ns"])


@needs_promtool
def test_a_rule_file_promtool_rejects_is_one_line_naming_its_message(tmp_path):
    require_promtool()
    samples, sc = drill({("m", ""): {0.0: 1.0, 1.0: 1.0}}, [0.0, 1.0])
    path = rules_file(tmp_path, rule("Bad", "m >"))
    with pytest.raises(PromtoolError) as err:
        evaluate_alert_rules(path, samples, sc)
    msg = str(err.value)
    assert "\n" not in msg
    assert str(path) in msg and "could not parse expression" in msg


@needs_promtool
def test_an_evaluation_error_names_the_rule_not_its_copy(tmp_path):
    require_promtool()
    samples, sc = drill({("m", '{a="1"}'): {0.0: 1.0}, ("m", '{a="2"}'): {0.0: 1.0}}, [0.0])
    # Dropping label a leaves two series with one label set: Prometheus refuses the vector.
    path = rules_file(tmp_path, rule("Dup", 'label_replace(m, "a", "", "a", ".*")'))
    with pytest.raises(PromtoolError, match="rule: Dup, time: 0s, err: vector cannot contain"):
        evaluate_alert_rules(path, samples, sc)


def test_without_promtool_the_alerts_are_not_evaluated(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without promtool
    samples, sc = drill({("m", ""): {0.0: 5.0}}, [0.0])
    ev = evaluate_alert_rules(rules_file(tmp_path, rule("High", "m > 1")), samples, sc)
    assert not ev.evaluated and ev.note == NOT_FOUND
    assert ev.note == "promtool not found; install the Debian package prometheus"
    assert ev.episodes.empty


def test_go_label_sets_parse_with_go_quoting():
    text = '{a="1", b="x,y\\"z", c="tab\\there", d="\\\\", e="é"}'
    assert parse_go_labels(text) == {"a": "1", "b": 'x,y"z', "c": "tab\there", "d": "\\",
                                     "e": "é"}  # fmt: skip
    assert parse_go_labels("{}") == {}


@pytest.mark.slow
def test_a_drill_without_promtool_says_not_evaluated_in_every_reader(tmp_path, monkeypatch):
    """A real (virtual) plan drill of the default pack analysed with no promtool on PATH: the
    report, failure-test.md, the MLflow run's fields, the comparison and the CLI line all say
    "not evaluated", and none says NO."""
    from capacity_pack.decide.compare import drill_facts
    from capacity_pack.drills.alerts import write_alert_rules
    from capacity_pack.drills.analyze import DrillAnalysisSpec, analyze_drill
    from capacity_pack.drills.plan import DrillInputs
    from capacity_pack.drills.render import (
        alerts_fired_text,
        drill_line,
        expected_alert_text,
        failure_test,
        failure_test_markdown,
    )
    from capacity_pack.drills.run import run_drill
    from capacity_pack.plan.manifest import PLAN_DRILL, load_pack
    from capacity_pack.track.records import drill as drill_run
    from tests.drills import plan_at
    from tests.paths import DEFAULT

    base = load_pack(DEFAULT)
    failure = base.failure.model_copy(
        update={"plan_drill": base.failure.plan_drill.model_copy(update={"mode": "virtual"})}
    )
    pack = base.model_copy(update={"failure": failure})
    inputs = DrillInputs.for_drill(pack, PLAN_DRILL)
    sel = {"capacity_per_replica_rps": 30.0, "capacity_rps": 30.0}
    plan = plan_at(inputs, {"primary_cache_state": "cold", "open_loop": {"cold": sel}}, {},
                   {"required_replicas": 2})  # fmt: skip
    run_drill(inputs, plan, tmp_path)
    write_alert_rules(pack, tmp_path / "rules.yaml")
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    report = analyze_drill(tmp_path, tmp_path / "rules.yaml", DrillAnalysisSpec.of(pack))
    json.dumps(report)
    assert report["alerts_evaluated"] is False and report["alert_evaluation"] == NOT_FOUND
    assert report["alerts_fired"] == [] and report["alerts"] == []
    assert report["expected_alert_fired"] is None and report["detection_time_s"] is None
    assert report["detection_source"] == f"not evaluated: {NOT_FOUND}"
    assert expected_alert_text(report) == "not evaluated"
    assert alerts_fired_text(report) == f"not evaluated ({NOT_FOUND})"
    assert "alerts not evaluated" in drill_line(report)
    doc = failure_test([report], {"name": "p"})
    assert doc["summary"]["alerts_not_evaluated"] == {report["drill"]: NOT_FOUND}
    md = failure_test_markdown(doc)
    assert f"Alerts: not evaluated ({NOT_FOUND})" in md
    assert "Expected mechanism alert fired: not evaluated" in md and "fired: NO" not in md
    run = drill_run(report)
    assert run["metrics"]["expected_alert_fired"] is None
    assert run["metrics"]["alerts_fired"] is None
    assert run["tags"]["capacity_pack.alerts_fired"] == "not evaluated"
    # The comparison's outcome of a mechanism drill (a plan drill's is its N+1 verdict).
    assert drill_facts({**report, "n_plus_one": None})["outcome"] == "alerts not evaluated"
