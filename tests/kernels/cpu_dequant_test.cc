// DequantizeCpu (both row kernels, several thread counts and row ranges) against
// DequantizeReference, bit for bit (memcmp).
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/dequant.h"
#include "tests/kernels/test_util.h"

namespace dequantd {
namespace {

using cpu::CpuDequantOptions;
using cpu::CpuIsa;
using testing::HostLayer;
using testing::OutputBuffer;
using testing::RandomLayer;

struct ShapeCase {
  int64_t K, N, G;
};
void PrintTo(const ShapeCase& s, std::ostream* os) {
  *os << "K=" << s.K << " N=" << s.N << " G=" << s.G;
}

// N = 8, 24, 520, 1000, 1440, 2056, 4672 and 200008 (not multiples of 64 among them); G = 32,
// 64, 128 and G = K; K = 1, 3, 7, 64, 128, 256, 384 and 10944 (= 64 * 171).
constexpr ShapeCase kShapes[] = {
    {1, 8, 1},        {7, 1440, 7},   {128, 4672, 32}, {128, 1440, 64},
    {256, 520, 128},  {128, 8, 128},  {10944, 24, 64}, {10944, 8, 10944},
    {384, 1000, 128}, {64, 2056, 64}, {3, 200008, 3},  // fewer rows than threads: the words of each
                                                       // row are split
};

std::vector<CpuIsa> Isas() {
  std::vector<CpuIsa> isas = {CpuIsa::kPortable};
  if (cpu::CpuHasAvx2()) isas.push_back(CpuIsa::kAvx2);
  return isas;
}

// The first 32-byte aligned address at or after p.
uint8_t* Aligned32(uint8_t* p) { return p + (32 - reinterpret_cast<uintptr_t>(p) % 32) % 32; }

const char* IsaName(CpuIsa isa) { return isa == CpuIsa::kAvx2 ? "avx2" : "portable"; }

using Param = std::tuple<ShapeCase, DType, DType>;  // shape, scales dtype, output dtype

class CpuVsReferenceTest : public ::testing::TestWithParam<Param> {};

TEST_P(CpuVsReferenceTest, BitExact) {
  const auto [sc, scale_dtype, out_dtype] = GetParam();
  const QuantShape shape{.K = sc.K, .N = sc.N, .group_size = sc.G, .scale_dtype = scale_dtype};
  const HostLayer layer = RandomLayer(shape, static_cast<uint64_t>(sc.K * 1000003 + sc.N));
  const int64_t elem = DTypeSize(out_dtype);
  const int64_t row_bytes = sc.N * elem;

  std::vector<uint8_t> expected = OutputBuffer(sc.K * sc.N, out_dtype);
  ASSERT_TRUE(DequantizeReference(layer.view(), out_dtype, 0, sc.K, expected.data()).ok());

  const std::pair<int64_t, int64_t> ranges[] = {
      {0, sc.K}, {sc.K / 3, sc.K - sc.K / 5}, {sc.K - 1, sc.K}};
  for (CpuIsa isa : Isas()) {
    // AVX2 also with non-temporal stores (stream_min_bytes = 0, 16-byte aligned output).
    for (bool stream : {false, true}) {
      if (stream && isa != CpuIsa::kAvx2) continue;
      for (int threads : {1, 2, 3, 7}) {
        for (const auto& [begin, end] : ranges) {
          SCOPED_TRACE(::testing::Message()
                       << IsaName(isa) << (stream ? " stream" : "") << " threads " << threads
                       << " rows [" << begin << ", " << end << ")");
          const int64_t bytes = (end - begin) * row_bytes;
          std::vector<uint8_t> buffer = OutputBuffer((end - begin) * sc.N + 32, out_dtype);
          uint8_t* got = Aligned32(buffer.data()) + 16;  // 16- but not 32-byte aligned
          // min_elements_per_thread = 1: every requested thread gets a part, even for tiny shapes.
          const CpuDequantOptions options{.threads = threads,
                                          .isa = isa,
                                          .min_elements_per_thread = 1,
                                          .stream_min_bytes = stream ? 0 : int64_t{1} << 40};
          ASSERT_TRUE(
              cpu::DequantizeCpuWithOptions(layer.view(), out_dtype, begin, end, got, options)
                  .ok());
          ASSERT_EQ(std::memcmp(got, expected.data() + begin * row_bytes, bytes), 0);
          // Nothing written past the range.
          for (int64_t i = bytes; i < bytes + 16; ++i) ASSERT_EQ(got[i], 0xA5) << i;
        }
      }
    }
  }
  // The public entry point with its defaults (hardware concurrency, best ISA).
  std::vector<uint8_t> got = OutputBuffer(sc.K * sc.N, out_dtype);
  ASSERT_TRUE(DequantizeCpu(layer.view(), out_dtype, 0, sc.K, got.data()).ok());
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size()), 0);
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto& [sc, scale_dtype, out_dtype] = info.param;
  return "K" + std::to_string(sc.K) + "_N" + std::to_string(sc.N) + "_G" + std::to_string(sc.G) +
         "_" + std::string(DTypeName(scale_dtype)) + "Scales_" + std::string(DTypeName(out_dtype)) +
         "Out";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuVsReferenceTest,
    ::testing::Combine(::testing::ValuesIn(kShapes), ::testing::Values(DType::kF16, DType::kBF16),
                       ::testing::Values(DType::kF16, DType::kBF16, DType::kF32)),
    ParamName);

// (N, K) results (Orientation::kNK): the reference is the exact transpose of the (K, N) one
// (w_nk[n][k] == w_kn[k][n], bit for bit), and the fast path matches the reference for several
// thread counts and row ranges (rows are output columns n).
class CpuNkVsReferenceTest : public ::testing::TestWithParam<Param> {};

TEST_P(CpuNkVsReferenceTest, BitExact) {
  const auto [sc, scale_dtype, out_dtype] = GetParam();
  QuantShape shape{.K = sc.K, .N = sc.N, .group_size = sc.G, .scale_dtype = scale_dtype};
  const HostLayer kn = RandomLayer(shape, static_cast<uint64_t>(sc.K * 1000003 + sc.N));
  HostLayer nk = kn;
  nk.shape.orientation = Orientation::kNK;
  const int64_t elem = DTypeSize(out_dtype);
  std::vector<uint8_t> kn_out = OutputBuffer(sc.K * sc.N, out_dtype);
  ASSERT_TRUE(DequantizeReference(kn.view(), out_dtype, 0, sc.K, kn_out.data()).ok());
  std::vector<uint8_t> expected = OutputBuffer(sc.K * sc.N, out_dtype);
  ASSERT_TRUE(DequantizeReference(nk.view(), out_dtype, 0, sc.N, expected.data()).ok());
  for (int64_t n = 0; n < sc.N; ++n) {
    for (int64_t k = 0; k < sc.K; ++k) {
      ASSERT_EQ(std::memcmp(expected.data() + (n * sc.K + k) * elem,
                            kn_out.data() + (k * sc.N + n) * elem, static_cast<size_t>(elem)),
                0)
          << "n " << n << " k " << k;
    }
  }
  const int64_t row_bytes = sc.K * elem;
  const std::pair<int64_t, int64_t> ranges[] = {
      {0, sc.N}, {sc.N / 3, sc.N - sc.N / 5}, {sc.N - 1, sc.N}, {3, 5}};
  for (int threads : {1, 2, 3, 7}) {
    for (const auto& [begin, end] : ranges) {
      SCOPED_TRACE(::testing::Message()
                   << "threads " << threads << " rows [" << begin << ", " << end << ")");
      const int64_t bytes = (end - begin) * row_bytes;
      std::vector<uint8_t> got = OutputBuffer((end - begin) * sc.K + 16, out_dtype);
      const CpuDequantOptions options{.threads = threads, .min_elements_per_thread = 1};
      ASSERT_TRUE(
          cpu::DequantizeCpuWithOptions(nk.view(), out_dtype, begin, end, got.data(), options)
              .ok());
      ASSERT_EQ(std::memcmp(got.data(), expected.data() + begin * row_bytes, bytes), 0);
      for (int64_t i = bytes; i < bytes + 16; ++i) ASSERT_EQ(got[i], 0xA5) << i;
    }
  }
}

constexpr ShapeCase kNkShapes[] = {
    {1, 8, 1}, {7, 1440, 7}, {128, 520, 32}, {130, 24, 65}, {384, 1000, 128}, {64, 2056, 64},
};

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuNkVsReferenceTest,
    ::testing::Combine(::testing::ValuesIn(kNkShapes), ::testing::Values(DType::kF16, DType::kBF16),
                       ::testing::Values(DType::kF16, DType::kBF16, DType::kF32)),
    ParamName);

// Every scale bit pattern (inf and NaN included) times every q - z in [-15, 15]: K = 32, G = 16,
// N = 65536. Group 0 has z = 0 (q - z = 0..15), group 1 has z = 15 (q - z = -15..0); row k has
// q = k % 16 in every column; column n's scale is the bit pattern n.
class AllScalePatternsTest : public ::testing::TestWithParam<std::tuple<DType, DType>> {};

TEST_P(AllScalePatternsTest, BitExact) {
  const auto [scale_dtype, out_dtype] = GetParam();
  const QuantShape shape{.K = 32, .N = 65536, .group_size = 16, .scale_dtype = scale_dtype};
  HostLayer layer = testing::ZeroLayer(shape);
  for (int64_t k = 0; k < 32; ++k) {
    for (int64_t c = 0; c < shape.N / 8; ++c) {
      layer.qweight[k * (shape.N / 8) + c] = static_cast<int32_t>(0x11111111u * (k % 16));
    }
  }
  for (int64_t c = 0; c < shape.N / 8; ++c) {
    layer.qzeros[c] = 0;
    layer.qzeros[shape.N / 8 + c] = static_cast<int32_t>(0xFFFFFFFFu);
  }
  for (int64_t g = 0; g < 2; ++g) {
    for (int64_t n = 0; n < shape.N; ++n) layer.scales[g * shape.N + n] = static_cast<uint16_t>(n);
  }
  std::vector<uint8_t> expected = OutputBuffer(shape.output_elements(), out_dtype);
  ASSERT_TRUE(DequantizeReference(layer.view(), out_dtype, 0, shape.K, expected.data()).ok());
  for (CpuIsa isa : Isas()) {
    std::vector<uint8_t> got = OutputBuffer(shape.output_elements(), out_dtype);
    ASSERT_TRUE(cpu::DequantizeCpuWithOptions(layer.view(), out_dtype, 0, shape.K, got.data(),
                                              {.threads = 2, .isa = isa})
                    .ok());
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size()), 0) << IsaName(isa);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AllScalePatternsTest,
                         ::testing::Combine(::testing::Values(DType::kF16, DType::kBF16),
                                            ::testing::Values(DType::kF16, DType::kBF16,
                                                              DType::kF32)),
                         [](const ::testing::TestParamInfo<std::tuple<DType, DType>>& info) {
                           return std::string(DTypeName(std::get<0>(info.param))) + "Scales_" +
                                  std::string(DTypeName(std::get<1>(info.param))) + "Out";
                         });

// stream_min_bytes = 0 with an output that is only 8-byte aligned: regular stores are used.
TEST(CpuDequantTest, StreamRequestWithMisalignedOutputK64N1440G32) {
  const HostLayer layer =
      RandomLayer({.K = 64, .N = 1440, .group_size = 32, .scale_dtype = DType::kBF16}, 5);
  for (DType out_dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
    const int64_t bytes = 64 * 1440 * DTypeSize(out_dtype);
    std::vector<uint8_t> expected = OutputBuffer(64 * 1440, out_dtype);
    ASSERT_TRUE(DequantizeReference(layer.view(), out_dtype, 0, 64, expected.data()).ok());
    std::vector<uint8_t> buffer = OutputBuffer(64 * 1440 + 64, out_dtype);
    uint8_t* got = Aligned32(buffer.data()) + 8;
    ASSERT_TRUE(cpu::DequantizeCpuWithOptions(layer.view(), out_dtype, 0, 64, got,
                                              {.threads = 2, .stream_min_bytes = 0})
                    .ok());
    EXPECT_EQ(std::memcmp(got, expected.data(), bytes), 0) << DTypeName(out_dtype);
  }
}

TEST(CpuDequantTest, EmptyRangeWritesNothing) {
  const HostLayer layer =
      RandomLayer({.K = 64, .N = 64, .group_size = 32, .scale_dtype = DType::kF16}, 1);
  std::vector<uint8_t> out = OutputBuffer(8, DType::kF16);
  ASSERT_TRUE(DequantizeCpu(layer.view(), DType::kF16, 5, 5, out.data(), 2).ok());
  EXPECT_EQ(out, OutputBuffer(8, DType::kF16));
}

TEST(CpuDequantTest, RejectsBadCalls) {
  const HostLayer layer =
      RandomLayer({.K = 64, .N = 64, .group_size = 32, .scale_dtype = DType::kF16}, 1);
  std::vector<uint8_t> out = OutputBuffer(64 * 64, DType::kF32);
  EXPECT_EQ(DequantizeCpu(layer.view(), DType::kF16, 0, 65, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeCpu(layer.view(), DType::kI32, 0, 64, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeCpu(layer.view(), DType::kF16, 0, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeCpu(layer.view(), DType::kF16, 0, 64, out.data(), -1).code(),
            absl::StatusCode::kInvalidArgument);
  QuantView bad = layer.view();
  bad.shape.group_size = 48;
  EXPECT_EQ(DequantizeCpu(bad, DType::kF16, 0, 64, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::DequantizeCpuWithOptions(layer.view(), DType::kF16, 0, 64, out.data(),
                                          {.min_elements_per_thread = 0})
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::DequantizeCpuWithOptions(layer.view(), DType::kF16, 0, 64, out.data(),
                                          {.stream_min_bytes = -1})
                .code(),
            absl::StatusCode::kInvalidArgument);
  if (!cpu::CpuHasAvx2()) {
    EXPECT_EQ(cpu::DequantizeCpuWithOptions(layer.view(), DType::kF16, 0, 64, out.data(),
                                            {.isa = CpuIsa::kAvx2})
                  .code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace dequantd
