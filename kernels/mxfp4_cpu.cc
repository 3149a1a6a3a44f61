// mxfp4::DequantizeCpu: the reference's result, bit for bit, from a threaded path.
//
// Every output value is one of 16 per scale: a table of round_out(Element(nibble, s)) for all 256
// scales x 16 nibbles (built once per output dtype with the reference's Element and rounding) turns
// each byte into two table loads. Work split: the result rows [row_begin, row_end) are cut into one
// contiguous range per thread (at least options.min_elements_per_thread elements each).
// (E*N, K) results (kNK): row r is blocks row r; a thread walks its rows one 16-byte block (one
// scale) at a time, writing contiguously. (E*K, N) results (kKN): a thread walks its rows in runs
// inside one 32-row block of one expert; for each run it decodes 64 columns n at a time (one
// scale and 16 bytes per n) into a 32 x 64 tile and writes the tile row by row.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/status/status.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/mxfp4.h"
#include "kernels/mxfp4_format.h"
#include "kernels/reference_rows.h"
#include "kernels/run_parts.h"

namespace dequantd::mxfp4 {
namespace {

constexpr int64_t kTileN = 64;

template <DType kOut>
using OutT = std::conditional_t<kOut == DType::kF32, float, uint16_t>;

// table[s * 16 + nibble] = round_out(Element(nibble, s)).
template <DType kOut>
const std::array<OutT<kOut>, 256 * 16>& ValueTable() {
  static const std::array<OutT<kOut>, 256 * 16> table = [] {
    std::array<OutT<kOut>, 256 * 16> t{};
    for (uint32_t s = 0; s < 256; ++s)
      for (uint32_t q = 0; q < 16; ++q)
        StoreRounded<kOut>(t.data(), s * 16 + q, Element(q, static_cast<uint8_t>(s)));
    return t;
  }();
  return table;
}

// Rows [r_begin, r_end) of the (E*N, K) result; `out` points at row `out_row0`.
template <DType kOut>
void RunNkPart(const QuantView& in, int64_t r_begin, int64_t r_end, int64_t out_row0, void* out) {
  const auto& table = ValueTable<kOut>();
  const int64_t K = in.shape.K;
  const int64_t groups = K / kBlockValues;
  auto* o = static_cast<OutT<kOut>*>(out);
  for (int64_t r = r_begin; r < r_end; ++r) {
    const uint8_t* blocks = Blocks(in) + r * (K / 2);
    const uint8_t* scales = Scales(in) + r * groups;
    OutT<kOut>* row = o + (r - out_row0) * K;
    for (int64_t g = 0; g < groups; ++g) {
      const OutT<kOut>* lut = table.data() + scales[g] * 16;
      const uint8_t* b = blocks + g * kBlockBytes;
      OutT<kOut>* w = row + g * kBlockValues;
      for (int64_t j = 0; j < kBlockBytes; ++j) {
        w[2 * j] = lut[b[j] & 0x0F];
        w[2 * j + 1] = lut[b[j] >> 4];
      }
    }
  }
}

// Rows [r_begin, r_end) of the (E*K, N) result; `out` points at row `out_row0`.
template <DType kOut>
void RunKnPart(const QuantView& in, int64_t r_begin, int64_t r_end, int64_t out_row0, void* out) {
  const auto& table = ValueTable<kOut>();
  const int64_t K = in.shape.K;
  const int64_t N = in.shape.N;
  const int64_t groups = K / kBlockValues;
  auto* o = static_cast<OutT<kOut>*>(out);
  OutT<kOut> tile[kBlockValues][kTileN];
  for (int64_t r0 = r_begin; r0 < r_end;) {
    // A run of rows inside one block: K % 32 == 0, so a 32-aligned run is one expert's block g.
    const int64_t r1 = std::min(r_end, (r0 / kBlockValues + 1) * kBlockValues);
    const int64_t e = r0 / K;
    const int64_t g = (r0 % K) / kBlockValues;
    const int64_t j0 = r0 % kBlockValues;  // first value of the block in the run
    const int64_t j1 = j0 + (r1 - r0);
    for (int64_t n0 = 0; n0 < N; n0 += kTileN) {
      const int64_t n1 = std::min(N, n0 + kTileN);
      for (int64_t n = n0; n < n1; ++n) {
        const int64_t row = e * N + n;
        const OutT<kOut>* lut = table.data() + Scales(in)[row * groups + g] * 16;
        const uint8_t* b = Blocks(in) + row * (K / 2) + g * kBlockBytes;
        for (int64_t j = j0; j < j1; ++j) tile[j][n - n0] = lut[NibbleOf(b[j / 2], j)];
      }
      for (int64_t j = j0; j < j1; ++j) {
        std::memcpy(o + (r0 + (j - j0) - out_row0) * N + n0, tile[j],
                    static_cast<size_t>(n1 - n0) * sizeof(OutT<kOut>));
      }
    }
    r0 = r1;
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
  const PartFn run = out_dtype == DType::kF16    ? Select<DType::kF16>(shape.orientation)
                     : out_dtype == DType::kBF16 ? Select<DType::kBF16>(shape.orientation)
                                                 : Select<DType::kF32>(shape.orientation);
  const int64_t rows = row_end - row_begin;
  const int64_t threads = cpu::PartsForRows(options, rows, shape.result_cols());
  RunParts(threads, [&](int64_t p) {
    run(in, row_begin + rows * p / threads, row_begin + rows * (p + 1) / threads, row_begin, out);
  });
  return absl::OkStatus();
}

}  // namespace dequantd::mxfp4
