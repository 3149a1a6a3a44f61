// The compressed-tensors `float-quantized` FP8 format (llm-compressor's FP8 / FP8_DYNAMIC /
// FP8_BLOCK checkpoints: quant_method "compressed-tensors", format "float-quantized", weights
// num_bits 8, type "float"), written down once. The CPU reference, the CPU path, the CUDA decoder
// and the validator include this header; nothing else restates the layout. Source:
// compressed-tensors 0.20.0 `compressors/naive_quantized/base.py` (FloatQuantizationCompressor is
// the name NaiveQuantizationCompressor is registered under for float-quantized) and
// `quantization/lifecycle/forward_helpers.py` `_dequantize`; pinned by the vectors
// tests/data/formats/compressed_tensors/ct_fp8_tensor_fp32 and ct_fp8_channel_bf16 (made by the
// library's own compressor; docs/formats/compressed_tensors.md "float-quantized").
//
// For a linear layer with in_features K and out_features N (PyTorch nn.Linear orientation):
//   weight:       (N, K)                       float8 E4M3FN (safetensors F8_E4M3), row-major.
//   weight_scale: (ceil(N/R), ceil(K/C))        fp32, bf16 or fp16 (the checkpoint's scale
//                                               dtype), row-major; scale (n / R, k / C) covers
//                                               weight element (n, k).
// The scale grid (R rows, C columns of weight per scale; QuantShape::scale_block_rows and
// QuantShape::group_size) covers every strategy:
//   tensor:  R = N, C = K: one scale, stored with shape (1) or () (or (1, 1));
//   channel: R = 1, C = K: (N, 1);
//   group:   R = 1, C = group_size (K a multiple of it): (N, K / group_size);
//   block:   (R, C) = weights.block_structure, e.g. [128, 128]: (ceil(N/R), ceil(K/C)); the last
//            block row / column is partial when R / C does not divide N / K (_process_block
//            pads the edge blocks; the padding is never a result element).
// `input_scale` (static activation schemes) is not a weight tensor: it stays a raw tensor.
//
// Dequantization (_dequantize: `x_q.to(scale.dtype) * scale`, computed in the scale dtype, then
// the caller's `.to(dtype)`: the definition every path reproduces bit for bit):
//   w[n, k] = round_out( round_sdt( float32(weight[n, k]) * float32(s[n / R, k / C]) ) )
// float32(E4M3) and its conversion to bf16/fp16 are exact; with an fp16 or bf16 scale the fp32
// product (4 + 11 significant bits at most) is exact and round_sdt rounds it once, RNE, to the
// scale dtype (torch's bf16/fp16 multiply); with an fp32 scale it is the fp32 product (rounded
// once in fp32; round_sdt is the identity). round_out is then the cast, RNE, to the output dtype:
// so a bf16-scaled layer's fp32 result holds bf16 values (two roundings; case ct_fp8_channel_bf16
// pins it). This differs from fp8_block (DeepSeek's kernel: the fp32 product cast straight to the
// output) only by round_sdt, and only for fp16/bf16 scales. fp16 output overflows to +-inf above
// 65504; E4M3 NaN (0x7F, 0xFF) gives NaN. The result is (N, K), the format's own orientation;
// (K, N) is its transpose.
//
// The E4M3 conversion and the scale load are fp8_block's (fp8_block_format.h: Fp32Product,
// ScaleToFloat), round_sdt is compressed-tensors' (compressed_tensors_format.h:
// RoundToScaleDType): this header adds only the grid.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "kernels/compressed_tensors_format.h"
#include "kernels/dtype.h"
#include "kernels/fp8_block_format.h"
#include "kernels/quant_tensor.h"

namespace dequantd::compressed_tensors_fp8 {

// The stored tensors of a layer, by role (QuantView::tensors index; checkpoint suffix = name).
// weight_scale marks a layer: a checkpoint's unquantized `.weight` tensors (the `ignore` list:
// lm_head, norms, embeddings) have none and stay raw tensors.
enum Role : int { kWeight = 0, kWeightScale = 1, kRoleCount = 2 };
inline constexpr std::array<std::string_view, kRoleCount> kRoleNames = {"weight", "weight_scale"};

// The compressed-tensors `format` this row serves.
inline constexpr char kFloatQuantized[] = "float-quantized";

// R of a shape: scale_block_rows, 0 reading as 1 (an inline request's shape).
inline int64_t RowsPerScale(const QuantShape& shape) {
  return shape.scale_block_rows > 0 ? shape.scale_block_rows : 1;
}

// Rows and columns of the scale grid: ceil(N / R), ceil(K / C).
constexpr int64_t GridDim(int64_t extent, int64_t per_scale) {
  return (extent + per_scale - 1) / per_scale;
}
static_assert(GridDim(136, 128) == 2 && GridDim(128, 128) == 1 && GridDim(64, 64) == 1 &&
              GridDim(64, 1) == 64);

// The element index of the scale covering weight element (n, k).
DEQUANTD_HD int64_t ScaleIndex(int64_t n, int64_t k, int64_t rows_per_scale, int64_t cols_per_scale,
                               int64_t grid_cols) {
  return (n / rows_per_scale) * grid_cols + k / cols_per_scale;
}

// w[n, k] before round_out: the fp32 product of fp8_block, then round_sdt.
DEQUANTD_HD float Element(uint8_t weight_bits, float scale, DType scale_dtype) {
  return compressed_tensors::RoundToScaleDType(fp8_block::Fp32Product(weight_bits, scale),
                                               scale_dtype);
}

// Typed access to a compressed_tensors_fp8 QuantView's tensors (host or device pointers).
inline const uint8_t* Weight(const QuantView& v) {
  return static_cast<const uint8_t*>(v.tensors[kWeight]);
}
inline const void* WeightScale(const QuantView& v) { return v.tensors[kWeightScale]; }

// A compressed_tensors_fp8 shape with an (rows_per_scale, cols_per_scale) grid: tensor (N, K),
// channel (1, K), group (1, G), block (R, C).
inline QuantShape MakeShape(int64_t K, int64_t N, int64_t rows_per_scale, int64_t cols_per_scale,
                            DType scale_dtype = DType::kF32,
                            Orientation orientation = Orientation::kNK) {
  QuantShape s;
  s.format = Format::kCompressedTensorsFp8;
  s.K = K;
  s.N = N;
  s.group_size = cols_per_scale;
  s.scale_block_rows = rows_per_scale;
  s.scale_dtype = scale_dtype;
  s.orientation = orientation;
  s.bits = 8;
  return s;
}

inline QuantView MakeView(const QuantShape& shape, const void* weight, const void* weight_scale) {
  QuantView v;
  v.shape = shape;
  v.tensors[kWeight] = weight;
  v.tensors[kWeightScale] = weight_scale;
  return v;
}

}  // namespace dequantd::compressed_tensors_fp8
