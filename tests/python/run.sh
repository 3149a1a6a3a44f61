#!/usr/bin/env bash
# Runs the Python client tests (pytest) in a virtual environment: creates BUILD_DIR/python-venv
# once (python3 -m venv; Debian: python3-venv), installs ./client/python with its test extras
# from PyPI (grpcio, protobuf, numpy, safetensors, ml-dtypes, tqdm, pytest, and the `loader`
# extra: torch and transformers for test_torch.py; DEQUANTD_TEST_TORCH=0 leaves them out and
# those cases skip; PyPI's torch for Linux brings its CUDA libraries, see docs/python-client.md
# for what that costs), then runs pytest on tests/python against BUILD_DIR's dequantd and
# dequantctl and $DEQUANTD_MODEL_DIR (default models/smollm2-135m-awq). test_format_vectors.py needs neither: it
# checks the format reference vectors in tests/data/formats with numpy and ml-dtypes alone.
#
#   tests/python/run.sh BUILD_DIR [pytest args...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)"
shift
venv="$build/python-venv"
extras=test
[[ ${DEQUANTD_TEST_TORCH:-1} == 0 ]] || extras=test,loader
stamp="$( (cat "$root/client/python/pyproject.toml"; echo "$extras") | sha256sum | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$root/client/python[$extras]"
  echo "$stamp" > "$venv/.stamp"
else
  # The package's own code may have changed: reinstall it alone (no dependency resolution).
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall \
    "$root/client/python"
fi
export DEQUANTD_BUILD_DIR="$build"
cd "$root/tests/python"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" .
