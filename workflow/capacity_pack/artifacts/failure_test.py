"""``pack/failure-test.json``: every drill side by side, the plan drill's answer and the checks
across drills; written by ``failure_test`` (:func:`capacity_pack.drills.render.failure_test`),
read by ``report``, the console's last lines, the HTML page and ``capacity-pack compare``.

Each drill's own report (``drill-report.json``, its fields by drill kind) is kept whole in
``drills``: its fields are stated in docs/failure-drills.md, "How the fields are computed".
"""

from __future__ import annotations

from typing import Any

from capacity_pack.artifacts.base import Artifact, Num, Part


class PlanAnswer(Part):
    """The plan drill's answer to "what happens when one replica fails": its verdict and
    sentence always; the rest only when the drill ran (``NOT RUN`` carries neither)."""

    verdict: str
    sentence: str
    why_fail: list[str] | str | None = None
    execution: str | None = None
    execution_reason: str | None = None
    replicas: int | None = None
    peak_rps: Num | None = None
    recovery_after_injection_s: Num | None = None
    requests_rejected: int | None = None
    requests_lost: int | None = None


class FailureSummary(Part):
    """The checks across drills: which ran or were skipped (and why), which alerts fired, which
    drills' alerts were not evaluated (and why), other mechanisms' alerts firing in a drill, and
    one line per mechanism drill in words."""

    drills_run: list[str]
    drills_skipped: dict[str, str]
    any_alert_fired: bool
    expected_alerts_fired: dict[str, bool]
    alerts_not_evaluated: dict[str, str | None]
    unexpected_mechanisms: dict[str, list[str]]
    mechanism_lines: list[str]


class FailureTest(Artifact):
    """The failure test: the pack section it ran for (with its label), the one clock every
    drill used (None when live and virtual drills differ; ``clocks`` names each), every drill's
    report, the plan drill's :class:`PlanAnswer` (None: no plan drill) and the
    :class:`FailureSummary`."""

    pack: dict[str, Any]
    clock: str | None
    clocks: dict[str, str]
    drills: list[dict[str, Any]]
    plan_drill: PlanAnswer | None
    summary: FailureSummary

    @property
    def drill_names(self) -> list[str]:
        return [d["drill"] for d in self.drills]
