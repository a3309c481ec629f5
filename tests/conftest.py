"""Shared pack builders and fixtures.

Every builder starts from the default pack (``config/config.yaml``) and returns a fresh dict, so
a test edits its copy freely. ``small_pack_data`` shrinks the default pack to a rehearsal that
runs the real pipeline in seconds; ``run_snakemake`` runs the real workflow on a pack written by
``write_pack``, with the tracking store under the work directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.exclusive import (  # noqa: F401 (the hooks: module order, exclusive tests)
    order_modules,
    pytest_configure,
    pytest_runtest_protocol,
    pytest_unconfigure,
)
from tests.paths import DEFAULT_CONFIG, ROOT
from tests.tiers import mark_tiers

#: Snakemake as the tests run it: the greedy job scheduler, not the default ILP one, which
#: starts the CBC solver (PuLP) on every scheduling pass; a small pack's 35 jobs spend 3-5
#: CPU-s in it, about 7 % of the pack's CPU, and on CI's two cores the suite is CPU-bound
#: (docs/performance.md, "Where the suite's time goes"). Which ready job starts first is all
#: the scheduler decides here: the same jobs run, measurements still take turns through the
#: target lock (capacity_pack.measure.lock).
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--scheduler", "greedy"]


# Before pytest's own hook deselects by mark (`-m "not slow"`): the tiers mark first.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_tiers(items)
    order_modules(config, items)


#: The host checks a pipeline test's pack runs without (capacity_pack.measure.host;
#: :func:`write_pack` sets them unless the pack does): the suite runs three workers side by
#: side (pytest -n 3), so a point measured by one shares the host with the others' work, and
#: would be marked disturbed and measured again; these tests check what the pipeline does with a
#: point, not the target's capacity. tests/integration/test_isolation.py (alone on the host)
#: keeps the shipped bounds.
UNCHECKED_HOST = {"other_cpu_bound": None, "step_lateness_bound_ms": None}

#: For the same reason a pipeline test's measuring jobs take one core, not every core of the
#: invocation (rules/common.smk, measure_threads): alone in the invocation they would not be
#: alone on the host, and the next point's analysis runs beside them as before isolation
#: (a small pack's pipeline 14 % faster). ``run_snakemake(alone=True)`` keeps the shipped
#: isolation.
SHARED_MEASUREMENT = ("--set-threads", "sweep=1", "failure_drill=1")


#: Round 1's open-loop rates of :func:`pack_data`: the default pack's boundary lies between
#: them (cold near 36, warm near 43 RPS).
DECLARED_RPS = [30, 40, 50]


def pack_data(*, shipped: bool = False) -> dict[str, Any]:
    """The default pack as plain data (a fresh copy each call). Its search starts from declared
    rates (:data:`DECLARED_RPS`) instead of the engine model's prediction, which only a
    simulated target has and most tests change the target or the rates; ``shipped``: exactly
    as shipped."""
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    if not shipped and (data["sweep"].get("search") or {}).get("initial") == "predicted":
        del data["sweep"]["search"]["initial"]
        data["sweep"]["open_loop_rps"] = list(DECLARED_RPS)
    return data


# Fixed (input, output) tokens per class of the default pack's workload, round numbers near its
# distributions' medians: for tests whose expectations are exact per-request lengths.
FIXED_LENGTHS = {
    "interactive": (256, 32),
    "long_context": (1024, 48),
    "generation_heavy": (128, 128),
}


def with_fixed_lengths(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a pack as plain data, edited in place and returned) with the default pack's
    classes at :data:`FIXED_LENGTHS`."""
    for c in data["workload"]:
        c["input_tokens"], c["output_tokens"] = FIXED_LENGTHS[c["name"]]
    return data


def small_pack_data(
    name: str,
    *,
    requests: int,
    min_samples: int,
    sweep: dict[str, Any] | None = None,
    **client: Any,
) -> dict[str, Any]:
    """The default pack, shrunk: ``requests`` scheduled per point, ``min_samples`` per class for
    the sample gate, an attainment gate of 0.6, short warm-up and duration, no load-shape
    experiments, no boundary search (the declared rates only); ``sweep`` and ``client`` override
    the sweep and client sections."""
    data = pack_data()
    data["pack"]["name"] = name
    data["client"].update(
        initial_scheduled_requests=requests,
        minimum_duration_seconds=1,
        warmup_seconds=0.5,
        maximum_duration_seconds=10,
    )
    data["client"].update(client)
    data["client"].pop("class_schedule_counts")
    data["acceptance"]["min_successful_samples_per_class"] = min_samples
    # A gate a few seconds of load can decide: a class passes 0.95 at 95 % only after 81
    # successes (capacity_pack.binomial), 0.6 after 15; lint refuses a pack that cannot get there.
    data["acceptance"]["class_slo_attainment_min"] = 0.6
    # A fixed sweep (the rates given, no boundary search) unless `sweep` gives a search.
    data["sweep"].pop("search", None)
    data["sweep"].update(
        repeats=1, closed_loop_min_requests=10, closed_loop_requests_per_worker=2, **(sweep or {})
    )
    data["experiments"] = []
    return data


def real_calibratable(data: dict[str, Any], *, architecture: bool = True) -> dict[str, Any]:
    """``data`` (a pack as plain data, edited in place and returned) against a real target: a
    managed OpenAI-compatible server (the project's own engine started as a plain process), with
    the model's shape declared (``architecture``) so that the pack can calibrate a twin."""
    data["model"]["id"] = "sim-small"
    if architecture:
        data["model"]["architecture"] = {
            "config": "config/architectures/smollm2-135m.json",
            "bytes_per_param": 2,
        }
    data["target"] = {
        "kind": "openai",
        "base_url": "http://127.0.0.1:9",
        "cache_reset": "none",
        "managed": {
            "command": [sys.executable, "-m", "capacity_pack.sim", "serve", "--profile",
                        "small-fast", "--model-name", "sim-small", "--host", "{host}",
                        "--port", "{port}"],
        },
    }  # fmt: skip
    return data


def write_pack(workdir: Path, data: dict[str, Any]) -> Path:
    """``data`` as ``workdir/pack.yaml``, without the host checks unless it sets them
    (:data:`UNCHECKED_HOST`)."""
    for key, value in UNCHECKED_HOST.items():
        data.setdefault("client", {}).setdefault(key, value)
    path = workdir / "pack.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_snakemake(
    workdir: Path,
    *args: str,
    check: bool = True,
    env: dict[str, str] | None = None,
    alone: bool = False,
) -> subprocess.CompletedProcess:
    """The real workflow on ``workdir/pack.yaml`` (2 cores); the local MLflow store unless
    ``env`` names another; a measurement beside the invocation's other jobs unless ``alone``
    (:data:`SHARED_MEASUREMENT`)."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    res = subprocess.run(
        [
            *SNAKEMAKE,
            "-s",
            str(ROOT / "Snakefile"),
            "--directory",
            str(workdir),
            "--configfile",
            str(workdir / "pack.yaml"),
            # Before --cores: --set-threads takes every word up to the next option.
            *(() if alone else SHARED_MEASUREMENT),
            "--cores",
            "2",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if check and res.returncode != 0:
        raise AssertionError(f"snakemake failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


@pytest.fixture
def default_pack() -> dict[str, Any]:
    """The default pack as plain data, for a test to edit."""
    return pack_data()
