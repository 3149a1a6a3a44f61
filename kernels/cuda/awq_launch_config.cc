// AWQ GEMM's launch configurations and their checks (its FormatKernels row entries besides the
// launch, kernels/cuda/format_kernels.h). No device code: this file compiles with the host
// compiler.
#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/awq_format.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/cuda/format_kernels.h"
#include "kernels/cuda/layer_size.h"

namespace dequantd::cuda {
namespace {

bool IsV4WordsPerThread(int w) { return w == 1 || w == 2 || w == 4; }
bool IsV4RowsPerThread(int r) { return r == 1 || r == 2 || r == 4 || r == 8 || r == 16; }

// Largest of `options` (descending) that divides `n`; options end with 1.
int LargestDivisor(int64_t n, std::initializer_list<int> options) {
  for (int o : options)
    if (n % o == 0) return o;
  return 1;
}

// The (N, K) tile kernel's launch configurations (AwqNkTileKernel: 256-thread blocks, the tiles
// along K per block as rows_per_thread), which the autotuner sweeps; the first is the default.
// Measured on an H100 (2026-12-07, bf16, docs/performance.md "H100 call at 3bb903e"): one tile per
// block is the fastest on 4096 x 14336, 14336 x 4096, 8192 x 28672, 4096 x 4096 and 4096 x 1024
// (2 tiles 1-4% slower; 4 tiles 6-7%, 43% on 4096 x 1024; 8 tiles 12-19%, 2.4x on 4096 x 1024,
// not kept).
constexpr LaunchConfig kNkTileConfigs[] = {
    {.block_size = 256, .words_per_thread = 1, .rows_per_thread = 1},
    {.block_size = 256, .words_per_thread = 1, .rows_per_thread = 2},
    {.block_size = 256, .words_per_thread = 1, .rows_per_thread = 4}};

}  // namespace

// Measured on the H200 (fp16 scales, group 128, cuda_quick_bench --sweep, 2026-11-30): one word
// per thread and 128-thread blocks lead everywhere. fp16/bf16 output: two rows per thread on
// layers with >= 32M outputs (4096x14336: 94.0% of the peak copy rate, 8192x28672: 98.0%),
// 16 rows on mid-size layers (1536x8960: 86.3% vs 81.5% with 4), 4 on small ones (1536x1536).
// fp32 output (two threads per word): 4 rows (4096x14336: 93.7% vs 87.1% with 2), 8 rows and
// 256-thread blocks on mid-size layers (1536x8960: 85.9%).
LaunchConfig AwqDefaultConfig(KernelVariant v, const QuantShape& shape, DType out_dtype) {
  LaunchConfig c;
  if (v != KernelVariant::kV4Vec16) return c;
  if (shape.orientation == Orientation::kNK) return kNkTileConfigs[0];
  c.block_size = 128;
  c.words_per_thread = 1;
  const int64_t G = shape.group_size > 0 ? shape.group_size : 1;
  const bool large = ClassifyLayer(shape) == LayerSize::kLarge;
  const bool mid = ClassifyLayer(shape) == LayerSize::kMid;
  if (out_dtype == DType::kF32) {
    if (mid) c.block_size = 256;
    c.rows_per_thread = mid ? LargestDivisor(G, {8, 4, 2, 1}) : LargestDivisor(G, {4, 2, 1});
  } else if (large) {
    c.rows_per_thread = LargestDivisor(G, {2, 1});
  } else if (mid) {
    c.rows_per_thread = LargestDivisor(G, {16, 8, 4, 2, 1});
  } else {
    c.rows_per_thread = LargestDivisor(G, {4, 2, 1});
  }
  return c;
}

std::vector<LaunchConfig> AwqCandidateConfigs(KernelVariant v, const QuantShape& shape,
                                              DType out_dtype) {
  std::vector<LaunchConfig> out;
  const auto add = [&](LaunchConfig c) {
    if (CanImplement(v, c, shape, out_dtype).ok() &&
        std::find(out.begin(), out.end(), c) == out.end())
      out.push_back(c);
  };
  add(AwqDefaultConfig(v, shape, out_dtype));
  switch (v) {
    case KernelVariant::kV1PerElement:
    case KernelVariant::kV2PerWord:
      break;
    case KernelVariant::kV3PerWordBlock:
      for (int b : {64, 128, 256, 512, 1024}) add({.block_size = b});
      break;
    case KernelVariant::kV4Vec16:
      if (shape.orientation == Orientation::kNK) {
        for (const LaunchConfig& nk : kNkTileConfigs) add(nk);
        break;
      }
      // At most 16: the sweep's leaders on every measured shape.
      for (int b : {128, 256})
        for (int r : {1, 2, 4, 8, 16})
          add({.block_size = b, .words_per_thread = 1, .rows_per_thread = r});
      add({.block_size = 128, .words_per_thread = 2, .rows_per_thread = 1});
      add({.block_size = 128, .words_per_thread = 2, .rows_per_thread = 2});
      add({.block_size = 128, .words_per_thread = 4, .rows_per_thread = 1});
      add({.block_size = 512, .words_per_thread = 1, .rows_per_thread = 16});
      add({.block_size = 512, .words_per_thread = 1, .rows_per_thread = 2});
      break;
  }
  return out;
}

bool AwqIsTunable(KernelVariant v, const QuantShape& shape, DType out_dtype) {
  if (v == KernelVariant::kV4Vec16 && ClassifyLayer(shape) == LayerSize::kSmall) return false;
  return AwqCandidateConfigs(v, shape, out_dtype).size() > 1;
}

absl::Status AwqCanImplement(KernelVariant v, const LaunchConfig& config, const QuantShape& shape,
                             DType out_dtype) {
  const std::string name(VariantName(v));
  switch (v) {
    case KernelVariant::kV1PerElement:
    case KernelVariant::kV2PerWord:
      if (!(config == LaunchConfig{}))
        return absl::InvalidArgumentError(
            absl::StrCat(name, " takes no launch parameters: config must be the default, got ",
                         config.ToString()));
      return absl::OkStatus();
    case KernelVariant::kV3PerWordBlock:
    case KernelVariant::kV4Vec16:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown kernel variant ", static_cast<int>(v)));
  }
  const int max_block = v == KernelVariant::kV4Vec16 ? kV4MaxBlockSize : 1024;
  if (config.block_size < 32 || config.block_size > max_block || config.block_size % 32 != 0)
    return absl::InvalidArgumentError(absl::StrCat("block_size must be a multiple of 32 in [32, ",
                                                   max_block, "], got ", config.block_size));
  if (v == KernelVariant::kV3PerWordBlock) {
    if (config.words_per_thread != 1 || config.rows_per_thread != 1)
      return absl::InvalidArgumentError(absl::StrCat(
          name, " takes only block_size: words_per_thread and rows_per_thread must be 1, got ",
          config.ToString()));
    return absl::OkStatus();
  }
  if (shape.orientation == Orientation::kNK) {
    return ConfigAmong(kNkTileConfigs, config,
                       "v4_vec16 of awq_gemm (N, K) takes the tiles along K per block (block = "
                       "256, words = 1, rows = tiles)");
  }
  const int64_t words_per_row = shape.N / awq::kPackFactor;
  if (!IsV4WordsPerThread(config.words_per_thread) || words_per_row % config.words_per_thread != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("words_per_thread must be 1, 2 or 4 and divide N/8 = ", words_per_row,
                     ", got ", config.words_per_thread));
  if (!IsV4RowsPerThread(config.rows_per_thread) || shape.group_size % config.rows_per_thread != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "rows_per_thread must be 1, 2, 4, 8 or 16 and divide group_size = ", shape.group_size,
        ", got ", config.rows_per_thread));
  if (config.words_per_thread * config.rows_per_thread > kV4MaxTileWords)
    return absl::InvalidArgumentError(
        absl::StrCat("words_per_thread * rows_per_thread must be at most ", kV4MaxTileWords,
                     ", got ", config.ToString()));
  // One launch of v4 covers whole groups in fewer than 2^31 threads (32-bit index arithmetic).
  const int64_t lanes_per_word = out_dtype == DType::kF32 ? 2 : 1;  // kVec16LanesPerWord
  const int64_t units_per_group = shape.group_size / config.rows_per_thread *
                                  (words_per_row / config.words_per_thread) * lanes_per_word;
  if (units_per_group > int64_t{0x7FFFFFFF})
    return absl::InvalidArgumentError(
        absl::StrCat("group_size * N / 8 / (words_per_thread * rows_per_thread), x2 for fp32 "
                     "output, must be below 2^31 for ",
                     name, ", got ", units_per_group));
  return absl::OkStatus();
}

}  // namespace dequantd::cuda
