// MXFP4 as gpt-oss ships it (quant_method "mxfp4": openai/gpt-oss-20b, -120b), written down once.
// The CPU reference, the CPU path, the CUDA decoder and the validator include this header; nothing
// else restates the layout. Source: transformers 5.23.0 `integrations/mxfp4.py`
// `convert_moe_packed_tensors` (the dequantize path of Mxfp4Config(dequantize=True) and of CPU
// loading), read against OpenAI's gpt-oss 0.0.9 `torch/weights.py` `_get_mxfp4_tensor`; pinned by
// the vectors in tests/data/formats/mxfp4/ (made with convert_moe_packed_tensors;
// docs/formats/mxfp4.md has the sources).
//
// One layer is one MoE projection of E experts (prefix `model.layers.L.mlp.experts.gate_up_proj`
// or `.down_proj`), each expert a linear layer with in_features K and out_features N, stored in
// [E, out, in] orientation:
//   <prefix>_blocks: (E, N, K/32, 16)  uint8 (safetensors U8): 16 bytes per block of 32 inputs;
//                                      byte j of block g of row n holds input 32g + 2j in its LOW
//                                      nibble and 32g + 2j + 1 in its high nibble.
//   <prefix>_scales: (E, N, K/32)      uint8 E8M0: scale (e, n, g) covers the block's 32 values.
// The checkpoint joins prefix and role with '_' (FormatRow::role_separator). A layer with no
// expert axis ((N, K/32, 16) and (N, K/32)) is one expert. gate_up_proj's N = 2I holds gate and up
// rows interleaved (gate = [..., ::2]); dequantd keeps them as stored. `<prefix>_bias` (bf16
// (E, N)) is not quantized: it stays a raw tensor.
//
// Dequantization (_convert_moe_packed_tensors: lut[nibble] in the output dtype (exact), then
// torch.ldexp(sub, scale - 127, out=sub) = at::mul_out(sub, sub, pow(2.0, e)): an fp32 2^e, an
// fp32 multiply, one cast to the output dtype):
//   w_e[k, n] = round_out( float32(FP4[nibble(e, n, k)]) * float32(2^(scale[e, n, k/32] - 127)) )
// FP4 = E2M1 (bit 3 sign, 3-bit magnitude index into {0, 0.5, 1, 1.5, 2, 3, 4, 6}). 2^(s - 127)
// is exact in fp32 for s in [0, 254] (2^-127 is a subnormal) and the product (2 significant bits
// times a power of two, at least 2^-128) is exact, so round_out (RNE to fp16 / bf16; identity for
// fp32) is the one rounding: bf16 holds every value, fp16 overflows to +-inf above 65504 and
// rounds below 2^-14 to subnormals or +-0. Scale 0xFF is 2^128 = inf in torch: +-inf for a nonzero
// value, NaN for +-0 (OCP MX calls 0xFF NaN; transformers computes inf * value): every dequantd
// path writes +-inf and, for +-0, the quiet NaN 0x7FC00000 (rounded to the output dtype), so CPU
// and CUDA agree bit for bit (torch's NaN bits are the CPU's own and not pinned).
//
// Result: each expert's (K, N) matrix, experts stacked: (E, K, N) = transformers' [E, in, out]
// (its `.transpose(1, 2)`; what GptOssExperts multiplies, `hidden @ gate_up_proj`), the format's
// own orientation (Orientation::kKN). kNK gives (E, N, K) = [E, out, in], the blocks' own order
// (OpenAI's `_get_mxfp4_tensor`).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "kernels/dtype.h"
#include "kernels/quant_tensor.h"

namespace dequantd::mxfp4 {

// The stored tensors of a layer, by role (QuantView::tensors index; checkpoint suffix after '_').
// blocks marks a layer.
enum Role : int { kBlocks = 0, kScales = 1, kRoleCount = 2 };
inline constexpr std::array<std::string_view, kRoleCount> kRoleNames = {"blocks", "scales"};

inline constexpr int64_t kBlockValues = 32;  // inputs per block, one E8M0 scale each
inline constexpr int64_t kBlockBytes = 16;   // two E2M1 values per byte
inline constexpr int kScaleBias = 127;       // E8M0: 2^(s - 127)
inline constexpr uint8_t kScaleNan = 0xFF;   // 2^128 = inf in transformers' arithmetic
static_assert(kBlockValues == 2 * kBlockBytes, "two nibbles per byte");

// E2M1 magnitudes by the low 3 bits of a nibble (bit 3 is the sign): transformers' FP4_VALUES.
inline constexpr std::array<float, 8> kFp4Magnitudes = {0.0f, 0.5f, 1.0f, 1.5f,
                                                        2.0f, 3.0f, 4.0f, 6.0f};
// Twice each magnitude, {0, 1, 2, 3, 4, 6, 8, 12}: integers, 4 bits each, magnitude index m at
// bits [4m, 4m + 4) (a table in one register: no memory access and no branch on any path).
inline constexpr uint32_t kTwiceMagnitudes = 0xC8643210u;
constexpr bool TwiceMagnitudesMatch() {
  for (uint32_t m = 0; m < 8; ++m)
    if (static_cast<float>((kTwiceMagnitudes >> (4 * m)) & 0xFu) != 2 * kFp4Magnitudes[m])
      return false;
  return true;
}
static_assert(TwiceMagnitudesMatch(), "kTwiceMagnitudes holds 2 * kFp4Magnitudes");

// The NaN every path writes for scale 0xFF times +-0 (a positive quiet NaN).
inline constexpr uint32_t kNanBits = 0x7FC00000u;

// Nibble of input k (within its row) in byte `b`: the low nibble for even k, the high for odd.
DEQUANTD_HD uint32_t NibbleOf(uint8_t b, int64_t k) {
  return (k & 1) != 0 ? static_cast<uint32_t>(b >> 4) : static_cast<uint32_t>(b & 0x0Fu);
}
static_assert((0x7Bu & 0x0Fu) == 0xBu && (0x7Bu >> 4) == 0x7u);

// float32(FP4[nibble]) (exact): sign from bit 3, magnitude 0, 0.5, 1, 1.5, 2, 3, 4 or 6, as
// float(twice the magnitude) * 0.5 (an integer below 16 converts exactly; halving is exact).
DEQUANTD_HD float Fp4ToFloat(uint32_t nibble) {
  const uint32_t twice = (kTwiceMagnitudes >> (4 * (nibble & 0x7u))) & 0xFu;
  const float magnitude = SmallUintToFloat(twice) * 0.5f;
  return BitsToFloat(FloatBits(magnitude) | ((nibble & 0x8u) << 28));
}

// float32(2^(s - 127)) (exact): s in [1, 254] is the normal with exponent field s; s = 0 is the
// subnormal 2^-127; s = 0xFF is +inf (2^128 overflows fp32, as torch.pow(2.0, 128) does).
DEQUANTD_HD float ScaleToFloat(uint8_t s) {
  return BitsToFloat(s == 0 ? 0x00400000u : static_cast<uint32_t>(s) << 23);
}

// w before round_out: the fp32 product of the definition; scale 0xFF with a +-0 value is the quiet
// NaN kNanBits (inf * 0; spelled out so every path writes the same NaN bits). Branch-free.
DEQUANTD_HD float Element(uint32_t nibble, uint8_t scale) {
  const float product = Fp4ToFloat(nibble) * ScaleToFloat(scale);
  const bool inf_times_zero = (scale == kScaleNan) & ((nibble & 0x7u) == 0);
  return inf_times_zero ? BitsToFloat(kNanBits) : product;
}

// Typed access to an mxfp4 QuantView's tensors (host or device pointers, as the view's): blocks
// read as (E*N, K/2) bytes, scales as (E*N, K/32).
inline const uint8_t* Blocks(const QuantView& v) {
  return static_cast<const uint8_t*>(v.tensors[kBlocks]);
}
inline const uint8_t* Scales(const QuantView& v) {
  return static_cast<const uint8_t*>(v.tensors[kScales]);
}

// An mxfp4 shape of `experts` stacked (K, N) matrices (group_size 32, E8M0 scales).
inline QuantShape MakeShape(int64_t K, int64_t N, int64_t experts = 1,
                            Orientation orientation = Orientation::kKN) {
  QuantShape s;
  s.format = Format::kMxfp4;
  s.K = K;
  s.N = N;
  s.group_size = kBlockValues;
  s.scale_dtype = DType::kU8;
  s.orientation = orientation;
  s.bits = 4;
  s.experts = experts;
  return s;
}

inline QuantView MakeView(const QuantShape& shape, const void* blocks, const void* scales) {
  QuantView v;
  v.shape = shape;
  v.tensors[kBlocks] = blocks;
  v.tensors[kScales] = scales;
  return v;
}

}  // namespace dequantd::mxfp4
