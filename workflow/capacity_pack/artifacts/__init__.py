"""Typed artifacts: each JSON file one stage writes and another reads, one pydantic model each
(:mod:`capacity_pack.artifacts.base`); ``capacity-pack schema --artifact NAME`` exports each
model's JSON schema (:data:`ARTIFACTS`).
"""

from __future__ import annotations

from capacity_pack.artifacts.base import Artifact, ArtifactError
from capacity_pack.artifacts.capacity import Capacity
from capacity_pack.artifacts.plan import Plan
from capacity_pack.artifacts.prediction import TwinPrediction
from capacity_pack.artifacts.slo_report import SloReport

ARTIFACTS: dict[str, type[Artifact]] = {
    "slo-report": SloReport,
    "capacity": Capacity,
    "plan": Plan,
    "twin-prediction": TwinPrediction,
}

__all__ = [
    "ARTIFACTS",
    "Artifact",
    "ArtifactError",
    "Capacity",
    "Plan",
    "SloReport",
    "TwinPrediction",
]
