"""The capacity decision of the tests' report dicts, as the dicts the report and page take."""

from __future__ import annotations

from typing import Any

from capacity_pack.artifacts import Capacity, SloReport
from capacity_pack.decide import capacity


def reports_of(docs: list[dict[str, Any]]) -> list[SloReport]:
    return [SloReport.model_validate(d) for d in docs]


def build_capacity(docs: list[dict[str, Any]], pack) -> dict[str, Any]:
    return capacity.build_capacity(reports_of(docs), pack).dump()


def build_plan(cap: dict[str, Any], docs: list[dict[str, Any]], pack) -> dict[str, Any]:
    return capacity.build_plan(Capacity.model_validate(cap), reports_of(docs), pack)
