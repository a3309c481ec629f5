#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the llama.cpp source vendored in PyPI's
# llama-cpp-python source distribution (no git, no model download; CPU build).
#
#   scripts/build-llama-server.sh [PREFIX]     # default PREFIX: .cache/llama.cpp
#
# Prints the path of the built binary. Idempotent: an existing binary is reused. About 4 min
# on 2 cores. Needs cmake and a C++ compiler (Debian: cmake g++).
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PREFIX="${1:-.cache/llama.cpp}"
BIN="$PREFIX/bin/llama-server"
if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi
command -v cmake >/dev/null || { echo "cmake not found (Debian: apt-get install cmake g++)" >&2; exit 1; }
PY="${PYTHON:-python3}"
mkdir -p "$PREFIX/src"
SDIST="$PREFIX/src/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
  "$PY" -m pip download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$PREFIX/src" >&2
fi
SRC="$PREFIX/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [[ ! -d "$SRC" ]]; then
  tar -xzf "$SDIST" -C "$PREFIX/src"
fi
BUILD="$PREFIX/build"
# The server alone: no tests, examples, curl (no model downloads) or web UI.
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_WEBUI=OFF -DGGML_NATIVE=ON >&2
cmake --build "$BUILD" --target llama-server -j "$(nproc)" >&2
mkdir -p "$PREFIX/bin"
cp "$BUILD/bin/llama-server" "$BIN"
echo "$BIN"
