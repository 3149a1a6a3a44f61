// Host-only checks of the CUDA kernel API: names, CanImplement, DefaultConfig, CandidateConfigs.
// No device needed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/dequant_cuda.h"

namespace dequantd::cuda {
namespace {

QuantShape Shape(int64_t K, int64_t N, int64_t G, DType scale = DType::kF16) {
  return QuantShape{.K = K, .N = N, .group_size = G, .scale_dtype = scale};
}

TEST(VariantNameTest, RoundTripsEveryVariant) {
  ASSERT_EQ(AllVariants().size(), 4u);
  for (KernelVariant v : AllVariants()) {
    KernelVariant parsed{};
    ASSERT_TRUE(ParseVariant(VariantName(v), &parsed)) << VariantName(v);
    EXPECT_EQ(parsed, v);
  }
  EXPECT_EQ(VariantName(KernelVariant::kV4Vec16), "v4_vec16");
  KernelVariant parsed{};
  EXPECT_TRUE(ParseVariant("v3", &parsed));
  EXPECT_EQ(parsed, KernelVariant::kV3PerWordBlock);
  EXPECT_FALSE(ParseVariant("v5", &parsed));
  EXPECT_FALSE(ParseVariant("", &parsed));
}

TEST(LaunchConfigTest, ToString) {
  EXPECT_EQ(
      (LaunchConfig{.block_size = 128, .words_per_thread = 4, .rows_per_thread = 2}).ToString(),
      "block=128,words=4,rows=2");
}

TEST(CanImplementTest, V1AndV2TakeOnlyTheDefaultConfig) {
  const QuantShape s = Shape(128, 4096, 128);
  for (KernelVariant v : {KernelVariant::kV1PerElement, KernelVariant::kV2PerWord}) {
    EXPECT_TRUE(CanImplement(v, LaunchConfig{}, s, DType::kF16).ok());
    EXPECT_EQ(CanImplement(v, {.block_size = 128}, s, DType::kF16).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(CanImplementTest, V3BlockSize) {
  const QuantShape s = Shape(64, 24, 32);
  for (int b : {32, 64, 992, 1024})
    EXPECT_TRUE(
        CanImplement(KernelVariant::kV3PerWordBlock, {.block_size = b}, s, DType::kF32).ok())
        << b;
  for (int b : {0, 16, 48, 1056, 2048})
    EXPECT_EQ(
        CanImplement(KernelVariant::kV3PerWordBlock, {.block_size = b}, s, DType::kF32).code(),
        absl::StatusCode::kInvalidArgument)
        << b;
  EXPECT_EQ(
      CanImplement(KernelVariant::kV3PerWordBlock, {.words_per_thread = 2}, s, DType::kF16).code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(CanImplementTest, V4WordsMustDivideWordsPerRow) {
  // N = 24: 3 words per row, so only words_per_thread = 1.
  const QuantShape n24 = Shape(64, 24, 32);
  EXPECT_TRUE(
      CanImplement(KernelVariant::kV4Vec16, {.words_per_thread = 1}, n24, DType::kF16).ok());
  EXPECT_EQ(CanImplement(KernelVariant::kV4Vec16, {.words_per_thread = 2}, n24, DType::kF16).code(),
            absl::StatusCode::kInvalidArgument);
  // N = 1440: 180 words, divisible by 4.
  EXPECT_TRUE(CanImplement(KernelVariant::kV4Vec16, {.words_per_thread = 4}, Shape(64, 1440, 64),
                           DType::kBF16)
                  .ok());
  EXPECT_EQ(CanImplement(KernelVariant::kV4Vec16, {.words_per_thread = 3}, Shape(64, 1440, 64),
                         DType::kBF16)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CanImplementTest, V4RowsMustDivideGroupSize) {
  EXPECT_TRUE(
      CanImplement(KernelVariant::kV4Vec16, {.rows_per_thread = 8}, Shape(128, 64, 32), DType::kF16)
          .ok());
  EXPECT_EQ(
      CanImplement(KernelVariant::kV4Vec16, {.rows_per_thread = 2}, Shape(1, 64, 1), DType::kF16)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      CanImplement(KernelVariant::kV4Vec16, {.rows_per_thread = 3}, Shape(96, 64, 96), DType::kF16)
          .code(),
      absl::StatusCode::kInvalidArgument);
  // Tile of 4 x 8 = 32 words exceeds kV4MaxTileWords.
  EXPECT_EQ(CanImplement(KernelVariant::kV4Vec16, {.words_per_thread = 4, .rows_per_thread = 8},
                         Shape(128, 64, 128), DType::kF16)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      CanImplement(KernelVariant::kV4Vec16, {.block_size = 1024}, Shape(128, 64, 128), DType::kF16)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(CanImplementTest, RejectsInvalidShapeForEveryVariant) {
  for (KernelVariant v : AllVariants()) {
    EXPECT_EQ(CanImplement(v, DefaultConfig(v, Shape(128, 4096, 128), DType::kF16),
                           Shape(100, 4096, 128), DType::kF16)
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << VariantName(v);
  }
}

// AWQ (N, K): v4 is the tile transpose, whose one parameter is the tiles along K per block
// (rows_per_thread) in 256-thread blocks; 1 (the fastest measured) is the default.
TEST(CanImplementTest, V4NkTakesTilesAlongKPerBlock) {
  QuantShape nk{.K = 4096, .N = 14336, .group_size = 128, .scale_dtype = DType::kF16};
  nk.orientation = Orientation::kNK;
  const LaunchConfig one{.block_size = 256, .words_per_thread = 1, .rows_per_thread = 1};
  const LaunchConfig two{.block_size = 256, .words_per_thread = 1, .rows_per_thread = 2};
  const LaunchConfig four{.block_size = 256, .words_per_thread = 1, .rows_per_thread = 4};
  EXPECT_EQ(DefaultConfig(KernelVariant::kV4Vec16, nk, DType::kBF16), one);
  EXPECT_EQ(CandidateConfigs(KernelVariant::kV4Vec16, nk, DType::kBF16),
            (std::vector<LaunchConfig>{one, two, four}));
  EXPECT_TRUE(IsTunable(KernelVariant::kV4Vec16, nk, DType::kBF16));
  for (const LaunchConfig& bad : {LaunchConfig{.block_size = 128}, LaunchConfig{.block_size = 512},
                                  LaunchConfig{.block_size = 256, .rows_per_thread = 8},
                                  LaunchConfig{.block_size = 256, .words_per_thread = 2}}) {
    const absl::Status s = CanImplement(KernelVariant::kV4Vec16, bad, nk, DType::kBF16);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.ToString();
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("tiles along K per block"));
  }
}

TEST(CandidateConfigsTest, AllImplementableAndIncludeTheDefault) {
  const QuantShape shapes[] = {Shape(1, 8, 1),
                               Shape(64, 24, 32),
                               Shape(128, 1440, 128),
                               Shape(10944, 4672, 64),
                               Shape(4096, 14336, 128, DType::kBF16),
                               Shape(1536, 1536, 128)};
  for (const QuantShape& s : shapes) {
    for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
      for (KernelVariant v : AllVariants()) {
        SCOPED_TRACE(testing::Message()
                     << VariantName(v) << " K=" << s.K << " N=" << s.N << " G=" << s.group_size);
        const LaunchConfig def = DefaultConfig(v, s, out);
        EXPECT_TRUE(CanImplement(v, def, s, out).ok()) << def.ToString();
        const std::vector<LaunchConfig> c = CandidateConfigs(v, s, out);
        ASSERT_FALSE(c.empty());
        EXPECT_LE(c.size(), 16u);
        EXPECT_NE(std::find(c.begin(), c.end(), def), c.end());
        for (const LaunchConfig& config : c)
          EXPECT_TRUE(CanImplement(v, config, s, out).ok()) << config.ToString();
      }
    }
  }
}

// The rule-based default: v4 on small layers (< 4M outputs) is not timed; mid and large layers
// are; variants with one candidate never are.
TEST(IsTunableTest, SmallLayersTakeTheDefaultLargerOnesAreTuned) {
  for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
    EXPECT_FALSE(IsTunable(KernelVariant::kV4Vec16, Shape(1536, 1536, 128), out));
    EXPECT_FALSE(IsTunable(KernelVariant::kV4Vec16, Shape(2048, 2040, 128), out));  // 4M - 16K
    EXPECT_TRUE(IsTunable(KernelVariant::kV4Vec16, Shape(2048, 2048, 128), out));   // 4M
    EXPECT_TRUE(IsTunable(KernelVariant::kV4Vec16, Shape(1536, 8960, 128), out));
    EXPECT_TRUE(IsTunable(KernelVariant::kV4Vec16, Shape(8192, 28672, 128, DType::kBF16), out));
    EXPECT_TRUE(IsTunable(KernelVariant::kV3PerWordBlock, Shape(1536, 1536, 128), out));
    EXPECT_FALSE(IsTunable(KernelVariant::kV2PerWord, Shape(8192, 28672, 128), out));
    EXPECT_FALSE(IsTunable(KernelVariant::kV1PerElement, Shape(8192, 28672, 128), out));
  }
}

}  // namespace
}  // namespace dequantd::cuda
