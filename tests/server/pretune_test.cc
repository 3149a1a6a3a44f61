// Pretune and DistinctLayerShapes (server/backend/pretune.h) without a GPU: a fake TuneTarget, the
// real autotuner (kernels/autotune.h).
#include "server/backend/pretune.h"

#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

using ::testing::HasSubstr;

const TuneDevice kH200{"NVIDIA H200", 90};

QuantizedLayer Layer(const std::string& name, int64_t K, int64_t N, int64_t G, DType scales) {
  QuantizedLayer layer;
  layer.name = name;
  layer.view.shape = QuantShape{K, N, G, scales};
  return layer;
}

TEST(DistinctLayerShapesTest, OnePerKNGroupAndScaleDtypeInFirstAppearanceOrder) {
  const std::vector<QuantizedLayer> layers = {
      Layer("l0.q_proj", 1536, 1536, 128, DType::kF16),
      Layer("l0.up_proj", 1536, 8960, 128, DType::kF16),
      Layer("l1.q_proj", 1536, 1536, 128, DType::kF16),   // same as l0.q_proj
      Layer("l1.k_proj", 1536, 1536, 64, DType::kF16),    // other group size
      Layer("l1.v_proj", 1536, 1536, 128, DType::kBF16),  // other scale dtype
      Layer("l1.up_proj", 1536, 8960, 128, DType::kF16),  // same as l0.up_proj
      Layer("l1.down_proj", 8960, 1536, 128, DType::kF16),
  };
  const std::vector<QuantShape> shapes = DistinctLayerShapes(layers);
  ASSERT_EQ(shapes.size(), 5u);
  auto expect = [&](size_t i, int64_t K, int64_t N, int64_t G, DType s) {
    SCOPED_TRACE(i);
    EXPECT_EQ(shapes[i].K, K);
    EXPECT_EQ(shapes[i].N, N);
    EXPECT_EQ(shapes[i].group_size, G);
    EXPECT_EQ(shapes[i].scale_dtype, s);
  };
  expect(0, 1536, 1536, 128, DType::kF16);
  expect(1, 1536, 8960, 128, DType::kF16);
  expect(2, 1536, 1536, 64, DType::kF16);
  expect(3, 1536, 1536, 128, DType::kBF16);
  expect(4, 8960, 1536, 128, DType::kF16);
  EXPECT_TRUE(DistinctLayerShapes({}).empty());
}

// A target whose candidate counts and failures are scripted per K.
class FakeTarget final : public TuneTarget {
 public:
  TuneKey Key(const QuantShape& shape, DType out_dtype) const override {
    return TuneKey::For(kH200, "v4_vec16", shape, out_dtype, TuneObjective::kLatency);
  }
  int CandidateCount(const QuantShape& shape, DType) const override {
    return shape.K == 128 ? 1 : 5;  // K = 128: a single candidate, nothing to tune
  }
  absl::StatusOr<TuneEntry> Tune(const QuantShape& shape, DType out_dtype) override {
    tuned.push_back(Key(shape, out_dtype));
    if (shape.K == 512) return absl::InternalError("scripted failure");
    return TuneEntry{cuda::LaunchConfig{static_cast<int>(shape.N / 8), 1, 1}, 1e-5};
  }
  std::vector<TuneKey> tuned;  // Tune calls, in order
};

TEST(PretuneTest, TunesOnlyWhatIsTunableAndNotCached) {
  Autotuner tuner;
  FakeTarget target;
  const QuantShape cached{256, 512, 128};
  const TuneEntry winner{cuda::LaunchConfig{128, 1, 2}, 2.5e-5};
  ASSERT_TRUE(tuner
                  .GetOrTune(target.Key(cached, DType::kF16), 5,
                             [&] { return absl::StatusOr<TuneEntry>(winner); })
                  .ok());
  const std::vector<QuantShape> shapes = {
      QuantShape{128, 256, 128},  // untunable
      cached,                     // already cached
      QuantShape{512, 256, 128},  // fails
      QuantShape{1024, 2048, 128},
      QuantShape{2048, 1024, 128, DType::kBF16},
  };
  const DType dtypes[] = {DType::kF16};
  const PretuneReport report = Pretune(tuner, target, shapes, dtypes);
  EXPECT_EQ(report.keys, 5);
  EXPECT_EQ(report.untunable, 1);
  EXPECT_EQ(report.cached, 1);
  EXPECT_EQ(report.failed, 1);
  EXPECT_EQ(report.tuned, 2);
  EXPECT_EQ(report.first_error.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(report.first_error.message(), HasSubstr("512x256"));
  ASSERT_EQ(target.tuned.size(), 3u);  // not the untunable nor the cached shape
  EXPECT_EQ(target.tuned[0].K, 512);
  EXPECT_EQ(target.tuned[1].K, 1024);
  EXPECT_EQ(target.tuned[2].K, 2048);
  EXPECT_EQ(target.tuned[2].scale_dtype, DType::kBF16);
  std::optional<TuneEntry> held = tuner.Peek(target.Key(shapes[3], DType::kF16));
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->config.block_size, 2048 / 8);
  EXPECT_EQ(tuner.Peek(target.Key(cached, DType::kF16)), winner);  // not re-tuned
  // Counted as requests are: the cached shape is a hit, the three tunings are misses.
  EXPECT_EQ(tuner.counters().hits, 1u);
  EXPECT_EQ(tuner.counters().misses, 4u);  // 3 here + the set-up tuning
  EXPECT_EQ(tuner.counters().tune_failures, 1u);
  // A second pretune finds everything tunable cached except the failed shape, tuned again.
  target.tuned.clear();
  const PretuneReport again = Pretune(tuner, target, shapes, dtypes);
  EXPECT_EQ(again.cached, 3);
  EXPECT_EQ(again.failed, 1);
  EXPECT_EQ(again.tuned, 0);
  ASSERT_EQ(target.tuned.size(), 1u);
  EXPECT_EQ(target.tuned[0].K, 512);
}

TEST(PretuneReportTest, AddSumsCountsAndKeepsTheFirstError) {
  PretuneReport a;
  a.keys = 2;
  a.tuned = 1;
  a.failed = 1;
  a.first_error = absl::InternalError("first");
  a.wall_seconds = 0.5;
  PretuneReport b;
  b.keys = 3;
  b.cached = 2;
  b.untunable = 1;
  b.failed = 1;
  b.first_error = absl::InternalError("second");
  b.wall_seconds = 0.25;
  PretuneReport total;
  total.Add(a);
  total.Add(b);
  EXPECT_EQ(total.keys, 5);
  EXPECT_EQ(total.tuned, 1);
  EXPECT_EQ(total.cached, 2);
  EXPECT_EQ(total.untunable, 1);
  EXPECT_EQ(total.failed, 2);
  EXPECT_EQ(total.first_error.message(), "first");
  EXPECT_DOUBLE_EQ(total.wall_seconds, 0.75);
}

}  // namespace
}  // namespace dequantd
