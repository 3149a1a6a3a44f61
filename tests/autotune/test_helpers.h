// Tune keys and entries shared by autotune_test and bench/autotune_hit_benchmark (no gtest here).
#pragma once

#include <cstdint>

#include "kernels/autotune.h"

namespace dequantd::autotune_testing {

inline const TuneDevice kH200{"NVIDIA H200", 90};

// The key of an H200 v4_vec16 latency tuning for a (K, N) layer with group_size 128, fp16 scales
// and the output dtype `out`.
inline TuneKey Key(int64_t K, int64_t N, DType out = DType::kF16,
                   TuneObjective objective = TuneObjective::kLatency) {
  return TuneKey::For(kH200, "v4_vec16", QuantShape{K, N, 128, DType::kF16}, out, objective);
}

// A tuned launch configuration (block size, words and rows per thread) and its time in seconds.
inline TuneEntry Entry(int block, int words, int rows, double seconds) {
  return TuneEntry{cuda::LaunchConfig{block, words, rows}, seconds};
}

}  // namespace dequantd::autotune_testing
