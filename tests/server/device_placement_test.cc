// Tests for --devices, --placement and DEQUANTD_INJECT_DEVICE_FAILURE parsing
// (server/device_placement.h, server/failure_injection.h): known answers worked by hand, exact
// status codes and the field named in each message. No GPU.
#include "server/device_placement.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/failure_injection.h"

namespace dequantd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseDeviceListTest, AllListsEveryVisibleGpu) {
  EXPECT_THAT(*ParseDeviceList("all", 3), ElementsAre(0, 1, 2));
  EXPECT_TRUE(ParseDeviceList("all", 0)->empty());
}

TEST(ParseDeviceListTest, ListKeepsOrderAndRepeats) {
  EXPECT_THAT(*ParseDeviceList("0,2", 4), ElementsAre(0, 2));
  EXPECT_THAT(*ParseDeviceList(" 1 , 0 ", 2), ElementsAre(1, 0));
  EXPECT_THAT(*ParseDeviceList("0,0", 1), ElementsAre(0, 0));
}

TEST(ParseDeviceListTest, BadEntriesAreInvalidArgumentNamingTheFlag) {
  for (const char* spec : {"", "0,", "x", "-1", "1.5", "0;1", "ALL"}) {
    absl::StatusOr<std::vector<int>> parsed = ParseDeviceList(spec, 2);
    ASSERT_FALSE(parsed.ok()) << spec;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(parsed.status().message(), HasSubstr("--devices")) << spec;
  }
  absl::StatusOr<std::vector<int>> missing = ParseDeviceList("0,2", 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("CUDA device 2 does not exist (2 visible: 0..1)"));
}

TEST(WorkerLabelsTest, RepeatsGetASuffix) {
  EXPECT_THAT(WorkerLabels(std::vector<int>{0, 2, 0, 0}),
              ElementsAre("cuda:0", "cuda:2", "cuda:0.1", "cuda:0.2"));
}

TEST(PlacementModeTest, NamesRoundTripAndUnknownIsRefused) {
  for (PlacementMode mode :
       {PlacementMode::kAuto, PlacementMode::kReplicated, PlacementMode::kSplit}) {
    EXPECT_EQ(*ParsePlacementMode(PlacementModeName(mode)), mode);
  }
  absl::StatusOr<PlacementMode> bad = ParsePlacementMode("spread");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("--placement"));
}

const std::vector<std::string> kTwo = {"cuda:0", "cuda:1"};

TEST(PlanPlacementTest, ReplicatedWhenTheModelFitsEveryGpu) {
  const std::vector<int64_t> layers = {10, 20, 30};
  absl::StatusOr<Placement> p = PlanPlacement(layers, {100, 60}, kTwo, PlacementMode::kAuto);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->split);
  for (const std::vector<int>& holders : p->holders) EXPECT_THAT(holders, ElementsAre(0, 1));
  EXPECT_THAT(p->worker_bytes, ElementsAre(60, 60));
}

TEST(PlanPlacementTest, SplitContiguouslyByBytesWhenItDoesNotFit) {
  // Total 100. Midpoints: 5, 15, 25, 40 | 60, 75, 90 -> *2/100 -> 0,0,0,0 | 1,1,1.
  const std::vector<int64_t> layers = {10, 10, 10, 20, 20, 10, 20};
  absl::StatusOr<Placement> p = PlanPlacement(layers, {60, 60}, kTwo, PlacementMode::kAuto);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->split);
  std::vector<int> owner;
  for (const std::vector<int>& holders : p->holders) {
    ASSERT_EQ(holders.size(), 1u);
    owner.push_back(holders[0]);
  }
  EXPECT_THAT(owner, ElementsAre(0, 0, 0, 0, 1, 1, 1));
  EXPECT_THAT(p->worker_bytes, ElementsAre(50, 50));
}

TEST(PlanPlacementTest, SplitIsForcedByTheModeAndMeaninglessOnOneGpu) {
  const std::vector<int64_t> layers = {10, 10, 10, 10};
  absl::StatusOr<Placement> split =
      PlanPlacement(layers, {1000, 1000}, kTwo, PlacementMode::kSplit);
  ASSERT_TRUE(split.ok());
  EXPECT_TRUE(split->split);
  EXPECT_THAT(split->worker_bytes, ElementsAre(20, 20));
  absl::StatusOr<Placement> one =
      PlanPlacement(layers, {1000}, std::vector<std::string>{"cuda:0"}, PlacementMode::kSplit);
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->split);
  EXPECT_THAT(one->holders[3], ElementsAre(0));
}

TEST(PlanPlacementTest, TooLargeIsResourceExhaustedNamingTheGpu) {
  // Total 150 > 100: split. Midpoints 25, 75, 125 -> * 2 / 150 -> workers 0, 1, 1.
  const std::vector<int64_t> layers = {50, 50, 50};
  absl::StatusOr<Placement> split = PlanPlacement(layers, {100, 60}, kTwo, PlacementMode::kAuto);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(split.status().message(),
              HasSubstr("split over 2 GPUs, cuda:1 would hold 100 bytes but has 60 bytes usable"));
  absl::StatusOr<Placement> first = PlanPlacement(layers, {40, 200}, kTwo, PlacementMode::kAuto);
  ASSERT_FALSE(first.ok());
  EXPECT_THAT(first.status().message(), HasSubstr("cuda:0 would hold 50 bytes but has 40"));
  absl::StatusOr<Placement> replicated =
      PlanPlacement(layers, {1000, 100}, kTwo, PlacementMode::kReplicated);
  ASSERT_FALSE(replicated.ok());
  EXPECT_EQ(replicated.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(replicated.status().message(), HasSubstr("replicated, cuda:1 would hold 150 bytes"));
}

TEST(PlanPlacementTest, EmptyModelIsReplicated) {
  absl::StatusOr<Placement> p = PlanPlacement({}, {0, 0}, kTwo, PlacementMode::kAuto);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->split);
  EXPECT_TRUE(p->holders.empty());
}

TEST(DeviceFailureInjectionTest, ParsesEachForm) {
  auto parsed = ParseDeviceFailureInjection("cuda:1=start, cuda:0=launch,cuda:0.1=launch@7");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 3u);
  EXPECT_TRUE(parsed->at("cuda:1").at_start);
  EXPECT_EQ(parsed->at("cuda:1").launches_before_failure, -1);
  EXPECT_FALSE(parsed->at("cuda:0").at_start);
  EXPECT_EQ(parsed->at("cuda:0").launches_before_failure, 0);
  EXPECT_EQ(parsed->at("cuda:0.1").launches_before_failure, 7);
  EXPECT_TRUE(ParseDeviceFailureInjection("")->empty());
}

TEST(DeviceFailureInjectionTest, BadItemsNameTheVariable) {
  for (const char* spec : {"cuda:1", "cuda:1=stop", "gpu1=start", "cuda:=start", "cuda:1=launch@",
                           "cuda:1=launch@-2", "cuda:1=start,cuda:1=launch"}) {
    auto parsed = ParseDeviceFailureInjection(spec);
    ASSERT_FALSE(parsed.ok()) << spec;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(parsed.status().message(), HasSubstr("DEQUANTD_INJECT_DEVICE_FAILURE")) << spec;
  }
}

TEST(LaunchFailureCountdownTest, FailsAfterNLaunchesAndStaysFailed) {
  LaunchFailureCountdown never;
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(never.NextLaunchFails());
  EXPECT_FALSE(never.failed());
  LaunchFailureCountdown after2(2);
  EXPECT_FALSE(after2.NextLaunchFails());
  EXPECT_FALSE(after2.NextLaunchFails());
  EXPECT_FALSE(after2.failed());
  EXPECT_TRUE(after2.NextLaunchFails());
  EXPECT_TRUE(after2.NextLaunchFails());
  EXPECT_TRUE(after2.failed());
  LaunchFailureCountdown first(0);
  EXPECT_TRUE(first.NextLaunchFails());
}

}  // namespace
}  // namespace dequantd
