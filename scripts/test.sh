#!/usr/bin/env bash
# The test command: installs dependencies, builds everything, makes the bundled model, and runs
# the whole test suite with CTest. GPU tests skip on machines without a GPU.
# Then the container image is built and run (scripts/test-container.sh), the unit and integration
# tests run again under AddressSanitizer + UndefinedBehaviorSanitizer (scripts/test-sanitizers.sh,
# a second build in build-asan) and each libFuzzer target runs for 60 s (scripts/fuzz.sh; issue 11,
# docs/hardening.md). DEQUANTD_SKIP_CONTAINER_TEST=1 / DEQUANTD_SKIP_SANITIZERS=1 /
# DEQUANTD_SKIP_FUZZ=1 leave them out of a local run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
scripts/make-model.sh
export DEQUANTD_MODEL_DIR="$PWD/models/smollm2-135m-awq"
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900
# The container image built from build/ and run, and the deploy/ manifests validated (Podman on a
# debootstrap Debian 12 base; 10-13 minutes on a fresh 2-core machine, docs/container.md).
# DEQUANTD_SKIP_CONTAINER_TEST=1 leaves it out (it needs root).
if [[ ${DEQUANTD_SKIP_CONTAINER_TEST:-0} != 1 ]]; then
  scripts/test-container.sh
fi
[ "${DEQUANTD_SKIP_SANITIZERS:-0}" = 1 ] || scripts/test-sanitizers.sh
[ "${DEQUANTD_SKIP_FUZZ:-0}" = 1 ] || scripts/fuzz.sh
