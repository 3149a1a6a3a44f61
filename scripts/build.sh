#!/usr/bin/env bash
# Configures and builds dequantd into ./build (Release, Ninja). CUDA kernels are built when nvcc is
# on PATH (or at /usr/local/cuda/bin). Extra arguments are passed to `ninja` (e.g. target names).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
jobs=${DEQUANTD_BUILD_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${DEQUANTD_CMAKE_ARGS:-} >/dev/null
ninja -C build -j "$jobs" "$@"
