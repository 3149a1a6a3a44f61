#!/usr/bin/env bash
# The one script run on the GPU machine, from the repository root, after `. .bundle/env.sh`
# (the bundle is made on the build machine with
#   /work/shared/tools/device-bundle .bundle build-X/tests/cuda/cuda_test \
#       build-X/tests/cuda/cuda_quick_bench [build-X/bench/dequantd_bench] [server tests...]
# and travels with the call as a carried path). Runs what the bundle holds and writes logs under
# $OUT (default ./out): device.txt, cuda_test.log/.xml, quick_bench.log, bench.log, server.log.
# Usage: scripts/device-check.sh [STEP...]   STEP: tests quickbench bench formats awq-nk
#   mxfp4-profile gptq-tiles grouped server counters (default: all). gptq-tiles: the GPTQ (N, K)
#   kernel's tiles-per-block candidates, each timed by dequantd_tune_sweep, into gptq_tiles.txt.
#   awq-nk: the AWQ (N, K) kernel (the model loader's orientation) beside the copy, and its
#   tiles-per-block candidates, into awq_nk.md.
#   formats: every format's kernels beside the copy (dequantd_bench
#   --formats, bf16 out, 8B- and 70B-shaped layers; gpt-oss-20b-shaped experts for mxfp4) into
#   formats.md. Extra arguments for a step: CUDA_TEST_ARGS, QUICK_BENCH_ARGS, BENCH_ARGS,
#   GROUPED_ARGS, SERVER_TEST_FILTER, COUNTER_SHAPES, FORMAT_SHAPES, MXFP4_SHAPES, AWQ_NK_SHAPES,
#   GPTQ_SHAPES (environment). The integration tests run dequantctl: set
#   DEQUANTCTL to the bundle's copy (the build tree's path does not exist there).
# Exit status: non-zero when any step that ran failed.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests quickbench bench formats awq-nk mxfp4-profile gptq-tiles grouped server counters)
want() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
have() { command -v "$1" >/dev/null 2>&1; }
failed=()

{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; } \
  2>&1 | tee "$OUT/device.txt"

if want tests && have cuda_test; then
  echo "== cuda_test"
  # shellcheck disable=SC2086
  cuda_test --gtest_output="xml:$OUT/cuda_test.xml" ${CUDA_TEST_ARGS:-} >"$OUT/cuda_test.log" 2>&1
  rc=$?
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|mismatch|^\[==========\]" "$OUT/cuda_test.log" | tail -60
  grep -cE "^\[       OK \]" "$OUT/cuda_test.log" | sed 's/^/tests OK: /'
  [ $rc -eq 0 ] || failed+=("cuda_test($rc)")
fi

if want quickbench && have cuda_quick_bench; then
  echo "== cuda_quick_bench ${QUICK_BENCH_ARGS:-}"
  # shellcheck disable=SC2086
  cuda_quick_bench ${QUICK_BENCH_ARGS:-} >"$OUT/quick_bench.log" 2>&1
  rc=$?
  # The reply carries only the tail: print the copy rows, v1-v3 and the best v4 rows per shape.
  grep -E "^device|^==|copy|v1_|v2_|v3_|v4 " "$OUT/quick_bench.log"
  awk '$2=="v4_vec16" {k=$1; t=$NF+0; if (!(k in best) || t > best[k]) {best[k]=t; line[k]=$0}}
       END {for (k in line) print "best v4: " line[k]}' "$OUT/quick_bench.log"
  [ $rc -eq 0 ] || failed+=("cuda_quick_bench($rc)")
fi

if want bench && have dequantd_bench; then
  echo "== dequantd_bench ${BENCH_ARGS:-}"
  # shellcheck disable=SC2086
  dequantd_bench ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  rc=$?
  tail -60 "$OUT/bench.log"
  [ $rc -eq 0 ] || failed+=("dequantd_bench($rc)")
fi

if want formats && have dequantd_bench; then
  echo "== dequantd_bench --formats (${FORMAT_SHAPES:=4096x14336,8192x28672}; mxfp4 ${MXFP4_SHAPES:=32x2880x5760})"
  # shellcheck disable=SC2086
  { dequantd_bench --formats awq_gemm,gptq,compressed_tensors,fp8_block,compressed_tensors_fp8 \
      --shapes "$FORMAT_SHAPES" --dtypes bf16 --trials 3 --runs 10 --markdown ${FORMATS_ARGS:-} &&
    dequantd_bench --formats mxfp4 --shapes "$MXFP4_SHAPES" --dtypes bf16 --trials 3 --runs 10 \
      --markdown ${FORMATS_ARGS:-}; } >"$OUT/formats.md" 2>&1
  rc=$?
  grep -E "^\| (v|copy)|^- (device|commit|peak)" "$OUT/formats.md"
  [ $rc -eq 0 ] || { tail -5 "$OUT/formats.md"; failed+=("dequantd_bench --formats($rc)"); }
fi

if want awq-nk && have dequantd_bench && have dequantd_tune_sweep; then
  echo "== AWQ (N, K) beside the copy, and its tiles per block (${AWQ_NK_SHAPES:=4096x14336,14336x4096,8192x28672,4096x4096,4096x1024})"
  { dequantd_bench --formats awq_gemm --orientation nk --shapes "$AWQ_NK_SHAPES" --dtypes bf16,fp16 \
      --trials 3 --runs 10 --markdown &&
    dequantd_tune_sweep --format awq_gemm --orientation nk --shapes "$AWQ_NK_SHAPES" --dtypes bf16 \
      --objectives latency --tunings 1; } >"$OUT/awq_nk.md" 2>&1
  rc=$?
  grep -E "^\| (v4|copy)|^\| awq|^candidates|^- (device|commit|peak)" "$OUT/awq_nk.md"
  [ $rc -eq 0 ] || { tail -5 "$OUT/awq_nk.md"; failed+=("awq-nk($rc)"); }
fi

if want mxfp4-profile && have dequantd_bench && have ncu; then
  # Issue 21's open MXFP4 (E, K, N) gap: the tile kernel's stall reasons and memory sectors, one
  # launch of the default (fastest measured) tile shape, bf16, into mxfp4_ncu.txt.
  echo "== ncu of the MXFP4 (E, K, N) tile kernel (${MXFP4_SHAPES:-32x2880x5760}, bf16)"
  ncu --set full --kernel-name regex:Mxfp4KnTile --launch-skip 3 --launch-count 1 \
    dequantd_bench --formats mxfp4 --shapes "${MXFP4_SHAPES:-32x2880x5760}" --dtypes bf16 \
    --variants v4_vec16 --trials 1 --runs 5 >"$OUT/mxfp4_ncu.txt" 2>&1
  rc=$?
  grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Shared Memory Config|Stall|L1/TEX Hit|Sectors" \
    "$OUT/mxfp4_ncu.txt" | head -40
  [ $rc -eq 0 ] || failed+=("ncu mxfp4($rc)")
fi

if want gptq-tiles && have dequantd_tune_sweep; then
  # Issue 21's GPTQ act-order (N, K) gap: every tiles-per-block candidate's time per layer.
  echo "== dequantd_tune_sweep --format gptq (${GPTQ_SHAPES:=4096x14336,8192x28672,14336x4096})"
  dequantd_tune_sweep --format gptq --shapes "$GPTQ_SHAPES" --dtypes bf16,fp16 \
    --objectives latency --tunings 1 >"$OUT/gptq_tiles.txt" 2>&1
  rc=$?
  grep -E "^\| gptq|^candidates" "$OUT/gptq_tiles.txt"
  [ $rc -eq 0 ] || failed+=("dequantd_tune_sweep gptq($rc)")
fi

if want grouped && have dequantd_bench; then
  echo "== dequantd_bench --grouped qwen2.5-1.5b ${GROUPED_ARGS:-}"
  # shellcheck disable=SC2086
  dequantd_bench --grouped qwen2.5-1.5b ${GROUPED_ARGS:-} >"$OUT/grouped.log" 2>&1
  rc=$?
  tail -30 "$OUT/grouped.log"
  [ $rc -eq 0 ] || failed+=("dequantd_bench --grouped($rc)")
fi

if want server; then
  for t in server_test integration_test observability_test autotune_test bench_test; do
    have "$t" || continue
    echo "== $t"
    log=$(mktemp)
    "$t" --gtest_filter="${SERVER_TEST_FILTER:-*}" >"$log" 2>&1
    rc=$?
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]" "$log" | tail -20
    cat "$log" >>"$OUT/server.log"
    rm -f "$log"
    [ $rc -eq 0 ] || failed+=("$t($rc)")
  done
fi

if want counters && have dequantd_bench && have ncu; then
  echo "== hardware counters vs Nsight Compute"
  # shellcheck disable=SC2086 # COUNTER_SHAPES is a list of arguments
  OUT="$OUT" bash "$(dirname "$0")/counters-vs-ncu.sh" ${COUNTER_SHAPES:-} | tee "$OUT/counters_table.md"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("counters-vs-ncu")
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "device-check: FAILED: ${failed[*]}"
  exit 1
fi
echo "device-check: all steps passed"
