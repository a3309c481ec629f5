"""`capacity-pack init`: a pack skeleton from a real server's answers, which `capacity-pack lint`
accepts once the fields it leaves to the user are filled; a server that cannot be used is one
line naming the URL and the cause."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml
from starlette.responses import JSONResponse

from capacity_pack.sim.process import SimProcess
from tests.paths import ROOT
from tests.unit.engines.test_engines import MODEL, Fake, serve, vllm

CLI = [sys.executable, "-m", "capacity_pack"]
KEY = "sk-init-test-0123456789abcdef"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def fill(path: Path, todo: list[str]) -> None:
    """What the user decides: every field init left null."""
    data = yaml.safe_load(path.read_text())
    values = {
        "workload[0].request_ttft_cutoff_ms": 800,
        "workload[0].request_tpot_cutoff_ms": 60,
        "model.revision": "0e9e39f249a16976918f6564b8830bc894c89659",
        "model.tokenizer_revision": "0e9e39f249a16976918f6564b8830bc894c89659",
        "model.precision": "bf16",
    }
    for dotted in todo:
        assert dotted in values, dotted
        if dotted.startswith("workload[0]."):
            data["workload"][0][dotted.split(".", 1)[1]] = values[dotted]
        else:
            section, key = dotted.split(".")
            assert data[section][key] is None, dotted
            data[section][key] = values[dotted]
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_init_against_the_simulator_writes_a_pack_lint_accepts_once_filled(tmp_path):
    out = tmp_path / "pack.yaml"
    with SimProcess("--profile", "small-fast") as sim:
        res = cli("init", "--url", sim.url, "-o", str(out))
        assert res.returncode == 0, res.stderr
    text = out.read_text()
    data = yaml.safe_load(text)
    assert data["engine"]["name"] == "capacity-pack-sim" and data["engine"]["version"]
    assert data["target"] == {
        "kind": "openai",
        "base_url": sim.url,
        "cache_reset": "vllm",  # the simulator serves vLLM's reset
        # No /tokenize on the simulator: prompts are fitted by the pack's word tokenizer, which
        # is the simulator's own.
        "tokenize_endpoint": False,
    }
    assert data["sweep"]["cache_states"] == ["cold", "warm"]
    assert "capacity-pack-sim" in text and "/metrics serves" in text
    todo = res.stdout.split("still yours to decide: ")[1].splitlines()[0].split(", ")
    assert "workload[0].request_ttft_cutoff_ms" in todo and "model.precision" in todo
    # As written, lint refuses it and names the fields left to decide.
    refused = cli("lint", str(out))
    assert refused.returncode != 0 and "request_ttft_cutoff_ms" in refused.stdout + refused.stderr
    fill(out, todo)
    res = cli("lint", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    # An existing file is never overwritten silently.
    again = cli("init", "--url", sim.url, "-o", str(out))
    assert again.returncode == 1 and "--force" in again.stderr


def test_init_against_a_vllm_shaped_server_with_a_key(tmp_path):
    answers = vllm(version="0.11.0")
    answers["POST /tokenize"] = {"count": 7, "tokens": list(range(7)), "max_model_len": 8192}
    answers["GET /openapi.json"] = {"paths": {"/v1/completions": {}, "/reset_prefix_cache": {}}}
    fake = Fake(answers)
    out = tmp_path / "vllm.yaml"
    with serve(fake.app) as url:
        res = cli(
            "init", "--url", url, "--api-key-env", "INIT_TEST_KEY", "-o", str(out),
            env={"INIT_TEST_KEY": KEY},
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    data = yaml.safe_load(out.read_text())
    assert data["engine"]["name"] == "vllm" and data["engine"]["version"] == "0.11.0"
    assert data["model"]["id"] == data["model"]["served_name"] == MODEL
    assert data["target"]["api_key_env"] == "INIT_TEST_KEY"
    assert data["target"]["cache_reset"] == "vllm" and data["target"]["tokenize_endpoint"] is True
    # The key went to the server, never into the pack or the console.
    assert all(h.get("authorization") == f"Bearer {KEY}" for *_, h in fake.calls)
    assert KEY not in out.read_text() and KEY not in res.stdout + res.stderr
    todo = res.stdout.split("still yours to decide: ")[1].splitlines()[0].split(", ")
    fill(out, todo)
    res = cli("lint", str(out))
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_vllm_without_its_reset_route_gets_a_warm_only_pack(tmp_path):
    answers = vllm(version="0.11.0")
    answers["GET /openapi.json"] = {"paths": {"/v1/completions": {}}}
    out = tmp_path / "warm.yaml"
    with serve(Fake(answers).app) as url:
        res = cli("init", "--url", url, "-o", str(out))
    assert res.returncode == 0, res.stderr
    data = yaml.safe_load(out.read_text())
    assert data["target"]["cache_reset"] == "none" and data["sweep"]["cache_states"] == ["warm"]
    assert "VLLM_SERVER_DEV_MODE=1" in res.stdout
    assert data["target"]["tokenize_endpoint"] is False  # no /tokenize on this server


def test_an_unreachable_or_wrong_server_is_one_line(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    res = cli("init", "--url", f"http://127.0.0.1:{port}", "-o", str(tmp_path / "a.yaml"))
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no server answers at http://127.0.0.1:{port}" in lines[0]
    assert "Traceback" not in res.stderr and not (tmp_path / "a.yaml").exists()

    # A server that answers, but not the OpenAI API at that URL (here: the API under /v1).
    with serve(Fake({"GET /health": ""}).app) as url:
        res = cli("init", "--url", url, "-o", str(tmp_path / "b.yaml"))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert "GET /v1/models (HTTP 404)" in lines[0] and "without /v1" in lines[0]
    # A key the server refuses.
    refused = Fake({"GET /v1/models": lambda r: JSONResponse({"error": "no"}, status_code=401)})
    with serve(refused.app) as url:
        res = cli("init", "--url", url, "-o", str(tmp_path / "c.yaml"))
    assert res.returncode == 1 and "--api-key-env" in res.stderr
    assert not (tmp_path / "b.yaml").exists() and not (tmp_path / "c.yaml").exists()
    missing = cli("init", "--url", url, "--api-key-env", "NO_SUCH_VAR_FOR_INIT", "-o", "x.yaml")
    assert missing.returncode == 1 and "NO_SUCH_VAR_FOR_INIT" in missing.stderr


def test_measuring_a_server_that_is_not_there_is_one_line(tmp_path):
    """The sweep's own path (`capacity-pack load` runs the stage a sweep job runs)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    data = yaml.safe_load((ROOT / "config" / "packs" / "vllm-example.yaml").read_text())
    data["target"]["base_url"] = f"http://127.0.0.1:{port}"
    data["target"].pop("api_key_env")
    pack = tmp_path / "pack.yaml"
    pack.write_text(yaml.safe_dump(data, sort_keys=False))
    res = cli(
        "load", str(pack), "--point", "open-r1", "--cache-state", "warm", "--no-progress",
        "-o", str(tmp_path / "out"),
    )  # fmt: skip
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert f"no server answers at http://127.0.0.1:{port}" in lines[0]
    assert "target.base_url" in lines[0] and "capacity-pack init --url" in lines[0]
