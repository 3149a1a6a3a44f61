// The autotuner's CUDA side on a real device (skipped without one).
#include "kernels/cuda/autotune_cuda.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace dequantd::cuda {
namespace {

bool HaveDevice() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

TEST(AutotuneCudaTest, ScratchTuningPicksACandidate_K4096N4096G128Fp16) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const AwqShape shape{4096, 4096, 128, DType::kF16};
  for (KernelVariant v : AllVariants()) {
    SCOPED_TRACE(std::string(VariantName(v)));
    absl::StatusOr<TuneEntry> e = TuneLaunchConfigScratch(v, shape, DType::kF16, nullptr);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_GT(e->seconds, 0);
    const std::vector<LaunchConfig> candidates = CandidateConfigs(v, shape, DType::kF16);
    EXPECT_NE(std::find(candidates.begin(), candidates.end(), ToLaunchConfig(e->config)),
              candidates.end());
  }
}

TEST(AutotuneCudaTest, GetOrTuneTunesOnceThenHits_K1536N8960G128Bf16) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const AwqShape shape{1536, 8960, 128, DType::kF16};
  void *qweight, *qzeros, *scales, *out;
  ASSERT_EQ(cudaMalloc(&qweight, shape.qweight_bytes()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&qzeros, shape.qzeros_bytes()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&scales, shape.scales_bytes()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, shape.output_bytes(DType::kBF16)), cudaSuccess);
  ASSERT_EQ(cudaMemset(qweight, 0x11, shape.qweight_bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(qzeros, 0x11, shape.qzeros_bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(scales, 0x3C, shape.scales_bytes()), cudaSuccess);
  PackedTensorView in{shape, static_cast<const int32_t*>(qweight),
                      static_cast<const int32_t*>(qzeros), scales};
  Autotuner tuner("");
  Autotuner::Result first, second;
  absl::StatusOr<LaunchConfig> a =
      GetOrTuneLaunchConfig(tuner, KernelVariant::kV4Vec16, in, DType::kBF16, out, nullptr, &first);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(first.tuned);
  absl::StatusOr<LaunchConfig> b = GetOrTuneLaunchConfig(tuner, KernelVariant::kV4Vec16, in,
                                                         DType::kBF16, out, nullptr, &second);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(second.tuned);
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(tuner.counters().tunes, 1u);
  EXPECT_EQ(tuner.counters().hits, 1u);
  // A single-candidate variant is not tuned at all.
  absl::StatusOr<LaunchConfig> v1 =
      GetOrTuneLaunchConfig(tuner, KernelVariant::kV1PerElement, in, DType::kBF16, out, nullptr);
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ(*v1, DefaultConfig(KernelVariant::kV1PerElement, shape, DType::kBF16));
  EXPECT_EQ(tuner.counters().tunes, 1u);
  cudaFree(qweight);
  cudaFree(qzeros);
  cudaFree(scales);
  cudaFree(out);
}

}  // namespace
}  // namespace dequantd::cuda
