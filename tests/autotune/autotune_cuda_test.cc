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

TEST(AutotuneCudaTest, TuningPicksACandidate_K4096N4096G128Fp16) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const QuantShape shape{4096, 4096, 128, DType::kF16};
  for (KernelVariant v : AllVariants()) {
    for (TuneObjective objective : {TuneObjective::kLatency, TuneObjective::kThroughput}) {
      SCOPED_TRACE(std::string(VariantName(v)) + " " + std::string(TuneObjectiveName(objective)));
      absl::StatusOr<TuneEntry> e = TuneLaunchConfig(v, shape, DType::kF16, objective);
      ASSERT_TRUE(e.ok()) << e.status();
      EXPECT_GT(e->seconds, 0);
      const std::vector<LaunchConfig> candidates = CandidateConfigs(v, shape, DType::kF16);
      EXPECT_NE(std::find(candidates.begin(), candidates.end(), e->config), candidates.end());
    }
  }
}

TEST(AutotuneCudaTest, MeasureGivesEveryCandidateItsRounds_K1536N8960G128Bf16) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const QuantShape shape{1536, 8960, 128, DType::kBF16};
  const std::vector<LaunchConfig> candidates =
      CandidateConfigs(KernelVariant::kV4Vec16, shape, DType::kBF16);
  TuneOptions options;
  options.rounds = 3;
  absl::StatusOr<std::vector<CandidateSamples>> samples = MeasureCandidates(
      KernelVariant::kV4Vec16, shape, DType::kBF16, TuneObjective::kLatency, candidates, options);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    EXPECT_EQ((*samples)[i].config, candidates[i]);
    ASSERT_EQ((*samples)[i].seconds.size(), 3u);
    for (double s : (*samples)[i].seconds) EXPECT_GT(s, 0);
  }
  // A candidate the variant cannot run is refused before anything is timed.
  const LaunchConfig bad{.block_size = 100};
  EXPECT_EQ(MeasureCandidates(KernelVariant::kV4Vec16, shape, DType::kBF16, TuneObjective::kLatency,
                              {&bad, 1})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AutotuneCudaTest, GetOrTuneTunesOnceThenHits_K1536N8960G128) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const QuantShape shape{1536, 8960, 128, DType::kF16};
  absl::StatusOr<TuneDevice> device = ReadTuneDevice(0);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_FALSE(device->name.empty());
  EXPECT_GE(device->compute_capability, 70);
  Autotuner tuner;
  Autotuner::Result first, second;
  absl::StatusOr<LaunchConfig> a = GetOrTuneLaunchConfig(
      tuner, *device, KernelVariant::kV4Vec16, shape, DType::kBF16, kDequantizeObjective, &first);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(first.tuned);
  absl::StatusOr<LaunchConfig> b = GetOrTuneLaunchConfig(
      tuner, *device, KernelVariant::kV4Vec16, shape, DType::kBF16, kDequantizeObjective, &second);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(second.tuned);
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(tuner.counters().tunings, 1u);
  EXPECT_EQ(tuner.counters().hits, 1u);
  // A single-candidate variant is not tuned nor counted.
  absl::StatusOr<LaunchConfig> v1 = GetOrTuneLaunchConfig(
      tuner, *device, KernelVariant::kV1PerElement, shape, DType::kBF16, kDequantizeObjective);
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ(*v1, DefaultConfig(KernelVariant::kV1PerElement, shape, DType::kBF16));
  EXPECT_EQ(tuner.counters().tunings, 1u);
  EXPECT_EQ(tuner.counters().hits + tuner.counters().misses, 2u);
}

}  // namespace
}  // namespace dequantd::cuda
