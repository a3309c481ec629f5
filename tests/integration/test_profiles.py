"""Cluster executors: the per-target measurement resource and the Slurm and Kubernetes profiles.

The profiles are checked the way a user first runs them: `snakemake --lint` and a dry run of
the default pack, each in a scratch working directory (a dry run still writes `.snakemake/`).
A dry run never submits: Snakemake validates against the profile's executor and runs the jobs
with its dry-run executor, so neither sbatch nor a Kubernetes API is needed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from capacity_pack.measure.cluster import (
    LEGACY_RESOURCE,
    MAX_NAME_LENGTH,
    held_target_resources,
    target_identity,
    target_resource,
)
from capacity_pack.plan.manifest import validate_pack
from tests.conftest import pack_data
from tests.paths import ROOT

DEFAULT_PACK = ROOT / "config" / "config.yaml"
PROFILES = {
    "slurm": ROOT / "workflow" / "profiles" / "slurm",
    "kubernetes": ROOT / "workflow" / "profiles" / "kubernetes",
}
MEASUREMENT_RULES = ("sweep", "failure_drill")
# What the host class is called in each profile: Slurm pins by partition and node feature, the
# Kubernetes plugin by instance type (its only node selector).
HOST_CLASS_KEYS = {"slurm": ("slurm_partition", "constraint"), "kubernetes": ("machine_type",)}
# The Kubernetes profile passes the MLflow server's address to its pods and stops without it.
K8S_ENV = {"MLFLOW_TRACKING_URI": "http://mlflow.invalid:5000"}


# -- the per-target resource ---------------------------------------------------------------


def pack_with(target: dict | None = None, name: str | None = None):
    data = pack_data()
    if target is not None:
        data["target"] = target
    if name is not None:
        data["pack"]["name"] = name
    return validate_pack(data, "test")


def openai(base_url: str, **extra) -> dict:
    return {"kind": "openai", "base_url": base_url, "cache_reset": "none", **extra}


def test_default_pack_resource_is_named_after_its_simulated_target():
    assert target_resource(pack_with()) == "target_sim_rehearsal_sim"


def test_two_targets_get_two_resources():
    names = {
        target_resource(pack_with(openai("http://10.0.0.5:8000"))),
        target_resource(pack_with(openai("http://10.0.0.6:8000"))),
        target_resource(pack_with(openai("http://10.0.0.5:8001"))),
        target_resource(pack_with()),
        target_resource(pack_with(name="other-sim")),
    }
    assert len(names) == 5
    assert target_resource(pack_with(openai("http://10.0.0.5:8000"))) == "target_10_0_0_5_8000"


def test_one_server_is_one_target_whatever_the_path_or_pack():
    a = pack_with(openai("https://GPU-7.example.net/v1"), name="pack-a")
    b = pack_with(openai("https://gpu-7.example.net:443/other/v1"), name="pack-b")
    assert target_identity(a) == target_identity(b) == "openai:gpu-7.example.net:443"
    assert target_resource(a) == target_resource(b) == "target_gpu_7_example_net_443"
    # The default port follows the scheme.
    assert target_resource(pack_with(openai("http://h"))) == "target_h_80"


def test_managed_and_ipv6_targets():
    managed = openai("http://127.0.0.1:0", managed={"command": ["server", "--port", "{port}"]})
    assert target_resource(pack_with(managed, name="llm.small")) == "target_managed_llm_small"
    assert target_identity(pack_with(openai("http://[::1]:8000"))) == "openai:[::1]:8000"


def test_long_host_names_are_cut_and_stay_distinct():
    host = "a" * 80
    a = target_resource(pack_with(openai(f"http://{host}.one.example:8000")))
    b = target_resource(pack_with(openai(f"http://{host}.two.example:8000")))
    assert a != b
    for name in (a, b):
        assert len(name) == MAX_NAME_LENGTH and name.isidentifier()
        assert re.fullmatch(r"target_[a-z0-9_]+", name)


def test_held_resources_are_read_from_a_logged_resources_line():
    line = "tmpdir=/tmp, mem_mb=8000, slurm_partition=loadgen, target_10_0_0_5_8000=1"
    assert held_target_resources(line) == ["target_10_0_0_5_8000"]
    # Logs from before the resource was named after the target still read as holding one.
    assert held_target_resources(f"tmpdir=/tmp, {LEGACY_RESOURCE}=1") == ["target_slot"]
    assert held_target_resources("tmpdir=/tmp, target_x=0, not_target_y=1") == []


# -- Snakemake runs ------------------------------------------------------------------------


def run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "SNAKEMAKE_PROFILE")
    }
    return subprocess.run(
        args, cwd=cwd, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=300
    )


def snakemake(workdir: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile")]
    base += ["--directory", str(workdir), "--configfile", str(DEFAULT_PACK)]
    return run([*base, *args], workdir, env)


def jobs(dry_run_stdout: str) -> list[tuple[str, str]]:
    """(rule, resources line) of every job a dry run printed."""
    out = []
    for block in re.split(r"\n(?=(?:local)?(?:rule|checkpoint) \w+:)", dry_run_stdout):
        rule = re.match(r"(?:local)?(?:rule|checkpoint) (\w+):", block.strip())
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        if rule:
            out.append((rule.group(1), res.group(1) if res else ""))
    return out


def resource_value(line: str, name: str) -> str | None:
    m = re.search(rf"(?:^|, ){name}=([^,]*)", line)
    return m.group(1) if m else None


def profile_host_class(profile: str) -> dict[str, str]:
    """The host class the profile pins measurements to (its own quoting removed)."""
    doc = yaml.safe_load((PROFILES[profile] / "config.yaml").read_text())
    sweep = doc["set-resources"]["sweep"]
    return {k: str(sweep[k]).strip("'\"") for k in HOST_CLASS_KEYS[profile]}


@pytest.mark.slow
def test_local_limit_is_one_unit_of_the_targets_resource(tmp_path):
    """Without any flag, the Snakefile gives the target's resource 1 unit, counted globally.

    Global scope is what makes Snakemake's scheduler count it for cluster jobs too (it skips
    local-scoped resources such as mem_mb when submitting).
    """
    probe = textwrap.dedent(
        f"""
        import json
        from pathlib import Path
        from snakemake.api import SnakemakeApi
        from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings
        with SnakemakeApi(OutputSettings()) as api:
            wf = api.workflow(
                resource_settings=ResourceSettings(cores=2),
                config_settings=ConfigSettings(configfiles=[Path({str(DEFAULT_PACK)!r})]),
                snakefile=Path({str(ROOT / "Snakefile")!r}),
                workdir=Path({str(tmp_path)!r}),
            )
            wf.dag()
            w = wf._workflow
            name = w.globals["TARGET_RESOURCE"]
            print(json.dumps({{
                "name": name,
                "limit": w.global_resources[name].value,
                "local": w.resource_scopes.is_local(name),
                "held": {{
                    r.name: r.resources[name].value if name in r.resources else None
                    for r in w.rules
                }},
            }}))
        """
    )
    res = run([sys.executable, "-c", probe], tmp_path)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["name"] == "target_sim_rehearsal_sim"
    assert got["limit"] == 1 and got["local"] is False
    holders = {rule for rule, held in got["held"].items() if held}
    assert holders == set(MEASUREMENT_RULES)
    assert all(got["held"][r] == 1 for r in MEASUREMENT_RULES)


@pytest.mark.slow
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_profile_lints_clean(profile, tmp_path):
    res = snakemake(tmp_path, "--lint", "--workflow-profile", str(PROFILES[profile]))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Congratulations, your workflow is in a good condition!" in res.stdout + res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_profile_dry_run_pins_measurements_and_holds_the_target(profile, tmp_path):
    env = K8S_ENV if profile == "kubernetes" else {}
    res = snakemake(tmp_path, "-n", "--workflow-profile", str(PROFILES[profile]), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    planned = jobs(res.stdout)
    by_rule = {rule for rule, _ in planned}
    assert set(MEASUREMENT_RULES) <= by_rule and "freeze" in by_rule
    host_class = profile_host_class(profile)
    for rule, line in planned:
        if rule == "all":
            continue
        pinned = {k: resource_value(line, k) for k in host_class}
        if rule in MEASUREMENT_RULES:
            assert resource_value(line, "target_sim_rehearsal_sim") == "1", (rule, line)
            assert pinned == host_class, (rule, line)
        else:
            assert "target_" not in line, (rule, line)
            assert all(pinned[k] != v for k, v in host_class.items()), (rule, line)
    if profile == "slurm":
        sweep = next(line for rule, line in planned if rule == "sweep")
        # threads + 1: a dry run caps threads at its 1 core; a cluster run does not.
        assert resource_value(sweep, "cpus_per_task") == "2"
        assert resource_value(sweep, "slurm_extra") == "--exclusive"
    else:
        assert "(send to storage)" in res.stdout


@pytest.mark.slow
def test_kubernetes_profile_needs_a_tracking_server(tmp_path):
    res = snakemake(tmp_path, "-n", "--workflow-profile", str(PROFILES["kubernetes"]))
    assert res.returncode != 0
    assert "MLFLOW_TRACKING_URI" in res.stdout + res.stderr
