// MXFP4's CUDA kernels (kernels/cuda/mxfp4_cuda.cu) against the CPU reference (which
// tests/server/mxfp4_vectors_test.cc pins to transformers' own results), bit for bit: every
// variant, both orientations, fp16/bf16/fp32 output, stacked experts, every byte and every scale
// (0xFF's inf and NaN included: every path writes the same NaN bits), an odd number of blocks per
// row (the transpose tile's partial block pair), N not a multiple of the tile, and blocks or
// output pointers that are not 16-byte aligned (v4's per-element fallback). GPU tests skip without
// a device; the variant and configuration checks run anywhere.
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
#include "kernels/mxfp4_format.h"
#include "tests/cuda/cuda_test_util.h"

namespace dequantd::cuda::testing {
namespace {

struct Case {
  int64_t E, K, N;
  // Scales in [103, 142] (real checkpoints' are near 127), one in 16 anywhere; otherwise every
  // byte value alike (0xFF, the NaN scale, included).
  bool near_one_scales = false;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return absl::StrCat("E", info.param.E, "_K", info.param.K, "_N", info.param.N,
                      info.param.near_one_scales ? "_nearOneScales" : "");
}

class Mxfp4CudaTest : public ::testing::TestWithParam<Case> {};

TEST_P(Mxfp4CudaTest, EveryVariantBothOrientationsBitExactToTheReference) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const QuantShape shape = mxfp4::MakeShape(c.K, c.N, c.E);
  std::mt19937 rng(static_cast<uint32_t>(c.E * 131 + c.K * 7 + c.N));
  std::vector<uint8_t> blocks(static_cast<size_t>(TensorSpecOf(shape, mxfp4::kBlocks).bytes()));
  std::vector<uint8_t> scales(static_cast<size_t>(TensorSpecOf(shape, mxfp4::kScales).bytes()));
  for (uint8_t& b : blocks) b = static_cast<uint8_t>(rng());
  for (uint8_t& s : scales) {
    const uint32_t r = rng();
    s = static_cast<uint8_t>(c.near_one_scales && r % 16 != 0 ? 103 + (r >> 4) % 40 : r);
  }
  // 16 bytes of slack: the second launch reads the blocks one byte in (misaligned).
  DeviceBuffer d_blocks(blocks.size() + 16), d_scales(scales.size());
  ASSERT_TRUE(d_blocks.ok() && d_scales.ok());
  for (int64_t in_offset : {int64_t{0}, int64_t{1}}) {
    void* blocks_at = static_cast<char*>(d_blocks.get()) + in_offset;
    ASSERT_EQ(cudaMemcpy(blocks_at, blocks.data(), blocks.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_scales.get(), scales.data(), scales.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    for (Orientation o : {Orientation::kKN, Orientation::kNK}) {
      QuantShape oriented = shape;
      oriented.orientation = o;
      const QuantView host = mxfp4::MakeView(oriented, blocks.data(), scales.data());
      const QuantView device = mxfp4::MakeView(oriented, blocks_at, d_scales.get());
      for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
        std::vector<uint8_t> want(static_cast<size_t>(oriented.output_bytes(out)));
        ASSERT_TRUE(DequantizeReference(host, out, 0, oriented.result_rows(), want.data()).ok());
        DeviceBuffer result(want.size() + 16);
        ASSERT_TRUE(result.ok());
        for (KernelVariant v : VariantsOf(Format::kMxfp4)) {
          for (const LaunchConfig& config : CandidateConfigs(v, oriented, out)) {
            for (int64_t out_offset : {int64_t{0}, DTypeSize(out)}) {
              SCOPED_TRACE(std::string(VariantName(v)) + " " + config.ToString() + " " +
                           std::string(OrientationName(o)) + " " + std::string(DTypeName(out)) +
                           " blocks offset " + std::to_string(in_offset) + " out offset " +
                           std::to_string(out_offset));
              ASSERT_EQ(cudaMemset(result.get(), 0xFF, result.bytes()), cudaSuccess);
              void* dst = static_cast<char*>(result.get()) + out_offset;
              const absl::Status st = LaunchDequantize(v, config, device, out, dst, nullptr);
              ASSERT_TRUE(st.ok()) << st;
              ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
              std::vector<uint8_t> got(want.size());
              ASSERT_EQ(cudaMemcpy(got.data(), dst, got.size(), cudaMemcpyDeviceToHost),
                        cudaSuccess);
              EXPECT_TRUE(got == want);
            }
          }
        }
      }
    }
  }
}

// gpt-oss-20b's down_proj is (E, K, N) = (32, 2880, 2880) (90 blocks per row); a slice of experts
// keeps the test small.
INSTANTIATE_TEST_SUITE_P(Shapes, Mxfp4CudaTest,
                         ::testing::Values(Case{2, 64, 64}, Case{2, 32, 64}, Case{1, 32, 1},
                                           Case{3, 96, 70}, Case{5, 160, 300}, Case{2, 2880, 640},
                                           Case{1, 4096, 1024},
                                           // (E, K, N) v4: an odd number of blocks per row
                                           // (the last pair has one), one column group.
                                           Case{3, 96, 64}, Case{3, 96, 64, true},
                                           Case{1, 32, 8, true}, Case{2, 2880, 640, true},
                                           // (E, K, N) tiles: a partial last tile of rows n
                                           // for every tile shape, 9 blocks per row
                                           Case{2, 288, 200},
                                           // fp32 tiles with half an octet of rows n last
                                           Case{2, 64, 36}),
                         CaseName);

// No device needed: the variants mxfp4 implements and their launch parameters: none but for the
// (E, K, N) v4 tile kernel, whose tile shape the autotuner chooses among five per output dtype.
TEST(Mxfp4CudaConfigTest, VariantsAndLaunchConfigurations) {
  const QuantShape kn = mxfp4::MakeShape(2880, 5760, 32);
  QuantShape nk = kn;
  nk.orientation = Orientation::kNK;
  const std::vector<KernelVariant> variants = VariantsOf(Format::kMxfp4);
  EXPECT_EQ(variants,
            (std::vector<KernelVariant>{KernelVariant::kV1PerElement, KernelVariant::kV4Vec16}));
  for (const QuantShape& shape : {kn, nk}) {
    const absl::Status s = CanImplement(KernelVariant::kV1PerElement,
                                        LaunchConfig{.block_size = 128}, shape, DType::kBF16);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("v1_per_element of mxfp4 takes no launch parameters here"),
              std::string::npos)
        << s;
    EXPECT_FALSE(IsTunable(KernelVariant::kV1PerElement, shape, DType::kBF16));
  }
  EXPECT_FALSE(IsTunable(KernelVariant::kV4Vec16, nk, DType::kBF16));
  EXPECT_EQ(CandidateConfigs(KernelVariant::kV4Vec16, nk, DType::kBF16),
            std::vector<LaunchConfig>{LaunchConfig{}});

  // (E, K, N): block = threads, words = blocks of 32 inputs k per tile, rows = rows n / 32.
  const std::vector<LaunchConfig> half_tiles = {
      {256, 8, 4}, {256, 8, 2}, {256, 4, 4}, {128, 4, 2}, {128, 2, 4}};
  const std::vector<LaunchConfig> f32_tiles = {
      {256, 8, 2}, {256, 8, 1}, {256, 4, 2}, {128, 4, 1}, {128, 2, 2}};
  for (DType out : {DType::kF16, DType::kBF16}) {
    EXPECT_EQ(CandidateConfigs(KernelVariant::kV4Vec16, kn, out), half_tiles);
    EXPECT_EQ(DefaultConfig(KernelVariant::kV4Vec16, kn, out), half_tiles.front());
  }
  EXPECT_EQ(CandidateConfigs(KernelVariant::kV4Vec16, kn, DType::kF32), f32_tiles);
  EXPECT_TRUE(IsTunable(KernelVariant::kV4Vec16, kn, DType::kBF16));
  EXPECT_FALSE(IsTunable(KernelVariant::kV4Vec16, mxfp4::MakeShape(64, 64, 2), DType::kBF16));
  const absl::Status f32_tile_for_bf16 =
      CanImplement(KernelVariant::kV4Vec16, f32_tiles[1], kn, DType::kBF16);
  EXPECT_EQ(f32_tile_for_bf16.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f32_tile_for_bf16.message().find("v4_vec16 of mxfp4 (E, K, N) takes a tile shape"),
            std::string::npos)
      << f32_tile_for_bf16;
  EXPECT_NE(f32_tile_for_bf16.message().find("got block=256,words=8,rows=1"), std::string::npos);

  const absl::Status v2 = CanImplement(KernelVariant::kV2PerWord, LaunchConfig{}, kn, DType::kF16);
  EXPECT_EQ(v2.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v2.message(), "kernel variant v2_per_word is not implemented for format mxfp4");
}

}  // namespace
}  // namespace dequantd::cuda::testing
