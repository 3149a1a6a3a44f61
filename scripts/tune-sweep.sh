#!/usr/bin/env bash
# Issue 13 on the GPU machine, from the repository root after `. BUNDLE/env.sh` (a bundle made with
#   /work/shared/tools/device-bundle BUNDLE build/tests/autotune/autotune_test \
#       build/bench/dequantd_tune_sweep build/bench/dequantd_bench
# ): the autotuner's GPU tests, the tuning sweep (bench/tune_sweep.cc: the tuner's choice against
# all candidates, three fresh tunings per row), and one Nsight Compute profile of v4 on the
# largest shape with the configuration the tuner chose. Writes $OUT (default ./out):
# device.txt, autotune_test.log, sweep.md, bench.md, server_tests.log, bench_profile.log,
# ncu_<shape>.txt.
# Environment: STEPS (default "tests sweep bench server ncu"; a step whose binary is not in the
# bundle is skipped), SWEEP_ARGS (extra dequantd_tune_sweep flags), PROFILE_SHAPE (default
# 8192x28672). bench: dequantd_bench --variants v4_vec16 --dtypes fp16,bf16 over the nine shapes
# (v4 with the tuner's choice against the same-size copy); server: integration_test and
# server_test filtered to the autotuner (needs DEQUANTCTL unset-safe tests only).
# Exit status: non-zero when a step failed (a sweep row that misses a target counts).
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
have() { command -v "$1" >/dev/null 2>&1; }
want() { [[ " ${STEPS:-tests sweep bench server ncu} " == *" $1 "* ]]; }
failed=()

{ date -u; nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv; } 2>&1 | tee "$OUT/device.txt"

if want tests; then
  echo "== autotune_test (GPU tests)"
  autotune_test --gtest_filter='AutotuneCuda*' >"$OUT/autotune_test.log" 2>&1 ||
    failed+=(autotune_test)
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|Failure" "$OUT/autotune_test.log" | tail -12
fi

if want sweep; then
  echo "== dequantd_tune_sweep ${SWEEP_ARGS:-}"
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout 200 dequantd_tune_sweep ${SWEEP_ARGS:-} >"$OUT/sweep.md" 2>&1
  rc=$?
  cat "$OUT/sweep.md"
  echo "sweep: exit $rc in $(( $(date +%s) - start )) s"
  [ $rc -eq 0 ] || failed+=("dequantd_tune_sweep($rc)")
fi

if want bench; then
  echo "== dequantd_bench --variants v4_vec16 --dtypes fp16,bf16 --markdown"
  timeout 150 dequantd_bench --variants v4_vec16 --dtypes fp16,bf16 --markdown \
    >"$OUT/bench.md" 2>&1 || failed+=(dequantd_bench)
  cat "$OUT/bench.md"
fi

if want server; then
  for t in integration_test server_test; do
    have "$t" || continue
    echo "== $t (autotuner tests)"
    timeout 120 "$t" --gtest_filter='AutotuneTest.*:Pretune*:*Autotun*' >>"$OUT/server_tests.log" 2>&1 ||
      failed+=("$t")
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]" "$OUT/server_tests.log" | tail -6
  done
fi

shape=${PROFILE_SHAPE:-8192x28672}
if want ncu && have ncu; then
  echo "== Nsight Compute: v4_vec16 $shape fp16 (the tuner's choice, single launch)"
  cache=$(mktemp -d)/tune.json
  args=(--shapes "$shape" --variants v4_vec16 --dtypes fp16 --group-size 128 --tune-cache "$cache")
  # First run tunes (and fills the cache) and prints latency/throughput against the copy.
  dequantd_bench "${args[@]}" --trials 3 --runs 10 >"$OUT/bench_profile.log" 2>&1 ||
    failed+=(dequantd_bench)
  grep -E "v4_vec16|copy" "$OUT/bench_profile.log" | head -4
  timeout 90 ncu --clock-control none -k regex:DequantVec16Kernel -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    dequantd_bench "${args[@]}" --trials 1 --runs 1 >"$OUT/ncu_$shape.txt" 2>&1 || failed+=(ncu)
  grep -E "Block Size|Grid Size|Registers Per|Waves Per SM|Achieved Occupancy|Theoretical Occ|DRAM Throughput|Memory Throughput|Duration|Compute \(SM\) Throughput|Stall|Warp Cycles Per Issued|Issue Slots|No Eligible|Active Warps Per|Eligible Warps|L2 Hit|Mem Busy|Max Bandwidth|tail|Tail|wave" \
    "$OUT/ncu_$shape.txt" | head -60
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "tune-sweep: FAILED: ${failed[*]}"
  exit 1
fi
echo "tune-sweep: all steps passed"
