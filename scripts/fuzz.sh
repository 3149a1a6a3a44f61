#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ in ./build-fuzz (clang 14, the whole build
# instrumented with ASan + UBSan, CUDA off) and runs each for FUZZ_SECONDS (default 60) on top of
# its checked-in seed corpus tests/fuzz/corpus/<target>/ (new inputs go to a scratch directory;
# the corpus is not modified). Fails on the first crash, leak, sanitizer report or timeout; the
# input is kept in build-fuzz/artifacts/.
#
#   scripts/fuzz.sh                                # CI: every target, 60 s each
#   FUZZ_SECONDS=3600 scripts/fuzz.sh checkpoint   # a longer run of one target
# Targets: safetensors_header config_json checkpoint gptq_checkpoint compressed_tensors_checkpoint
#   fp8_block_checkpoint compressed_tensors_fp8_checkpoint mxfp4_checkpoint
# inline_request.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
jobs=${DEQUANTD_BUILD_JOBS:-$(nproc)}
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
if ! command -v clang++-14 >/dev/null 2>&1 ||
  ! ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    clang-14 libclang-rt-14-dev >/dev/null
fi
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++-14 -DDEQUANTD_CUDA=OFF \
  -DBUILD_TESTING=OFF -DDEQUANTD_FUZZ=ON \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -Wno-unknown-warning-option -include $PWD/tests/fuzz/clang14_cpu_supports.h" \
  ${DEQUANTD_CMAKE_ARGS:-} >/dev/null
all=(safetensors_header config_json checkpoint gptq_checkpoint compressed_tensors_checkpoint
  fp8_block_checkpoint compressed_tensors_fp8_checkpoint mxfp4_checkpoint inline_request)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
ninja -C build-fuzz -j "$jobs" "${targets[@]/%/_fuzzer}"
mkdir -p build-fuzz/artifacts
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
for target in "${targets[@]}"; do
  scratch=$(mktemp -d)
  echo "fuzz: $target for $seconds s"
  # The fuzzer's own exit status decides (PIPESTATUS right after the pipeline, with errexit off:
  # `|| true` would replace it with true's, and grep may match nothing).
  set +e
  build-fuzz/tests/fuzz/"${target}"_fuzzer -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix=build-fuzz/artifacts/"$target"- "$scratch" tests/fuzz/corpus/"$target" \
    2>&1 | grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==|SUMMARY|artifact_prefix)'
  status=${PIPESTATUS[0]}
  set -e
  rm -rf "$scratch"
  if [ "$status" != 0 ]; then
    echo "fuzz: $target FAILED (exit $status); input in build-fuzz/artifacts/" >&2
    exit 1
  fi
done
echo "fuzz: done"
