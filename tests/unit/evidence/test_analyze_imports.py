"""``python -m capacity_pack analyze CSV DURATION TREND`` loads only what the analysis uses.

Each test runs the command in a fresh interpreter with ``-X importtime`` (every module the
process imports is listed on standard error) and asserts on the listed modules: no pandas,
pydantic, MLflow, matplotlib, SciPy, click or pack models for a valid file (a refused one loads
pandas for the exact path that words the error, and nothing else of these).
It also checks that the quick route and the click command print the same report and the same
error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from capacity_pack.cli import main
from capacity_pack.evidence.requests_csv import CSV_COLUMNS

# Top-level packages the analyzer does not use; each costs more than a small file's analysis.
NOT_LOADED = ("pandas", "pydantic", "mlflow", "matplotlib", "scipy", "click", "yaml", "pandera")
OUTPUTS = {"interactive": 128, "long_context": 256, "generation_heavy": 1024}


def write_csv(path: Path, n: int = 30, bad_class_at: int | None = None) -> Path:
    lines = [",".join(CSV_COLUMNS)]
    for i in range(n):
        name = list(OUTPUTS)[i % 3] if i != bad_class_at else "batch"
        if i % 7 == 6:
            lines.append(f"r-{i},{name},0,0,0,0,timeout")
            continue
        ttft, tpot, out = 100.0 + i, 20.0 + i / 10, OUTPUTS.get(name, 128)
        e2e = round(ttft + tpot * (out - 1), 2)
        lines.append(f"r-{i},{name},{ttft},{tpot},{e2e},{out},ok")
    path.write_text("\n".join(lines) + "\n")
    return path


def run_analyze(path: Path) -> tuple[subprocess.CompletedProcess, set[str], list[str]]:
    """The command's result, the modules it imported, and its standard error without the
    import-time lines."""
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "capacity_pack", "analyze", str(path)]
        + ["300", "flat"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    modules, other = set(), []
    for line in res.stderr.splitlines():
        if line.startswith("import time:"):
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line
                modules.add(name)
        else:
            other.append(line)
    return res, modules, other


def loaded(modules: set[str], package: str) -> list[str]:
    return sorted(m for m in modules if m == package or m.startswith(package + "."))


def test_analyzing_a_csv_imports_neither_pandas_nor_pydantic_nor_the_cli(tmp_path):
    path = write_csv(tmp_path / "requests.csv")
    res, modules, other = run_analyze(path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert other == []
    report = json.loads(res.stdout)
    assert report["attempted"] == 30 and report["failed"] == 4  # rows 6, 13, 20, 27
    # The analysis did run in this process: its modules are listed.
    assert "capacity_pack.evidence.requests_csv" in modules and "pyarrow.csv" in modules
    for package in NOT_LOADED:
        assert loaded(modules, package) == [], package
    assert loaded(modules, "capacity_pack.plan") == []
    assert "capacity_pack.cli" not in modules
    # The click command prints the same report.
    result = CliRunner().invoke(main, ["analyze", str(path), "300", "flat"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == report


def test_a_refused_file_is_one_line_exit_1_without_the_cli_or_pack_models(tmp_path):
    (tmp_path / "workload-manifest.yaml").write_text("{}\n")  # named in the hint
    path = write_csv(tmp_path / "requests.csv", bad_class_at=11)
    res, modules, other = run_analyze(path)
    assert res.returncode == 1 and res.stdout == ""
    assert len(other) == 1
    assert other[0] == (
        f"Error: {path}: line 13: unknown workload class 'batch' (known: interactive, "
        "long_context, generation_heavy); the pack's classes and cutoffs come with --manifest "
        f"{tmp_path / 'workload-manifest.yaml'}"
    )
    # The exact path, which words the error, reads the file again as a pandas table.
    for package in set(NOT_LOADED) - {"pandas"}:
        assert loaded(modules, package) == [], package
    result = CliRunner().invoke(main, ["analyze", str(path), "300", "flat"])
    assert result.exit_code == 1 and result.output.strip() == other[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["300", "sideways"], "Error: queue trend must be flat or growing"),
        (["0", "flat"], "Error: duration must be positive"),
    ],
)
def test_bad_arguments_read_the_same_on_both_routes(tmp_path, args, message):
    path = write_csv(tmp_path / "requests.csv")
    res = subprocess.run(
        [sys.executable, "-m", "capacity_pack", "analyze", str(path), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (res.returncode, res.stdout, res.stderr.strip()) == (1, "", message)
    result = CliRunner().invoke(main, ["analyze", str(path), *args])
    assert result.exit_code == 1 and result.output.strip() == message


def test_other_command_lines_go_to_the_cli(tmp_path):
    path = write_csv(tmp_path / "requests.csv")
    # Not a number: click words the usage error (exit status 2).
    res = subprocess.run(
        [sys.executable, "-m", "capacity_pack", "analyze", str(path), "soon", "flat"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "'soon' is not a valid float" in res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "capacity_pack", "analyze", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and "--manifest" in res.stdout
