#!/usr/bin/env bash
# Installs the part of the CUDA 13.0 toolkit dequantd builds with (nvcc, the runtime, CCCL,
# CUPTI) from NVIDIA's PyPI wheels into DEST as a toolkit directory CMake's FindCUDAToolkit and
# nvcc expect (bin/, include/, lib/ = lib64/, nvvm/, targets/x86_64-linux/{include,lib}):
#   deploy/container/install-cuda-pypi.sh DEST
# The versions are the ones on the project's build machines (docs/container.md). Needs python3
# with venv and PyPI. The wheels are unpacked into a temporary venv that is removed afterwards.
set -euo pipefail
dest=${1:?usage: $0 DEST}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --no-cache-dir --target "$tmp/wheels" \
  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-cupti==13.0.85
mkdir -p "$dest/targets/x86_64-linux"
cp -a "$tmp/wheels/nvidia/cu13/." "$dest/"
ln -sfn lib "$dest/lib64"
ln -sfn ../../include "$dest/targets/x86_64-linux/include"
ln -sfn ../../lib "$dest/targets/x86_64-linux/lib"
# The wheels ship libX.so.N only; the linker looks for libX.so.
for lib in "$dest"/lib/lib*.so.*; do
  base=${lib%%.so.*}.so
  [[ -e $base ]] || ln -s "$(basename "$lib")" "$base"
done
"$dest/bin/nvcc" --version | tail -n1
