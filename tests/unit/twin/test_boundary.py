"""The engine model's own boundary of a pack: a bracket the model's attainment crosses the gate
in, found from any start, for a simulated target only."""

from __future__ import annotations

import pytest

from capacity_pack.plan.manifest import validate_pack
from capacity_pack.twin.boundary import model_boundary
from tests.conftest import pack_data


@pytest.mark.parametrize("start", [8.0, 100.0])
def test_the_models_boundary_brackets_the_gate_from_below_or_above(start):
    pack = validate_pack(pack_data(), "pack.yaml")
    b = model_boundary(pack, "cold", duration_s=30, seeds=(0,), resolution_rps=1, start_rps=start)
    gate = pack.acceptance.class_slo_attainment_min
    assert 0 < b.misses_rps - b.meets_rps <= 1
    assert min(b.evaluated[b.meets_rps].values()) >= gate
    assert min(b.evaluated[b.misses_rps].values()) < gate
    # The default pack's engine model crosses its gate between 30 and 45 RPS cold.
    assert 30 <= b.meets_rps <= 45
    doc = b.to_dict()
    assert doc["midpoint_rps"] == pytest.approx((b.meets_rps + b.misses_rps) / 2)


def test_only_a_simulated_target_has_a_model_boundary():
    data = pack_data()
    data["target"] = {"kind": "openai", "base_url": "http://127.0.0.1:9", "cache_reset": "none"}
    with pytest.raises(ValueError, match="simulated target only"):
        model_boundary(validate_pack(data, "pack.yaml"), "cold")
