"""Reruns follow the code: each rule's code hash is the import closure of its script.

The unit tests check the closure (against grimp's import graph) and the hash (blind to comments
and docstrings); the slow ones run a tiny pack for real on a copy of the repository, edit the
copy's library and ask ``snakemake -n`` what it would rerun.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import grimp
import pytest
import yaml

from capacity_pack import codehash
from capacity_pack.stages import STAGES
from tests.conftest import SNAKEMAKE, write_pack
from tests.conftest import run_snakemake as snakemake
from tests.integration.test_pipeline import small_pack
from tests.paths import ROOT


def test_closure_matches_grimps_import_graph_for_every_module():
    graph = grimp.build_graph("capacity_pack", exclude_type_checking_imports=True, cache_dir=None)

    def grimp_closure(module: str) -> set[str]:
        seen, todo = {module}, [module]
        while todo:
            name = todo.pop()
            parts = name.split(".")
            parents = {".".join(parts[:i]) for i in range(1, len(parts))}
            for dep in (graph.find_modules_directly_imported_by(name) | parents) - seen:
                seen.add(dep)
                todo.append(dep)
        return seen

    for module in sorted(graph.modules):
        assert set(codehash.closure(module)) == grimp_closure(module), module


def test_imports_anywhere_count_except_type_checking_ones(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from capacity_pack.plan import manifest\n"
        "def f():\n"
        "    from capacity_pack.drills import dashboard\n"
        "    from . import sweep\n"
        "    import capacity_pack.evidence.analysis as a\n"
    )
    parsed = codehash.parse_file(source, "capacity_pack.measure")
    assert parsed.imports == (
        "capacity_pack",
        "capacity_pack.drills",
        "capacity_pack.drills.dashboard",
        "capacity_pack.evidence",
        "capacity_pack.evidence.analysis",
        "capacity_pack.measure",
        "capacity_pack.measure.sweep",
    )


def test_hash_ignores_comments_docstrings_and_layout_but_not_code(tmp_path):
    def digest(text: str) -> str:
        path = tmp_path / f"v{len(list(tmp_path.iterdir()))}.py"
        path.write_text(text)
        return codehash.parse_file(path).digest

    code = '"""Doc."""\nclass A:\n    """Doc."""\n    def f(self, x):\n        return x + 1\n'
    base = digest(code)
    same = digest(
        "# a comment\n"
        '"""Another docstring."""\n\n\n'
        "class A:\n"
        "    def f(self,\n"
        "          x):  # why\n"
        '        """A new docstring."""\n'
        "        return (x\n"
        "                + 1)\n"
    )
    changed = digest(code.replace("x + 1", "x + 2"))
    assert base == same
    assert base != changed


# Modules through which a measurement would reach a presentation module: none since the metric
# maps live in the engine modules. May only shrink.
KNOWN_DASHBOARD_IMPORTERS: set[str] = set()


def test_a_measurement_never_hashes_presentation_modules():
    def stage_closure(name: str) -> list[str]:
        """What the rule's code param hashes (rules/common.smk stage_code_hash)."""
        script = ROOT / "scripts" / f"{name}.py"
        return codehash.closure(script, STAGES[name].entry_module, "capacity_pack.sim.__main__")

    sweep, drill = stage_closure("sweep"), stage_closure("failure_drill")
    assert "capacity_pack.measure.sweep" in sweep
    assert "capacity_pack.sim.server" in sweep
    # A drill runs the load generator (measure.run) without the sweep's point logic.
    assert "capacity_pack.measure.run" in drill
    presentation = (
        "decide.report",
        "decide.html",
        "decide.console",
        "decide.progress",
        "track.tracking",
        "drills.dashboard",
        "drills.alerts",
    )
    for module in presentation:
        assert f"capacity_pack.{module}" not in sweep + drill, module
    importers = {
        m
        for m in sweep + drill
        if {f"capacity_pack.drills.{p}" for p in ("dashboard", "alerts")}
        & set(codehash.direct_imports(m))
    }
    assert importers <= KNOWN_DASHBOARD_IMPORTERS


def test_the_disk_cache_gives_the_same_hashes(tmp_path):
    script = ROOT / "scripts" / "sweep.py"
    cold = codehash.code_hash(script)
    codehash.use_cache_file(tmp_path / "cache.json")
    try:
        codehash.forget()
        assert codehash.code_hash(script) == cold
        assert (tmp_path / "cache.json").is_file()
        codehash.forget()
        codehash.use_cache_file(tmp_path / "cache.json")
        assert codehash.code_hash(script) == cold
    finally:
        codehash.use_cache_file(tmp_path / "none.json")
        codehash.forget()


def test_every_work_directory_shares_the_accounts_cache(tmp_path, default_pack):
    # Keyed by content: a pack's first parse in a new work directory hits what another parsed.
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        write_pack(tmp_path / name, default_pack)
        snakemake(tmp_path / name, "--dry-run", env=env)
    cache = json.loads((tmp_path / "xdg" / "capacity-pack" / "codehash.json").read_text())
    assert len(cache["entries"]) > 100  # every module the rules run
    assert not (tmp_path / "two" / ".snakemake" / "codehash.json").exists()


# --- the real pipeline, on a copy of the repository --------------------------------------------


def tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *WORKFLOW_PATHS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [f for f in out.stdout.splitlines() if (ROOT / f).is_file()]


WORKFLOW_PATHS = ["Snakefile", "rules", "scripts", "workflow", "config", "report"]


def run_snakemake(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    # The jobs and the simulated engine import the copy's library, not the installed one.
    env["PYTHONPATH"] = os.pathsep.join([str(repo / "workflow"), env.get("PYTHONPATH", "")])
    res = subprocess.run(
        [*SNAKEMAKE, "-s", str(repo / "Snakefile")]
        + ["--directory", str(repo / "work"), "--configfile", str(repo / "work" / "pack.yaml")]
        + ["--cores", "2", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if res.returncode != 0:
        raise AssertionError(f"snakemake failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res.stdout


def planned_rules(repo: Path) -> list[str]:
    """The rules of the jobs a dry run would execute, one entry per job."""
    out = run_snakemake(repo, "--dry-run")
    jobs = re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):$", out, flags=re.MULTILINE)
    return sorted(j for j in jobs if j != "all")


def tiny_pack() -> dict:
    data = small_pack()
    data["pack"]["name"] = "reruns-test"
    # One point: a dozen jobs, each mostly its imports.
    data["sweep"].update(open_loop_rps=[10], closed_loop_concurrency=[], cache_states=["cold"])
    # One short drill whose rate and admission limit come from the decision (capacity.json and
    # the SLO report at its rate), so that an analysis edit reaches the drill's numbers; the
    # plan drill (plan.json's fleet, in virtual time) beside it.
    failure = data["failure"]
    del failure["rate_rps"], failure["admission_max_outstanding"]
    return data


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A copy of the workflow that has run the tiny pack once, for real."""
    repo = tmp_path_factory.mktemp("repo")
    for name in tracked_files():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, repo / name)
    (repo / "work").mkdir()
    (repo / "work" / "pack.yaml").write_text(yaml.safe_dump(tiny_pack(), sort_keys=False))
    run_snakemake(repo)
    assert planned_rules(repo) == []
    return repo


def edited(repo: Path, module: str, edit) -> list[str]:
    """The rules a dry run lists after ``edit`` changed one module of the copy's library."""
    path = repo / "workflow" / "capacity_pack" / module
    original = path.read_text()
    path.write_text(edit(original))
    try:
        return planned_rules(repo)
    finally:
        path.write_text(original)


@pytest.mark.slow
def test_a_comment_or_docstring_edit_in_measuring_code_reruns_nothing(repo):
    def edit(text: str) -> str:
        doc_end = text.index('"""', 3) + 3
        text = '"""A different module docstring."""' + text[doc_end:]
        return text.replace("\ndef ", "\n# a new comment\ndef ", 1) + "\n# a trailing comment\n"

    assert edited(repo, "measure/sweep.py", edit) == []


@pytest.mark.slow
def test_an_analysis_only_edit_reruns_analysis_side_jobs_and_never_measures(repo):
    jobs = edited(repo, "evidence/analysis.py", lambda t: t + "\nRERUN_PROBE = 1\n")
    assert set(jobs) >= {"analyze", "capacity", "report", "track", "autopsy"}
    assert jobs.count("analyze") == 1
    assert not {"sweep", "schedule", "normalize", "failure_drill"} & set(jobs)


@pytest.mark.slow
def test_a_rerun_decision_that_lands_where_it_was_runs_no_drill(repo):
    """Not the dry run's guess but the run: the decision is made again (its code changed) and,
    its numbers unchanged, every drill keeps its measurement."""
    drills = sorted((repo / "work" / "results").glob("*/failure/*/drill.json"))
    assert len(drills) == 2  # the capacity-point drill and the plan drill
    decision = next((repo / "work" / "results").glob("*/capacity/capacity.json"))
    decided, before = decision.stat().st_mtime_ns, {p: p.stat().st_mtime_ns for p in drills}
    path = repo / "workflow" / "capacity_pack" / "decide" / "capacity.py"
    original = path.read_text()
    path.write_text(original + "\nRERUN_PROBE = 1\n")
    try:
        run_snakemake(repo)
    finally:
        path.write_text(original)
    assert decision.stat().st_mtime_ns > decided
    assert {p: p.stat().st_mtime_ns for p in drills} == before
    # The decision's code is back as it was: one more decision, still no drill.
    assert "failure_drill" not in planned_rules(repo)


@pytest.mark.slow
def test_a_measuring_code_edit_remeasures(repo):
    jobs = edited(repo, "measure/sweep.py", lambda t: t + "\nRERUN_PROBE = 1\n")
    assert jobs.count("sweep") == 1
    assert "schedule" not in jobs
    assert {"normalize", "analyze", "capacity", "report"} <= set(jobs)
