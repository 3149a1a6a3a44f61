// gptq::DequantizeCpu: the reference's result, bit for bit, from a threaded path.
//
// Work split: the output rows [row_begin, row_end) are cut into one contiguous range per thread.
// (K, N) results: a thread walks its rows k; when a row's group (g_idx[k], or k / G) differs from
// the previous row's, it widens that group's zero points and scales to float once per column,
// then each column is one field extract, one subtract, one multiply and one rounding (qweight row
// k * bits / 32 is read contiguously). (N, K) results: a thread walks its columns n in tiles of
// kNkTileColumns; per tile it widens every group's zero points and scales for those columns once,
// then for each k reads the tile's codes from one qweight row (contiguous in n) and stores them at
// column k of the tile's output rows. Same scalar conversions as the reference (kernels/dtype.h).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/gptq.h"
#include "kernels/gptq_format.h"
#include "kernels/reference_rows.h"
#include "kernels/run_parts.h"

namespace dequantd::gptq {
namespace {

constexpr int64_t kNkTileColumns = 64;

int64_t GroupOf(const QuantView& in, int64_t k) {
  const int32_t* g_idx = Gidx(in);
  return g_idx != nullptr ? g_idx[k] : k / in.shape.group_size;
}

// Group g's zero points and scales for columns [n0, n0 + count), as floats.
void WidenGroup(const QuantView& in, int64_t g, int64_t n0, int64_t count, float* zero,
                float* scale) {
  const QuantShape& s = in.shape;
  const int32_t* zero_row = Qzeros(in) + g * StreamWords(s.N, s.bits);
  for (int64_t j = 0; j < count; ++j) {
    zero[j] = static_cast<float>(ZeroAt(zero_row, n0 + j, s.bits, s.format_flags));
    scale[j] = ScaleAsFloat(Scales(in), s.scale_dtype, g * s.N + n0 + j);
  }
}

// Rows [k_begin, k_end) of a (K, N) result; `out` points at row `out_row0`.
template <DType kOut>
void RunKnPart(const QuantView& in, int64_t k_begin, int64_t k_end, int64_t out_row0, void* out) {
  const QuantShape& s = in.shape;
  const int64_t N = s.N;
  const uint32_t mask = (1u << s.bits) - 1u;
  std::vector<float> zero(static_cast<size_t>(N)), scale(static_cast<size_t>(N));
  int64_t widened = -1;
  for (int64_t k = k_begin; k < k_end; ++k) {
    const int64_t g = GroupOf(in, k);
    if (g != widened) {
      WidenGroup(in, g, 0, N, zero.data(), scale.data());
      widened = g;
    }
    const int64_t at = (k - out_row0) * N;
    const int64_t bit = k * s.bits;
    if ((bit & 31) + s.bits <= 32) {  // the field lies in one word (always for 2, 4, 8 bits)
      const int32_t* row = Qweight(in) + (bit >> 5) * N;
      const int shift = static_cast<int>(bit & 31);
      for (int64_t n = 0; n < N; ++n) {
        const auto q = static_cast<float>((static_cast<uint32_t>(row[n]) >> shift) & mask);
        StoreRounded<kOut>(out, at + n,
                           (q - zero[static_cast<size_t>(n)]) * scale[static_cast<size_t>(n)]);
      }
    } else {
      for (int64_t n = 0; n < N; ++n) {
        const auto q = static_cast<float>(StreamField(Qweight(in) + n, N, k, s.bits));
        StoreRounded<kOut>(out, at + n,
                           (q - zero[static_cast<size_t>(n)]) * scale[static_cast<size_t>(n)]);
      }
    }
  }
}

// Rows (= columns n) [n_begin, n_end) of an (N, K) result; `out` points at row `out_row0`.
template <DType kOut>
void RunNkPart(const QuantView& in, int64_t n_begin, int64_t n_end, int64_t out_row0, void* out) {
  const QuantShape& s = in.shape;
  const int64_t K = s.K;
  const int64_t groups = s.groups();
  std::vector<float> zero(static_cast<size_t>(groups * kNkTileColumns));
  std::vector<float> scale(zero.size());
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kNkTileColumns) {
    const int64_t count = std::min(kNkTileColumns, n_end - n0);
    for (int64_t g = 0; g < groups; ++g) {
      WidenGroup(in, g, n0, count, zero.data() + g * kNkTileColumns,
                 scale.data() + g * kNkTileColumns);
    }
    for (int64_t k = 0; k < K; ++k) {
      const int64_t g = GroupOf(in, k);
      const float* z = zero.data() + g * kNkTileColumns;
      const float* sc = scale.data() + g * kNkTileColumns;
      for (int64_t j = 0; j < count; ++j) {
        const auto q = static_cast<float>(StreamField(Qweight(in) + n0 + j, s.N, k, s.bits));
        StoreRounded<kOut>(out, (n0 + j - out_row0) * K + k, (q - z[j]) * sc[j]);
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

absl::Status DequantizeCpu(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, const cpu::CpuDequantOptions& options) {
  const QuantShape& shape = in.shape;
  // The groups every row reads must exist (CheckStored refused such a g_idx at load; a caller
  // that skipped it gets an error, not a read outside scales).
  if (const int32_t* g_idx = Gidx(in); g_idx != nullptr) {
    for (int64_t k = 0; k < shape.K; ++k) {
      if (g_idx[k] < 0 || g_idx[k] >= shape.groups()) {
        return absl::InvalidArgumentError(
            absl::StrCat("g_idx[", k, "] is ", g_idx[k], ", want [0, ", shape.groups(), ")"));
      }
    }
  }
  PartFn run = out_dtype == DType::kF16    ? Select<DType::kF16>(shape.orientation)
               : out_dtype == DType::kBF16 ? Select<DType::kBF16>(shape.orientation)
                                           : Select<DType::kF32>(shape.orientation);
  const int64_t rows = row_end - row_begin;
  const int64_t threads = cpu::PartsForRows(options, rows, shape.result_cols());
  RunParts(threads, [&](int64_t p) {
    run(in, row_begin + rows * p / threads, row_begin + rows * (p + 1) / threads, row_begin, out);
  });
  return absl::OkStatus();
}

}  // namespace dequantd::gptq
