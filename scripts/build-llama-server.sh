#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the llama.cpp source vendored in PyPI's
# llama-cpp-python source distribution (no git, no model download; CPU build).
#
#   scripts/build-llama-server.sh [PREFIX]     # default PREFIX: .cache/llama.cpp
#
# Prints the path of the built binary. Idempotent: a binary built with the same version and
# options is reused (they are stamped beside it); a change rebuilds. About 4 min on 2 cores.
# Needs cmake and a C++ compiler (Debian: cmake g++).
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PREFIX="${1:-.cache/llama.cpp}"
BIN="$PREFIX/bin/llama-server"
# The server alone: no tests, examples, curl (no model downloads) or web UI (neither built nor
# downloaded: LLAMA_USE_PREBUILT_UI would fetch it from Hugging Face). Tuned to this CPU
# (GGML_NATIVE) but without Intel AMX: ggml's AMX matrix multiply crashed (SIGSEGV in
# ggml_backend_amx_mul_mat, on the first decode) on a Sapphire Rapids VM serving this pack's
# Q4_1 model; its AVX-512 paths serve the model instead.
OPTIONS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_NATIVE=ON)
if [[ "$(uname -m)" == x86_64 ]]; then
  NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  OPTIONS+=("-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX")
fi
STAMP="llama-cpp-python $VERSION ${OPTIONS[*]}"
# One build at a time per prefix: a second invocation (CI starts the build in the background
# and the real-engine test asks for the binary later) waits for the first, then finds its stamp.
mkdir -p "$PREFIX"
exec 9>"$PREFIX/.build.lock"
flock 9
if [[ -x "$BIN" && -f "$BIN.build" && "$(cat "$BIN.build")" == "$STAMP" ]]; then
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
rm -rf "$BUILD"
cmake -S "$SRC" -B "$BUILD" "${OPTIONS[@]}" >&2
cmake --build "$BUILD" --target llama-server -j "$(nproc)" >&2
mkdir -p "$PREFIX/bin"
cp "$BUILD/bin/llama-server" "$BIN"
echo "$STAMP" > "$BIN.build"
echo "$BIN"
