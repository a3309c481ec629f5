"""The gate registry and the SLO predicate: one entry per acceptance gate, each check and message
on crafted statistics, and the gate table of docs/reading.md rendered from the registry."""

from __future__ import annotations

import ast
import re

import numpy as np
import pandas as pd
import pytest
import yaml
from pydantic_core import PydanticUndefined

from capacity_pack.evidence import gates as g
from capacity_pack.evidence.analysis import failing_gates
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.plan.workload import Acceptance
from tests.paths import DEFAULT_CONFIG, ROOT


def thresholds(**values) -> g.Gates:
    return g.Gates({**g.ANALYSIS_DEFAULTS, **values})


# -- the registry ------------------------------------------------------------------------------


def test_every_acceptance_gate_field_has_exactly_one_entry():
    fields = [gate.field for gate in g.GATES]
    assert len(fields) == len(set(fields))
    assert len(g.GATE) == len(g.GATES)  # names are unique too
    assert set(fields).isdisjoint(g.NOT_GATES)
    assert set(fields) | set(g.NOT_GATES) == set(Acceptance.model_fields)


def test_defaults_follow_the_manifest_where_it_has_one():
    for gate in g.GATES:
        default = Acceptance.model_fields[gate.field].default
        if default is not PydanticUndefined:
            assert gate.default == default, gate.name
        assert gate.optional == (gate.default is None), gate.name
    assert g.Gates()["p99_min_samples"] == Acceptance.model_fields["p99_min_samples"].default
    assert set(g.Gates().values) == set(g.ANALYSIS_DEFAULTS)


def test_gates_of_a_pack_read_its_acceptance():
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    data["acceptance"]["per_class_error_rate_max"] = 0.02
    pack = validate_pack(data, "test pack")
    gates = g.pack_gates(pack)
    for name in g.ANALYSIS_DEFAULTS:
        assert gates[name] == getattr(pack.acceptance, name)
        if name in {gate.field for gate in g.GATES}:
            gate = next(x for x in g.GATES if x.field == name)
            assert gate.threshold(gates) == gate.threshold(pack.acceptance)
    assert g.Gates.of(pack.acceptance.model_dump()) == gates
    names = [x.name for x in gates.active("class")]
    assert "class_error_rate" in names and "all_attempt_attainment" not in names


def test_every_gate_is_well_formed():
    for gate in g.GATES:
        assert gate.op in (">=", "<=", "==")
        assert gate.statistic.key and gate.statistic.unit and gate.statistic.estimate
        assert (gate.requires is None) or (gate.requires in g.GATE)
        assert (gate.marginal_message is None) == (gate.interval_key is None)
        if gate.scope == "class":
            assert gate.passes_key and "{cls}" in gate.message
        assert "{threshold}" in gate.phrase


def test_plan_manifest_does_not_import_evidence():
    tree = ast.parse((ROOT / "workflow/capacity_pack/plan/manifest.py").read_text())
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if "evidence" in n]


# -- each check and message --------------------------------------------------------------------


def test_sample_size_gate_makes_an_under_sampled_class_inconclusive():
    gates = thresholds(min_successful_samples_per_class=10)
    assert g.SAMPLE_SIZE.check({"successful_count": 9}, gates) == g.INCONCLUSIVE
    assert not g.SAMPLE_SIZE.passed({"successful_count": 9}, gates)
    assert (
        g.SAMPLE_SIZE.failure({"successful_count": 9}, gates, "chat") == "chat: 9 successful < 10"
    )
    assert g.SAMPLE_SIZE.check({"successful_count": 10}, gates) == g.PASS
    assert g.SAMPLE_SIZE.failure({"successful_count": 10}, gates, "chat") is None


def test_attainment_gate_pass_marginal_fail_and_not_judged():
    gates = thresholds(min_successful_samples_per_class=10, class_slo_attainment_min=0.95)
    a = g.CLASS_ATTAINMENT
    stats = {"successful_count": 100, "attainment": 0.96}
    assert a.check(stats, gates) == g.PASS  # no interval yet: the point estimate decides
    assert a.check({**stats, "attainment_ci": [0.951, 0.98]}, gates) == g.PASS
    marginal = {**stats, "attainment_ci": [0.94, 0.98]}
    assert a.check(marginal, gates) == g.MARGINAL and a.passed(marginal, gates)
    assert (
        a.marginal(marginal, gates, "chat")
        == "chat: attainment confidence-sequence lower bound 0.9400 < 0.95"
    )
    assert a.failure(marginal, gates, "chat") is None
    # No interval (no successes) reads as a lower bound of 0.
    assert a.marginal({**stats, "attainment_ci": None}, gates, "chat").endswith("0.0000 < 0.95")
    failed = {"successful_count": 100, "attainment": 0.9, "attainment_ci": [0.85, 0.94]}
    assert a.check(failed, gates) == g.FAIL and a.marginal(failed, gates) is None
    assert a.failure(failed, gates, "chat") == "chat: attainment 0.9000 < 0.95"
    # Under-sampled: not judged, so no words of its own (the sample gate speaks).
    small = {"successful_count": 5, "attainment": 0.2}
    assert a.check(small, gates) == g.INCONCLUSIVE and a.failure(small, gates, "chat") is None
    assert a.check({"successful_count": 100, "attainment": 0.95}, gates) == g.PASS  # >= holds


def test_optional_per_class_gates():
    gates = thresholds(per_class_error_rate_max=0.01, all_attempt_attainment_min=0.9)
    err, allat = g.GATE["class_error_rate"], g.GATE["all_attempt_attainment"]
    assert err.check({"error_rate": 0.01}, gates) == g.PASS
    assert err.failure({"error_rate": 0.02}, gates, "chat") == "chat: error rate 0.0200 > 0.01"
    assert allat.failure({"all_attempt_attainment": 0.85}, gates, "chat") == (
        "chat: all-attempt attainment 0.8500 < 0.9"
    )
    # Nothing attempted: the gate fails without a number to quote.
    assert err.check({"error_rate": None}, gates) == g.FAIL
    assert err.failure({"error_rate": None}, gates, "chat") is None
    assert {x.name for x in g.Gates().active("class")} == {"class_attainment", "sample_size"}


def test_point_gates():
    gates = thresholds(error_rate_max=0.01)
    e, q = g.ERROR_RATE, g.GATE["queue_trend"]
    assert e.check({"error_rate": 0.01}, gates) == g.PASS
    assert e.failure({"error_rate": 0.25}, gates) == "error rate 0.2500 > 0.01"
    assert e.check({"error_rate": None}, gates) == g.FAIL
    assert e.failure({"error_rate": None}, gates) is None
    assert q.check({"queue_trend": "flat"}, gates) == g.PASS
    assert q.check({"queue_trend": "growing"}, gates) == g.FAIL
    assert q.failure({"queue_trend": "growing"}, gates) == "queue trend growing"
    assert q.check({"queue_trend": "inconclusive"}, gates) == g.INCONCLUSIVE
    assert q.failure({"queue_trend": "inconclusive"}, gates) == "queue trend inconclusive"


def test_failing_gates_lists_each_class_then_the_point():
    gates = thresholds(min_successful_samples_per_class=10, per_class_error_rate_max=0.05)
    report = {
        "classes": {
            "a": {"successful_count": 5, "attainment": 0.1, "error_rate": 0.5},
            "b": {"successful_count": 50, "attainment": 0.9, "error_rate": 0.0},
        },
        "error_rate": 0.2,
        "queue_trend": "inconclusive",
    }
    assert failing_gates(report, gates) == [
        "a: 5 successful < 10",
        "a: error rate 0.5000 > 0.05",
        "b: attainment 0.9000 < 0.95",
        "error rate 0.2000 > 0.01",
        "queue trend inconclusive",
    ]


def test_holds_is_elementwise():
    values = pd.Series([0.9, 0.95, np.nan, 1.0])
    assert g.CLASS_ATTAINMENT.holds(values, 0.95).tolist() == [False, True, False, True]
    assert g.CLASS_ATTAINMENT.holds(None, 0.95) is False


# -- the docs follow the registry --------------------------------------------------------------


def test_docs_gate_table_is_the_registry():
    text = (ROOT / "docs" / "reading.md").read_text()
    found = re.search(r"<!-- gates:begin -->\n(.*?)\n<!-- gates:end -->", text, re.S)
    assert found, "docs/reading.md lacks the gate table markers"
    assert found.group(1) == g.markdown_table(), (
        "docs/reading.md's gate table differs from the registry: paste "
        "capacity_pack.evidence.gates.markdown_table() between the markers"
    )
    for gate in g.GATES:
        assert f"`{gate.field}`" in found.group(1)


@pytest.mark.parametrize("optional", [False, True])
def test_pack_readme_names_every_active_gate(optional):
    from capacity_pack.decide.report import gate_sentence

    acc = dict(g.ANALYSIS_DEFAULTS)
    if optional:
        acc |= {"per_class_error_rate_max": 0.02, "all_attempt_attainment_min": 0.9}
    text = gate_sentence(acc)
    gates = g.Gates.of(acc)
    for gate in g.GATES:
        phrase = gate.phrase.format(threshold=gate.threshold(gates))
        assert (phrase in text) == (gate in gates.active(gate.scope)), gate.name
    if not optional:  # the default pack's words
        assert text == (
            "A rate passes when, in **every repeat**, every class has joint TTFT+TPOT attainment "
            ">= 0.95 among successful requests (with its confidence sequence's lower bound "
            "above it too), at least 2000 successful requests, the global error rate is <= 0.01, "
            "the queue trend is flat (Mann-Kendall on queue depth and the client backlog), and "
            "the client kept its schedule (dispatch lateness under its bound)."
        )
