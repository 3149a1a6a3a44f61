// compressed-tensors' CUDA kernels (layer 2), their host launcher (layer 3) and its FormatKernels
// row entry (kernels/cuda/format_kernels.h). Three variants, bits 4 and 8, either orientation:
//   v1_per_element: one thread per output element, in output order (coalesced stores);
//   v2_per_word:    one thread per weight_packed word (32/b consecutive codes k of one row n), its
//                   group's zero and scale reloaded only when the group changes; (N, K):
//                   consecutive threads take consecutive words of one row (coalesced loads, each
//                   thread stores 32/b consecutive elements); (K, N): consecutive threads take
//                   consecutive rows n of one word column (coalesced stores);
//   v4_vec16:       (N, K) with a 16-byte aligned out, K a multiple of the chunk and (without
//                   g_idx) group_size too: RowChunkKernel (row_chunk_kernel.cuh), one thread per
//                   16-byte chunk of a result row (int4: one word, one zero and scale; without
//                   g_idx and with fp16/bf16 scales decoded in packed 16-bit pairs,
//                   CtNkInt4PairChunks); other shapes and (K, N) run v2's loop.
// None takes launch parameters (v1/v2: 256-thread blocks, grid-stride loops, 64-bit indices).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/compressed_tensors_format.h"
#include "kernels/cuda/compressed_tensors_decode.cuh"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/cuda/format_kernels.h"
#include "kernels/cuda/half2_pairs.cuh"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/cuda/row_chunk_kernel.cuh"
#include "kernels/nibble_pairs.h"

namespace dequantd::cuda {
namespace {

namespace ct = compressed_tensors;

constexpr int kBlock = 256;

template <DType kScale, DType kOut>
__global__ void CtPerElementKernel(CompressedTensorsParams p) {
  const int64_t total = p.K * p.N;
  for (int64_t e = GlobalThreadIndex(); e < total; e += GridThreads()) {
    const int64_t k = p.nk ? e % p.K : e / p.N;
    const int64_t n = p.nk ? e / p.K : e % p.N;
    float z;
    float s;
    CtZeroScale<kScale>(p, n, CtGroup(p, k), &z, &s);
    StoreElement<kOut>(p.out, e, RoundToScale<kScale>((CtCode(p, n, k) - z) * s));
  }
}

template <DType kScale, DType kOut>
__global__ void CtPerWordKernel(CompressedTensorsParams p) {
  const int per_word = 32 / p.bits;
  const int64_t total = p.N * p.row_words;
  for (int64_t u = GlobalThreadIndex(); u < total; u += GridThreads()) {
    const int64_t n = p.nk ? u / p.row_words : u % p.N;
    const int64_t w = p.nk ? u % p.row_words : u / p.N;
    const uint32_t word = static_cast<uint32_t>(__ldg(p.weight_packed + n * p.row_words + w));
    const uint32_t mask = (1u << p.bits) - 1u;
    int64_t g = -1;
    float z = 0.0f;
    float s = 0.0f;
    for (int j = 0; j < per_word; ++j) {
      const int64_t k = w * per_word + j;
      const int64_t gk = CtGroup(p, k);
      if (gk != g) {
        g = gk;
        CtZeroScale<kScale>(p, n, g, &z, &s);
      }
      const float f = static_cast<float>((word >> (j * p.bits)) & mask);
      StoreElement<kOut>(p.out, p.nk ? n * p.K + k : k * p.N + n,
                         RoundToScale<kScale>((f - z) * s));
    }
  }
}

// (N, K) chunks for RowChunkKernel: result row n, columns [k0, k0 + kChunk) from weight_packed
// row n (int4: one word holds 8 codes; int8: one or two words). Without g_idx a chunk lies in one
// group (the launcher checks group_size % kChunk == 0): one zero and one scale, the group found
// with one 32-bit division; with g_idx each column's group is read (coalesced along the row), its
// zero and scale reloaded when it changes. Same results as v1: round_out(round_sdt((f - z) * s)),
// f converted exactly without I2F (SmallUintToFloat).
template <DType kScale, int kBits, bool kGidx>
struct CtNkChunks {
  static_assert(kBits == 4 || kBits == 8);
  using Params = CompressedTensorsParams;
  // round_sdt(v), or v itself where PackChunk's round_out is the same rounding (kOut == kScale:
  // rounding twice to one dtype is rounding once).
  template <DType kOut>
  static __device__ __forceinline__ float Rounded(float v) {
    if constexpr (kOut == kScale) {
      return v;
    } else {
      return RoundToScale<kScale>(v);
    }
  }
  template <DType kOut>
  static __device__ __forceinline__ uint4 Chunk(const Params& p, int64_t n, int64_t k0) {
    constexpr int kValues = kChunk<kOut>;
    const auto* row = reinterpret_cast<const unsigned*>(p.weight_packed + n * p.row_words);
    uint32_t codes[kValues];
    if constexpr (kBits == 4) {
      const uint32_t word = __ldg(row + k0 / 8) >> (4 * (k0 % 8));
#pragma unroll
      for (int j = 0; j < kValues; ++j) codes[j] = (word >> (4 * j)) & 0xFu;
    } else {
#pragma unroll
      for (int w = 0; w < kValues / 4; ++w) {
        const uint32_t word = __ldg(row + k0 / 4 + w);
#pragma unroll
        for (int b = 0; b < 4; ++b) codes[4 * w + b] = (word >> (8 * b)) & 0xFFu;
      }
    }
    float v[kValues];
    float z;
    float s;
    if constexpr (!kGidx) {
      const int64_t g = static_cast<uint32_t>(k0) / static_cast<uint32_t>(p.group_size);
      CtZeroScale<kScale>(p, n, g, &z, &s);
      // f - z as (2^23 + f) - (2^23 + z): both exact, so the difference is f - z exactly.
      const float z_biased = 8388608.0f + z;
#pragma unroll
      for (int j = 0; j < kValues; ++j) {
        v[j] = Rounded<kOut>((__uint_as_float(0x4B000000u | codes[j]) - z_biased) * s);
      }
    } else {
      int64_t g = -1;
#pragma unroll
      for (int j = 0; j < kValues; ++j) {
        const int64_t gk = CtGroup(p, k0 + j);
        if (gk != g) {
          g = gk;
          CtZeroScale<kScale>(p, n, g, &z, &s);
        }
        v[j] = Rounded<kOut>((SmallUintToFloat(codes[j]) - z) * s);
      }
    }
    return PackChunk<kOut>(v);
  }
};

// (N, K) int4 chunks without g_idx for fp16 / bf16 scales, in packed 16-bit arithmetic (AWQ's
// v4 technique): the codes of the chunk's word placed two at a time in 16-bit floats
// (kernels/nibble_pairs.h: fp16 one prmt + one lop3 per pair, the second code of the pair in the
// kF16Hi form; bf16 one more shift per word), f - z by one exact packed subtraction of the zero
// pair, round_sdt((f - z) * s) by one packed multiply by the scale pair (the exact fp32 product
// correctly rounded, kernels/cuda/half2_pairs.cuh), then round_out by PairsToChunk (nothing when
// the output dtype is the scale dtype). Same results as CtNkChunks, bit for bit.
template <DType kScale>
struct CtNkInt4PairChunks {
  static_assert(kScale == DType::kF16 || kScale == DType::kBF16);
  using Params = CompressedTensorsParams;
  template <DType kOut>
  static __device__ __forceinline__ uint4 Chunk(const Params& p, int64_t n, int64_t k0) {
    namespace np = nibble_pairs;
    constexpr int kPairs = kChunk<kOut> / 2;
    const auto* row = reinterpret_cast<const unsigned*>(p.weight_packed + n * p.row_words);
    // One word per chunk (fp32: half a word, k0 % 8 in {0, 4}), its codes in order from bit 0.
    const uint32_t word = __ldg(row + k0 / 8) >> (4 * (k0 % 8));
    const uint32_t g = p.group_div.Div(static_cast<uint32_t>(k0));
    const uint32_t z = ct::ZeroAt(p.weight_zero_point, n, g, p.groups, 4);
    const uint32_t s = __ldg(static_cast<const unsigned short*>(p.weight_scale) +
                             ct::ScaleIndex(n, g, p.groups, p.flags));
    const uint32_t scale_pair = s | s << 16;
    uint32_t product[kPairs];
    if constexpr (kScale == DType::kF16) {
      const uint32_t zero_pair = np::ZeroPair(z, z, np::kF16Lo, np::kF16Hi);
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        const uint32_t d = SubPairs<kScale>(np::SeqPairF16LoHi(word, i), zero_pair);
        product[i] = MulPairs<kScale>(d, scale_pair);
      }
    } else {
      const uint32_t zero_pair = np::ZeroPair(z, z, np::kBf16Lo, np::kBf16Lo);
      const uint32_t word_shr4 = word >> 4;
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        const uint32_t d = SubPairs<kScale>(np::SeqPairBf16(word, word_shr4, i), zero_pair);
        product[i] = MulPairs<kScale>(d, scale_pair);
      }
    }
    return PairsToChunk<kScale, kOut>(product);
  }
};

// Launches the CtNkChunks instance of the layer's bits and g_idx (int4 without g_idx and with
// 16-bit scales: CtNkInt4PairChunks).
template <DType kScale, DType kOut>
absl::Status LaunchCtNkChunks(const CompressedTensorsParams& p, cudaStream_t stream) {
  const bool gidx = p.weight_g_idx != nullptr;
  if constexpr (kScale != DType::kF32) {
    if (p.bits == 4 && !gidx && p.K < (int64_t{1} << 31) && p.group_size < (int64_t{1} << 31)) {
      return LaunchRowChunks<CtNkInt4PairChunks<kScale>, kOut>(p, p.N, p.K, stream);
    }
  }
  if (p.bits == 4) {
    return gidx ? LaunchRowChunks<CtNkChunks<kScale, 4, true>, kOut>(p, p.N, p.K, stream)
                : LaunchRowChunks<CtNkChunks<kScale, 4, false>, kOut>(p, p.N, p.K, stream);
  }
  return gidx ? LaunchRowChunks<CtNkChunks<kScale, 8, true>, kOut>(p, p.N, p.K, stream)
              : LaunchRowChunks<CtNkChunks<kScale, 8, false>, kOut>(p, p.N, p.K, stream);
}

constexpr KernelVariant kCtVariants[] = {KernelVariant::kV1PerElement, KernelVariant::kV2PerWord,
                                         KernelVariant::kV4Vec16};

LaunchConfig CtDefaultConfig(KernelVariant, const QuantShape&, DType) { return LaunchConfig{}; }

std::vector<LaunchConfig> CtCandidateConfigs(KernelVariant, const QuantShape&, DType) {
  return {LaunchConfig{}};
}

bool CtIsTunable(KernelVariant, const QuantShape&, DType) { return false; }

absl::Status CtCanImplement(KernelVariant v, const LaunchConfig& config, const QuantShape&, DType) {
  if (!(config == LaunchConfig{})) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(VariantName(v)),
        " of compressed_tensors takes no launch parameters: config must be the default, got ",
        config.ToString()));
  }
  return absl::OkStatus();
}

absl::Status CtLaunch(KernelVariant v, const LaunchConfig&, const QuantView& in, DType out_dtype,
                      void* out, cudaStream_t stream) {
  const QuantShape& shape = in.shape;
  const bool has_zero_point = (shape.format_flags & ct::kSym) == 0;
  const bool has_gidx = (shape.format_flags & ct::kNoGidx) == 0;
  if (ct::WeightPacked(in) == nullptr || ct::WeightScale(in) == nullptr ||
      (has_zero_point && ct::WeightZeroPoint(in) == nullptr) ||
      (has_gidx && ct::WeightGidx(in) == nullptr) || out == nullptr) {
    return absl::InvalidArgumentError(
        "weight_packed, weight_scale, weight_zero_point and weight_g_idx (when stored) and out "
        "must be non-null");
  }
  CompressedTensorsParams p;
  p.weight_packed = ct::WeightPacked(in);
  p.weight_scale = ct::WeightScale(in);
  p.weight_zero_point = ct::WeightZeroPoint(in);
  p.weight_g_idx = ct::WeightGidx(in);
  p.out = out;
  p.K = shape.K;
  p.N = shape.N;
  p.group_size = shape.group_size;
  p.groups = shape.groups();
  p.row_words = ct::PackedRowWords(shape.K, shape.bits);
  if (shape.group_size > 0 && shape.group_size < (int64_t{1} << 31)) {
    p.group_div = FastDivmod::Make(static_cast<uint32_t>(shape.group_size));
  }
  p.bits = shape.bits;
  p.flags = shape.format_flags;
  p.nk = shape.orientation == Orientation::kNK;
  const int64_t chunk = out_dtype == DType::kF32 ? 4 : 8;
  const bool chunks = p.nk && (p.bits == 4 || p.bits == 8) && ChunkAligned(out, p.K, out_dtype) &&
                      (p.weight_g_idx != nullptr || p.group_size % chunk == 0);
  return DispatchDTypes<DType::kF16, DType::kBF16, DType::kF32>(
      shape.scale_dtype, out_dtype, [&](auto scale_c, auto out_c) {
        constexpr DType kScale = decltype(scale_c)::value;
        constexpr DType kOut = decltype(out_c)::value;
        switch (v) {
          case KernelVariant::kV1PerElement:
            return LaunchGridStride(CtPerElementKernel<kScale, kOut>, p.K * p.N, kBlock, p, stream);
          case KernelVariant::kV4Vec16:
            if (chunks) return LaunchCtNkChunks<kScale, kOut>(p, stream);
            [[fallthrough]];
          case KernelVariant::kV2PerWord:
            return LaunchGridStride(CtPerWordKernel<kScale, kOut>, p.N * p.row_words, kBlock, p,
                                    stream);
          default:
            return absl::InvalidArgumentError(
                "kernel variant not implemented for compressed_tensors");
        }
      });
}

}  // namespace

const FormatKernels kCompressedTensorsKernels = {.variants = kCtVariants,
                                                 .default_config = &CtDefaultConfig,
                                                 .candidate_configs = &CtCandidateConfigs,
                                                 .is_tunable = &CtIsTunable,
                                                 .can_implement = &CtCanImplement,
                                                 .launch = &CtLaunch};

}  // namespace dequantd::cuda
