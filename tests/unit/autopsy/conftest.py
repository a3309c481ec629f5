"""The committed autopsy fixture (``tests/data/autopsy``), laid out as the pack run left it.

The fixture is one real, small pack run (``tests/data/autopsy/regenerate.py`` says what it
holds and how to remake it). ``materialize`` puts it back where Snakemake wrote it: the main
log under ``.snakemake/log/``, the pack's files under ``results/<pack>/`` with their recorded
mtimes (git keeps none), and, on request, an MLflow store holding the run's recorded runs.
The run was recorded with ``TZ=UTC``; Snakemake's stamps are naive local time, so the
fixtures ``real_run`` and ``real_tracked`` (with the MLflow store) hold this process in UTC
while a test reads it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.paths import DATA

FIXTURE = DATA / "autopsy"
PACK = "autopsy-fixture"
RULE_LINE = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$", re.M)


@dataclass(frozen=True)
class FixtureRun:
    fixture: Path  # tests/data/autopsy: the pack that ran, its recorded MLflow runs
    pack: str  # the pack's name
    root: Path  # Snakemake's working directory
    log: Path  # the invocation's main log
    log_dir: Path
    results: Path  # root/results/<pack>
    mlflow_db: Path | None

    def log_text(self) -> str:
        return self.log.read_text()

    def logged_rules(self) -> list[str]:
        """Every job block's rule, straight from the log's text."""
        return RULE_LINE.findall(self.log_text())

    def elapsed_s(self) -> float:
        h, m, s = re.search(r"^Elapsed time: (\d+):(\d+):([\d.]+)", self.log_text(), re.M).groups()
        return int(h) * 3600 + int(m) * 60 + float(s)


@contextmanager
def utc() -> Iterator[None]:
    """This process in the zone the fixture was recorded in."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


def _mlflow_store(db: Path) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.create_experiment(f"capacity-pack/{PACK}")
    for r in json.loads((FIXTURE / "mlflow_runs.json").read_text()):
        run = client.create_run(exp, start_time=r["start_ms"], tags=r["tags"], run_name=r["name"])
        if r["end_ms"]:
            client.set_terminated(run.info.run_id, end_time=r["end_ms"])


def materialize(root: Path, *, mlflow: bool = False) -> FixtureRun:
    """The fixture run under ``root`` (its Snakemake working directory)."""
    (log,) = FIXTURE.glob("*.snakemake.log")
    log_dir = root / ".snakemake" / "log"
    log_dir.mkdir(parents=True)
    shutil.copyfile(log, log_dir / log.name)
    results = root / "results" / PACK
    shutil.copytree(FIXTURE / "pack", results)
    for rel, mtime in json.loads((FIXTURE / "mtimes.json").read_text()).items():
        os.utime(results / rel, (mtime, mtime))
    db = root / "results" / "mlflow.db" if mlflow else None
    if db is not None:
        _mlflow_store(db)
    return FixtureRun(FIXTURE, PACK, root, log_dir / log.name, log_dir, results, db)


@pytest.fixture
def real_run(tmp_path: Path) -> Iterator[FixtureRun]:
    """The fixture's pack run laid out under tmp_path, read in the zone it was recorded in."""
    with utc():
        yield materialize(tmp_path)


@pytest.fixture
def real_tracked(tmp_path: Path) -> Iterator[FixtureRun]:
    """The same, with an MLflow store holding the runs it recorded."""
    with utc():
        yield materialize(tmp_path, mlflow=True)
