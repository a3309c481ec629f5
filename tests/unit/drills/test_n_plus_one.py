"""The plan drill's N+1 verdict on request tables built by hand: PASS, FAIL on what it saw, and
UNDECIDED when a window holds no request of some class (nothing to judge either way)."""

from __future__ import annotations

import pandas as pd
import pytest

from capacity_pack.drills.analyze import DrillAnalysisSpec, n_plus_one
from capacity_pack.drills.plan import DrillInputs
from capacity_pack.plan.manifest import PLAN_DRILL, validate_pack
from tests.conftest import pack_data
from tests.drills import plan_at

NS = 1_000_000_000
INJ, CLEARED, END, BASE = 5 * NS, 9 * NS, 12 * NS, 2 * NS


@pytest.fixture(scope="module")
def setup():
    pack = validate_pack(pack_data(), "test pack")
    plan = plan_at(
        DrillInputs.for_drill(pack, PLAN_DRILL),
        None,
        {},
        {"required_replicas": 2, "replicas_for_load": 1, "redundancy_replicas": 1},
        None,
    )
    return DrillAnalysisSpec.of(pack), plan, [c.name for c in pack.workload]


def requests(rows: list[tuple[str, float, float, str, bool]]) -> pd.DataFrame:
    """(class, sent s, ended s, status, met its SLO) per request."""
    return pd.DataFrame(
        {
            "class": [r[0] for r in rows],
            "sent_offset_ns": [int(r[1] * NS) for r in rows],
            "end_offset_ns": [int(r[2] * NS) for r in rows],
            "status": [r[3] for r in rows],
            "meets_slo": [r[4] for r in rows],
            "failed": [r[3] != "ok" for r in rows],
        }
    )


REPORT = {
    "router_removal_time_s": 5.3,
    "recovery_time_s": 8.0,
    "requests_rejected": 0,
    "requests_lost": 0,
    "execution": "live",
}


def verdict(setup, rows, report=REPORT):
    spec, plan, _ = setup
    return n_plus_one(requests(rows), report, plan, spec, INJ, CLEARED, END, BASE)


def every_class(setup, sent: float, ended: float, ok: bool = True):
    return [(c, sent, ended, "ok", ok) for c in setup[2]]


def test_a_request_of_every_class_in_both_windows_meeting_its_slo_passes(setup):
    n = verdict(setup, every_class(setup, 3.0, 4.0) + every_class(setup, 6.0, 7.0))
    assert n["verdict"] == "PASS", n["why_fail"]
    assert all(v is True for v in n["checks"].values())


def test_a_class_with_no_request_before_the_failure_is_undecided_not_failed(setup):
    # Nothing ended between the warm-up and the injection (a low peak, a short baseline).
    n = verdict(setup, every_class(setup, 6.0, 7.0))
    assert n["verdict"] == "UNDECIDED"
    assert n["checks"]["plan_holds_before_the_failure"] is None
    assert n["checks"]["survivors_carry_the_peak"] is True
    assert any("nothing to judge the healthy fleet by" in w for w in n["why_fail"])
    assert not any("linear scaling" in w for w in n["why_fail"])
    assert "UNDECIDED" in n["sentence"]


def test_a_class_missing_while_one_replica_short_is_undecided(setup):
    first, *rest = setup[2]
    rows = every_class(setup, 3.0, 4.0) + [(c, 6.0, 7.0, "ok", True) for c in rest]
    n = verdict(setup, rows)
    assert n["verdict"] == "UNDECIDED"
    assert n["checks"]["survivors_carry_the_peak"] is None
    assert any(f"no {first} request sent while one replica short" in w for w in n["why_fail"])


def test_a_miss_on_requests_seen_fails_even_where_another_window_is_empty(setup):
    first, *_ = setup[2]
    rows = every_class(setup, 6.0, 7.0)
    rows[0] = (first, 6.0, 7.0, "ok", False)  # the survivors missed a request's SLO
    n = verdict(setup, rows)
    assert n["verdict"] == "FAIL"
    assert n["checks"]["survivors_carry_the_peak"] is False
    assert n["checks"]["plan_holds_before_the_failure"] is None
    assert any(f"class {first}: 0.000 of 1 attempts" in w for w in n["why_fail"])


def test_a_fleet_that_never_recovers_fails(setup):
    rows = every_class(setup, 3.0, 4.0) + every_class(setup, 6.0, 7.0)
    n = verdict(setup, rows, {**REPORT, "recovery_time_s": None})
    assert n["verdict"] == "FAIL" and n["checks"]["recovered"] is False
