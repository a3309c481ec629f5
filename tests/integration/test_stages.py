"""The stage table (capacity_pack.stages) against the rules, the scripts and the CLI.

Every rule has a stage row whose entry point, inputs model and tracking record resolve; every
rule script only opens its job log and calls its stage's entry point; the rules' outputs are the
table's; importing the table imports no stage module (so a rule's code hash is its own stage's).
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from capacity_pack import stages
from tests.paths import DEFAULT_CONFIG, ROOT

RULE = re.compile(r"^(?:rule|checkpoint) (\w+):", re.MULTILINE)


def smk_rules() -> list[str]:
    names = [n for f in sorted((ROOT / "rules").glob("*.smk")) for n in RULE.findall(f.read_text())]
    return [n for n in names if n != "all"]


def test_every_rule_is_a_stage_and_every_stage_a_rule():
    assert sorted(smk_rules()) == sorted(stages.STAGES)


@pytest.mark.parametrize("name", sorted(stages.STAGES))
def test_each_stage_names_objects_that_exist(name):
    stage = stages.STAGES[name]
    run = stages.entry(name)
    assert callable(run)
    params = inspect.signature(run).parameters
    assert "log" in params and all(p.kind is p.KEYWORD_ONLY for p in params.values()), name
    if stage.inputs is not None:
        assert issubclass(stages.resolve(stage.inputs), BaseModel)
    if stage.record is not None:
        assert callable(stages.resolve(stage.record))
        assert stage.summary in stage.outputs
        assert stage in stages.TRACKED[stage.tracked_as]


def test_a_point_is_one_run_and_a_drill_another():
    assert {name: [s.name for s in group] for name, group in stages.TRACKED.items()} == {
        "point": ["schedule", "sweep", "analyze"],
        "failure": ["failure_analyze"],
    }


def test_the_record_of_a_summary_is_its_stages():
    """A tracked job's summary finds its stage's record by its path, and no other does."""
    point = stages.record("point")
    summary = {"point": "open-r30", "cache_state": "cold", "repeat": 0}
    with pytest.raises(ValueError, match="not the summary of a job tracked as 'point'"):
        point("results/p/tables/open-r30/cold/rep0/summary.json", summary)
    with pytest.raises(ValueError, match="tracked as 'failure'"):
        stages.record("failure")("results/p/reports/open-r30/cold/rep0/slo-report.json", summary)


@pytest.mark.parametrize("name", sorted(stages.STAGES))
def test_each_script_opens_its_log_and_calls_its_stage(name):
    script = ROOT / "scripts" / f"{name}.py"
    tree = ast.parse(script.read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    } | {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    assert imported <= {"capacity_pack.logs", "capacity_pack.stages"}, imported
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Call)
    ]
    called = [
        c.func.args[0].value
        for c in calls
        if getattr(c.func.func, "id", None) == "entry" and c.func.args
    ]
    assert called == [name]
    assert "job_logging(snakemake.log[0])" in script.read_text()


def test_importing_the_table_imports_no_stage_module():
    tree = ast.parse((ROOT / "workflow/capacity_pack/stages/__init__.py").read_text())
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in modules if m and m.startswith("capacity_pack")], modules
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, capacity_pack.stages; "
            "print(sorted(m for m in sys.modules if m.startswith('capacity_pack')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "['capacity_pack', 'capacity_pack.stages']"


def test_output_paths_fill_the_wildcards_they_are_given():
    sweep = stages.STAGES["sweep"]
    assert sweep.output("records", "results/p") == (
        "results/p/raw/{point}/{cache}/rep{repeat}/records.jsonl"
    )
    assert sweep.output("summary", "r", point="open-r2.5", cache="warm", repeat=1) == (
        "r/raw/open-r2.5/warm/rep1/summary.json"
    )
    assert stages.STAGES["failure_analyze"].output("report", drill="x") == (
        "failure/x/drill-report.json"
    )


# --- the rules' outputs, read from the parsed workflow -------------------------------------------

WILDCARD = re.compile(r"\{(\w+),[^}]*\}")


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, ResourceSettings, StorageSettings

    workdir = tmp_path_factory.mktemp("wd")
    with SnakemakeApi() as api:
        wf = api.workflow(
            snakefile=ROOT / "Snakefile",
            resource_settings=ResourceSettings(),
            config_settings=ConfigSettings(configfiles=[DEFAULT_CONFIG]),
            storage_settings=StorageSettings(),
            workdir=workdir,
        )
        yield wf._workflow


def rule_outputs(rule) -> dict[str, str]:
    """A rule's named outputs, wildcard constraints removed."""
    out = {}
    for key, (start, end) in rule.output._names.items():
        files = list(rule.output)[start : end if end is not None else start + 1]
        out[key] = [WILDCARD.sub(r"{\1}", str(f)) for f in files]
    return out


def test_the_rules_outputs_are_the_tables(workflow):
    results = "results/rehearsal-sim"
    for name, stage in stages.STAGES.items():
        got = rule_outputs(workflow.get_rule(name))
        want = {k: [v] for k, v in stage.output_paths(results).items()}
        if name == "report":
            # The plots beside the README: the pack's sweep decides which.
            plots = got.pop("plots")
            assert [Path(p).name for p in plots] == list(stages.REPORT_PLOTS)
            assert {str(Path(p).parent) for p in plots} == {f"{results}/{stage.folder}"}
        if name == "shapes":
            # Each experiment's picture beside the README: the pack's experiments decide which.
            from capacity_pack.plan.manifest import load_pack

            pictures = [Path(p).name for p in got.pop("plots")]
            names = [e.name for e in load_pack(DEFAULT_CONFIG).experiments]
            assert pictures == [f"shape-{n}.png" for n in names]
        if name == "failure_test":
            # Each drill's timeline beside failure-test.md: the pack's drills decide which.
            pictures = [Path(p).name for p in got.pop("timelines")]
            from capacity_pack.plan.manifest import load_pack

            drills = [d.name for d in load_pack(DEFAULT_CONFIG).failure.all_drills]
            assert pictures == [f"failure-timeline-{d}.png" for d in drills]
        assert got == want, name


def test_point_stages_write_under_one_point_folder():
    for name in ("schedule", "prompts", "sweep", "normalize", "analyze"):
        assert stages.STAGES[name].folder.endswith("/" + stages.POINT_DIR), name


# --- the CLI runs the same entry points ------------------------------------------------------


def test_cli_schedule_writes_what_the_schedule_stage_writes(tmp_path):
    import logging

    from click.testing import CliRunner

    from capacity_pack.cli import main
    from capacity_pack.plan import schedule as S
    from capacity_pack.plan.manifest import load_pack

    config = DEFAULT_CONFIG
    out = tmp_path / "cli.parquet"
    res = CliRunner().invoke(
        main,
        ["schedule", str(config), "--point", "open-r20", "--cache-state", "warm", "-o", str(out)],
    )
    assert res.exit_code == 0, res.output
    pack = load_pack(config)
    point = S.find_point(pack, "open-r20", "warm", 0)
    stages.entry("schedule")(
        inputs=S.ScheduleInputs.for_point(pack, point).canonical_json(),
        point="open-r20",
        cache_state="warm",
        repeat=0,
        schedule=tmp_path / "rule.parquet",
        summary=tmp_path / "rule.json",
        log=logging.getLogger("test"),
    )
    assert out.read_bytes() == (tmp_path / "rule.parquet").read_bytes()
    assert out.with_suffix(".json").read_text() == (tmp_path / "rule.json").read_text()
    assert f"{out}: " in res.output


def test_cli_alerts_writes_what_the_dashboard_stage_writes(tmp_path):
    import logging

    from click.testing import CliRunner

    from capacity_pack.cli import main
    from capacity_pack.io import canonical_json
    from capacity_pack.plan.manifest import load_pack

    config = DEFAULT_CONFIG
    rules, board = tmp_path / "cli.yaml", tmp_path / "cli.json"
    res = CliRunner().invoke(
        main, ["alerts", str(config), "--rules", str(rules), "--dashboard", str(board)]
    )
    assert res.exit_code == 0, res.output
    omitted = stages.entry("dashboard")(
        inputs=canonical_json(load_pack(config).model_dump(mode="json")),
        rules=tmp_path / "rule.yaml",
        omitted=tmp_path / "omitted.json",
        dashboard_path=tmp_path / "rule.json",
        log=logging.getLogger("test"),
    )
    assert rules.read_text() == (tmp_path / "rule.yaml").read_text()
    assert board.read_text() == (tmp_path / "rule.json").read_text()
    assert all(f"left out: {o['alert']}" in res.output for o in omitted)


@pytest.mark.slow
def test_cli_drill_runs_the_drill_stages(tmp_path):
    import yaml
    from click.testing import CliRunner

    from capacity_pack.cli import main
    from tests.integration.test_failure import drill_pack

    config = tmp_path / "pack.yaml"
    pack = drill_pack(tmp_path).model_dump(mode="json", exclude_none=True)
    config.write_text(yaml.safe_dump(pack, sort_keys=False))
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main, ["drill", str(config), "--drill", "replica_kill", "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "expected alert fired: yes" in res.output
    files = {p.name for p in out.iterdir()}
    assert {*stages.STAGES["failure_drill"].outputs.values(), "alert-rules.yaml"} <= files
    assert stages.STAGES["failure_analyze"].outputs["report"] in files
    res = CliRunner().invoke(main, ["drill", str(config), "--drill", "nope", "-o", str(out)])
    assert res.exit_code == 1 and "no drill named 'nope'" in res.output
