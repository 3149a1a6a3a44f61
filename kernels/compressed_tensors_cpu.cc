// compressed_tensors::DequantizeCpu: the reference's result, bit for bit, from a threaded path.
//
// Work split: the output rows [row_begin, row_end) are cut into one contiguous range per thread.
// (N, K) results (the format's own): a thread walks its rows n; per row it widens that row's zero
// points and scales of every group to float once, then each k is one field extract from the row's
// contiguous weight_packed words, one subtract, one multiply and the two roundings (scale dtype,
// output dtype). (K, N) results: a thread walks its rows k; when a row's group differs from the
// previous row's it widens that group's zero points and scales for every n, then each n is one
// field extract (weight_packed column k of row n), subtract, multiply and roundings. Same scalar
// conversions as the reference (kernels/dtype.h, reference_rows.h).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/compressed_tensors.h"
#include "kernels/compressed_tensors_format.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/reference_rows.h"
#include "kernels/run_parts.h"

namespace dequantd::compressed_tensors {
namespace {

int64_t GroupOf(const QuantView& in, int64_t k) {
  const int32_t* g_idx = WeightGidx(in);
  return g_idx != nullptr ? g_idx[k] : k / in.shape.group_size;
}

// z[n, g] and s[n, g] as floats.
void Widen(const QuantView& in, int64_t n, int64_t g, float* zero, float* scale) {
  const QuantShape& s = in.shape;
  const int64_t groups = s.groups();
  *zero = static_cast<float>(ZeroAt(WeightZeroPoint(in), n, g, groups, s.bits));
  *scale = ScaleAsFloat(WeightScale(in), s.scale_dtype, ScaleIndex(n, g, groups, s.format_flags));
}

// Rows (= output rows n) [n_begin, n_end) of an (N, K) result; `out` points at row `out_row0`.
template <DType kOut>
void RunNkPart(const QuantView& in, int64_t n_begin, int64_t n_end, int64_t out_row0, void* out) {
  const QuantShape& s = in.shape;
  const int64_t K = s.K;
  const int64_t groups = s.groups();
  const int64_t row_words = PackedRowWords(K, s.bits);
  std::vector<float> zero(static_cast<size_t>(groups)), scale(zero.size());
  for (int64_t n = n_begin; n < n_end; ++n) {
    for (int64_t g = 0; g < groups; ++g)
      Widen(in, n, g, &zero[static_cast<size_t>(g)], &scale[static_cast<size_t>(g)]);
    const int32_t* row = WeightPacked(in) + n * row_words;
    const int64_t at = (n - out_row0) * K;
    for (int64_t k = 0; k < K; ++k) {
      const auto g = static_cast<size_t>(GroupOf(in, k));
      const auto f = static_cast<float>(StreamField(row, 1, k, s.bits));
      StoreRounded<kOut>(out, at + k, RoundToScaleDType((f - zero[g]) * scale[g], s.scale_dtype));
    }
  }
}

// Rows [k_begin, k_end) of a (K, N) result; `out` points at row `out_row0`.
template <DType kOut>
void RunKnPart(const QuantView& in, int64_t k_begin, int64_t k_end, int64_t out_row0, void* out) {
  const QuantShape& s = in.shape;
  const int64_t N = s.N;
  const int64_t row_words = PackedRowWords(s.K, s.bits);
  std::vector<float> zero(static_cast<size_t>(N)), scale(zero.size());
  int64_t widened = -1;
  for (int64_t k = k_begin; k < k_end; ++k) {
    const int64_t g = GroupOf(in, k);
    if (g != widened) {
      for (int64_t n = 0; n < N; ++n)
        Widen(in, n, g, &zero[static_cast<size_t>(n)], &scale[static_cast<size_t>(n)]);
      widened = g;
    }
    const int64_t at = (k - out_row0) * N;
    for (int64_t n = 0; n < N; ++n) {
      const auto f =
          static_cast<float>(StreamField(WeightPacked(in) + n * row_words, 1, k, s.bits));
      const auto j = static_cast<size_t>(n);
      StoreRounded<kOut>(out, at + n, RoundToScaleDType((f - zero[j]) * scale[j], s.scale_dtype));
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
  // The groups every column reads must exist (CheckStored refused such a g_idx at load; a caller
  // that skipped it gets an error, not a read outside weight_scale).
  if (const int32_t* g_idx = WeightGidx(in); g_idx != nullptr) {
    for (int64_t k = 0; k < shape.K; ++k) {
      if (g_idx[k] < 0 || g_idx[k] >= shape.groups()) {
        return absl::InvalidArgumentError(absl::StrCat("weight_g_idx[", k, "] is ", g_idx[k],
                                                       ", want [0, ", shape.groups(), ")"));
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

}  // namespace dequantd::compressed_tensors
