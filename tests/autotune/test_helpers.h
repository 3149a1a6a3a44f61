// Tune keys and entries shared by autotune_test and bench/autotune_hit_benchmark (no gtest here).
#pragma once

#include <cstdint>

#include "kernels/tune_cache.h"

namespace dequantd::autotune_testing {

// The key of an H200 v4_vec16 tuning for a (K, N) layer with group_size 128, fp16 scales and the
// output dtype `out`.
inline TuneKey Key(int64_t K, int64_t N, DType out = DType::kF16) {
  TuneKey k;
  k.device = "NVIDIA H200";
  k.compute_capability = 90;
  k.variant = "v4_vec16";
  k.K = K;
  k.N = N;
  k.group_size = 128;
  k.scale_dtype = DType::kF16;
  k.output_dtype = out;
  return k;
}

// A tuned launch configuration (block size, words and rows per thread) and its time in seconds.
inline TuneEntry Entry(int block, int words, int rows, double seconds) {
  return TuneEntry{TunedConfig{block, words, rows}, seconds};
}

}  // namespace dequantd::autotune_testing
