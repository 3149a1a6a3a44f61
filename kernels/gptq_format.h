// The GPTQ checkpoint format (GPTQModel / AutoGPTQ, quant_method "gptq"), written down once. The
// CPU reference, the CPU path, the CUDA decoder and the validator include this header; nothing
// else restates the layout. Each rule was checked against gptqmodel 7.7.0 and is pinned by the
// vectors in tests/data/formats/gptq/ (docs/formats/gptq.md has the sources, file by file).
//
// For a linear layer with in_features K, out_features N, b = bits in {2, 3, 4, 8} and group size G
// (K % G == 0; a checkpoint's group_size -1 means G = K):
//   qweight: (K*b/32, N)    int32, row-major. Codes q in [0, 2^b), packed along K (dim 0).
//   qzeros:  (K/G, N*b/32)  int32, row-major. Zero fields, packed along N (dim 1).
//   scales:  (K/G, N)       fp16 (bf16 accepted), row-major.
//   g_idx:   (K)            int32, the group of each input row k, in [0, K/G); optional when
//                           desc_act is false (then g = k / G).
// K*b and N*b must be multiples of 32 (K and N multiples of 16, 8, 4 for b = 2, 4, 8; of 32 for
// b = 3): the packed dims are whole words.
// Bit order (kernels/bit_stream.h): along the packed axis the words, each read from its low bit,
// form one bit stream; value i occupies stream bits [i*b, i*b + b), low bit first. For b = 2, 4, 8
// that is word i*b/32, bits [(i*b) % 32, ...); for b = 3 a value may straddle two words (values 10
// and 21 of every 32). No interleave (unlike AWQ).
//
// Zero points (checkpoint_format):
//   gptq_v2: z = the stored field.
//   gptq (v1, "zeros stored minus one"): GPTQModel writes v1 by subtracting 0x55555555 (2-bit),
//     0x11111111 (4-bit) or 0x01010101 (8-bit) from each packed v2 word, borrows included. dequantd
//     undoes exactly that: it adds the constant back to the word (mod 2^32) and reads the fields
//     as v2, as GPTQModel's own loader does (convert_gptq_v1_to_v2_format_module, TorchLinear). For
//     3-bit, fields are decoded first and z = (field + 1) mod 8 (GPTQModel's 3-bit conversion).
//     This differs from GPTQModel's offline converter (per field: (field + 1) mod 2^b) only where a
//     stored v1 field is 2^b - 1, i.e. a true zero of 0 whose borrow the word rule recovers (case
//     gptq_4bit_g64_asym_v1_zero0: dequantd matches expected_torchlinear.fp16 there).
//
// Dequantization (the definition every path must reproduce bit for bit):
//   w[k, n] = round_out( float(q[k, n] - z[g, n]) * float(s[g, n]) ),  g = g_idx[k] (or k / G)
// q - z is an integer with |q - z| < 2^8 and s has at most 11 significant bits, so the fp32
// product is exact; it is rounded once, round-to-nearest-even, to the output dtype (GPTQModel's
// offline converter: fp32 (q - z) * s, then one cast). The reference result is PyTorch's
// (N, K) = nn.Linear.weight, the format's own orientation; (K, N) is its transpose.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "kernels/bit_stream.h"
#include "kernels/dtype.h"
#include "kernels/quant_tensor.h"

namespace dequantd::gptq {

// The stored tensors of a layer, by role (QuantView::tensors index; checkpoint suffix = name).
enum Role : int { kQweight = 0, kQzeros = 1, kScales = 2, kGidx = 3, kRoleCount = 4 };
inline constexpr std::array<std::string_view, kRoleCount> kRoleNames = {"qweight", "qzeros",
                                                                        "scales", "g_idx"};

// QuantShape::format_flags of a GPTQ layer.
inline constexpr uint32_t kZerosV1 = 1u;  // checkpoint_format "gptq": zeros stored minus one
inline constexpr uint32_t kNoGidx = 2u;   // no g_idx stored: g = k / G
inline constexpr uint32_t kSym = 4u;      // declared sym: every zero must be 2^(b-1) (checked)
inline constexpr uint32_t kKnownFlags = kZerosV1 | kNoGidx | kSym;

// The per-word constant v1 zeros lack, by bits (0: decode fields first, b = 3).
DEQUANTD_HD uint32_t V1WordBias(int bits) {
  return bits == 2 ? 0x55555555u : bits == 4 ? 0x11111111u : bits == 8 ? 0x01010101u : 0u;
}
static_assert(0x11111111u * 15u == 0xFFFFFFFFu && 0x55555555u * 3u == 0xFFFFFFFFu &&
                  0x01010101u * 255u == 0xFFFFFFFFu,
              "a v1 word bias is 1 in every field");

// Words of a stream (qweight rows, qzeros columns) and value i of one: kernels/bit_stream.h.
using ::dequantd::StreamField;
using ::dequantd::StreamWords;

// z[g, n] from the zero row of group g (N*b/32 words), v1 or v2 as `flags` says.
DEQUANTD_HD uint32_t ZeroAt(const int32_t* zero_row, int64_t n, int bits, uint32_t flags) {
  if ((flags & kZerosV1) == 0) return StreamField(zero_row, 1, n, bits);
  if (bits == 3) return (StreamField(zero_row, 1, n, bits) + 1u) & 7u;
  const int64_t bit = n * bits;
  const uint32_t word = static_cast<uint32_t>(zero_row[bit >> 5]) + V1WordBias(bits);
  return (word >> (bit & 31)) & ((1u << bits) - 1u);
}

// Typed access to a GPTQ QuantView's tensors (host or device pointers, as the view's).
inline const int32_t* Qweight(const QuantView& v) {
  return static_cast<const int32_t*>(v.tensors[kQweight]);
}
inline const int32_t* Qzeros(const QuantView& v) {
  return static_cast<const int32_t*>(v.tensors[kQzeros]);
}
inline const void* Scales(const QuantView& v) { return v.tensors[kScales]; }
// Null when the layer stores none (kNoGidx), whatever the slot holds.
inline const int32_t* Gidx(const QuantView& v) {
  if ((v.shape.format_flags & kNoGidx) != 0) return nullptr;
  return static_cast<const int32_t*>(v.tensors[kGidx]);
}

// A GPTQ shape. `flags`: kZerosV1, kNoGidx, kSym.
inline QuantShape MakeShape(int64_t K, int64_t N, int64_t group_size, int bits, uint32_t flags,
                            DType scale_dtype = DType::kF16,
                            Orientation orientation = Orientation::kNK) {
  QuantShape s;
  s.format = Format::kGptq;
  s.K = K;
  s.N = N;
  s.group_size = group_size;
  s.scale_dtype = scale_dtype;
  s.orientation = orientation;
  s.bits = bits;
  s.format_flags = flags;
  return s;
}

inline QuantView MakeView(const QuantShape& shape, const void* qweight, const void* qzeros,
                          const void* scales, const void* g_idx) {
  QuantView v;
  v.shape = shape;
  v.tensors[kQweight] = qweight;
  v.tensors[kQzeros] = qzeros;
  v.tensors[kScales] = scales;
  v.tensors[kGidx] = g_idx;
  return v;
}

}  // namespace dequantd::gptq
