// compressed_tensors_fp8::DequantizeCpu: the reference's result, bit for bit, from a threaded
// path.
//
// Work split: the output rows [row_begin, row_end) are cut into one contiguous range per thread
// (at least options.min_elements_per_thread elements each). Each E4M3 byte is widened through
// fp8_block's 256-entry table (exact), multiplied in fp32 by its scale, rounded to the scale dtype
// (round_sdt) and then once to the output dtype, the reference's operations. (N, K) results: a
// thread walks its rows n, one scale column (C weights, one scale) at a time, reading and writing
// contiguously. (K, N) results: a thread walks its rows k in tiles of kTile x kTile (k, n),
// reading kTile bytes of each weight row per tile and writing the transposed tile row by row; the
// scale is looked up per element (a tile may cross scale blocks: channel grids have R = 1).
#include <algorithm>
#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/compressed_tensors_fp8.h"
#include "kernels/compressed_tensors_fp8_format.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/fp8_block.h"
#include "kernels/reference_rows.h"
#include "kernels/run_parts.h"

namespace dequantd::compressed_tensors_fp8 {
namespace {

constexpr int64_t kTile = 64;

struct Grid {
  int64_t rows_per_scale;
  int64_t cols_per_scale;
  int64_t grid_cols;
};

Grid GridOf(const QuantShape& shape) {
  return {RowsPerScale(shape), shape.group_size, GridDim(shape.K, shape.group_size)};
}

// Rows n [n_begin, n_end) of an (N, K) result; `out` points at row `out_row0`.
template <DType kScale, DType kOut>
void RunNkPart(const QuantView& in, int64_t n_begin, int64_t n_end, int64_t out_row0, void* out) {
  const std::array<float, 256>& table = fp8_block::E4m3Table();
  const int64_t K = in.shape.K;
  const Grid g = GridOf(in.shape);
  for (int64_t n = n_begin; n < n_end; ++n) {
    const uint8_t* row = Weight(in) + n * K;
    const int64_t at = (n - out_row0) * K;
    const int64_t scale_row = (n / g.rows_per_scale) * g.grid_cols;
    for (int64_t c = 0; c < g.grid_cols; ++c) {
      const float s = fp8_block::ScaleToFloat(WeightScale(in), kScale, scale_row + c);
      const int64_t k0 = c * g.cols_per_scale;
      const int64_t k1 = std::min(K, k0 + g.cols_per_scale);
      for (int64_t k = k0; k < k1; ++k) {
        StoreRounded<kOut>(out, at + k,
                           compressed_tensors::RoundToScaleDType(table[row[k]] * s, kScale));
      }
    }
  }
}

// Rows k [k_begin, k_end) of a (K, N) result; `out` points at row `out_row0`.
template <DType kScale, DType kOut>
void RunKnPart(const QuantView& in, int64_t k_begin, int64_t k_end, int64_t out_row0, void* out) {
  const std::array<float, 256>& table = fp8_block::E4m3Table();
  const int64_t K = in.shape.K;
  const int64_t N = in.shape.N;
  const Grid g = GridOf(in.shape);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kTile) {
    const int64_t k1 = std::min(k0 + kTile, k_end);
    for (int64_t n0 = 0; n0 < N; n0 += kTile) {
      const int64_t n1 = std::min(N, n0 + kTile);
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t at = (k - out_row0) * N;
        const int64_t scale_col = k / g.cols_per_scale;
        for (int64_t n = n0; n < n1; ++n) {
          const float s = fp8_block::ScaleToFloat(WeightScale(in), kScale,
                                                  (n / g.rows_per_scale) * g.grid_cols + scale_col);
          StoreRounded<kOut>(
              out, at + n,
              compressed_tensors::RoundToScaleDType(table[Weight(in)[n * K + k]] * s, kScale));
        }
      }
    }
  }
}

using PartFn = void (*)(const QuantView&, int64_t, int64_t, int64_t, void*);

template <DType kScale, DType kOut>
PartFn Select(Orientation orientation) {
  return orientation == Orientation::kKN ? &RunKnPart<kScale, kOut> : &RunNkPart<kScale, kOut>;
}

template <DType kScale>
PartFn SelectOut(DType out_dtype, Orientation orientation) {
  return out_dtype == DType::kF16    ? Select<kScale, DType::kF16>(orientation)
         : out_dtype == DType::kBF16 ? Select<kScale, DType::kBF16>(orientation)
                                     : Select<kScale, DType::kF32>(orientation);
}

}  // namespace

absl::Status DequantizeCpu(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, const cpu::CpuDequantOptions& options) {
  const QuantShape& shape = in.shape;
  // ValidateShape admitted fp32, bf16 and fp16 scales only.
  PartFn run =
      shape.scale_dtype == DType::kF32    ? SelectOut<DType::kF32>(out_dtype, shape.orientation)
      : shape.scale_dtype == DType::kBF16 ? SelectOut<DType::kBF16>(out_dtype, shape.orientation)
                                          : SelectOut<DType::kF16>(out_dtype, shape.orientation);
  const int64_t rows = row_end - row_begin;
  const int64_t threads = cpu::PartsForRows(options, rows, shape.result_cols());
  RunParts(threads, [&](int64_t p) {
    run(in, row_begin + rows * p / threads, row_begin + rows * (p + 1) / threads, row_begin, out);
  });
  return absl::OkStatus();
}

}  // namespace dequantd::compressed_tensors_fp8
