"""The real-engine tier's server launcher maps llama-server's flags onto llama.cpp's own server
parameters (xllamacpp's CommonParams), and refuses a flag it does not map."""

from __future__ import annotations

import subprocess
import sys

import pytest

from capacity_pack.llamacpp_server import params, parse

PACK_FLAGS = (
    "-m model.gguf --alias SmolLM2-135M-Instruct --host 127.0.0.1 --port 18080 -np 4 -c 4096 "
    "-t 2 --cache-ram 0 --slot-save-path /tmp/slots --metrics --no-ui"
).split()


def test_the_packs_flags_become_the_servers_parameters():
    pytest.importorskip("xllamacpp", reason="bash scripts/install-real-engine.sh")
    p = params(parse(PACK_FLAGS))
    assert p.model.path == "model.gguf" and p.model_alias == {"SmolLM2-135M-Instruct"}
    assert p.hostnames == ["127.0.0.1"] and p.port == 18080
    assert (p.n_parallel, p.n_ctx) == (4, 4096)
    assert (p.cpuparams.n_threads, p.cpuparams_batch.n_threads) == (2, 2)
    assert p.cache_ram_mib == 0 and p.slot_save_path == "/tmp/slots"
    assert p.endpoint_metrics and p.endpoint_slots and not p.ui


def test_a_flag_it_does_not_map_is_refused_by_name():
    res = subprocess.run(
        [sys.executable, "-m", "capacity_pack.llamacpp_server", *PACK_FLAGS, "--flash-attn"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2
    assert "unrecognized arguments: --flash-attn" in res.stderr
