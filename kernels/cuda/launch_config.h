// A kernel variant's launch parameters, as the launcher takes them and the autotuner stores them.
// Plain host data with no CUDA headers, so the CPU-only autotuner (kernels/autotune.h) and its
// cache file use this one type.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"

namespace dequantd::cuda {

// Launch parameters a variant exposes (fields a variant ignores must be left at their defaults;
// v1 and v2 take none). Checked against a shape by CanImplement (dequant_cuda.h).
struct LaunchConfig {
  int block_size = 256;      // threads per block (v3: [32, 1024], v4: [32, 512]); multiple of 32
  int words_per_thread = 1;  // packed words of a row per thread, N/8/words apart (v4: 1, 2 or
                             // 4, dividing N/8)
  int rows_per_thread = 1;   // consecutive rows of K per thread (v4: 1, 2, 4, 8 or 16, dividing
                             // group_size; also group_size * N/8 / (words * rows) < 2^31)
  // e.g. "block=256,words=4,rows=2".
  std::string ToString() const {
    return absl::StrCat("block=", block_size, ",words=", words_per_thread,
                        ",rows=", rows_per_thread);
  }
  bool operator==(const LaunchConfig&) const = default;
};

}  // namespace dequantd::cuda
