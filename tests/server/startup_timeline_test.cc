// StartupTimeline (server/model/startup_timeline.h): phases are listed in the order they began,
// each with its span; nothing here depends on how long anything took.
#include "server/model/startup_timeline.h"

#include <chrono>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

using ::testing::HasSubstr;

TEST(StartupTimelineTest, PhasesAreListedByTheirBeginWithExecFirst) {
  StartupTimeline timeline;
  const StartupTimeline::Clock::time_point t0 = StartupTimeline::Clock::now();
  {
    StartupTimeline::Phase outer(&timeline, "cuda contexts");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // two distinct begins
    StartupTimeline::Phase ended(&timeline, "checkpoint headers");
    ended.End();
    ended.End();  // once only
  }
  timeline.Add("before", t0 - std::chrono::milliseconds(1), t0);
  const std::string text = timeline.Describe();
  EXPECT_THAT(text, testing::MatchesRegex(
                        "exec\\.\\.start [0-9.]+-[0-9.]+, before [0-9.]+-[0-9.]+, cuda contexts "
                        "[0-9.]+-[0-9.]+, checkpoint headers [0-9.]+-[0-9.]+"));
}

TEST(StartupTimelineTest, ANullTimelineRecordsNothing) {
  StartupTimeline::Phase phase(nullptr, "nothing");
  phase.End();
  StartupTimeline timeline;
  EXPECT_THAT(timeline.Describe(), testing::Not(HasSubstr("nothing")));
}

}  // namespace
}  // namespace dequantd
