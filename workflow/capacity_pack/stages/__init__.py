"""The pipeline's stages in one table: what one Snakemake rule runs (``rules/<file>.smk``,
``scripts/<stage>.py``) and the ``capacity-pack`` command runs for the same work. A row names:
``entry``, the ``"module:function"`` both call (plain values, input and output paths, a logger);
``inputs``, the pydantic model of the manifest content read (the rule's ``inputs``/``spec``/
``pack`` param is its canonical JSON, so nothing else of the manifest reruns it); ``folder`` and
``outputs``, relative to ``results/<pack name>`` with the rule's wildcards (``{point}/{cache}/
rep{repeat}``, ``{cache}/round{round}``, ``{drill}``, ``{stage}``), the rules' only file names;
``record`` and ``tracked_as``, for a stage with MLflow child runs, the function mapping one job's
summary (output ``summary``) to ``track.tracking.log_child_run``'s arguments and its ``track``
job's name (``tracking/<name>.json``).

Entries and records are dotted strings imported only when called, so a rule's code hash
(:mod:`capacity_pack.codehash`) is its own entry module's closure, not every stage's; for the
same reason ``track`` never imports this module and gets its record function by name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The folder of one measurement point's files under a stage's own folder, in rule wildcards.
POINT_DIR = "{point}/{cache}/rep{repeat}"


@dataclass(frozen=True)
class Stage:
    """One row of the table (see the module docstring)."""

    name: str
    entry: str
    folder: str
    outputs: Mapping[str, str]
    inputs: str | None = None
    record: str | None = None
    tracked_as: str | None = None
    summary: str = "summary"
    doc: str = field(default="", compare=False)

    @property
    def entry_module(self) -> str:
        """The module of the entry point: the root of the stage's code hash."""
        return self.entry.partition(":")[0]

    @property
    def record_module(self) -> str | None:
        return self.record.partition(":")[0] if self.record else None

    def output(self, key: str, results: str = "", **wildcards: Any) -> str:
        """The path of output ``key`` under ``results``; wildcards given are filled in, the rest
        are left as ``{name}`` for Snakemake."""
        path = f"{self.folder}/{self.outputs[key]}"
        if wildcards:
            path = path.format_map(_Keep(wildcards))
        return f"{results}/{path}" if results else path

    def output_paths(self, results: str = "", **wildcards: Any) -> dict[str, str]:
        """Every output of the stage by name (a rule's ``output: **...``)."""
        return {key: self.output(key, results, **wildcards) for key in self.outputs}


class _Keep(dict):
    """Formatting map that leaves wildcards it does not know as they are."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def point_wildcards(point: Any) -> dict[str, Any]:
    """The rule wildcards of a ``plan.schedule.Point``."""
    return {"point": point.point_id, "cache": point.cache_state, "repeat": point.repeat}


_STAGES = [
    Stage(
        "freeze",
        entry="capacity_pack.stages.freeze:run",
        inputs="capacity_pack.plan.manifest:Pack",
        folder="manifest",
        outputs={"frozen": "frozen.json", "fit": "fit-probe.json"},
        doc="Lint, refuse mutable revisions, write the frozen manifest, open the MLflow parent.",
    ),
    Stage(
        "schedule",
        entry="capacity_pack.stages.schedule:run",
        inputs="capacity_pack.plan.schedule:ScheduleInputs",
        folder="schedules/" + POINT_DIR,
        outputs={"schedule": "schedule.parquet", "summary": "summary.json"},
        record="capacity_pack.track.records:schedule",
        tracked_as="point",
        doc="Seeded arrival schedule of one point.",
    ),
    Stage(
        "prompts",
        entry="capacity_pack.stages.prompts:run",
        inputs="capacity_pack.plan.prepared:PromptInputs",
        folder="prompts/" + POINT_DIR,
        outputs={"prompts": "prompts.parquet"},
        doc="Every scheduled request's exact prompt, prepared before the target is reserved.",
    ),
    Stage(
        "preflight",
        entry="capacity_pack.stages.preflight:run",
        inputs="capacity_pack.plan.manifest:Pack",
        folder="preflight",
        outputs={"preflight": "preflight.json"},
        doc="A simulated target's planned points and bracket predicted in virtual time.",
    ),
    Stage(
        "sweep",
        entry="capacity_pack.stages.sweep:run",
        inputs="capacity_pack.measure.inputs:SweepInputs",
        folder="raw/" + POINT_DIR,
        outputs={
            "records": "records.jsonl",
            "metrics": "metrics.parquet",
            "summary": "summary.json",
        },
        record="capacity_pack.track.records:sweep",
        tracked_as="point",
        doc="Measure one point against the target.",
    ),
    Stage(
        "normalize",
        entry="capacity_pack.stages.normalize:run",
        inputs="capacity_pack.plan.schedule:ScheduleInputs",
        folder="tables/" + POINT_DIR,
        outputs={
            "requests": "requests.parquet",
            "chunks": "chunks.parquet",
            "metrics": "server_metrics.parquet",
            "csv": "requests.csv",
            "summary": "summary.json",
        },
        doc="Records -> validated requests, chunks and server-metrics tables.",
    ),
    Stage(
        "analyze",
        entry="capacity_pack.stages.analyze:run",
        inputs="capacity_pack.evidence.analysis:AnalysisSpec",
        folder="reports/" + POINT_DIR,
        outputs={"report": "slo-report.json"},
        record="capacity_pack.track.records:analysis",
        tracked_as="point",
        summary="report",
        doc="Per-class SLO report of one point.",
    ),
    Stage(
        "search_round",
        entry="capacity_pack.stages.search:run_round",
        inputs="capacity_pack.decide.search:SearchInputs",
        folder="search/{cache}",
        outputs={"round": "round{round}.json"},
        doc="One round of a cache state's SLO-boundary search: the bracket, the next round.",
    ),
    Stage(
        "search",
        entry="capacity_pack.stages.search:run",
        inputs="capacity_pack.decide.search:SearchInputs",
        folder="search/{cache}",
        outputs={"summary": "search.json"},
        doc="A cache state's finished search: each round's points, why it stopped, the bracket.",
    ),
    Stage(
        "capacity",
        entry="capacity_pack.stages.capacity:run",
        inputs="capacity_pack.plan.manifest:Pack",
        folder="capacity",
        outputs={"capacity": "capacity.json", "plan": "plan.json"},
        doc="Capacity per cache state, the closed-loop operating point, the replica plan.",
    ),
    Stage(
        "calibrate",
        entry="capacity_pack.stages.calibrate:run",
        inputs="capacity_pack.twin.calibrate:CalibrationInputs",
        folder="twin",
        outputs={"calibration": "calibration.json", "profile": "profile.yaml"},
        doc="The target's engine model fitted to the declared cold closed-loop points.",
    ),
    Stage(
        "twin_predict",
        entry="capacity_pack.stages.twin_predict:run",
        inputs="capacity_pack.plan.manifest:Pack",
        folder="twin",
        outputs={"prediction": "prediction.json"},
        doc="The calibrated twin's open-loop capacity, predicted before the open loop is read.",
    ),
    Stage(
        "twin_validate",
        entry="capacity_pack.stages.twin_validate:run",
        inputs="capacity_pack.plan.manifest:Pack",
        folder="twin",
        outputs={"validation": "validation.json"},
        doc="The twin's predicted capacity against the measured one, trusted within a tolerance.",
    ),
    Stage(
        "shapes",
        entry="capacity_pack.stages.shapes:run",
        inputs="capacity_pack.decide.shapes:ShapesInputs",
        folder="pack",
        outputs={"json": "shapes.json"},
        doc="Each load-shape experiment's own answer and plot (shape-<experiment>.png).",
    ),
    Stage(
        "report",
        entry="capacity_pack.stages.report:run",
        folder="pack",
        outputs={"readme": "README.md"},
        doc="The pack folder (README, plots, copies).",
    ),
    Stage(
        "dashboard",
        entry="capacity_pack.stages.dashboard:run",
        inputs="capacity_pack.plan.manifest:Pack",
        folder="pack",
        outputs={
            "rules": "alerts/alert-rules.yaml",
            "omitted": "alerts/omitted.json",
            "dashboard": "dashboard/grafana-dashboard.json",
        },
        doc="Prometheus alert rules and a Grafana dashboard.",
    ),
    Stage(
        "failure_drill",
        entry="capacity_pack.stages.failure_drill:run",
        inputs="capacity_pack.drills.plan:DrillInputs",
        folder="failure/{drill}",
        outputs={
            "drill": "drill.json",
            "records": "records.jsonl",
            "samples": "samples.parquet",
            "scrapes": "scrapes.parquet",
            "events": "events.json",
        },
        doc="Run one failure drill (capacity point, or the plan drill at the planned peak).",
    ),
    Stage(
        "failure_analyze",
        entry="capacity_pack.stages.failure_analyze:run",
        inputs="capacity_pack.drills.analyze:DrillAnalysisSpec",
        folder="failure/{drill}",
        outputs={"report": "drill-report.json", "timeline": "timeline.png"},
        record="capacity_pack.track.records:drill",
        tracked_as="failure",
        summary="report",
        doc="One drill's failure-test fields; the alert rules evaluated on its series.",
    ),
    Stage(
        "failure_test",
        entry="capacity_pack.stages.failure_test:run",
        folder="pack",
        outputs={"markdown": "failure-test.md", "json": "failure-test.json"},
        doc="failure-test.md and failure-test.json: every drill side by side.",
    ),
    Stage(
        "track",
        entry="capacity_pack.track.tracking:run_stage",
        folder="tracking",
        outputs={"runs": "{stage}.json"},
        doc="MLflow runs of the tracked jobs: one per measured point, one per drill.",
    ),
    Stage(
        "publish",
        entry="capacity_pack.stages.publish:run",
        folder="tracking",
        outputs={"published": "parent.json"},
        doc="The finished pack on its MLflow parent run: decision, metrics, every pack file.",
    ),
    Stage(
        "autopsy",
        entry="capacity_pack.stages.autopsy:run",
        inputs="capacity_pack.plan.manifest:Pack",
        folder="pack",
        outputs={"markdown": "autopsy.md", "json": "autopsy.json"},
        doc="Where the run's wall clock and each SLO miss went.",
    ),
    Stage(
        "html",
        entry="capacity_pack.stages.html:run",
        folder="pack",
        outputs={"index": "index.html"},
        doc="The pack as one self-contained page: decision first, evidence per point, limits.",
    ),
]

#: Every stage by name, in pipeline order.
STAGES: dict[str, Stage] = {s.name: s for s in _STAGES}
#: The stages whose jobs get MLflow child runs, by their ``track`` job's name: a measured point's
#: schedule, measurement and analysis share one run (``point``); each drill has its own.
TRACKED: dict[str, tuple[Stage, ...]] = {}
for _stage in _STAGES:
    if _stage.tracked_as:
        TRACKED[_stage.tracked_as] = (*TRACKED.get(_stage.tracked_as, ()), _stage)
#: The plots the report writes beside the README, and the sweep each needs.
REPORT_PLOTS = {
    "throughput.png": None,
    "attainment.png": None,
    "latency.png": None,
    "closed_loop.png": "closed_loop_concurrency",
    "timeseries.png": "has_open_loop",
}


def report_plots(sweep: Any) -> list[str]:
    """The plot files of a pack whose sweep section is ``sweep``."""
    return [name for name, need in REPORT_PLOTS.items() if need is None or getattr(sweep, need)]


def resolve(dotted: str) -> Any:
    """The object named ``"module:attribute"``, imported now."""
    module, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module), attr)


def entry(name: str) -> Callable[..., Any]:
    """The entry point of stage ``name``."""
    return resolve(STAGES[name].entry)


def record(tracked: str) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """The record function of the jobs tracked as ``tracked``: it maps a summary's path (under
    the pack's results folder) and content to its run's keyword arguments, with the record of
    the stage whose folder holds the path."""
    import re

    matchers = []
    for stage in TRACKED[tracked]:
        pattern = re.escape(f"{stage.folder}/{stage.outputs[stage.summary]}")
        # Wildcards ({point}, {cache}, {repeat}, {drill}) match one path component each.
        pattern = re.sub(r"\\\{\w+\\\}", "[^/]+", pattern)
        matchers.append((re.compile(f"(?:^|/){pattern}$"), resolve(stage.record)))

    def record_of(path: str, summary: dict[str, Any]) -> dict[str, Any]:
        for matcher, fn in matchers:
            if matcher.search(str(path)):
                return fn(summary)
        raise ValueError(f"{path}: not the summary of a job tracked as {tracked!r}")

    return record_of
