"""What the whole-pack benchmarks share: one pack run by Snakemake, timed, and its brackets.

Used by ``bench_seed_robustness.py`` and ``bench_real_engine_cores.py`` (run as scripts from the
repository root: this folder is then first on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_snakemake(workdir: Path, configfile: Path, cores: int) -> tuple[int, float]:
    """``snakemake --cores cores`` of ``configfile`` in ``workdir`` (its output to
    ``workdir/snakemake.out``, no MLflow URI from the environment): (exit status, wall s)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = str(ROOT / "workflow")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
           str(workdir), "--configfile", str(configfile), "--cores", str(cores)]  # fmt: skip
    start = time.monotonic()
    with (workdir / "snakemake.out").open("w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    return rc, time.monotonic() - start


def read_capacity(results: Path) -> dict[str, Any] | None:
    """The pack's ``capacity.json``, or None when the run wrote none."""
    path = results / "pack" / "capacity.json"
    return json.loads(path.read_text()) if path.exists() else None


def bracket_row(sel: dict[str, Any]) -> dict[str, Any]:
    """One cache state's bracket, its ends' statuses and every tested rate's status."""
    b = sel["bracket"]
    return {
        "pass_rps": b["pass_rps"],
        "fail_rps": b["fail_rps"],
        "resolution_rps": b.get("resolution_rps"),
        "pass_status": b.get("pass_status"),
        "fail_status": b.get("fail_status"),
        "shown_to_pass_rps": sel.get("shown_to_pass_rps"),
        "rates": {f"{r['offered_rps']:g}": r["status"] for r in sel["rates"]},
    }
