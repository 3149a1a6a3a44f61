#!/usr/bin/env bash
# Issue 8's GPU check, run on the GPU machine from a bundle dir (made with
# /work/shared/tools/device-bundle DIR build/tests/cuda/cuda_test build/tests/server/server_test
#   build/tests/integration/integration_test build/tests/observability/observability_test
#   build/tests/autotune/autotune_test build/server/dequantd build/client/dequantctl
#   build/bench/result_pipeline_bench [dequantd_old]):
#   1. every GPU test (kernels, server, integration incl. the exit test, observability, autotune);
#   2. optionally DIR/bin/dequantd_old (a build before the exit fix) under the exit test: must FAIL;
#   3. result_pipeline_bench on a generated Llama-3-8B-shaped model (table for docs/performance.md);
#   4. the exit test again on that model (whole-model DequantizeLayers through gRPC, SIGTERM, 0).
# Usage: bash DIR/device-check-pipeline.sh   Logs under $OUT (default ./out). Exit 1 if a step failed.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/env.sh"
export DEQUANTD=$here/bin/dequantd DEQUANTCTL=$here/bin/dequantctl
O=${OUT:-$PWD/out}
mkdir -p "$O"
failed=()
{ date -u; nvidia-smi -L; } 2>&1 | tee "$O/device.txt"
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2 start rc
  shift 2
  echo "== $name"
  start=$(date +%s)
  timeout "$limit" "$@" >"$O/$name.log" 2>&1
  rc=$?
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|^\||^whole model|^device memory|exit status" \
    "$O/$name.log" | grep -v "^\[==========\] Running" | tail -30
  echo "$name: rc=$rc in $(($(date +%s) - start)) s"
  [ $rc -eq 0 ] || failed+=("$name($rc)")
}
have() { [ -x "$here/bin/$1" ]; }
have cuda_test && step cuda_test 120 cuda_test --gtest_filter=-CudaDequantLargeTest.*
have server_test && step server_test 90 server_test
have integration_test && step integration_test 180 integration_test
have observability_test && step observability_test 60 observability_test
have autotune_test && step autotune_test 90 autotune_test
if have dequantd_old; then
  echo "== exit test against the binary before the fix (expected to FAIL)"
  DEQUANTD=$here/bin/dequantd_old timeout 120 integration_test --gtest_filter='CudaExitTest.*' \
    >"$O/exit_old.log" 2>&1
  echo "old dequantd: rc=$? (non-zero expected)"
  grep -E "ended by signal|Segmentation|FAILED  \]|OK \]" "$O/exit_old.log" | head -5
fi
have result_pipeline_bench && step pipeline_bench 240 result_pipeline_bench --dir /tmp/m8b --runs 3
if [ -f /tmp/m8b/model.safetensors ]; then
  DEQUANTD_EXIT_TEST_MODEL=/tmp/m8b step exit_8b 180 integration_test --gtest_filter='CudaExitTest.*'
  grep -E "^whole model" "$O/exit_8b.log"
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "device-check-pipeline: FAILED: ${failed[*]}"
  exit 1
fi
echo "device-check-pipeline: all steps passed"
