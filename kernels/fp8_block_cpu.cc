// fp8_block::DequantizeCpu: the reference's result, bit for bit, from a threaded path.
//
// Work split: the output rows [row_begin, row_end) are cut into one contiguous range per thread.
// Each E4M3 byte is widened through a 256-entry float table (Fp8E4m3BitsToFloat of every byte,
// built once), multiplied in fp32 by its block's scale and rounded once to the output dtype, the
// same operations as the reference. (N, K) results: a thread walks its rows n, one 128-column
// block (one scale) at a time, reading and writing contiguously. (K, N) results: a thread walks
// its rows k in tiles of kTile x kTile (k, n), reading each weight row's kTile bytes once per tile
// and writing the transposed tile row by row.
#include <algorithm>
#include <array>
#include <cstdint>
#include <thread>

#include "absl/status/status.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/fp8_block.h"
#include "kernels/fp8_block_format.h"
#include "kernels/run_parts.h"

namespace dequantd::fp8_block {
namespace {

constexpr int64_t kTile = 64;
static_assert(kBlock % kTile == 0, "a (K, N) tile lies inside one scale block");

template <DType kOut>
void Store(void* out, int64_t i, float w) {
  if constexpr (kOut == DType::kF16) {
    static_cast<uint16_t*>(out)[i] = FloatToHalfBitsRne(w);
  } else if constexpr (kOut == DType::kBF16) {
    static_cast<uint16_t*>(out)[i] = FloatToBf16BitsRne(w);
  } else {
    static_cast<float*>(out)[i] = w;
  }
}

float ScaleOf(const QuantView& in, int64_t n, int64_t k) {
  return ScaleToFloat(ScaleInv(in), in.shape.scale_dtype,
                      (n / kBlock) * GridCols(in.shape.K) + k / kBlock);
}

// Rows (= output columns n) [n_begin, n_end) of an (N, K) result; `out` points at row `out_row0`.
template <DType kOut>
void RunNkPart(const QuantView& in, int64_t n_begin, int64_t n_end, int64_t out_row0, void* out) {
  const std::array<float, 256>& table = E4m3Table();
  const int64_t K = in.shape.K;
  for (int64_t n = n_begin; n < n_end; ++n) {
    const uint8_t* row = Weight(in) + n * K;
    const int64_t at = (n - out_row0) * K;
    for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
      const float s = ScaleOf(in, n, k0);
      const int64_t k1 = std::min(K, k0 + kBlock);
      for (int64_t k = k0; k < k1; ++k) Store<kOut>(out, at + k, table[row[k]] * s);
    }
  }
}

// Rows k [k_begin, k_end) of a (K, N) result; `out` points at row `out_row0`.
template <DType kOut>
void RunKnPart(const QuantView& in, int64_t k_begin, int64_t k_end, int64_t out_row0, void* out) {
  const std::array<float, 256>& table = E4m3Table();
  const int64_t K = in.shape.K;
  const int64_t N = in.shape.N;
  // A tile of kTile rows k aligned to kTile (so inside one block column), clipped to the range.
  for (int64_t kt = k_begin - k_begin % kTile; kt < k_end; kt += kTile) {
    const int64_t k0 = std::max(kt, k_begin);
    const int64_t k1 = std::min(kt + kTile, k_end);
    for (int64_t n0 = 0; n0 < N; n0 += kTile) {
      const int64_t n1 = std::min(N, n0 + kTile);
      const float s = ScaleOf(in, n0, k0);  // the tile lies in one block: n0 / 128, k0 / 128
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t at = (k - out_row0) * N;
        for (int64_t n = n0; n < n1; ++n)
          Store<kOut>(out, at + n, table[Weight(in)[n * K + k]] * s);
      }
    }
  }
}

using PartFn = void (*)(const QuantView&, int64_t, int64_t, int64_t, void*);

template <DType kOut>
PartFn Select(Orientation orientation) {
  return orientation == Orientation::kKN ? &RunKnPart<kOut> : &RunNkPart<kOut>;
}

}  // namespace

const std::array<float, 256>& E4m3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b)
      t[static_cast<size_t>(b)] = Fp8E4m3BitsToFloat(static_cast<uint8_t>(b));
    return t;
  }();
  return table;
}

absl::Status DequantizeCpu(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, const cpu::CpuDequantOptions& options) {
  const QuantShape& shape = in.shape;
  PartFn run = out_dtype == DType::kF16    ? Select<DType::kF16>(shape.orientation)
               : out_dtype == DType::kBF16 ? Select<DType::kBF16>(shape.orientation)
                                           : Select<DType::kF32>(shape.orientation);
  const int64_t rows = row_end - row_begin;
  int64_t threads = options.threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(
      threads, std::max<int64_t>(1, rows * shape.result_cols() / options.min_elements_per_thread));
  threads = std::min(threads, rows);
  RunParts(threads, [&](int64_t p) {
    run(in, row_begin + rows * p / threads, row_begin + rows * (p + 1) / threads, row_begin, out);
  });
  return absl::OkStatus();
}

}  // namespace dequantd::fp8_block
