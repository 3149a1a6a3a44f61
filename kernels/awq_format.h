// The AWQ 4-bit GEMM checkpoint format, written down once. The CPU reference, every CUDA kernel,
// the validator and the checkpoint loader include this header; nothing else restates the layout.
//
// Source: AutoAWQ's "gemm" version (awq/modules/linear/gemm.py, WQLinear_GEMM.from_linear), the
// layout vLLM's `awq` quantization method reads (vllm/model_executor/layers/quantization/awq.py,
// AWQ_REVERSE_ORDER in awq_triton.py). For a linear layer with in_features K, out_features N and
// group size G (K % G == 0; a checkpoint's `group_size: -1` means G = K):
//   qweight: (K, N/8)   int32, row-major. Eight 4-bit unsigned weights per word.
//   qzeros:  (K/G, N/8) int32, row-major. Eight 4-bit unsigned zero points per word.
//   scales:  (K/G, N)   fp16 (bf16 accepted), row-major.
// Within a word of row r and word-column c, output column 8c + kColumnOfNibble[j] sits in bits
// [4j, 4j+4); equivalently column 8c + i sits in nibble kNibbleOfColumn[i] = [0,4,1,5,2,6,3,7].
//
// Dequantization (the definition every path must reproduce bit for bit):
//   w[k, n] = round_out( float(q[k, n] - z[k/G, n]) * float(s[k/G, n]) )
// q - z is an integer in [-15, 15] and s has at most 11 significant bits, so the fp32 product is
// exact; it is rounded once, round-to-nearest-even, to the output dtype (fp16 overflow gives inf,
// subnormals are kept, NaN scales give a NaN whose payload is unspecified, 0 * negative scale
// gives -0). fp32 output is exact.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "kernels/dtype.h"
#include "kernels/quant_tensor.h"

namespace dequantd {

namespace awq {

inline constexpr int kBits = 4;
inline constexpr int kPackFactor = 32 / kBits;  // weights per int32 word
inline constexpr uint32_t kNibbleMask = (1u << kBits) - 1;
// kNibbleOfColumn[i]: the nibble holding output column 8c + i.
inline constexpr std::array<int, kPackFactor> kNibbleOfColumn = {0, 4, 1, 5, 2, 6, 3, 7};
// kColumnOfNibble[j]: the output column (within the word's 8) held by nibble j (AutoAWQ order_map).
inline constexpr std::array<int, kPackFactor> kColumnOfNibble = {0, 2, 4, 6, 1, 3, 5, 7};

static_assert(kPackFactor == 8, "AWQ GEMM packs eight 4-bit values per int32");
static_assert(
    [] {
      for (int i = 0; i < kPackFactor; ++i)
        if (kColumnOfNibble[kNibbleOfColumn[i]] != i) return false;
      return true;
    }(),
    "kNibbleOfColumn and kColumnOfNibble must be inverse permutations");

// kNibbleOfColumn as one word: nibble i of this constant is kNibbleOfColumn[i]. (Checked here,
// outside any __host__ __device__ function, so nvcc needs no relaxed constexpr for it.)
inline constexpr uint32_t kNibbleOfColumnPacked = 0x73625140u;
static_assert(
    [] {
      for (int i = 0; i < kPackFactor; ++i)
        if (((kNibbleOfColumnPacked >> (4 * i)) & 0xFu) !=
            static_cast<uint32_t>(kNibbleOfColumn[i]))
          return false;
      return true;
    }(),
    "kNibbleOfColumnPacked must spell kNibbleOfColumn");

// The 4-bit field of `word` that holds output column 8c + i (i in [0, 8)).
DEQUANTD_HD uint32_t NibbleForColumn(uint32_t word, int i) {
  return (word >> (4u * ((kNibbleOfColumnPacked >> (4 * i)) & 0xFu))) & kNibbleMask;
}

// The stored tensors of a layer, by role (QuantView::tensors index; checkpoint suffix = name).
enum Role : int { kQweight = 0, kQzeros = 1, kScales = 2, kRoleCount = 3 };
inline constexpr std::array<std::string_view, kRoleCount> kRoleNames = {"qweight", "qzeros",
                                                                        "scales"};

// Typed access to an AWQ QuantView's tensors (host or device pointers, as the view's).
inline const int32_t* Qweight(const QuantView& v) {
  return static_cast<const int32_t*>(v.tensors[kQweight]);
}
inline const int32_t* Qzeros(const QuantView& v) {
  return static_cast<const int32_t*>(v.tensors[kQzeros]);
}
inline const void* Scales(const QuantView& v) { return v.tensors[kScales]; }
// An AWQ view of `shape` (whose format must be Format::kAwqGemm) over the three tensors.
inline QuantView MakeView(const QuantShape& shape, const void* qweight, const void* qzeros,
                          const void* scales) {
  QuantView v;
  v.shape = shape;
  v.tensors[kQweight] = qweight;
  v.tensors[kQzeros] = qzeros;
  v.tensors[kScales] = scales;
  return v;
}
// Elements and bytes of each stored tensor of an AWQ shape (TensorSpecOf's dims).
inline int64_t QweightElements(const QuantShape& s) { return s.K * (s.N / kPackFactor); }
inline int64_t QzerosElements(const QuantShape& s) { return s.groups() * (s.N / kPackFactor); }
inline int64_t ScalesElements(const QuantShape& s) { return s.groups() * s.N; }
inline int64_t QweightBytes(const QuantShape& s) { return QweightElements(s) * 4; }
inline int64_t QzerosBytes(const QuantShape& s) { return QzerosElements(s) * 4; }
inline int64_t ScalesBytes(const QuantShape& s) {
  return ScalesElements(s) * DTypeSize(s.scale_dtype);
}

// An AWQ shape: K, N, group size and scale dtype (the format field set).
inline QuantShape MakeShape(int64_t K, int64_t N, int64_t group_size,
                            DType scale_dtype = DType::kF16) {
  QuantShape s;
  s.format = Format::kAwqGemm;
  s.K = K;
  s.N = N;
  s.group_size = group_size;
  s.scale_dtype = scale_dtype;
  return s;
}

}  // namespace awq

}  // namespace dequantd
