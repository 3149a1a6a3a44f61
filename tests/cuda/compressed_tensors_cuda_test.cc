// compressed-tensors' CUDA kernels (kernels/cuda/compressed_tensors_cuda.cu) against the CPU
// reference (which tests/server/compressed_tensors_vectors_test.cc pins to compressed-tensors' own
// results), bit for bit: every variant, both orientations, int4 and int8, group / channel / tensor
// strategies, with and without zero points and weight_g_idx (act-order permutations), N not a
// multiple of 8, fp16/bf16/fp32 scales, fp16/bf16/fp32 output. GPU tests skip without a device;
// the variant and configuration checks run anywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/compressed_tensors_format.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/dequant.h"
#include "tests/cuda/cuda_test_util.h"

namespace dequantd::cuda::testing {
namespace {

namespace ct = compressed_tensors;

// A layer in host memory, one byte buffer per role (TensorSpecOf's bytes): random packed words
// (every bit pattern), random finite scales (`nonfinite`: every fifth scale inf or a NaN with a
// payload), g_idx a random act-order permutation of k / G (each
// group keeps G columns) or none, weight_shape (N, K).
struct HostLayer {
  QuantShape shape;
  std::array<std::vector<uint8_t>, ct::kRoleCount> roles;
  QuantView view() const {
    QuantView v;
    v.shape = shape;
    for (int r = 0; r < ct::kRoleCount; ++r)
      v.tensors[r] = roles[r].empty() ? nullptr : roles[r].data();
    return v;
  }
};

HostLayer RandomLayer(const QuantShape& shape, uint32_t seed, bool nonfinite = false) {
  std::mt19937 rng(seed);
  HostLayer h;
  h.shape = shape;
  for (int r = 0; r < ct::kRoleCount; ++r) {
    h.roles[r].resize(static_cast<size_t>(TensorSpecOf(shape, r).bytes()));
    for (uint8_t& b : h.roles[r]) b = static_cast<uint8_t>(rng());
  }
  auto& scales = h.roles[ct::kWeightScale];
  // +-inf, quiet and signalling NaNs with payloads, as fp16, bf16 and fp32.
  const uint32_t special[4][3] = {{0x7C00, 0x7F80, 0x7F800000u},
                                  {0xFC00, 0xFF80, 0xFF800000u},
                                  {0x7E15, 0x7FC5, 0x7FC00015u},
                                  {0xFD01, 0xFF81, 0xFF800101u}};
  if (shape.scale_dtype == DType::kF32) {
    for (size_t i = 0; i < scales.size(); i += 4) {
      float s = std::ldexp(static_cast<float>(rng() % 2000) - 1000.0f, -12);
      if (nonfinite && (i / 4) % 5 == 0) std::memcpy(&s, &special[(i / 20) % 4][2], 4);
      std::memcpy(&scales[i], &s, 4);
    }
  } else {
    const bool bf16 = shape.scale_dtype == DType::kBF16;
    for (size_t i = 0; i < scales.size(); i += 2) {
      uint16_t bits;
      std::memcpy(&bits, &scales[i], 2);
      if ((bits & 0x7C00u) == 0x7C00u) bits &= 0xBFFFu;  // no inf / NaN in either dtype
      if (bf16 && (bits & 0x7F80u) == 0x7F80u) bits &= 0xBF7Fu;
      if (nonfinite && (i / 2) % 5 == 0) bits = static_cast<uint16_t>(special[(i / 10) % 4][bf16]);
      std::memcpy(&scales[i], &bits, 2);
    }
  }
  if ((shape.format_flags & ct::kNoGidx) == 0) {
    std::vector<int32_t> order(static_cast<size_t>(shape.K));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t j = 0; j < order.size(); ++j) {
      const auto g = static_cast<int32_t>(static_cast<int64_t>(j) / shape.group_size);
      std::memcpy(&h.roles[ct::kWeightGidx][4 * static_cast<size_t>(order[j])], &g, 4);
    }
  }
  const int64_t nk[2] = {shape.N, shape.K};
  std::memcpy(h.roles[ct::kWeightShape].data(), nk, 16);
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
         "_b" + std::to_string(c.bits) + ((c.flags & ct::kSym) ? "_sym" : "_asym") +
         ((c.flags & ct::kNoGidx) ? "_noGidx" : "_gIdx") +
         ((c.flags & ct::kTensorScale) ? "_tensor" : "");
}

class CompressedTensorsCudaTest : public ::testing::TestWithParam<Case> {};

// Every variant, both orientations, fp16/bf16/fp32 scales into fp16/bf16/fp32 against the
// reference: bit for bit, or with `nonfinite` scales equal up to a NaN's bits
// (ExpectEqualOrBothNan).
void CheckEveryVariant(const Case& c, bool nonfinite) {
  for (DType scale : {DType::kF16, DType::kBF16, DType::kF32}) {
    const HostLayer host =
        RandomLayer(ct::MakeShape(c.K, c.N, c.G, c.bits, c.flags, scale),
                    static_cast<uint32_t>(c.K * 31 + c.N * 7 + c.bits), nonfinite);
    std::array<std::unique_ptr<DeviceBuffer>, ct::kRoleCount> device_roles;
    QuantView device;
    for (int r = 0; r < ct::kRoleCount; ++r) {
      const std::vector<uint8_t>& bytes = host.roles[r];
      device_roles[r] = std::make_unique<DeviceBuffer>(std::max<size_t>(bytes.size(), 4));
      ASSERT_TRUE(device_roles[r]->ok());
      ASSERT_EQ(
          cudaMemcpy(device_roles[r]->get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
          cudaSuccess);
      device.tensors[r] = bytes.empty() ? nullptr : device_roles[r]->get();
    }
    for (Orientation o : {Orientation::kNK, Orientation::kKN}) {
      HostLayer oriented = host;
      oriented.shape.orientation = o;
      device.shape = oriented.shape;
      for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
        std::vector<uint8_t> want(static_cast<size_t>(oriented.shape.output_bytes(out)));
        ASSERT_TRUE(
            DequantizeReference(oriented.view(), out, 0, oriented.shape.result_rows(), want.data())
                .ok());
        for (KernelVariant v : VariantsOf(Format::kCompressedTensors)) {
          SCOPED_TRACE(std::string(VariantName(v)) + " " + std::string(OrientationName(o)) + " " +
                       std::string(DTypeName(scale)) + "->" + std::string(DTypeName(out)));
          ExpectLaunchResult(v, device, out, want, nonfinite);
        }
      }
    }
  }
}

TEST_P(CompressedTensorsCudaTest, EveryVariantBothOrientationsBitExactToTheReference) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  CheckEveryVariant(GetParam(), false);
}

// inf and NaN scales (a checkpoint's bytes are not trusted to be finite): every finite result
// bit-exact, every NaN of the reference a NaN (its bits may differ; the count is printed).
TEST_P(CompressedTensorsCudaTest, NonFiniteScalesEqualUpToNanBits) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  CheckEveryVariant(GetParam(), true);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CompressedTensorsCudaTest,
    ::testing::Values(Case{128, 64, 32, 4, ct::kSym | ct::kNoGidx},
                      Case{256, 64, 64, 4, ct::kNoGidx}, Case{128, 40, 32, 4, ct::kNoGidx},
                      Case{128, 64, 32, 4, 0}, Case{128, 64, 128, 8, ct::kSym | ct::kNoGidx},
                      Case{128, 36, 128, 8, ct::kNoGidx},
                      Case{256, 64, 256, 4, ct::kSym | ct::kNoGidx | ct::kTensorScale},
                      Case{4096, 1024, 128, 4, ct::kSym | ct::kNoGidx},
                      Case{1024, 4096, 128, 8, ct::kNoGidx},
                      // v4: a partial last tile of chunks (K = 264) and of rows (N = 36, 40);
                      // groups of 12 (whole 4-value fp32 chunks, not 8-value ones); g_idx int8.
                      Case{264, 40, 24, 4, ct::kNoGidx}, Case{264, 36, 12, 4, ct::kNoGidx},
                      Case{264, 40, 24, 8, 0}),
    CaseName);

// No device needed: the variants compressed-tensors implements and their (absent) parameters.
TEST(CompressedTensorsCudaConfigTest, VariantsAndLaunchConfigurations) {
  const QuantShape shape = ct::MakeShape(128, 64, 64, 4, ct::kNoGidx);
  const std::vector<KernelVariant> variants = VariantsOf(Format::kCompressedTensors);
  EXPECT_EQ(variants,
            (std::vector<KernelVariant>{KernelVariant::kV1PerElement, KernelVariant::kV2PerWord,
                                        KernelVariant::kV4Vec16}));
  for (KernelVariant v : variants) {
    EXPECT_TRUE(CanImplement(v, LaunchConfig{}, shape, DType::kF16).ok());
    EXPECT_FALSE(IsTunable(v, shape, DType::kF16));
    const absl::Status s = CanImplement(v, LaunchConfig{.block_size = 128}, shape, DType::kF16);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("of compressed_tensors takes no launch parameters"),
              std::string::npos)
        << s;
  }
  EXPECT_EQ(
      CanImplement(KernelVariant::kV3PerWordBlock, LaunchConfig{}, shape, DType::kF16).message(),
      "kernel variant v3_per_word_block is not implemented for format compressed_tensors");
}

}  // namespace
}  // namespace dequantd::cuda::testing
