// LogRateLimiter: the per-key, per-minute budget that bounds libprotobuf's and gRPC's log lines.
#include "server/rpc/log_rate_limit.h"

#include <chrono>

#include "gtest/gtest.h"

namespace dequantd {
namespace {

using Clock = std::chrono::steady_clock;

int AdmittedOf(LogRateLimiter& limiter, const char* key, int lines, Clock::time_point now) {
  int admitted = 0;
  for (int i = 0; i < lines; ++i) admitted += limiter.Admit(key, now).admit ? 1 : 0;
  return admitted;
}

TEST(LogRateLimiterTest, AdmitsTheBudgetPerMinuteThenReportsWhatItDropped) {
  LogRateLimiter limiter(10);
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(AdmittedOf(limiter, "call.cc:1211", 1000, t0), 10);
  // 59 s later: still the same window.
  EXPECT_FALSE(limiter.Admit("call.cc:1211", t0 + std::chrono::seconds(59)).admit);
  // A minute later: a new window, whose first line reports the 991 dropped lines.
  const LogRateLimiter::Decision next = limiter.Admit("call.cc:1211", t0 + std::chrono::minutes(1));
  EXPECT_TRUE(next.admit);
  EXPECT_EQ(next.dropped_before, 991);
  // The report is given once.
  const LogRateLimiter::Decision after =
      limiter.Admit("call.cc:1211", t0 + std::chrono::minutes(1) + std::chrono::seconds(1));
  EXPECT_TRUE(after.admit);
  EXPECT_EQ(after.dropped_before, 0);
}

TEST(LogRateLimiterTest, KeysHaveTheirOwnBudgets) {
  LogRateLimiter limiter(3);
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(AdmittedOf(limiter, "a.cc:1", 5, t0), 3);
  // A flood from one call site does not silence another (e.g. an assertion before abort).
  EXPECT_EQ(AdmittedOf(limiter, "b.cc:2", 5, t0), 3);
}

}  // namespace
}  // namespace dequantd
