// The FP8 block-scaled checkpoint format (DeepSeek-V3/R1/V3.1, Qwen3-FP8; quant_method "fp8"),
// written down once. The CPU reference, the CPU path, the CUDA decoder and the validator include
// this header; nothing else restates the layout. The reference is DeepSeek's own
// `inference/kernel.py` weight_dequant_kernel (deepseek-ai/DeepSeek-V3); each rule is pinned by the
// vectors in tests/data/formats/fp8_block/ (docs/formats/fp8_block.md has the sources).
//
// For a linear layer with in_features K and out_features N, block size B = 128 (config.json
// quantization_config.weight_block_size = [128, 128]; no other block size is served):
//   weight:           (N, K)                     float8 E4M3FN (safetensors F8_E4M3), row-major,
//                                                PyTorch nn.Linear orientation (out, in).
//   weight_scale_inv: (ceil(N/B), ceil(K/B))     fp32 (DeepSeek), bf16 or fp16 (Qwen3-FP8
//                                                variants), row-major.
// Despite its name weight_scale_inv is the multiplier: scale (i / B, j / B) covers weight element
// (i, j). N and K need not be multiples of B: the last block row / column is partial (the grid is
// the ceiling; the reference masks the elements outside the weight). `scale_fmt: "ue8m0"`
// (DeepSeek-V3.1) stores powers of two in the same fp32 tensor: the arithmetic is the same.
//
// Dequantization (the definition every path must reproduce bit for bit; weight_dequant_kernel:
// x = load(fp8).to(float32); y = x * s; store(y) into the output dtype):
//   w[n, k] = round_out( round_fp32( float32(weight[n, k]) * float32(s[n / B, k / B]) ) )
// float32(E4M3) is exact; an fp16 or bf16 scale is exact in fp32 and the product (4 + 11
// significant bits) is exact, so there is one rounding, to the output dtype; an fp32 scale gives
// a product of up to 28 significant bits, rounded to fp32 first and then (fp16/bf16 output) to the
// output dtype: two roundings, round-to-nearest-even each, exactly as the reference. A path must
// form the fp32 product and cast it (no wider product rounded once, no fused operations). fp16
// output overflows to +-inf above 65504; E4M3 NaN (0x7F, 0xFF) gives NaN. The reference result is
// (N, K), the format's own orientation; (K, N) is its transpose.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "kernels/dtype.h"
#include "kernels/quant_tensor.h"

namespace dequantd::fp8_block {

// The stored tensors of a layer, by role (QuantView::tensors index; checkpoint suffix = name).
// weight_scale_inv marks a layer: a checkpoint's unquantized `.weight` tensors (norms, embeddings,
// lm_head, gates) have none and stay raw tensors.
enum Role : int { kWeight = 0, kWeightScaleInv = 1, kRoleCount = 2 };
inline constexpr std::array<std::string_view, kRoleCount> kRoleNames = {"weight",
                                                                        "weight_scale_inv"};

// The one block size served (rows and columns of weight per scale).
inline constexpr int64_t kBlock = 128;
static_assert((kBlock & (kBlock - 1)) == 0, "the block size is a power of two");

// QuantShape::format_flags of an fp8_block layer.
inline constexpr uint32_t kScaleUe8m0 = 1u;  // declared scale_fmt "ue8m0" (informational)
inline constexpr uint32_t kKnownFlags = kScaleUe8m0;

// Rows and columns of the scale grid: ceil(N / B), ceil(K / B).
constexpr int64_t GridRows(int64_t N) { return (N + kBlock - 1) / kBlock; }
constexpr int64_t GridCols(int64_t K) { return (K + kBlock - 1) / kBlock; }
static_assert(GridRows(136) == 2 && GridCols(128) == 1 && GridCols(129) == 2);

// Scale element i of `scales` (of dtype kScale: fp32, bf16 or fp16) as a float (exact).
DEQUANTD_HD float ScaleToFloat(const void* scales, DType scale_dtype, int64_t i) {
  if (scale_dtype == DType::kF32) return static_cast<const float*>(scales)[i];
  const uint16_t bits = static_cast<const uint16_t*>(scales)[i];
  return scale_dtype == DType::kBF16 ? Bf16BitsToFloat(bits) : HalfBitsToFloat(bits);
}

// The fp32 product of the definition (rounded to fp32 once; the caller rounds to its output).
DEQUANTD_HD float Fp32Product(uint8_t weight_bits, float scale) {
  return Fp8E4m3BitsToFloat(weight_bits) * scale;
}

// Typed access to an fp8_block QuantView's tensors (host or device pointers, as the view's).
inline const uint8_t* Weight(const QuantView& v) {
  return static_cast<const uint8_t*>(v.tensors[kWeight]);
}
inline const void* ScaleInv(const QuantView& v) { return v.tensors[kWeightScaleInv]; }

// An fp8_block shape (group_size = kBlock).
inline QuantShape MakeShape(int64_t K, int64_t N, DType scale_dtype = DType::kF32,
                            Orientation orientation = Orientation::kNK, uint32_t flags = 0) {
  QuantShape s;
  s.format = Format::kFp8Block;
  s.K = K;
  s.N = N;
  s.group_size = kBlock;
  s.scale_dtype = scale_dtype;
  s.orientation = orientation;
  s.bits = 8;
  s.format_flags = flags;
  return s;
}

inline QuantView MakeView(const QuantShape& shape, const void* weight, const void* scale_inv) {
  QuantView v;
  v.shape = shape;
  v.tensors[kWeight] = weight;
  v.tensors[kWeightScaleInv] = scale_inv;
  return v;
}

}  // namespace dequantd::fp8_block
