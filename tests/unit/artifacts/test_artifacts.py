"""The typed artifacts: each file the pipeline's own writer makes reads back through its model to
the same JSON, a file that does not match is refused in one line naming the file and the field,
and ``capacity-pack schema --artifact`` exports the model's schema."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from click.testing import CliRunner

from capacity_pack.artifacts import ARTIFACTS, ArtifactError, Capacity, Plan, SloReport
from capacity_pack.artifacts.prediction import TwinPrediction
from capacity_pack.cli import main
from capacity_pack.evidence.gates import pack_gates
from capacity_pack.evidence.slo_report import class_report, pack_classes
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.stages import twin_predict
from tests.conftest import small_pack_data
from tests.paths import ROOT
from tests.unit.stages.test_capacity_stage_tail import run_stage, tail_pack

PROFILES = ROOT / "workflow" / "capacity_pack" / "profiles"


def test_capacity_and_plan_round_trip_what_the_capacity_stage_writes(tmp_path):
    run_stage(tmp_path, tail_pack())
    for model, name in ((Capacity, "capacity.json"), (Plan, "plan.json")):
        path = tmp_path / name
        assert model.read(path).dump() == json.loads(path.read_text())
    cap = Capacity.read(tmp_path / "capacity.json")
    assert cap.primary().bracket.pass_rps == cap.primary().capacity_rps == 20


def test_an_slo_report_round_trips_to_the_same_bytes(tmp_path):
    pack = validate_pack(small_pack_data("t", requests=60, min_samples=5), "pack")
    classes, rng = pack_classes(pack), np.random.default_rng(0)
    n = 300
    cols = {
        "code": rng.integers(0, len(classes), n),
        "ok": rng.random(n) > 0.05,
        "ttft": rng.gamma(2.0, 60.0, n),
        "tpot": rng.gamma(2.0, 8.0, n),
        "e2e": rng.gamma(2.0, 600.0, n),
        "out": rng.integers(10, 200, n).astype(float),
    }
    doc = class_report(cols, 30.0, "flat", classes, pack_gates(pack))
    doc.update(point="open-r10", key="open-r10/cold/rep0", cache_state="cold", repeat=0,
               mode="open", offered_rps=10, concurrency=None, verdict="pass")  # fmt: skip
    path = tmp_path / "slo-report.json"
    SloReport.parse(doc, path).write(path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(doc))
    again = tmp_path / "again.json"
    SloReport.read(path).write(again)
    assert again.read_bytes() == path.read_bytes()
    # A declared integer rate stays an integer on disk.
    assert '"offered_rps": 10,' in path.read_text()


@pytest.mark.slow
def test_the_twin_prediction_round_trips_what_twin_predict_writes(tmp_path):
    data = small_pack_data("t", requests=60, min_samples=5, sweep={"open_loop_rps": [10, 20]})
    (tmp_path / "calibration.json").write_text(json.dumps({"method": "m", "other": 1}))
    out = tmp_path / "prediction.json"
    twin_predict.run(
        pack=json.dumps(validate_pack(data, "pack").model_dump(mode="json")),
        profile=PROFILES / "small-fast.yaml",
        calibration=tmp_path / "calibration.json", prediction=out, log=logging.getLogger("t"),
    )  # fmt: skip
    doc = json.loads(out.read_text())
    assert TwinPrediction.read(out).dump() == doc
    assert doc["format"] == "capacity-pack/twin-prediction/v1"
    assert doc["calibration"] == {"method": "m"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"open_loop": {"cold": {"bracket": {"pass_rps": "x", "fail_rps": 3}}}}',
         r"capacity.json: not a Capacity file: open_loop.cold.bracket.pass_rps\.int: Input"),
        ('{"closed_loop": {}}', r"capacity.json: not a Capacity file: open_loop: Field required"),
        ('{"open_loop": {}, "surprise": 1}', r"surprise: Extra inputs are not permitted"),
        ("[1, 2", r"capacity.json: cannot read Capacity: Expecting"),
    ],
)  # fmt: skip
def test_a_file_that_does_not_match_is_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "capacity.json"
    path.write_text(text)
    with pytest.raises(ArtifactError, match=message) as err:
        Capacity.read(path)
    assert "\n" not in str(err.value)


def test_a_missing_file_is_named():
    with pytest.raises(ArtifactError, match="nowhere/plan.json: cannot read Plan"):
        Plan.read("nowhere/plan.json")


@pytest.mark.parametrize("name", sorted(ARTIFACTS))
def test_the_exported_schema_is_the_models(tmp_path, name):
    out = tmp_path / f"{name}.schema.json"
    res = CliRunner().invoke(main, ["schema", "--artifact", name, "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text()) == ARTIFACTS[name].model_json_schema()
