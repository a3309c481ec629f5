"""The analyze stage's miss attribution on a real overloaded point (the committed autopsy
fixture's 150 RPS run): every class that missed its SLO says what its misses were made of."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from capacity_pack.evidence.analysis import AnalysisSpec
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.stages import analyze
from capacity_pack.vocab.slo import requests_meeting_slo
from tests.paths import ROOT

FIXTURE = ROOT / "tests" / "data" / "autopsy"


def test_each_missing_class_names_the_causes_of_its_misses():
    pack = validate_pack(yaml.safe_load((FIXTURE / "pack.yaml").read_text()), "pack.yaml")
    tables = FIXTURE / "pack" / "tables" / "open-r150" / "cold" / "rep0"
    table = pd.read_parquet(tables / "requests.parquet")
    series = pd.read_parquet(tables / "server_metrics.parquet")
    doc = {"classes": {c.name: {} for c in pack.workload}}
    analyze.attribute(doc, table, series, AnalysisSpec.of(pack))
    measured_ok = table[table["phase"].isin(["measure", "extension"]) & (table["status"] == "ok")]
    cutoffs = {c.name: (c.request_ttft_cutoff_ms, c.request_tpot_cutoff_ms) for c in pack.workload}
    met = pd.Series(requests_meeting_slo(measured_ok, cutoffs), index=measured_ok.index)
    missed = (~met).groupby(measured_ok["class"]).sum()
    assert missed.sum() > 0, "the 150 RPS point is overloaded: some class misses"
    for name, entry in doc["classes"].items():
        att = entry["attribution"]
        if not missed.get(name, 0):
            assert att is None
            continue
        assert att["missed"] == missed[name]
        assert sum(att["cause_share"].values()) == pytest.approx(1.0)
        assert att["primary_cause"] == max(att["cause_share"], key=att["cause_share"].get)
        assert att["method"].startswith("server_series")
