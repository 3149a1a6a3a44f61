// Every CUDA variant (and every launch configuration of v3/v4) against the CPU reference, bit for
// bit, on fresh random inputs; hand-worked vectors; and a layer of more than 2^34 output elements.
// GPU tests skip without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/awq_format.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/dequant.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/kernels/test_util.h"

namespace dequantd::cuda::testing {
namespace {

std::string DTypeTag(DType t) {
  switch (t) {
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF32:
      return "F32";
    default:
      return "I32";
  }
}

// The launch configurations tested for v: its candidates, plus for v4 every (words, rows)
// instance the shape admits at an odd block size (96) so no config escapes the test.
std::vector<LaunchConfig> ConfigsUnderTest(KernelVariant v, const QuantShape& shape, DType out) {
  std::vector<LaunchConfig> configs = CandidateConfigs(v, shape, out);
  if (v == KernelVariant::kV4Vec16) {
    for (int w : {1, 2, 4}) {
      for (int r : {1, 2, 4, 8, 16}) {
        const LaunchConfig c{.block_size = 96, .words_per_thread = w, .rows_per_thread = r};
        if (CanImplement(v, c, shape, out).ok()) configs.push_back(c);
      }
    }
  }
  return configs;
}

// Index of the first differing element of two equal-size byte buffers of `elem_size` elements,
// or -1 when identical.
int64_t FirstMismatch(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                      int64_t elem_size) {
  if (std::memcmp(a.data(), b.data(), a.size()) == 0) return -1;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i) / elem_size;
  return -1;
}

std::string ElementHex(const std::vector<uint8_t>& buf, int64_t index, int64_t elem_size) {
  uint32_t bits = 0;
  std::memcpy(&bits, buf.data() + index * elem_size, static_cast<size_t>(elem_size));
  char s[16];
  std::snprintf(s, sizeof s, "0x%0*x", static_cast<int>(2 * elem_size), bits);
  return s;
}

// Fills `out` with 0xFF bytes (a NaN pattern: finite scales never produce NaN, so an unwritten
// element shows), launches on the default stream, waits, and copies all of `out` to `host`.
void LaunchAndFetch(KernelVariant v, const LaunchConfig& config, const QuantView& in,
                    DType out_dtype, const DeviceBuffer& out, std::vector<uint8_t>* host) {
  ASSERT_EQ(cudaMemset(out.get(), 0xFF, out.bytes()), cudaSuccess);
  const absl::Status st = LaunchDequantize(v, config, in, out_dtype, out.get(), nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  host->resize(out.bytes());
  ASSERT_EQ(cudaMemcpy(host->data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
}

// ---- Hand-worked vectors (independent of the CPU reference) -----------------------------------

// K = 1, N = 16, G = 1, fp16 scales.
// Word 0: q = 0x76543210 (nibble j holds j, so column i holds kNibbleOfColumn[i] =
// [0,4,1,5,2,6,3,7]), z = 0x11111111, s = 0.5: w = (q - 1) * 0.5.
// Word 1: q = 0xFFFFFFFF (15 everywhere), z = 0x0F0F0F0F (even nibbles 15: columns 0,1,4,5 have
// z = 15, columns 2,3,6,7 have z = 0), scales chosen for signed zeros, overflow and subnormals.
HostLayer HandWorkedLayer() {
  HostLayer l;
  l.shape = QuantShape{.K = 1, .N = 16, .group_size = 1, .scale_dtype = DType::kF16};
  l.qweight = {0x76543210, static_cast<int32_t>(0xFFFFFFFFu)};
  l.qzeros = {0x11111111, 0x0F0F0F0F};
  l.scales = {0x3800, 0x3800, 0x3800, 0x3800, 0x3800, 0x3800, 0x3800, 0x3800,  // 0.5
              0xBC00,                                                          // -1: 0 * -1 = -0
              0xFBFF,   // -65504: 0 * -65504 = -0
              0x7BFF,   // 65504: 15 * 65504 = 982560 -> +inf in fp16
              0xFBFF,   // -65504: -> -inf
              0x0001,   // 2^-24: 0 * s = +0
              0x8001,   // -2^-24: 0 * s = -0
              0x0001,   // 2^-24: 15 * 2^-24, fp16 subnormal 0x000F
              0x0200};  // 2^-15: 15 * 2^-15 = 1.875 * 2^-12, normal 0x0F80
  return l;
}

TEST(CudaDequantHandWorkedTest, Fp16OutK1N16G1EveryVariant) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  const HostLayer host = HandWorkedLayer();
  const std::vector<uint16_t> expected = {0xB800, 0x3E00, 0x0000, 0x4000,  // -0.5 1.5 0 2
                                          0x3800, 0x4100, 0x3C00, 0x4200,  // 0.5 2.5 1 3
                                          0x8000, 0x8000, 0x7C00, 0xFC00,
                                          0x0000, 0x8000, 0x000F, 0x0F80};
  DeviceLayer dev(host);
  ASSERT_TRUE(dev.ok());
  DeviceBuffer out(16 * sizeof(uint16_t));
  for (KernelVariant v : AllVariants()) {
    for (const LaunchConfig& c : ConfigsUnderTest(v, host.shape, DType::kF16)) {
      SCOPED_TRACE(std::string(VariantName(v)) + " " + c.ToString());
      std::vector<uint8_t> got;
      LaunchAndFetch(v, c, dev.view(), DType::kF16, out, &got);
      std::vector<uint16_t> got16(16);
      std::memcpy(got16.data(), got.data(), 32);
      EXPECT_EQ(got16, expected);
    }
  }
}

TEST(CudaDequantHandWorkedTest, Fp32OutK1N16G1EveryVariant) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  const HostLayer host = HandWorkedLayer();
  const std::vector<float> expected = {-0.5f,
                                       1.5f,
                                       0.0f,
                                       2.0f,
                                       0.5f,
                                       2.5f,
                                       1.0f,
                                       3.0f,
                                       -0.0f,
                                       -0.0f,
                                       982560.0f,
                                       -982560.0f,
                                       0.0f,
                                       -0.0f,
                                       std::ldexp(15.0f, -24),
                                       std::ldexp(15.0f, -15)};
  DeviceLayer dev(host);
  ASSERT_TRUE(dev.ok());
  DeviceBuffer out(16 * sizeof(float));
  for (KernelVariant v : AllVariants()) {
    for (const LaunchConfig& c : ConfigsUnderTest(v, host.shape, DType::kF32)) {
      SCOPED_TRACE(std::string(VariantName(v)) + " " + c.ToString());
      std::vector<uint8_t> got;
      LaunchAndFetch(v, c, dev.view(), DType::kF32, out, &got);
      for (int i = 0; i < 16; ++i) {
        uint32_t got_bits, want_bits;
        std::memcpy(&got_bits, got.data() + 4 * i, 4);
        std::memcpy(&want_bits, &expected[i], 4);
        EXPECT_EQ(got_bits, want_bits) << "column " << i;
      }
    }
  }
}

// ---- Random layers against the CPU reference ---------------------------------------------------

struct RandomCase {
  int64_t K, N, G;
  DType scale, out;
};

std::string CaseName(const ::testing::TestParamInfo<RandomCase>& info) {
  const RandomCase& c = info.param;
  return "K" + std::to_string(c.K) + "_N" + std::to_string(c.N) + "_G" + std::to_string(c.G) +
         "_scales" + DTypeTag(c.scale) + "_out" + DTypeTag(c.out);
}

class CudaDequantRandomTest : public ::testing::TestWithParam<RandomCase> {};

TEST_P(CudaDequantRandomTest, EveryVariantAndConfigBitExact) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  const RandomCase& c = GetParam();
  const QuantShape shape{.K = c.K, .N = c.N, .group_size = c.G, .scale_dtype = c.scale};
  const uint64_t seed = static_cast<uint64_t>(c.K * 1000003 + c.N * 101 + c.G) * 7 +
                        static_cast<uint64_t>(c.scale) * 3 + static_cast<uint64_t>(c.out);
  const HostLayer host = RandomLayer(shape, seed);
  const int64_t elem = DTypeSize(c.out);
  std::vector<uint8_t> want(static_cast<size_t>(shape.output_bytes(c.out)));
  ASSERT_TRUE(DequantizeReference(host.view(), c.out, 0, c.K, want.data()).ok());

  DeviceLayer dev(host);
  ASSERT_TRUE(dev.ok());
  DeviceBuffer out(want.size());
  ASSERT_TRUE(out.ok());
  std::vector<uint8_t> got;
  for (KernelVariant v : AllVariants()) {
    for (const LaunchConfig& config : ConfigsUnderTest(v, shape, c.out)) {
      SCOPED_TRACE(std::string(VariantName(v)) + " " + config.ToString());
      LaunchAndFetch(v, config, dev.view(), c.out, out, &got);
      const int64_t bad = FirstMismatch(got, want, elem);
      EXPECT_EQ(bad, -1) << "first mismatch at row " << bad / c.N << " column " << bad % c.N
                         << ": got " << ElementHex(got, bad, elem) << ", want "
                         << ElementHex(want, bad, elem);
    }
  }
}

std::vector<RandomCase> RandomCases() {
  struct Shape {
    int64_t K, N, G;
  };
  const Shape shapes[] = {
      {1, 8, 1},        {1, 4672, 1},      {64, 24, 32},      {64, 8, 64},
      {128, 1440, 128}, {128, 4096, 32},   {128, 4672, 64},   {256, 4096, 128},
      {64, 1440, 64},   {10944, 1440, 64}, {10944, 4672, 64}, {128, 24, 128},
  };
  std::vector<RandomCase> cases;
  for (const Shape& s : shapes)
    for (DType scale : {DType::kF16, DType::kBF16})
      for (DType out : {DType::kF16, DType::kBF16, DType::kF32})
        cases.push_back({s.K, s.N, s.G, scale, out});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDequantRandomTest, ::testing::ValuesIn(RandomCases()),
                         CaseName);

// ---- (N, K) results (Orientation::kNK) against the CPU reference ------------------------------

// Every variant and configuration writes the (N, K) transpose bit for bit as the reference does
// (whose transpose property tests/kernels/cpu_dequant_test.cc checks against the (K, N) result).
// Shapes include K not a multiple of v4's transpose tile (256 k, 128 for fp32) nor of its 16-byte
// chunks, N not a multiple of its 64 rows, and group sizes that split a chunk.
class CudaDequantNkRandomTest : public ::testing::TestWithParam<RandomCase> {};

TEST_P(CudaDequantNkRandomTest, EveryVariantAndConfigBitExact) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  const RandomCase& c = GetParam();
  const QuantShape shape{.K = c.K,
                         .N = c.N,
                         .group_size = c.G,
                         .scale_dtype = c.scale,
                         .orientation = Orientation::kNK};
  const uint64_t seed = static_cast<uint64_t>(c.K * 1000003 + c.N * 101 + c.G) * 11 +
                        static_cast<uint64_t>(c.scale) * 3 + static_cast<uint64_t>(c.out);
  const HostLayer host = RandomLayer(shape, seed);
  const int64_t elem = DTypeSize(c.out);
  std::vector<uint8_t> want(static_cast<size_t>(shape.output_bytes(c.out)));
  ASSERT_TRUE(DequantizeReference(host.view(), c.out, 0, c.N, want.data()).ok());
  DeviceLayer dev(host);
  ASSERT_TRUE(dev.ok());
  DeviceBuffer out(want.size());
  ASSERT_TRUE(out.ok());
  std::vector<uint8_t> got;
  for (KernelVariant v : AllVariants()) {
    for (const LaunchConfig& config : ConfigsUnderTest(v, shape, c.out)) {
      SCOPED_TRACE(std::string(VariantName(v)) + " " + config.ToString());
      LaunchAndFetch(v, config, dev.view(), c.out, out, &got);
      const int64_t bad = FirstMismatch(got, want, elem);
      EXPECT_EQ(bad, -1) << "first mismatch at row n = " << bad / c.K << " column k = " << bad % c.K
                         << ": got " << ElementHex(got, bad, elem) << ", want "
                         << ElementHex(want, bad, elem);
    }
  }
}

std::vector<RandomCase> NkRandomCases() {
  struct Shape {
    int64_t K, N, G;
  };
  // {96, 64, 12}: groups of whole 4-value fp32 chunks but not of 8-value fp16/bf16 ones.
  const Shape shapes[] = {{1, 8, 1},        {64, 24, 32},      {130, 40, 65},   {96, 64, 12},
                          {128, 1440, 128}, {10944, 1440, 64}, {256, 4096, 128}};
  std::vector<RandomCase> cases;
  for (const Shape& s : shapes)
    for (DType scale : {DType::kF16, DType::kBF16})
      for (DType out : {DType::kF16, DType::kBF16, DType::kF32})
        cases.push_back({s.K, s.N, s.G, scale, out});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDequantNkRandomTest, ::testing::ValuesIn(NkRandomCases()),
                         CaseName);

// v4's (N, K) tile kernel into an output one element past 16-byte alignment: the fast decode with
// element stores (K a multiple of the chunk), every candidate, bit for bit; the element before the
// result and the bytes after it stay untouched.
TEST(CudaDequantNkTest, MisalignedOutputTakesElementStoresBitExact) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  const QuantShape shape{.K = 96,
                         .N = 136,
                         .group_size = 32,
                         .scale_dtype = DType::kBF16,
                         .orientation = Orientation::kNK};
  const HostLayer host = RandomLayer(shape, 96136);
  DeviceLayer dev(host);
  ASSERT_TRUE(dev.ok());
  for (DType out_dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeTag(out_dtype));
    const int64_t elem = DTypeSize(out_dtype);
    const size_t bytes = static_cast<size_t>(shape.output_bytes(out_dtype));
    std::vector<uint8_t> want(bytes);
    ASSERT_TRUE(DequantizeReference(host.view(), out_dtype, 0, shape.N, want.data()).ok());
    DeviceBuffer out(bytes + 32);
    ASSERT_TRUE(out.ok());
    for (const LaunchConfig& config : CandidateConfigs(KernelVariant::kV4Vec16, shape, out_dtype)) {
      SCOPED_TRACE(config.ToString());
      ASSERT_EQ(cudaMemset(out.get(), 0xFF, out.bytes()), cudaSuccess);
      void* at = static_cast<uint8_t*>(out.get()) + elem;
      const absl::Status st =
          LaunchDequantize(KernelVariant::kV4Vec16, config, dev.view(), out_dtype, at, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint8_t> all(out.bytes());
      ASSERT_EQ(cudaMemcpy(all.data(), out.get(), all.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      const std::vector<uint8_t> got(all.begin() + elem, all.begin() + elem + bytes);
      const int64_t bad = FirstMismatch(got, want, elem);
      EXPECT_EQ(bad, -1) << "first mismatch at row n = " << bad / shape.K
                         << " column k = " << bad % shape.K;
      for (int64_t i = 0; i < elem; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], 0xFF);
      for (size_t i = static_cast<size_t>(elem) + bytes; i < all.size(); ++i)
        EXPECT_EQ(all[i], 0xFF) << "byte " << i;
    }
  }
}

// ---- More than 2^34 output elements ------------------------------------------------------------

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A random layer too large for std::vector's zero fill to be cheap: full 32-bit words, finite
// fp16 scale bit patterns over the whole range.
struct BigHostLayer {
  QuantShape shape;
  std::unique_ptr<int32_t[]> qweight, qzeros;
  std::unique_ptr<uint16_t[]> scales;

  explicit BigHostLayer(const QuantShape& s, uint64_t seed) : shape(s) {
    qweight.reset(new int32_t[static_cast<size_t>(awq::QweightElements(s))]);
    qzeros.reset(new int32_t[static_cast<size_t>(awq::QzerosElements(s))]);
    scales.reset(new uint16_t[static_cast<size_t>(awq::ScalesElements(s))]);
    uint64_t state = seed;
    const auto fill_words = [&](int32_t* p, int64_t n) {
      for (int64_t i = 0; i + 1 < n; i += 2) {
        const uint64_t r = SplitMix64(state);
        p[i] = static_cast<int32_t>(static_cast<uint32_t>(r));
        p[i + 1] = static_cast<int32_t>(static_cast<uint32_t>(r >> 32));
      }
      if (n % 2) p[n - 1] = static_cast<int32_t>(static_cast<uint32_t>(SplitMix64(state)));
    };
    fill_words(qweight.get(), awq::QweightElements(s));
    fill_words(qzeros.get(), awq::QzerosElements(s));
    for (int64_t i = 0; i < awq::ScalesElements(s); ++i) {
      uint16_t h;
      do {
        h = static_cast<uint16_t>(SplitMix64(state));
      } while ((h & 0x7C00) == 0x7C00);
      scales[i] = h;
    }
  }
  QuantView view() const { return awq::MakeView(shape, qweight.get(), qzeros.get(), scales.get()); }
};

// K * N = 2113536 * 8192 = 17,314,086,912 > 2^34 fp16 outputs (34.6 GB) and K * N / 8 > 2^31
// packed words, so v4 with one word and one row per thread needs two launches (slabs of 16383
// groups: the first ends at row 2097024). Rows around element 2^31, 2^32, the slab boundary,
// element 2^34 and both ends are copied back and compared with the reference on those rows.
TEST(CudaDequantLargeTest, K2113536N8192G128Fp16PastTwoTo34Elements) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  const QuantShape shape{.K = 2113536, .N = 8192, .group_size = 128, .scale_dtype = DType::kF16};
  ASSERT_GT(shape.output_elements(), int64_t{1} << 34);
  ASSERT_GT(awq::QweightElements(shape), int64_t{1} << 31);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  const int64_t need = shape.output_bytes(DType::kF16) + awq::QweightBytes(shape) +
                       awq::QzerosBytes(shape) + awq::ScalesBytes(shape);
  if (static_cast<int64_t>(free_bytes) < need + (int64_t{1} << 30))
    GTEST_SKIP() << "needs " << need << " bytes of device memory, " << free_bytes << " free";

  const BigHostLayer host(shape, 2026);
  const int64_t row_ranges[][2] = {{0, 64},
                                   {262080, 262208},    // element 2^31: row 262144
                                   {524224, 524352},    // element 2^32: row 524288
                                   {2096960, 2097088},  // v4 (1 word, 1 row) slab boundary
                                   {2097088, 2097216},  // element 2^34: row 2097152
                                   {shape.K - 64, shape.K}};
  std::vector<std::vector<uint8_t>> want;
  for (const auto& r : row_ranges) {
    want.emplace_back(static_cast<size_t>((r[1] - r[0]) * shape.N * 2));
    ASSERT_TRUE(DequantizeReference(host.view(), DType::kF16, r[0], r[1], want.back().data()).ok());
  }
  DeviceBuffer qweight(static_cast<size_t>(awq::QweightBytes(shape)));
  DeviceBuffer qzeros(static_cast<size_t>(awq::QzerosBytes(shape)));
  DeviceBuffer scales(static_cast<size_t>(awq::ScalesBytes(shape)));
  DeviceBuffer out(static_cast<size_t>(shape.output_bytes(DType::kF16)));
  ASSERT_TRUE(qweight.ok() && qzeros.ok() && scales.ok() && out.ok());
  ASSERT_EQ(cudaMemcpy(qweight.get(), host.qweight.get(), qweight.bytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(qzeros.get(), host.qzeros.get(), qzeros.bytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(scales.get(), host.scales.get(), scales.bytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  const QuantView dev = awq::MakeView(shape, static_cast<const int32_t*>(qweight.get()),
                                      static_cast<const int32_t*>(qzeros.get()), scales.get());
  for (KernelVariant v : AllVariants()) {
    std::vector<LaunchConfig> configs = {DefaultConfig(v, shape, DType::kF16)};
    if (v == KernelVariant::kV4Vec16) {
      configs.push_back({.block_size = 256, .words_per_thread = 1, .rows_per_thread = 1});
      configs.push_back({.block_size = 128, .words_per_thread = 4, .rows_per_thread = 4});
    }
    for (const LaunchConfig& config : configs) {
      SCOPED_TRACE(std::string(VariantName(v)) + " " + config.ToString());
      ASSERT_EQ(cudaMemset(out.get(), 0xFF, out.bytes()), cudaSuccess);
      const absl::Status st = LaunchDequantize(v, config, dev, DType::kF16, out.get(), nullptr);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (size_t i = 0; i < want.size(); ++i) {
        std::vector<uint8_t> got(want[i].size());
        const auto* src = static_cast<const uint8_t*>(out.get()) + row_ranges[i][0] * shape.N * 2;
        ASSERT_EQ(cudaMemcpy(got.data(), src, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        const int64_t bad = FirstMismatch(got, want[i], 2);
        EXPECT_EQ(bad, -1) << "rows from " << row_ranges[i][0] << ": first mismatch at row "
                           << row_ranges[i][0] + bad / shape.N << " column " << bad % shape.N;
      }
    }
  }
}

// ---- Refusals before any GPU work (no device needed) -------------------------------------------

TEST(LaunchDequantizeTest, RefusesNullAndMisalignedPointers) {
  const QuantShape shape{.K = 128, .N = 64, .group_size = 128, .scale_dtype = DType::kF16};
  // Never dereferenced: every case is refused before the launch.
  alignas(16) static int32_t words[64];
  alignas(16) static uint16_t scales[64];
  alignas(16) static uint16_t out[64];
  const QuantView good = awq::MakeView(shape, words, words, scales);
  QuantView null_scales = good;
  null_scales.tensors[awq::kScales] = nullptr;
  EXPECT_EQ(LaunchDequantize(KernelVariant::kV2PerWord, {}, null_scales, DType::kF16, out, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  QuantView odd_scales = good;
  odd_scales.tensors[awq::kScales] = scales + 1;  // 2-byte aligned only
  EXPECT_EQ(
      LaunchDequantize(KernelVariant::kV4Vec16, {}, odd_scales, DType::kF16, out, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      LaunchDequantize(KernelVariant::kV4Vec16, {}, good, DType::kF16, out + 1, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  // (N, K): v4's 16-byte scale loads need aligned scales too (a misaligned out is allowed:
  // MisalignedOutputTakesElementStoresBitExact).
  QuantView nk_odd_scales = odd_scales;
  nk_odd_scales.shape.orientation = Orientation::kNK;
  EXPECT_EQ(
      LaunchDequantize(KernelVariant::kV4Vec16,
                       DefaultConfig(KernelVariant::kV4Vec16, nk_odd_scales.shape, DType::kF16),
                       nk_odd_scales, DType::kF16, out, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dequantd::cuda::testing
