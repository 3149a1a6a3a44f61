// Tests for --devices, --placement and DEQUANTD_INJECT_DEVICE_FAILURE parsing
// (server/backend/device_placement.h, server/backend/failure_injection.h): known answers worked by
// hand, exact status codes and the field named in each message. No GPU.
#include "server/backend/device_placement.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend/failure_injection.h"

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

TEST(PlanPlacementTest, ASplitShareThatDoesNotFitSpillsToAnotherGpuThenToTheHost) {
  // Total 150 > 100: split. Midpoints 25, 75, 125 -> * 2 / 150 -> shares 0, 1, 1. cuda:1 (60)
  // keeps layer 1 (50) and not layer 2 (100 > 60); layer 2 spills to cuda:0 (50 + 50 <= 100).
  const std::vector<int64_t> layers = {50, 50, 50};
  absl::StatusOr<Placement> spilled = PlanPlacement(layers, {100, 60}, kTwo, PlacementMode::kAuto);
  ASSERT_TRUE(spilled.ok()) << spilled.status();
  EXPECT_TRUE(spilled->split);
  EXPECT_THAT(spilled->holders, ElementsAre(ElementsAre(0), ElementsAre(1), ElementsAre(0)));
  EXPECT_THAT(spilled->worker_bytes, ElementsAre(100, 50));
  EXPECT_EQ(spilled->host_layers, 0);
  EXPECT_EQ(spilled->host_bytes, 0);
  // cuda:0 (40) keeps nothing of its share (layer 0, 50); cuda:1 (200) keeps 1 and 2 and then
  // layer 0 (150 <= 200).
  absl::StatusOr<Placement> first = PlanPlacement(layers, {40, 200}, kTwo, PlacementMode::kAuto);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(first->holders, ElementsAre(ElementsAre(1), ElementsAre(1), ElementsAre(1)));
  EXPECT_THAT(first->worker_bytes, ElementsAre(0, 150));
  // Neither has room for the third: it is host-only.
  absl::StatusOr<Placement> host = PlanPlacement(layers, {60, 60}, kTwo, PlacementMode::kAuto);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_THAT(host->holders, ElementsAre(ElementsAre(0), ElementsAre(1), ::testing::IsEmpty()));
  EXPECT_THAT(host->worker_bytes, ElementsAre(50, 50));
  EXPECT_EQ(host->host_layers, 1);
  EXPECT_EQ(host->host_bytes, 50);
}

TEST(PlanPlacementTest, OneGpuKeepsLayersInCheckpointOrderWhileTheyFit) {
  // Capacity 100: 30 (30), 40 (70), 50 would be 120: host, 20 (90), 10 would be 100: kept
  // (exactly full), 5 would be 105: host.
  const std::vector<int64_t> layers = {30, 40, 50, 20, 10, 5};
  const std::vector<std::string> one = {"cuda:0"};
  absl::StatusOr<Placement> p = PlanPlacement(layers, {100}, one, PlacementMode::kAuto);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->split);
  std::vector<bool> resident;
  for (const std::vector<int>& holders : p->holders) resident.push_back(!holders.empty());
  EXPECT_THAT(resident, ElementsAre(true, true, false, true, true, false));
  EXPECT_THAT(p->worker_bytes, ElementsAre(100));
  EXPECT_EQ(p->host_layers, 2);
  EXPECT_EQ(p->host_bytes, 55);
  // A capacity below every layer leaves every layer on the host; 0 likewise.
  for (int64_t capacity : {4, 0}) {
    absl::StatusOr<Placement> none = PlanPlacement(layers, {capacity}, one, PlacementMode::kAuto);
    ASSERT_TRUE(none.ok()) << none.status();
    for (const std::vector<int>& holders : none->holders) EXPECT_TRUE(holders.empty());
    EXPECT_THAT(none->worker_bytes, ElementsAre(0));
    EXPECT_EQ(none->host_layers, 6);
    EXPECT_EQ(none->host_bytes, 155);
  }
}

TEST(PlanPlacementTest, ReplicatedKeepsEachGpusOwnPrefixAndTheRestOnTheHost) {
  // Replicated (asked for): every worker tries every layer. cuda:0 (1000) keeps all three; cuda:1
  // (100) keeps 50 + 50; the third is held by cuda:0 only; nothing is host-only.
  const std::vector<int64_t> layers = {50, 50, 50};
  absl::StatusOr<Placement> p =
      PlanPlacement(layers, {1000, 100}, kTwo, PlacementMode::kReplicated);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->split);
  EXPECT_THAT(p->holders, ElementsAre(ElementsAre(0, 1), ElementsAre(0, 1), ElementsAre(0)));
  EXPECT_THAT(p->worker_bytes, ElementsAre(150, 100));
  EXPECT_EQ(p->host_layers, 0);
  // Both at 60: each keeps layer 0 only (a second would be 100); layers 1 and 2 on the host.
  absl::StatusOr<Placement> small =
      PlanPlacement(layers, {60, 60}, kTwo, PlacementMode::kReplicated);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_THAT(small->holders,
              ElementsAre(ElementsAre(0, 1), ::testing::IsEmpty(), ::testing::IsEmpty()));
  EXPECT_EQ(small->host_layers, 2);
  EXPECT_EQ(small->host_bytes, 100);
}

TEST(WorkerCapacityTest, FreeMemorySharedByWorkersLessTheReserveCappedByTheLimit) {
  EXPECT_EQ(WorkerCapacity(1000, 1, 100, 0), 900);
  EXPECT_EQ(WorkerCapacity(1000, 2, 100, 0), 400);     // two workers on one GPU
  EXPECT_EQ(WorkerCapacity(1000, 1, 100, 300), 300);   // the limit
  EXPECT_EQ(WorkerCapacity(1000, 1, 100, 5000), 900);  // a limit above the free memory
  EXPECT_EQ(WorkerCapacity(50, 1, 100, 0), 0);         // less free than the reserve
}

TEST(DeviceMemoryLimitTest, ALimitAboveTheDeviceIsInvalidArgumentNamingFlagAndMemory) {
  constexpr int64_t kH200 = int64_t{150'754'820'096};
  EXPECT_TRUE(CheckDeviceMemoryLimit(0, kH200, "cuda:0", "NVIDIA H200").ok());
  EXPECT_TRUE(CheckDeviceMemoryLimit(1, kH200, "cuda:0", "NVIDIA H200").ok());
  EXPECT_TRUE(CheckDeviceMemoryLimit(kH200, kH200, "cuda:0", "NVIDIA H200").ok());
  const absl::Status above = CheckDeviceMemoryLimit(kH200 + 1, kH200, "cuda:1", "NVIDIA H200");
  EXPECT_EQ(above.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(above.message(), HasSubstr("--device-memory-limit=150754820097 is more than the "
                                         "memory of cuda:1 (NVIDIA H200: 150754820096 bytes)"));
  const absl::Status negative = CheckDeviceMemoryLimit(-5, kH200, "cuda:0", "NVIDIA H200");
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.message(), HasSubstr("--device-memory-limit must be 0 (no limit)"));
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
