// FP8 block-scaled's CUDA kernels (kernels/cuda/fp8_block_cuda.cu) against the CPU reference
// (which tests/server/fp8_block_vectors_test.cc pins to DeepSeek's own results), bit for bit:
// every variant, both orientations, fp32/bf16/fp16 scales, fp16/bf16/fp32 output, shapes with
// partial blocks, K not a multiple of 16 (v4's per-element fallback) and an output pointer that is
// not 16-byte aligned. GPU tests skip without a device; the variant and configuration checks run
// anywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/dequant.h"
#include "kernels/fp8_block_format.h"
#include "tests/cuda/cuda_test_util.h"

namespace dequantd::cuda::testing {
namespace {

// An fp8_block layer in host memory: random E4M3 bytes (every finite value; the NaN bytes 0x7F /
// 0xFF are left out because NaN payloads differ between host and device conversions), random
// finite scales of both signs over a wide exponent range (fp16 products overflow and underflow).
struct HostFp8 {
  QuantShape shape;
  std::vector<uint8_t> weight;
  std::vector<uint8_t> scales;  // scale_dtype elements, little-endian
  QuantView view() const { return fp8_block::MakeView(shape, weight.data(), scales.data()); }
};

HostFp8 RandomFp8(const QuantShape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  HostFp8 h;
  h.shape = shape;
  h.weight.resize(static_cast<size_t>(shape.N * shape.K));
  for (uint8_t& b : h.weight) {
    b = static_cast<uint8_t>(rng());
    if ((b & 0x7F) == 0x7F) b &= 0xFE;  // no NaN
  }
  const TensorSpec spec = TensorSpecOf(shape, fp8_block::kWeightScaleInv);
  h.scales.resize(static_cast<size_t>(spec.bytes()));
  for (int64_t i = 0; i < spec.elements(); ++i) {
    if (shape.scale_dtype == DType::kF32) {
      // sign, exponent 2^-30 .. 2^12, random mantissa.
      const uint32_t bits =
          (rng() & 0x80000000u) | ((97u + rng() % 43u) << 23) | (rng() & 0x7FFFFFu);
      std::memcpy(h.scales.data() + i * 4, &bits, 4);
    } else {
      uint16_t bits = static_cast<uint16_t>(rng());
      if (shape.scale_dtype == DType::kF16 && (bits & 0x7C00u) == 0x7C00u) bits &= 0xBFFFu;
      if (shape.scale_dtype == DType::kBF16 && (bits & 0x7F80u) == 0x7F80u) bits &= 0xBF7Fu;
      std::memcpy(h.scales.data() + i * 2, &bits, 2);
    }
  }
  return h;
}

struct Case {
  int64_t N, K;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return absl::StrCat("N", info.param.N, "_K", info.param.K);
}

class Fp8BlockCudaTest : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8BlockCudaTest, EveryVariantBothOrientationsBitExactToTheReference) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  for (DType scale : {DType::kF32, DType::kBF16, DType::kF16}) {
    const HostFp8 host =
        RandomFp8(fp8_block::MakeShape(c.K, c.N, scale),
                  static_cast<uint32_t>(c.N * 31 + c.K * 7 + static_cast<int>(scale)));
    DeviceBuffer weight(host.weight.size()), scales(host.scales.size());
    ASSERT_TRUE(weight.ok() && scales.ok());
    ASSERT_EQ(cudaMemcpy(weight.get(), host.weight.data(), weight.bytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(scales.get(), host.scales.data(), scales.bytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
    for (Orientation o : {Orientation::kNK, Orientation::kKN}) {
      HostFp8 oriented = host;
      oriented.shape.orientation = o;
      const QuantView device = fp8_block::MakeView(oriented.shape, weight.get(), scales.get());
      for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
        std::vector<uint8_t> want(static_cast<size_t>(oriented.shape.output_bytes(out)));
        ASSERT_TRUE(
            DequantizeReference(oriented.view(), out, 0, oriented.shape.result_rows(), want.data())
                .ok());
        // 16 bytes of slack: the second launch writes at an offset of one element (misaligned).
        DeviceBuffer result(want.size() + 16);
        ASSERT_TRUE(result.ok());
        for (KernelVariant v : VariantsOf(Format::kFp8Block)) {
          for (int64_t offset : {int64_t{0}, DTypeSize(out)}) {
            SCOPED_TRACE(std::string(VariantName(v)) + " " + std::string(OrientationName(o)) + " " +
                         std::string(DTypeName(scale)) + "->" + std::string(DTypeName(out)) +
                         " offset " + std::to_string(offset));
            ASSERT_EQ(cudaMemset(result.get(), 0xFF, result.bytes()), cudaSuccess);
            void* dst = static_cast<char*>(result.get()) + offset;
            const absl::Status st = LaunchDequantize(v, LaunchConfig{}, device, out, dst, nullptr);
            ASSERT_TRUE(st.ok()) << st;
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            std::vector<uint8_t> got(want.size());
            ASSERT_EQ(cudaMemcpy(got.data(), dst, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
            EXPECT_TRUE(got == want);
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8BlockCudaTest,
                         ::testing::Values(Case{136, 144}, Case{144, 128}, Case{1, 16},
                                           Case{300, 200}, Case{257, 129}, Case{128, 1},
                                           Case{1024, 4096}, Case{4096, 1024}),
                         CaseName);

// No device needed: the variants fp8_block implements and their (absent) launch parameters.
TEST(Fp8BlockCudaConfigTest, VariantsAndLaunchConfigurations) {
  const QuantShape shape = fp8_block::MakeShape(256, 128);
  const std::vector<KernelVariant> variants = VariantsOf(Format::kFp8Block);
  EXPECT_EQ(variants,
            (std::vector<KernelVariant>{KernelVariant::kV1PerElement, KernelVariant::kV4Vec16}));
  for (KernelVariant v : variants) {
    EXPECT_TRUE(CanImplement(v, LaunchConfig{}, shape, DType::kBF16).ok());
    EXPECT_FALSE(IsTunable(v, shape, DType::kBF16));
    EXPECT_EQ(CandidateConfigs(v, shape, DType::kBF16), std::vector<LaunchConfig>{LaunchConfig{}});
    const absl::Status s = CanImplement(v, LaunchConfig{.block_size = 128}, shape, DType::kBF16);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("of fp8_block takes no launch parameters"), std::string::npos) << s;
  }
  const absl::Status v2 =
      CanImplement(KernelVariant::kV2PerWord, LaunchConfig{}, shape, DType::kF16);
  EXPECT_EQ(v2.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v2.message(), "kernel variant v2_per_word is not implemented for format fp8_block");
}

}  // namespace
}  // namespace dequantd::cuda::testing
