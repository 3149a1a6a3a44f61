// awq::DequantizeCpu: the reference's result, bit for bit, from a threaded word-at-a-time path.
//
// Work split: the rows [row_begin, row_end) are cut into one contiguous range per thread (or,
// when there are fewer rows than threads, the packed words of each row are). Each thread walks
// its rows group by group and its columns in tiles of kTileColumns; per (group, tile) it widens
// the group's zero points and scales to float once (noting whether all scales are finite, which
// rules out NaN products), then runs a row kernel (awq_cpu_rows.h) over the group's rows. All
// indices are int64_t.
//
// (N, K) results (Orientation::kNK) are written by RunNkPart: the output rows [row_begin, row_end)
// are output columns n, split into one contiguous range per thread; each walks K in tiles of
// kNkTileRows rows and, per tile, the packed words covering its n range, so a word's eight values
// land in eight output rows at consecutive k (every store stream advances by one element per
// word; the tile's qweight lines stay in L1 across the words). Same rounding functions as the
// row kernels: the bits of DequantizeReference.
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "kernels/awq.h"
#include "kernels/awq_cpu_rows.h"
#include "kernels/awq_format.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/run_parts.h"

namespace dequantd {
namespace cpu {
namespace {

// Columns per tile: the tile's float zero points and scales (16 KiB) stay in L1.
constexpr int64_t kTileColumns = 2048;
constexpr int64_t kTileWords = kTileColumns / awq::kPackFactor;

// One thread's share: rows [row_begin, row_end) and packed words [word_begin, word_end).
struct Part {
  int64_t row_begin, row_end;
  int64_t word_begin, word_end;
};

template <DType kScale>
float ScaleToFloat(uint16_t bits) {
  return kScale == DType::kF16 ? HalfBitsToFloat(bits) : Bf16BitsToFloat(bits);
}

// Runs one part. `out` points at output row `out_row0` (the call's row_begin).
template <DType kScale, DType kOut, class Rows>
void RunPart(const QuantView& in, const Part& part, int64_t out_row0, void* out) {
  using OutT = typename OutTraits<kOut>::T;
  const int64_t N = in.shape.N;
  const int64_t G = in.shape.group_size;
  const int64_t words_per_row = N / awq::kPackFactor;
  const auto* scales = static_cast<const uint16_t*>(awq::Scales(in));
  alignas(64) float zero[kTileColumns];
  alignas(64) float scale[kTileColumns];

  for (int64_t k0 = part.row_begin; k0 < part.row_end;) {
    const int64_t g = k0 / G;
    const int64_t k1 = std::min(part.row_end, (g + 1) * G);
    for (int64_t t0 = part.word_begin; t0 < part.word_end; t0 += kTileWords) {
      const int64_t words = std::min(kTileWords, part.word_end - t0);
      // Hoist the group's zero points and scales for this tile's columns.
      const int32_t* zrow = awq::Qzeros(in) + g * words_per_row + t0;
      const uint16_t* srow = scales + g * N + t0 * awq::kPackFactor;
      bool finite_scales = true;
      for (int64_t c = 0; c < words; ++c) {
        const auto z = static_cast<uint32_t>(zrow[c]);
        for (int i = 0; i < awq::kPackFactor; ++i) {
          const int64_t j = c * awq::kPackFactor + i;
          zero[j] = static_cast<float>(awq::NibbleForColumn(z, i));
          scale[j] = ScaleToFloat<kScale>(srow[j]);
          finite_scales &= (FloatBits(scale[j]) & 0x7F800000u) != 0x7F800000u;
        }
      }
      for (int64_t k = k0; k < k1; ++k) {
        OutT* orow = static_cast<OutT*>(out) + (k - out_row0) * N + t0 * awq::kPackFactor;
        const int32_t* qrow = awq::Qweight(in) + k * words_per_row + t0;
        if (finite_scales) {
          Rows::template Row<kOut, true>(qrow, words, zero, scale, orow);
        } else {
          Rows::template Row<kOut, false>(qrow, words, zero, scale, orow);
        }
      }
    }
    k0 = k1;
  }
  Rows::Finish();
}

using PartFn = void (*)(const QuantView&, const Part&, int64_t, void*);

// Rows of K per tile of an (N, K) result.
constexpr int64_t kNkTileRows = 64;

// An (N, K) part: output rows (= columns n) [part.row_begin, part.row_end); `out` points at output
// row `out_row0`.
template <DType kScale, DType kOut>
void RunNkPart(const QuantView& in, const Part& part, int64_t out_row0, void* out) {
  using OutT = typename OutTraits<kOut>::T;
  const int64_t K = in.shape.K;
  const int64_t N = in.shape.N;
  const int64_t G = in.shape.group_size;
  const int64_t words_per_row = N / awq::kPackFactor;
  const auto* scales = static_cast<const uint16_t*>(awq::Scales(in));
  const int32_t* qweight = awq::Qweight(in);
  const int32_t* qzeros = awq::Qzeros(in);
  OutT* o = static_cast<OutT*>(out);
  const int64_t n_begin = part.row_begin;
  const int64_t n_end = part.row_end;
  const int64_t c_begin = n_begin / awq::kPackFactor;
  const int64_t c_end = (n_end + awq::kPackFactor - 1) / awq::kPackFactor;
  for (int64_t k0 = 0; k0 < K; k0 += kNkTileRows) {
    const int64_t k1 = std::min(K, k0 + kNkTileRows);
    for (int64_t c = c_begin; c < c_end; ++c) {
      const int i_begin = static_cast<int>(std::max<int64_t>(0, n_begin - c * awq::kPackFactor));
      const int i_end =
          static_cast<int>(std::min<int64_t>(awq::kPackFactor, n_end - c * awq::kPackFactor));
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t g = k / G;
        const auto q = static_cast<uint32_t>(qweight[k * words_per_row + c]);
        const auto z = static_cast<uint32_t>(qzeros[g * words_per_row + c]);
        for (int i = i_begin; i < i_end; ++i) {
          const int64_t n = c * awq::kPackFactor + i;
          const float w = (static_cast<float>(awq::NibbleForColumn(q, i)) -
                           static_cast<float>(awq::NibbleForColumn(z, i))) *
                          ScaleToFloat<kScale>(scales[g * N + n]);
          o[(n - out_row0) * K + k] = OutTraits<kOut>::FromFloat(w);
        }
      }
    }
  }
}

PartFn SelectNk(DType scale_dtype, DType out_dtype) {
  const bool f16 = scale_dtype == DType::kF16;
  switch (out_dtype) {
    case DType::kF16:
      return f16 ? &RunNkPart<DType::kF16, DType::kF16> : &RunNkPart<DType::kBF16, DType::kF16>;
    case DType::kBF16:
      return f16 ? &RunNkPart<DType::kF16, DType::kBF16> : &RunNkPart<DType::kBF16, DType::kBF16>;
    default:  // kF32; ValidateShape refused every other dtype.
      return f16 ? &RunNkPart<DType::kF16, DType::kF32> : &RunNkPart<DType::kBF16, DType::kF32>;
  }
}

enum class RowKernel { kPortable, kAvx2, kAvx2Stream };

template <DType kScale, DType kOut>
PartFn SelectKernel(RowKernel kernel) {
#if defined(DEQUANTD_CPU_X86)
  if (kernel == RowKernel::kAvx2) return &RunPart<kScale, kOut, Avx2Rows<false>>;
  if (kernel == RowKernel::kAvx2Stream) return &RunPart<kScale, kOut, Avx2Rows<true>>;
#endif
  (void)kernel;
  return &RunPart<kScale, kOut, PortableRows>;
}

template <DType kScale>
PartFn SelectOut(DType out_dtype, RowKernel kernel) {
  switch (out_dtype) {
    case DType::kF16:
      return SelectKernel<kScale, DType::kF16>(kernel);
    case DType::kBF16:
      return SelectKernel<kScale, DType::kBF16>(kernel);
    default:  // kF32; ValidateShape refused every other dtype.
      return SelectKernel<kScale, DType::kF32>(kernel);
  }
}

PartFn Select(DType scale_dtype, DType out_dtype, RowKernel kernel) {
  return scale_dtype == DType::kF16 ? SelectOut<DType::kF16>(out_dtype, kernel)
                                    : SelectOut<DType::kBF16>(out_dtype, kernel);
}

// Splits rows (or, with fewer rows than parts, each row's words) into `parts` near-equal parts.
std::vector<Part> Split(int64_t row_begin, int64_t row_end, int64_t words, int64_t parts) {
  std::vector<Part> out;
  const int64_t rows = row_end - row_begin;
  if (rows >= parts) {
    for (int64_t p = 0; p < parts; ++p) {
      out.push_back({row_begin + rows * p / parts, row_begin + rows * (p + 1) / parts, 0, words});
    }
  } else {
    parts = std::min(parts, words);
    for (int64_t p = 0; p < parts; ++p) {
      out.push_back({row_begin, row_end, words * p / parts, words * (p + 1) / parts});
    }
  }
  return out;
}

}  // namespace

bool CpuHasAvx2() {
#if defined(DEQUANTD_CPU_X86)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

absl::Status DequantizeAwq(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, const CpuDequantOptions& options) {
  const int64_t rows = row_end - row_begin;
  if (in.shape.orientation == Orientation::kNK) {
    const PartFn run = SelectNk(in.shape.scale_dtype, out_dtype);
    const int64_t threads = PartsForRows(options, rows, in.shape.K);
    RunParts(threads, [&](int64_t p) {
      const Part part{row_begin + rows * p / threads, row_begin + rows * (p + 1) / threads, 0, 0};
      run(in, part, row_begin, out);
    });
    return absl::OkStatus();
  }
  const bool avx2 = options.isa == CpuIsa::kAvx2 || (options.isa == CpuIsa::kBest && CpuHasAvx2());
  // Non-temporal stores for outputs too large to stay in cache, when `out` is 16-byte aligned
  // (malloc's alignment; then every word's 16 or 32 output bytes are too: N % 8 == 0).
  const bool stream = avx2 &&
                      rows * in.shape.N * DTypeSize(out_dtype) >= options.stream_min_bytes &&
                      reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const PartFn run =
      Select(in.shape.scale_dtype, out_dtype,
             stream ? RowKernel::kAvx2Stream : (avx2 ? RowKernel::kAvx2 : RowKernel::kPortable));

  const int64_t words = in.shape.N / awq::kPackFactor;
  int64_t threads = options.threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads =
      std::min(threads, std::max<int64_t>(1, rows * in.shape.N / options.min_elements_per_thread));
  const std::vector<Part> parts = Split(row_begin, row_end, words, threads);

  RunParts(static_cast<int64_t>(parts.size()),
           [&](int64_t p) { run(in, parts[static_cast<size_t>(p)], row_begin, out); });
  return absl::OkStatus();
}

}  // namespace cpu

namespace awq {

absl::Status DequantizeCpu(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, const cpu::CpuDequantOptions& options) {
  return cpu::DequantizeAwq(in, out_dtype, row_begin, row_end, out, options);
}

}  // namespace awq
}  // namespace dequantd
