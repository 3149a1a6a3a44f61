// The compressed-tensors `pack-quantized` format (llm-compressor / vLLM, quant_method
// "compressed-tensors", format "pack-quantized"), written down once. The CPU reference, the CPU
// path, the CUDA decoder and the validator include this header; nothing else restates the
// layout. Each rule was checked against compressed-tensors 0.20.0 (and 0.18.0 for actorder group)
// and is pinned by the vectors in tests/data/formats/compressed_tensors/
// (docs/formats/compressed_tensors.md has the sources, file by file).
//
// For a linear layer with in_features K, out_features N, b = num_bits in {4, 8}, group size G
// (strategy group: group_size; channel and tensor: G = K) and groups = K / G. PyTorch nn.Linear
// orientation, not transposed like GPTQ/AWQ:
//   weight_packed:     (N, K*b/32)            int32. Row n holds codes f[n, k] = q + 2^(b-1)
//                                              (q signed in [-2^(b-1), 2^(b-1))), packed along K.
//   weight_scale:      (N, groups)            fp16, bf16 or fp32 (the checkpoint's scale dtype);
//                      tensor strategy: (1) one scale for the whole tensor.
//   weight_zero_point: (ceil(N*b/32), groups) int32, asymmetric only: fields zf[n, g] = zp +
//   2^(b-1)
//                                              packed along N (dim 0): column g is one stream.
//   weight_g_idx:      (K)                    int32, optional (actorder "group", compressed-tensors
//                                              <= 0.18): the group of input column k.
//   weight_shape:      (2)                    int64, the dense shape (N, K).
// Bit order (pack_to_int32 / unpack_from_int32; kernels/bit_stream.h): along the packed axis the
// words, each read from its low bit, form one bit stream; value i at stream bits [i*b, i*b + b).
// For b = 4 value 8w + j is bits [4j, 4j + 4) of word w; for b = 8, 4 values per word, low byte
// first. dequantd serves K*b a multiple of 32 (whole weight_packed words: K a multiple of 8 for
// int4, of 4 for int8); N is free (the zero-point stream's last word is zero-padded).
//
// Dequantization (_dequantize, quantization/lifecycle/forward_helpers.py: computed in the scale
// dtype, then cast to the output dtype: the definition every path reproduces bit for bit):
//   w[k, n] = round_out( round_sdt( float(f[n, k] - z[n, g]) * float(s[n, g]) ) ),  g = g_idx[k]
//   (or k / G), z = zf[n, g] when stored, else 2^(b-1) (symmetric: zp = 0), s = s[0] for tensor.
// (q - zp = f - z exactly; |f - z| < 2^8 and its conversion to the scale dtype are exact; the fp32
// product is exact for fp16/bf16 scales and rounded once, RNE, to the scale dtype (round_sdt); for
// fp32 scales it is the fp32 product (round_sdt is the identity). The result is then rounded, RNE,
// to the output dtype (round_out): torch's `.to(dtype)` of the scale-dtype result.) The reference
// result is PyTorch's (N, K) = nn.Linear.weight, the format's own orientation; (K, N) is its
// transpose.
//
// actorder group (weight_g_idx): compressed-tensors sorts columns by g_idx and cuts groups of G in
// that order, so column k's group is rank(k) / G, which equals g_idx[k] when every group holds
// exactly G columns (as GPTQ act-order writes them). dequantd reads g = g_idx[k] and refuses, at
// load, a g_idx whose groups do not each hold G columns (CheckStored).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "kernels/bit_stream.h"
#include "kernels/dtype.h"
#include "kernels/quant_tensor.h"

namespace dequantd::compressed_tensors {

// The stored tensors of a layer, by role (QuantView::tensors index; checkpoint suffix = name).
enum Role : int {
  kWeightPacked = 0,
  kWeightScale = 1,
  kWeightZeroPoint = 2,
  kWeightGidx = 3,
  kWeightShape = 4,
  kRoleCount = 5
};
inline constexpr std::array<std::string_view, kRoleCount> kRoleNames = {
    "weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx", "weight_shape"};

// QuantShape::format_flags of a compressed-tensors layer (0: asymmetric, g_idx stored, one scale
// per (n, group): what an inline request carries).
inline constexpr uint32_t kSym = 1u;          // no weight_zero_point stored: z = 2^(b-1)
inline constexpr uint32_t kNoGidx = 2u;       // no weight_g_idx stored: g = k / G
inline constexpr uint32_t kTensorScale = 4u;  // strategy tensor: weight_scale holds one value
inline constexpr uint32_t kKnownFlags = kSym | kNoGidx | kTensorScale;

// The code offset: stored = signed + 2^(b-1) (pack_to_int32's `offset`).
DEQUANTD_HD uint32_t CodeOffset(int bits) { return 1u << (bits - 1); }
static_assert((1u << (4 - 1)) == 8u && (1u << (8 - 1)) == 128u, "int4 / int8 offsets");

// Words of a weight_packed row (K codes) and rows of weight_zero_point (N fields, rounded up).
constexpr int64_t PackedRowWords(int64_t K, int bits) { return StreamWords(K, bits); }
constexpr int64_t ZeroPointRows(int64_t N, int bits) { return (N * bits + 31) / 32; }

// Rounds `v` once (RNE) to the scale dtype and back to float: round_sdt of the definition.
DEQUANTD_HD float RoundToScaleDType(float v, DType scale_dtype) {
  if (scale_dtype == DType::kF16) return HalfBitsToFloat(FloatToHalfBitsRne(v));
  if (scale_dtype == DType::kBF16) return Bf16BitsToFloat(FloatToBf16BitsRne(v));
  return v;  // fp32
}

// Typed access to a compressed-tensors QuantView's tensors (host or device pointers, as the
// view's).
inline const int32_t* WeightPacked(const QuantView& v) {
  return static_cast<const int32_t*>(v.tensors[kWeightPacked]);
}
inline const void* WeightScale(const QuantView& v) { return v.tensors[kWeightScale]; }
// Null when the layer stores none (kSym / kNoGidx), whatever the slot holds.
inline const int32_t* WeightZeroPoint(const QuantView& v) {
  if ((v.shape.format_flags & kSym) != 0) return nullptr;
  return static_cast<const int32_t*>(v.tensors[kWeightZeroPoint]);
}
inline const int32_t* WeightGidx(const QuantView& v) {
  if ((v.shape.format_flags & kNoGidx) != 0) return nullptr;
  return static_cast<const int32_t*>(v.tensors[kWeightGidx]);
}
// Two int64 (N, K); may be only 4-byte aligned (an inline request's copy): read with memcpy.
inline const void* WeightShape(const QuantView& v) { return v.tensors[kWeightShape]; }

// The element index of s[n, g] in weight_scale.
DEQUANTD_HD int64_t ScaleIndex(int64_t n, int64_t g, int64_t groups, uint32_t flags) {
  return (flags & kTensorScale) != 0 ? 0 : n * groups + g;
}

// z[n, g]: the stored zero field, or 2^(b-1) when `zero_point` is null (symmetric).
DEQUANTD_HD uint32_t ZeroAt(const int32_t* zero_point, int64_t n, int64_t g, int64_t groups,
                            int bits) {
  if (zero_point == nullptr) return CodeOffset(bits);
  return StreamField(zero_point + g, groups, n, bits);
}

// A compressed-tensors shape. `flags`: kSym, kNoGidx, kTensorScale.
inline QuantShape MakeShape(int64_t K, int64_t N, int64_t group_size, int bits, uint32_t flags,
                            DType scale_dtype = DType::kBF16,
                            Orientation orientation = Orientation::kNK) {
  QuantShape s;
  s.format = Format::kCompressedTensors;
  s.K = K;
  s.N = N;
  s.group_size = group_size;
  s.scale_dtype = scale_dtype;
  s.orientation = orientation;
  s.bits = bits;
  s.format_flags = flags;
  return s;
}

inline QuantView MakeView(const QuantShape& shape, const void* weight_packed,
                          const void* weight_scale, const void* weight_zero_point,
                          const void* weight_g_idx, const void* weight_shape) {
  QuantView v;
  v.shape = shape;
  v.tensors[kWeightPacked] = weight_packed;
  v.tensors[kWeightScale] = weight_scale;
  v.tensors[kWeightZeroPoint] = weight_zero_point;
  v.tensors[kWeightGidx] = weight_g_idx;
  v.tensors[kWeightShape] = weight_shape;
  return v;
}

}  // namespace dequantd::compressed_tensors
