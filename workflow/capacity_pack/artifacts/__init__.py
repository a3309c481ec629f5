"""Typed artifacts: each JSON file one stage writes and another reads, one pydantic model each
(:mod:`capacity_pack.artifacts.base`); ``capacity-pack schema --artifact NAME`` exports each
model's JSON schema (:data:`ARTIFACTS`).
"""

from __future__ import annotations

from capacity_pack.artifacts.base import Artifact, ArtifactError
from capacity_pack.artifacts.capacity import Capacity
from capacity_pack.artifacts.failure_test import FailureTest
from capacity_pack.artifacts.plan import Plan
from capacity_pack.artifacts.prediction import TwinPrediction
from capacity_pack.artifacts.slo_report import SloReport
from capacity_pack.artifacts.twin_validation import TwinValidation

ARTIFACTS: dict[str, type[Artifact]] = {
    "slo-report": SloReport,
    "capacity": Capacity,
    "plan": Plan,
    "failure-test": FailureTest,
    "twin-prediction": TwinPrediction,
    "twin-validation": TwinValidation,
}

__all__ = [
    "ARTIFACTS",
    "Artifact",
    "ArtifactError",
    "Capacity",
    "FailureTest",
    "Plan",
    "SloReport",
    "TwinPrediction",
    "TwinValidation",
]
