// GPTQ's CUDA kernels (kernels/cuda/gptq_cuda.cu) against the CPU reference (which
// tests/server/gptq_vectors_test.cc pins to GPTQModel's own results), bit for bit: every variant,
// both orientations, bits 2/3/4/8, v1 and v2 zeros, with and without g_idx (act-order
// permutations), fp16/bf16 scales, fp16/bf16/fp32 output. GPU tests skip without a device; the
// variant and configuration checks run anywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/dequant_cuda.h"
#include "kernels/dequant.h"
#include "kernels/gptq_format.h"
#include "tests/cuda/cuda_test_util.h"

namespace dequantd::cuda::testing {
namespace {

// A GPTQ layer in host memory: random packed words (every bit pattern), random finite scales
// (some subnormal, some whose products overflow fp16) or, `nonfinite`, every fifth scale inf or a
// NaN with a payload, g_idx a random act-order permutation of k / G (each group keeps G rows) or
// none.
struct HostGptq {
  QuantShape shape;
  std::vector<int32_t> qweight, qzeros, g_idx;
  std::vector<uint16_t> scales;
  QuantView view() const {
    return gptq::MakeView(shape, qweight.data(), qzeros.data(), scales.data(),
                          g_idx.empty() ? nullptr : g_idx.data());
  }
};

HostGptq RandomGptq(const QuantShape& shape, uint32_t seed, bool nonfinite = false) {
  std::mt19937 rng(seed);
  HostGptq h;
  h.shape = shape;
  const auto words = [&](const TensorSpec& spec) {
    std::vector<int32_t> v(static_cast<size_t>(spec.elements()));
    for (int32_t& w : v) w = static_cast<int32_t>(rng());
    return v;
  };
  h.qweight = words(TensorSpecOf(shape, gptq::kQweight));
  h.qzeros = words(TensorSpecOf(shape, gptq::kQzeros));
  h.scales.resize(static_cast<size_t>(TensorSpecOf(shape, gptq::kScales).elements()));
  const bool bf16 = shape.scale_dtype == DType::kBF16;
  for (size_t i = 0; i < h.scales.size(); ++i) {
    uint16_t bits = static_cast<uint16_t>(rng());
    if ((bits & 0x7C00u) == 0x7C00u) bits &= 0xBFFFu;  // no inf / NaN in either dtype
    if (bf16 && (bits & 0x7F80u) == 0x7F80u) bits &= 0xBF7Fu;
    if (nonfinite && i % 5 == 0) {  // +-inf, quiet and signalling NaNs with payloads
      const uint16_t special[4][2] = {
          {0x7C00, 0x7F80}, {0xFC00, 0xFF80}, {0x7E15, 0x7FC5}, {0xFD01, 0xFF81}};
      bits = special[(i / 5) % 4][bf16 ? 1 : 0];
    }
    h.scales[i] = bits;
  }
  if ((shape.format_flags & gptq::kNoGidx) == 0) {
    std::vector<int32_t> order(static_cast<size_t>(shape.K));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    h.g_idx.resize(order.size());
    for (size_t j = 0; j < order.size(); ++j)
      h.g_idx[static_cast<size_t>(order[j])] = static_cast<int32_t>(j / shape.group_size);
  }
  return h;
}

struct Case {
  int64_t K, N, G;
  int bits;
  uint32_t flags;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "K" + std::to_string(c.K) + "_N" + std::to_string(c.N) + "_G" + std::to_string(c.G) +
         "_b" + std::to_string(c.bits) + ((c.flags & gptq::kZerosV1) ? "_v1" : "_v2") +
         ((c.flags & gptq::kNoGidx) ? "_noGidx" : "_gIdx");
}

class GptqCudaTest : public ::testing::TestWithParam<Case> {};

// Every variant, both orientations, fp16/bf16 scales into fp16/bf16/fp32 against the reference:
// bit for bit, or with `nonfinite` scales equal up to a NaN's bits (ExpectEqualOrBothNan).
void CheckEveryVariant(const Case& c, bool nonfinite) {
  for (DType scale : {DType::kF16, DType::kBF16}) {
    const HostGptq host = RandomGptq(gptq::MakeShape(c.K, c.N, c.G, c.bits, c.flags, scale),
                                     static_cast<uint32_t>(c.K * 31 + c.N * 7 + c.bits), nonfinite);
    DeviceBuffer qweight(host.qweight.size() * 4), qzeros(host.qzeros.size() * 4),
        scales(host.scales.size() * 2), g_idx(std::max<size_t>(host.g_idx.size(), 1) * 4);
    ASSERT_TRUE(qweight.ok() && qzeros.ok() && scales.ok() && g_idx.ok());
    ASSERT_EQ(
        cudaMemcpy(qweight.get(), host.qweight.data(), qweight.bytes(), cudaMemcpyHostToDevice),
        cudaSuccess);
    ASSERT_EQ(cudaMemcpy(qzeros.get(), host.qzeros.data(), qzeros.bytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(scales.get(), host.scales.data(), scales.bytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
    if (!host.g_idx.empty()) {
      ASSERT_EQ(
          cudaMemcpy(g_idx.get(), host.g_idx.data(), host.g_idx.size() * 4, cudaMemcpyHostToDevice),
          cudaSuccess);
    }
    for (Orientation o : {Orientation::kNK, Orientation::kKN}) {
      HostGptq oriented = host;
      oriented.shape.orientation = o;
      const QuantView device =
          gptq::MakeView(oriented.shape, qweight.get(), qzeros.get(), scales.get(),
                         host.g_idx.empty() ? nullptr : g_idx.get());
      for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
        std::vector<uint8_t> want(static_cast<size_t>(oriented.shape.output_bytes(out)));
        ASSERT_TRUE(
            DequantizeReference(oriented.view(), out, 0, oriented.shape.result_rows(), want.data())
                .ok());
        for (KernelVariant v : VariantsOf(Format::kGptq)) {
          for (const LaunchConfig& config : CandidateConfigs(v, oriented.shape, out)) {
            SCOPED_TRACE(std::string(VariantName(v)) + " " + config.ToString() + " " +
                         std::string(OrientationName(o)) + " " + std::string(DTypeName(scale)) +
                         "->" + std::string(DTypeName(out)));
            ExpectLaunchResult(v, device, out, want, nonfinite, config);
          }
        }
      }
    }
  }
}

TEST_P(GptqCudaTest, EveryVariantBothOrientationsBitExactToTheReference) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  CheckEveryVariant(GetParam(), false);
}

// inf and NaN scales (a checkpoint's bytes are not trusted to be finite): every finite result
// bit-exact, every NaN of the reference a NaN (its bits may differ; the count is printed).
TEST_P(GptqCudaTest, NonFiniteScalesEqualUpToNanBits) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  CheckEveryVariant(GetParam(), true);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GptqCudaTest,
    ::testing::Values(Case{128, 64, 32, 4, gptq::kZerosV1}, Case{128, 64, 64, 4, 0},
                      Case{256, 64, 128, 4, gptq::kZerosV1 | gptq::kNoGidx},
                      Case{128, 64, 128, 8, gptq::kZerosV1}, Case{128, 96, 64, 8, gptq::kNoGidx},
                      Case{128, 64, 64, 2, 0}, Case{128, 64, 32, 3, gptq::kZerosV1},
                      Case{96, 32, 32, 3, gptq::kNoGidx}, Case{4096, 1024, 128, 4, gptq::kZerosV1},
                      Case{1024, 4096, 128, 4, gptq::kNoGidx},
                      // v4: partial tiles along both axes (33 words of K, 40 columns), with and
                      // without g_idx; a group of 12 rows (not whole words: v4 runs v1's loop).
                      Case{264, 40, 24, 4, gptq::kZerosV1}, Case{264, 40, 24, 4, gptq::kNoGidx},
                      Case{96, 32, 12, 4, gptq::kNoGidx},
                      // 512 groups: v4's (N, K) shared memory over 48 KB (the opt-in launch).
                      Case{8192, 64, 16, 4, gptq::kZerosV1}),
    CaseName);

// v4's (K, N) kernel reads a word row's 8 groups as two 16-byte loads when g_idx is 16-byte
// aligned, one by one otherwise: g_idx placed 4 bytes into its buffer takes the second path.
TEST(GptqCudaV4Test, KnWithGidxNotSixteenByteAlignedBitExactToTheReference) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  for (DType scale : {DType::kF16, DType::kBF16}) {
    const HostGptq host =
        RandomGptq(gptq::MakeShape(256, 64, 32, 4, gptq::kZerosV1, scale, Orientation::kKN), 77);
    DeviceBuffer qweight(host.qweight.size() * 4), qzeros(host.qzeros.size() * 4),
        scales(host.scales.size() * 2), g_idx(host.g_idx.size() * 4 + 16);
    ASSERT_TRUE(qweight.ok() && qzeros.ok() && scales.ok() && g_idx.ok());
    auto* g_idx_at4 = static_cast<uint8_t*>(g_idx.get()) + 4;
    ASSERT_EQ(
        cudaMemcpy(qweight.get(), host.qweight.data(), qweight.bytes(), cudaMemcpyHostToDevice),
        cudaSuccess);
    ASSERT_EQ(cudaMemcpy(qzeros.get(), host.qzeros.data(), qzeros.bytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(scales.get(), host.scales.data(), scales.bytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(
        cudaMemcpy(g_idx_at4, host.g_idx.data(), host.g_idx.size() * 4, cudaMemcpyHostToDevice),
        cudaSuccess);
    const QuantView device =
        gptq::MakeView(host.shape, qweight.get(), qzeros.get(), scales.get(), g_idx_at4);
    for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(std::string(DTypeName(scale)) + "->" + std::string(DTypeName(out)));
      std::vector<uint8_t> want(static_cast<size_t>(host.shape.output_bytes(out)));
      ASSERT_TRUE(
          DequantizeReference(host.view(), out, 0, host.shape.result_rows(), want.data()).ok());
      DeviceBuffer result(want.size());
      ASSERT_TRUE(result.ok());
      ASSERT_EQ(cudaMemset(result.get(), 0xFF, result.bytes()), cudaSuccess);
      const absl::Status st = LaunchDequantize(KernelVariant::kV4Vec16, LaunchConfig{}, device, out,
                                               result.get(), nullptr);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint8_t> got(want.size());
      ASSERT_EQ(cudaMemcpy(got.data(), result.get(), got.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_TRUE(got == want);
    }
  }
}

// No device needed: the variants GPTQ implements and their launch parameters: none but for the
// (N, K) v4 tile kernel, whose tiles per block the autotuner chooses among five.
TEST(GptqCudaConfigTest, VariantsAndLaunchConfigurations) {
  const QuantShape nk = gptq::MakeShape(128, 64, 64, 4, 0);
  ASSERT_EQ(nk.orientation, Orientation::kNK);
  QuantShape kn = nk;
  kn.orientation = Orientation::kKN;
  const QuantShape nk_8bit = gptq::MakeShape(128, 64, 64, 8, 0);
  const std::vector<KernelVariant> variants = VariantsOf(Format::kGptq);
  EXPECT_EQ(variants,
            (std::vector<KernelVariant>{KernelVariant::kV1PerElement, KernelVariant::kV2PerWord,
                                        KernelVariant::kV4Vec16}));
  for (KernelVariant v : variants) {
    for (const QuantShape& shape : {nk, kn, nk_8bit}) {
      if (v == KernelVariant::kV4Vec16 && shape.orientation == Orientation::kNK &&
          shape.bits == 4) {
        continue;  // the tile shapes, below
      }
      EXPECT_TRUE(CanImplement(v, LaunchConfig{}, shape, DType::kF16).ok());
      EXPECT_FALSE(IsTunable(v, shape, DType::kF16));
      EXPECT_EQ(CandidateConfigs(v, shape, DType::kF16), std::vector<LaunchConfig>{LaunchConfig{}});
      const absl::Status s = CanImplement(v, LaunchConfig{.block_size = 128}, shape, DType::kF16);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("of gptq takes no launch parameters here"), std::string::npos)
          << s;
    }
  }
  // (N, K) 4-bit v4: block = 256, words = 1, rows = tiles along K per block; the first is the
  // default.
  const std::vector<LaunchConfig> tiles = {
      {256, 1, 4}, {256, 1, 2}, {256, 1, 1}, {256, 1, 8}, {256, 1, 16}};
  for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
    EXPECT_EQ(CandidateConfigs(KernelVariant::kV4Vec16, nk, out), tiles);
    EXPECT_EQ(DefaultConfig(KernelVariant::kV4Vec16, nk, out), tiles.front());
    for (const LaunchConfig& c : tiles)
      EXPECT_TRUE(CanImplement(KernelVariant::kV4Vec16, c, nk, out).ok());
  }
  for (const LaunchConfig& other : {LaunchConfig{.block_size = 256, .rows_per_thread = 3},
                                    LaunchConfig{.block_size = 128, .rows_per_thread = 4},
                                    LaunchConfig{.words_per_thread = 2, .rows_per_thread = 4}}) {
    const absl::Status s = CanImplement(KernelVariant::kV4Vec16, other, nk, DType::kBF16);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << other.ToString();
    EXPECT_NE(s.message().find("v4_vec16 of gptq (N, K) takes the tiles along K per block"),
              std::string::npos)
        << s;
  }
  // Tuned from 2^22 weights on: 4096 x 1024 is, 128 x 64 is not.
  EXPECT_FALSE(IsTunable(KernelVariant::kV4Vec16, nk, DType::kBF16));
  EXPECT_TRUE(
      IsTunable(KernelVariant::kV4Vec16, gptq::MakeShape(4096, 1024, 128, 4, 0), DType::kBF16));
  // More groups than the tiles' shared memory holds (K / G = 2048): no tiles, v1's loop.
  const QuantShape many_groups = gptq::MakeShape(32768, 64, 16, 4, 0);
  EXPECT_EQ(CandidateConfigs(KernelVariant::kV4Vec16, many_groups, DType::kBF16),
            std::vector<LaunchConfig>{LaunchConfig{}});
  const absl::Status v3 =
      CanImplement(KernelVariant::kV3PerWordBlock, LaunchConfig{}, nk, DType::kF16);
  EXPECT_EQ(v3.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v3.message(), "kernel variant v3_per_word_block is not implemented for format gptq");
}

}  // namespace
}  // namespace dequantd::cuda::testing
