#!/usr/bin/env bash
# The unit and integration tests under AddressSanitizer + UndefinedBehaviorSanitizer: a second
# build in ./build-asan (GCC, -O1, CUDA off), then CTest on it. Leak detection is on; the few
# leaks that are gRPC's own process-lifetime state are listed in tests/sanitizers/lsan.supp.
# Needs the packages of scripts/install-deps.sh and the bundled model (DEQUANTD_MODEL_DIR) for
# the tests that use it.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DEQUANTD_BUILD_JOBS:-$(nproc)}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEQUANTD_CUDA=OFF \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" ${DEQUANTD_CMAKE_ARGS:-} >/dev/null
ninja -C build-asan -j "$jobs"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=0"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Excluded: the Python checks (no C++ of ours runs in them), the benchmarks' timing tests, and the
# soak test, whose RSS bound does not hold under ASan (its quarantine keeps freed memory: 411 MiB
# after the load against 199 MiB idle on 2026-12-01; the soak test runs in the normal build).
ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 1800 \
  -E '(prometheus_dashboard|kubernetes_manifest|SoakTest)'
