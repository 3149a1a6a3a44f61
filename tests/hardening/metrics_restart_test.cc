// Issue 11: an idle /metrics endpoint took about 2 s to stop (civetweb's poll quantum), and a
// dequantd restarted within that time failed with "Address already in use" on the metrics port.
#include <chrono>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "server/metrics/metrics_http.h"
#include "tests/hardening/process_stats.h"

namespace dequantd::testing {
namespace {

using ::testing::HasSubstr;

TEST(MetricsRestartTest, StopsPromptlyAndTheSamePortServesAgainAtOnce) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("restart_test_total").Help("x").Register(*registry).Add({});
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
      MetricsHttpServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  for (int round = 0; round < 3; ++round) {
    // A scrape first: the server closes that connection, which leaves it in TIME_WAIT.
    EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("restart_test_total 0")) << round;
    const auto start = std::chrono::steady_clock::now();
    http->reset();
    const std::chrono::duration<double> stop = std::chrono::steady_clock::now() - start;
    // Generous: civetweb's own stop waited out a 2 s poll.
    EXPECT_LT(stop.count(), 1.0) << "round " << round;
    http = MetricsHttpServer::Start(address, registry);
    ASSERT_TRUE(http.ok()) << "round " << round << ": " << http.status();
    EXPECT_EQ((*http)->port(), port);
  }
  EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("restart_test_total 0"));
}

}  // namespace
}  // namespace dequantd::testing
