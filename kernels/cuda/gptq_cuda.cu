// GPTQ's CUDA kernels (layer 2), their host launcher (layer 3) and GPTQ's FormatKernels row
// entry (kernels/cuda/format_kernels.h). Three variants, either orientation:
//   v1_per_element: any bits (2, 3, 4, 8): one thread per output element, in output order
//                   (coalesced stores);
//   v2_per_word:    any bits: one thread per run of 32 consecutive rows k of one column n (the 32
//                   codes of b words of qweight column n), its group's zero and scale reloaded
//                   only when the group changes; (K, N): consecutive threads take consecutive n
//                   (coalesced loads and stores); (N, K): consecutive threads take consecutive
//                   runs of one column (each stores 32 consecutive elements of output row n);
//   v4_vec16:       4 bits, whole 16-byte result chunks, groups of whole words without g_idx:
//                   every store a 16-byte chunk, consecutive threads along a result row. (N, K):
//                   a block per 32 columns (GptqNkSliceKernel, shared-memory tiles); (K, N): a
//                   thread per 8 (fp32: 4) consecutive columns of one qweight row, 8 result rows
//                   (GptqKnChunkKernel, packed 16-bit pair decode). Other layers run v1's loop.
// 256-thread blocks and 64-bit indices; the one launch parameter is the (N, K) tile kernel's tiles
// along K per block (kNkTileConfigs, chosen by the autotuner); the others take none.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/cuda/format_kernels.h"
#include "kernels/cuda/gptq_decode.cuh"
#include "kernels/cuda/half2_pairs.cuh"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/cuda/row_chunk_kernel.cuh"
#include "kernels/gptq_format.h"
#include "kernels/nibble_pairs.h"

namespace dequantd::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kRun = 32;  // rows of K per v2 thread

template <DType kScale, DType kOut>
__global__ void GptqPerElementKernel(GptqParams p) {
  const int64_t total = p.K * p.N;
  for (int64_t e = GlobalThreadIndex(); e < total; e += GridThreads()) {
    const int64_t k = p.nk ? e % p.K : e / p.N;
    const int64_t n = p.nk ? e / p.K : e % p.N;
    StoreElement<kOut>(p.out, e, GptqElement<kScale>(p, k, n, GptqGroup(p, k)));
  }
}

template <DType kScale, DType kOut>
__global__ void GptqPerRunKernel(GptqParams p) {
  const int64_t runs = (p.K + kRun - 1) / kRun;
  const int64_t total = runs * p.N;
  for (int64_t u = GlobalThreadIndex(); u < total; u += GridThreads()) {
    const int64_t n = p.nk ? u / runs : u % p.N;
    const int64_t k0 = (p.nk ? u % runs : u / p.N) * kRun;
    const int64_t k1 = k0 + kRun < p.K ? k0 + kRun : p.K;
    int64_t g = -1;
    float z = 0.0f;
    float s = 0.0f;
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t gk = GptqGroup(p, k);
      if (gk != g) {
        g = gk;
        z = static_cast<float>(gptq::ZeroAt(p.qzeros + g * p.zero_words, n, p.bits, p.flags));
        s = LoadScaleAsFloat<kScale>(p.scales, g * p.N + n);
      }
      // float(q) - float(z) is exact (small integers), so this equals float(q - z) * s.
      const float q = static_cast<float>(gptq::StreamField(p.qweight + n, p.N, k, p.bits));
      StoreElement<kOut>(p.out, p.nk ? n * p.K + k : k * p.N + n, (q - z) * s);
    }
  }
}

// ---- v4 (4-bit): 16-byte stores of whole result chunks -----------------------------------------

constexpr int kTileN = 32;  // (N, K) tile: 32 columns n ...
constexpr int kTileWarps = kBlock / 32;
// ... x 32 qweight rows (256 inputs k); 16 for fp32 results (shared memory under 48 KB).
template <DType kOut>
inline constexpr int kNkTileWords = kOut == DType::kF32 ? 16 : 32;

// The zero (a 4-bit field) of column `i` of a zero word.
__device__ __forceinline__ uint32_t ZeroField(uint32_t zero_word, int64_t i) {
  return (zero_word >> (4 * (i % 8))) & 0xFu;
}

// GptqNkSliceKernel's decode: pairs of consecutive inputs (2p, 2p + 1) of one qweight word at a
// time in the nibble-pair forms (kernels/nibble_pairs.h), each code less its own row's zero (the
// two rows may lie in different groups under act-order) in one SubPairs, exact. When the scale
// dtype is the output dtype (kGptqNkNative), one MulPairs by the two rows' scales is the result
// pair, correctly rounded (half2_pairs.cuh); otherwise the difference is widened and multiplied in
// fp32 (exact) and rounded once by PackChunk.
template <DType kScale, DType kOut>
inline constexpr bool kGptqNkNative = kScale == kOut;
// The form of the codes and zeros: kBf16Lo (128 + v) for the bf16 multiply, else kF16Lo (1024 + v).
template <DType kScale, DType kOut>
inline constexpr uint32_t kGptqNkForm =
    kGptqNkNative<kScale, kOut>&& kOut == DType::kBF16 ? nibble_pairs::kBf16Lo
                                                       : nibble_pairs::kF16Lo;

// GptqNkSliceKernel's shared word of one group and column: the scale's 16 bits (fp16 or bf16)
// above the zero (field i of the v1-biased zero word) in the codes' 16-bit form (`form` | z).
__device__ __forceinline__ uint32_t GroupWord(uint16_t scale_bits, uint32_t zero_word, int64_t i,
                                              uint32_t form) {
  return static_cast<uint32_t>(scale_bits) << 16 | form | ZeroField(zero_word, i);
}

// The scale of a GroupWord as a float (exact): bf16 bits are a float's high half; fp16 is the
// high half of a half2 (one conversion instruction).
template <DType kScale>
__device__ __forceinline__ float GroupWordScale(uint32_t word) {
  static_assert(kScale == DType::kF16 || kScale == DType::kBF16);
  if constexpr (kScale == DType::kF16) {
    __half2 pair;
    static_assert(sizeof pair == sizeof word);
    memcpy(&pair, &word, sizeof pair);
    return __high2float(pair);
  } else {
    return __uint_as_float(word & 0xFFFF0000u);
  }
}

// (N, K): qweight word (kw, n) holds 8 consecutive elements of result row n, but consecutive
// words of that row lie N words apart. Block b takes the 32 columns [n0, n0 + 32) of slice b /
// segments, n0 = 32 slice, and `tiles_per_block` consecutive tiles of W qweight rows (8W inputs k)
// of segment b % segments (segments fastest: the blocks resident together cover whole result
// rows; the launch configuration sets tiles_per_block):
//  - once per block, every group's 32 scales (16-byte loads) and zeros (v1 bias added) of these
//    columns go to shared memory as one 32-bit word per group and column, the scale's 16 bits
//    above the zero in the codes' 16-bit form (GroupWord: groups x 128 bytes; with act-order any
//    group can occur), so an element's scale and zero are one conflict-free shared load (32
//    lanes, one wavefront);
//  - per tile, each thread loads its W / 8 words (warp w: rows kw0 + w + 8i, lanes along n:
//    coalesced) and the group of one input k (g_idx, or k / group_size), the next tile's while
//    this one is stored; decodes each word a pair of rows at a time (kGptqNkNative: PRMT of the
//    two rows' group words gives the zero pair and the scale pair, then one SubPairs and one
//    MulPairs; bit for bit GptqElement's round_out(float(q - z) * s)) into 16-byte chunks of its
//    result row n, kept in a shared-memory tile; then warp w stores result
//    rows n0 + w + 8i, lanes along the row (512 contiguous bytes per store instruction).
// Shared memory (dynamic): GptqNkSharedBytes.
template <DType kScale, DType kOut>
__global__ void __launch_bounds__(kBlock)
    GptqNkSliceKernel(GptqParams p, int64_t segments, int64_t tiles_per_block) {
  constexpr int kWords = kNkTileWords<kOut>;
  constexpr int kTileK = kWords * 8;                    // inputs k per tile: 256 or 128
  constexpr int kWordsPerThread = kWords / kTileWarps;  // 4 or 2
  constexpr int kPerWord = 8 / kChunk<kOut>;            // 16-byte chunks per word
  constexpr int kRowChunks = kWords * kPerWord;         // 32
  static_assert(kTileK <= kBlock && kRowChunks == 32);
  extern __shared__ uint4 shared[];
  // One padding chunk per row: the decode's writes (lanes along n) hit distinct banks.
  auto* tile = reinterpret_cast<uint4(*)[kRowChunks + 1]>(shared);
  auto* tile_groups = reinterpret_cast<int32_t*>(shared + kTileN * (kRowChunks + 1));
  // Per group and column: the scale's bits << 16 | the zero (GroupWord).
  auto* group_words = reinterpret_cast<uint32_t(*)[kTileN]>(tile_groups + kTileK);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int64_t segment = static_cast<int64_t>(blockIdx.x) % segments;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) / segments * kTileN;
  const int64_t n = n0 + lane;
  const int64_t words_k = p.K / 8;
  const int64_t tiles_k = (words_k + kWords - 1) / kWords;
  const int64_t t_end = std::min<int64_t>(tiles_k, (segment + 1) * tiles_per_block);
  const auto* qweight = reinterpret_cast<const unsigned*>(p.qweight);
  // This thread's loads for tile t: its words and (tid < kTileK) the group of input k0 + tid.
  const auto load = [&](int64_t t, uint32_t(&q)[kWordsPerThread], int32_t& group) {
    const int64_t kw0 = t * kWords;
#pragma unroll
    for (int i = 0; i < kWordsPerThread; ++i) {
      const int64_t kw = kw0 + warp + kTileWarps * i;
      q[i] = kw < words_k && n < p.N ? __ldg(qweight + kw * p.N + n) : 0u;
    }
    const int64_t k = kw0 * 8 + tid;
    group = tid < kTileK && k < p.K ? static_cast<int32_t>(GptqGroup(p, k)) : 0;
  };
  uint32_t q[kWordsPerThread];
  int32_t group = 0;
  int64_t t = segment * tiles_per_block;
  if (t < t_end) load(t, q, group);
  // The scales and zeros of every group (the first tile's loads are in flight meanwhile).
  for (int64_t i = tid; i < p.groups * (kTileN / 8); i += kBlock) {
    const int64_t g = i / (kTileN / 8);
    const int v = static_cast<int>(i % (kTileN / 8));
    if (n0 + 8 * v < p.N) {  // N % 8 == 0: whole 16-byte scale vectors and zero words
      const uint4 bits = __ldg(
          reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.scales) + g * p.N + n0) +
          v);
      const uint32_t halves[4] = {bits.x, bits.y, bits.z, bits.w};
      const uint32_t zero_word = GptqZeroWord4(p, g, n0 / 8 + v);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        group_words[g][8 * v + c] =
            GroupWord(static_cast<uint16_t>(halves[c / 2] >> (16 * (c % 2))), zero_word, c,
                      kGptqNkForm<kScale, kOut>);
      }
    }
  }
  for (; t < t_end; ++t) {
    if (tid < kTileK) tile_groups[tid] = group;
    __syncthreads();  // groups (and, the first time, scales and zeros) in place
    uint32_t q_next[kWordsPerThread];
    int32_t group_next = 0;
    if (t + 1 < t_end) load(t + 1, q_next, group_next);
    const int64_t kw0 = t * kWords;
#pragma unroll
    for (int i = 0; i < kWordsPerThread; ++i) {
      const int wl = warp + kTileWarps * i;  // the word's row in the tile
      if (kw0 + wl < words_k && n < p.N) {
        const int4 g_lo = reinterpret_cast<const int4*>(tile_groups)[2 * wl];
        const int4 g_hi = reinterpret_cast<const int4*>(tile_groups)[2 * wl + 1];
        const int32_t groups[8] = {g_lo.x, g_lo.y, g_lo.z, g_lo.w, g_hi.x, g_hi.y, g_hi.z, g_hi.w};
        uint32_t words[8];  // the group words of the word's 8 rows, this column
#pragma unroll
        for (int j = 0; j < 8; ++j) words[j] = group_words[groups[j]][lane];
        const uint32_t q_shr4 = q[i] >> 4;
        uint32_t pairs[4];  // the word's 8 results as 4 pairs of kScale (native) or kF16 values
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          constexpr uint32_t kForm = kGptqNkForm<kScale, kOut>;
          const uint32_t codes = kForm == nibble_pairs::kBf16Lo
                                     ? nibble_pairs::SeqPairBf16(q[i], q_shr4, m)
                                     : nibble_pairs::SeqPairF16Lo(q[i], q_shr4, m);
          const uint32_t zeros = nibble_pairs::Prmt(words[2 * m], words[2 * m + 1], 0x5410u);
          if constexpr (kGptqNkNative<kScale, kOut>) {
            const uint32_t scales = nibble_pairs::Prmt(words[2 * m], words[2 * m + 1], 0x7632u);
            pairs[m] = MulPairs<kOut>(SubPairs<kOut>(codes, zeros), scales);
          } else {
            pairs[m] = SubPairs<DType::kF16>(codes, zeros);
          }
        }
#pragma unroll
        for (int c = 0; c < kPerWord; ++c) {
          uint4 chunk;
          if constexpr (kGptqNkNative<kScale, kOut>) {
            chunk = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);  // kPerWord == 1
          } else {
            float part[kChunk<kOut>];
#pragma unroll
            for (int h = 0; h < kChunk<kOut> / 2; ++h) {
              const int m = c * kChunk<kOut> / 2 + h;
              const float2 d = WidenPair<DType::kF16>(pairs[m]);
              part[2 * h] = __fmul_rn(d.x, GroupWordScale<kScale>(words[2 * m]));
              part[2 * h + 1] = __fmul_rn(d.y, GroupWordScale<kScale>(words[2 * m + 1]));
            }
            chunk = PackChunk<kOut>(part);
          }
          tile[lane][wl * kPerWord + c] = chunk;
        }
      }
    }
    __syncthreads();  // the tile decoded; tile_groups free for the next tile
    const int64_t row_chunks = std::min<int64_t>(kWords, words_k - kw0) * kPerWord;
    for (int r = warp; r < kTileN && n0 + r < p.N; r += kTileWarps) {
      uint4* dst = static_cast<uint4*>(p.out) + ((n0 + r) * p.K + kw0 * 8) / kChunk<kOut>;
      if (lane < row_chunks) dst[lane] = tile[r][lane];
    }
    __syncthreads();  // the tile stored: free for the next decode
#pragma unroll
    for (int i = 0; i < kWordsPerThread; ++i) q[i] = q_next[i];
    group = group_next;
  }
}

// Dynamic shared memory of GptqNkSliceKernel<.., kOut> for a layer of `groups` groups.
template <DType kOut>
int64_t GptqNkSharedBytes(int64_t groups) {
  constexpr int kWords = kNkTileWords<kOut>;
  const int64_t tile = int64_t{kTileN} * (kWords * (8 / kChunk<kOut>)+1) * 16;
  return tile + kWords * 8 * 4 + groups * kTileN * 4;
}

// The most dynamic shared memory a GptqNkSliceKernel block asks for (a layer with more groups
// than fit runs v1): within every sm_90 GPU's 227 KB per block.
constexpr int64_t kGptqNkMaxSharedBytes = int64_t{200} << 10;

// (K, N) rows of one qweight row in packed 16-bit arithmetic (kernels/nibble_pairs.h,
// kernels/cuda/half2_pairs.cuh). Result row j of a qweight word row holds field j of the thread's
// kValues words, one per column, so column pair i of row j is (field j of q[2i], field j of
// q[2i + 1]): CrossBytes takes byte j / 2 of both words once for rows 2b and 2b + 1, and one lop3
// places the two fields in kDiff's form for row j. The zero word's fields (2i, 2i + 1) are made in
// the same form (SeqPair*), and one packed subtraction gives q - z exactly. Then:
//   * kScale == kOut: one packed multiply by the scale pair (two consecutive stored scales) is
//     round_out(float(q - z) * float(s)), the definition, since the fp32 product is exact;
//   * otherwise (fp16 -> bf16, bf16 -> fp16, fp32 output): the exact q - z (fp16) and the scales
//     are widened to floats, multiplied in fp32 (exact) and rounded once by PackPair (fp32: stored
//     as they are), as GptqElement does.
template <DType kScale, DType kOut>
struct KnPairDecode {
  static constexpr bool kNative = kScale == kOut;
  static constexpr DType kDiff = kNative ? kScale : DType::kF16;  // dtype of the q - z pairs
  static constexpr int kPairs = kChunk<kOut> / 2;
  using ScaleVec = std::conditional_t<kPairs == 4, uint4, uint2>;  // 2 kPairs 16-bit scales

  // The zero pairs of zero word `zw` (columns in fields [0, 2 kPairs)) in the form of the rows of
  // parity `odd`.
  static __device__ __forceinline__ void ZeroPairs(uint32_t zw, bool odd,
                                                   uint32_t (&zero)[kPairs]) {
    namespace np = nibble_pairs;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      if constexpr (kDiff == DType::kF16) {
        zero[i] = odd ? np::SeqPairF16Hi(zw << 4, zw, i) : np::SeqPairF16Lo(zw, zw >> 4, i);
      } else {
        zero[i] = np::SeqPairBf16(zw, zw >> 4, i);
      }
    }
  }

  // Result row j (parity `odd`) of the thread's columns: `cross` = CrossBytes of the word pairs
  // for byte j / 2, `zero` = ZeroPairs of the row's group for this parity, `scales` its scales.
  static __device__ __forceinline__ uint4 Row(const uint32_t (&cross)[kPairs], bool odd,
                                              const uint32_t (&zero)[kPairs], ScaleVec scales) {
    namespace np = nibble_pairs;
    uint32_t s[kPairs];
    static_assert(sizeof s == sizeof scales);
    memcpy(s, &scales, sizeof s);
    uint32_t d[kPairs];
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      const uint32_t q =
          kDiff == DType::kF16 ? np::CrossPairF16(cross[i], odd) : np::CrossPairBf16(cross[i], odd);
      d[i] = SubPairs<kDiff>(q, zero[i]);
    }
    if constexpr (kNative) {
      return make_uint4(MulPairs<kScale>(d[0], s[0]), MulPairs<kScale>(d[1], s[1]),
                        MulPairs<kScale>(d[2], s[2]), MulPairs<kScale>(d[3], s[3]));
    } else {
      float v[2 * kPairs];
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        const float2 dd = WidenPair<kDiff>(d[i]);
        const float2 ss = WidenPair<kScale>(s[i]);
        v[2 * i] = __fmul_rn(dd.x, ss.x);
        v[2 * i + 1] = __fmul_rn(dd.y, ss.y);
      }
      return PackChunk<kOut>(v);
    }
  }
};

// (K, N): thread (kw, c) takes qweight words (kw, [8c, 8c + 8)) (fp32: [4c, 4c + 4)), one 32-byte
// (16-byte) load, and stores their 8 result rows k = 8 kw + j as one 16-byte chunk each;
// consecutive threads take consecutive c (512 contiguous bytes per store instruction). Without
// g_idx (kGidx false) the word's 8 rows share one group (group_size % 8 == 0, launcher): one zero
// word and scale vector, their zero pairs made once. With g_idx the 8 rows' groups are read first,
// then every zero word and scale vector at once (no load waits on another but for the groups).
// Decode: KnPairDecode. Grid x the chunks of a row, grid y the qweight rows (a grid-stride loop
// past 65535).
template <DType kScale, DType kOut, bool kGidx>
__global__ void __launch_bounds__(kBlock) GptqKnChunkKernel(GptqParams p) {
  using Decode = KnPairDecode<kScale, kOut>;
  constexpr int kValues = kChunk<kOut>;
  constexpr int kPairs = Decode::kPairs;
  using ScaleVec = typename Decode::ScaleVec;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (c * kValues >= p.N) return;
  const int64_t n0 = c * kValues;
  const int zero_shift = 4 * static_cast<int>(n0 % 8);  // fp32: columns n0.. from field 0 or 4
  const int64_t words_k = p.K / 8;
  const int64_t row_chunks = p.N / kValues;
  // A group's row of qzeros / scales starts g * stride bytes after row 0: 32-bit strides
  // (launcher: N < 2^31), so each address is one wide multiply-add of the group.
  const auto zero_stride = static_cast<uint32_t>(p.zero_words * 4);
  const auto scale_stride = static_cast<uint32_t>(p.N * 2);
  const uint32_t v1_bias = (p.flags & gptq::kZerosV1) != 0 ? gptq::V1WordBias(4) : 0u;
  const auto* zero_col = reinterpret_cast<const char*>(p.qzeros + n0 / 8);
  const auto* scale_col =
      reinterpret_cast<const char*>(static_cast<const uint16_t*>(p.scales) + n0);
  // The zero word (v1 bias added, as GptqZeroWord4; columns n0.. from field 0) and the scales of
  // these columns in group g.
  const auto load_group = [&](uint32_t g, uint32_t& zw, ScaleVec& sv) {
    const uint64_t zero_offset = static_cast<uint64_t>(g) * zero_stride;
    const uint64_t scale_offset = static_cast<uint64_t>(g) * scale_stride;
    zw = (__ldg(reinterpret_cast<const unsigned*>(zero_col + zero_offset)) + v1_bias) >> zero_shift;
    sv = __ldg(reinterpret_cast<const ScaleVec*>(scale_col + scale_offset));
  };
  for (int64_t kw = blockIdx.y; kw < words_k; kw += gridDim.y) {
    uint32_t q[kValues];
    const auto* src = reinterpret_cast<const uint4*>(p.qweight + kw * p.N + n0);
#pragma unroll
    for (int h = 0; h < kValues / 4; ++h) {
      const uint4 w = __ldg(src + h);
      q[4 * h] = w.x;
      q[4 * h + 1] = w.y;
      q[4 * h + 2] = w.z;
      q[4 * h + 3] = w.w;
    }
    constexpr int kGroups = kGidx ? 8 : 1;  // zero words and scale vectors per word row
    uint32_t zw[kGroups];
    ScaleVec sv[kGroups];
    if constexpr (kGidx) {
      // The 8 rows' groups (two 16-byte loads when g_idx is 16-byte aligned: rows 8 kw.. start
      // 32 bytes apart), clamped as GptqGroup does.
      int32_t g[8];
      const int32_t* row_groups = p.g_idx + kw * 8;
      if (reinterpret_cast<uintptr_t>(p.g_idx) % 16 == 0) {
        const int4 lo = __ldg(reinterpret_cast<const int4*>(row_groups));
        const int4 hi = __ldg(reinterpret_cast<const int4*>(row_groups) + 1);
        const int32_t loaded[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) g[j] = loaded[j];
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) g[j] = __ldg(row_groups + j);
      }
      const auto last = static_cast<int32_t>(p.groups - 1);
#pragma unroll
      for (int j = 0; j < 8; ++j) load_group(min(max(g[j], 0), last), zw[j], sv[j]);
    } else {
      load_group(
          static_cast<int32_t>(static_cast<uint32_t>(kw * 8) / static_cast<uint32_t>(p.group_size)),
          zw[0], sv[0]);
    }
    uint32_t zero[2][kPairs];  // without g_idx: the group's zero pairs, even and odd rows
    if constexpr (!kGidx) {
      Decode::ZeroPairs(zw[0], false, zero[0]);
      Decode::ZeroPairs(zw[0], true, zero[1]);
    }
    uint4* out = static_cast<uint4*>(p.out) + kw * 8 * row_chunks + c;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      uint32_t cross[kPairs];
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        cross[i] = nibble_pairs::CrossBytes(q[2 * i], q[2 * i + 1], b);
      }
#pragma unroll
      for (int odd = 0; odd < 2; ++odd) {
        const int j = 2 * b + odd;
        uint4 chunk;
        if constexpr (kGidx) {
          uint32_t row_zero[kPairs];
          Decode::ZeroPairs(zw[j], odd != 0, row_zero);
          chunk = Decode::Row(cross, odd != 0, row_zero, sv[j]);
        } else {
          chunk = Decode::Row(cross, odd != 0, zero[odd], sv[0]);
        }
        out[j * row_chunks] = chunk;
      }
    }
  }
}

// Launches GptqKnChunkKernel for the layer's g_idx.
template <DType kScale, DType kOut>
absl::Status LaunchGptqKnChunks(const GptqParams& p, cudaStream_t stream) {
  const int64_t chunks = p.N / kChunk<kOut>;
  const dim3 grid(static_cast<unsigned>((chunks + kBlock - 1) / kBlock),
                  static_cast<unsigned>(std::min<int64_t>(p.K / 8, 65535)));
  if (p.g_idx != nullptr) {
    GptqKnChunkKernel<kScale, kOut, true><<<grid, kBlock, 0, stream>>>(p);
  } else {
    GptqKnChunkKernel<kScale, kOut, false><<<grid, kBlock, 0, stream>>>(p);
  }
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// Launches GptqNkSliceKernel with `tiles_per_block` tiles along K per block.
template <DType kScale, DType kOut>
absl::Status LaunchGptqNkSlices(const GptqParams& p, int64_t tiles_per_block, cudaStream_t stream) {
  const int64_t bytes = GptqNkSharedBytes<kOut>(p.groups);
  if (bytes > (int64_t{48} << 10)) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(GptqNkSliceKernel<kScale, kOut>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(bytes)));
  }
  const int64_t slices = (p.N + kTileN - 1) / kTileN;
  const int64_t tiles_k = (p.K / 8 + kNkTileWords<kOut> - 1) / kNkTileWords<kOut>;
  const int64_t segments = (tiles_k + tiles_per_block - 1) / tiles_per_block;
  if (slices * segments > int64_t{0x7FFFFFFF}) {
    return absl::InvalidArgumentError("too many gptq (N, K) tiles for one launch");
  }
  GptqNkSliceKernel<kScale, kOut>
      <<<static_cast<unsigned>(slices * segments), kBlock, static_cast<size_t>(bytes), stream>>>(
          p, segments, tiles_per_block);
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// The (N, K) tile kernel's launch configurations, which the autotuner sweeps:
// LaunchConfig{block_size = 256, words_per_thread = 1, rows_per_thread = tiles along K per block}.
// The first is the default (untuned layers): the fastest on an H100 for 4096 x 14336, 8192 x
// 28672 and 14336 x 4096 of those measured (2026-12-07, kernels/cuda/NOTES.md; wider tiles along
// K, 1024 and 2048 bytes of each result row, were slower and are not kept).
constexpr LaunchConfig kNkTileConfigs[] = {
    {.block_size = kBlock, .words_per_thread = 1, .rows_per_thread = 4},
    {.block_size = kBlock, .words_per_thread = 1, .rows_per_thread = 2},
    {.block_size = kBlock, .words_per_thread = 1, .rows_per_thread = 1},
    {.block_size = kBlock, .words_per_thread = 1, .rows_per_thread = 8},
    {.block_size = kBlock, .words_per_thread = 1, .rows_per_thread = 16}};

// Whether (v, shape, out) runs the (N, K) tile kernel, whose tiles per block are the launch
// configuration (when the pointers allow 16-byte loads and stores; otherwise v1's loop, which
// takes none): 4 bits, K and N multiples of 8, groups of whole words or g_idx, and the block's
// shared memory within kGptqNkMaxSharedBytes.
bool UsesNkTiles(KernelVariant v, const QuantShape& shape, DType out) {
  const bool has_gidx = (shape.format_flags & gptq::kNoGidx) == 0;
  if (v != KernelVariant::kV4Vec16 || shape.orientation != Orientation::kNK || shape.bits != 4 ||
      shape.K <= 0 || shape.K % 8 != 0 || shape.N <= 0 || shape.N % 8 != 0 ||
      !(has_gidx || shape.group_size % 8 == 0)) {
    return false;
  }
  const int64_t bytes = out == DType::kF32 ? GptqNkSharedBytes<DType::kF32>(shape.groups())
                                           : GptqNkSharedBytes<DType::kBF16>(shape.groups());
  return bytes <= kGptqNkMaxSharedBytes;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

constexpr KernelVariant kGptqVariants[] = {KernelVariant::kV1PerElement, KernelVariant::kV2PerWord,
                                           KernelVariant::kV4Vec16};

LaunchConfig GptqDefaultConfig(KernelVariant v, const QuantShape& shape, DType out) {
  return UsesNkTiles(v, shape, out) ? kNkTileConfigs[0] : LaunchConfig{};
}

std::vector<LaunchConfig> GptqCandidateConfigs(KernelVariant v, const QuantShape& shape,
                                               DType out) {
  if (!UsesNkTiles(v, shape, out)) return {LaunchConfig{}};
  return std::vector<LaunchConfig>(std::begin(kNkTileConfigs), std::end(kNkTileConfigs));
}

bool GptqIsTunable(KernelVariant v, const QuantShape& shape, DType out) {
  return UsesNkTiles(v, shape, out) && shape.K * shape.N >= (int64_t{1} << 22);
}

absl::Status GptqCanImplement(KernelVariant v, const LaunchConfig& config, const QuantShape& shape,
                              DType out) {
  if (UsesNkTiles(v, shape, out)) {
    return ConfigAmong(kNkTileConfigs, config,
                       "v4_vec16 of gptq (N, K) takes the tiles along K per block (block = 256, "
                       "words = 1, rows = tiles)");
  }
  if (!(config == LaunchConfig{})) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(VariantName(v)),
                     " of gptq takes no launch parameters here: config must be the default, got ",
                     config.ToString()));
  }
  return absl::OkStatus();
}

absl::Status GptqLaunch(KernelVariant v, const LaunchConfig& config, const QuantView& in,
                        DType out_dtype, void* out, cudaStream_t stream) {
  const QuantShape& shape = in.shape;
  const bool has_gidx = (shape.format_flags & gptq::kNoGidx) == 0;
  if (gptq::Qweight(in) == nullptr || gptq::Qzeros(in) == nullptr || gptq::Scales(in) == nullptr ||
      (has_gidx && gptq::Gidx(in) == nullptr) || out == nullptr) {
    return absl::InvalidArgumentError(
        "qweight, qzeros, scales, g_idx (when stored) and out must "
        "be non-null");
  }
  GptqParams p;
  p.qweight = gptq::Qweight(in);
  p.qzeros = gptq::Qzeros(in);
  p.scales = gptq::Scales(in);
  p.g_idx = has_gidx ? gptq::Gidx(in) : nullptr;
  p.out = out;
  p.K = shape.K;
  p.N = shape.N;
  p.group_size = shape.group_size;
  p.groups = shape.groups();
  p.zero_words = gptq::StreamWords(shape.N, shape.bits);
  p.bits = shape.bits;
  p.flags = shape.format_flags;
  p.nk = shape.orientation == Orientation::kNK;
  // v4 takes 4-bit layers whose groups (without g_idx) hold whole words, and whole 16-byte
  // result chunks: along K for (N, K), along N for (K, N).
  const bool v4 =
      p.bits == 4 && p.K > 0 && p.K % 8 == 0 && p.N > 0 && (has_gidx || p.group_size % 8 == 0);
  // Both read whole 16-byte vectors of a scale row (N % 8 == 0, 16-byte aligned scales).
  const bool v4_loads = p.N % 8 == 0 && Aligned16(p.scales) && Aligned16(p.qweight);
  // (N, K): the tile kernel's shape checks (UsesNkTiles), then the pointers'.
  const bool nk_tiles =
      UsesNkTiles(v, shape, out_dtype) && v4_loads && ChunkAligned(out, p.K, out_dtype);
  // (GptqKnChunkKernel's column arithmetic is 32-bit: N < 2^31.)
  const bool kn_chunks =
      v4 && v4_loads && !p.nk && ChunkAligned(out, p.N, out_dtype) && p.N < (int64_t{1} << 31);
  return DispatchDTypes<DType::kF16, DType::kBF16>(
      shape.scale_dtype, out_dtype, [&](auto scale_c, auto out_c) {
        constexpr DType kScale = decltype(scale_c)::value;
        constexpr DType kOut = decltype(out_c)::value;
        switch (v) {
          case KernelVariant::kV4Vec16:
            if (nk_tiles) {
              return LaunchGptqNkSlices<kScale, kOut>(p, config.rows_per_thread, stream);
            }
            if (kn_chunks) return LaunchGptqKnChunks<kScale, kOut>(p, stream);
            [[fallthrough]];
          case KernelVariant::kV1PerElement:
            return LaunchGridStride(GptqPerElementKernel<kScale, kOut>, p.K * p.N, kBlock, p,
                                    stream);
          case KernelVariant::kV2PerWord:
            return LaunchGridStride(GptqPerRunKernel<kScale, kOut>, (p.K + kRun - 1) / kRun * p.N,
                                    kBlock, p, stream);
          default:
            return absl::InvalidArgumentError("kernel variant not implemented for gptq");
        }
      });
}

}  // namespace

const FormatKernels kGptqKernels = {.variants = kGptqVariants,
                                    .default_config = &GptqDefaultConfig,
                                    .candidate_configs = &GptqCandidateConfigs,
                                    .is_tunable = &GptqIsTunable,
                                    .can_implement = &GptqCanImplement,
                                    .launch = &GptqLaunch};

}  // namespace dequantd::cuda
