// Metrics (server/metrics/metrics.h): each family's name, labels and values after the calls that
// feed it, read back from the registry (what /metrics serializes); and /metrics as served over HTTP
// (server/metrics/metrics_http.h), fetched with civetweb's client.
#include "server/metrics/metrics.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <civetweb.h>

#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "server/metrics/metrics_http.h"
#include "tests/observability/metrics_series.h"

namespace dequantd {
namespace {

using ::dequantd::testing::Labels;
using ::dequantd::testing::Series;

std::optional<Series> Find(const Metrics& metrics, const std::string& name,
                           const Labels& labels = {}) {
  return ::dequantd::testing::FindSeries(metrics, name, labels);
}

// Number of series of family `name` (0 when it has none or does not exist).
size_t SeriesCount(const Metrics& metrics, const std::string& name) {
  for (const prometheus::MetricFamily& family : metrics.registry()->Collect()) {
    if (family.name == name) return family.metric.size();
  }
  return 0;
}

// One HTTP response: status code and body.
struct Response {
  int status = 0;
  std::string body;
};

// GET http://127.0.0.1:`port``path` (civetweb's client); status 0 with the error in the body
// when the request could not be made.
Response HttpGet(int port, const std::string& path) {
  char error[256] = "";
  mg_connection* conn = mg_download("127.0.0.1", port, /*use_ssl=*/0, error, sizeof(error),
                                    "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path.c_str());
  if (conn == nullptr) return {0, error};
  Response response;
  response.status = mg_get_response_info(conn)->status_code;
  char buffer[4096];
  for (int n; (n = mg_read(conn, buffer, sizeof(buffer))) > 0;) response.body.append(buffer, n);
  mg_close_connection(conn);
  return response;
}

std::unique_ptr<Metrics> MakeMetrics() {
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "1.2.3");
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return std::move(*metrics);
}

TEST(MetricsTest, RpcCountsRequestsErrorsLatencyAndInFlight) {
  std::unique_ptr<Metrics> metrics = MakeMetrics();
  // Every method's in-flight gauge exists at 0 before any call.
  for (const char* method :
       {"ListTensors", "Dequantize", "DequantizeLayers", "GetServerInfo", "Benchmark"}) {
    ASSERT_TRUE(Find(*metrics, "dequantd_rpc_in_flight", {{"method", method}}).has_value());
  }
  metrics->RpcStarted("Dequantize");
  metrics->RpcStarted("Dequantize");
  EXPECT_EQ(Find(*metrics, "dequantd_rpc_in_flight", {{"method", "Dequantize"}})->value, 2);
  metrics->RpcFinished("Dequantize", 0, 0.5);
  metrics->RpcFinished("Dequantize", 5, 0.25);  // 5 = NOT_FOUND
  EXPECT_EQ(Find(*metrics, "dequantd_rpc_in_flight", {{"method", "Dequantize"}})->value, 0);

  const Labels ok = {{"method", "Dequantize"}, {"code", "OK"}};
  const Labels not_found = {{"method", "Dequantize"}, {"code", "NOT_FOUND"}};
  EXPECT_EQ(Find(*metrics, "dequantd_rpc_requests_total", ok)->value, 1);
  EXPECT_EQ(Find(*metrics, "dequantd_rpc_requests_total", not_found)->value, 1);
  EXPECT_EQ(Find(*metrics, "dequantd_rpc_errors_total", not_found)->value, 1);
  EXPECT_FALSE(Find(*metrics, "dequantd_rpc_errors_total", ok).has_value());
  const std::optional<Series> latency = Find(*metrics, "dequantd_rpc_duration_seconds", ok);
  ASSERT_TRUE(latency.has_value());
  EXPECT_EQ(latency->type, prometheus::MetricType::Histogram);
  EXPECT_EQ(latency->value, 1);
  EXPECT_EQ(latency->sum, 0.5);
}

TEST(MetricsTest, AutotuneObserverCountsLookupsEntriesAndTuningTime) {
  std::unique_ptr<Metrics> metrics = MakeMetrics();
  // Present at 0 before any autotuning (the CPU backend never tunes).
  EXPECT_EQ(Find(*metrics, "dequantd_autotune_cache_hits_total")->value, 0);
  EXPECT_EQ(Find(*metrics, "dequantd_autotune_cache_misses_total")->value, 0);
  AutotuneObserver& observer = *metrics;
  for (bool hit : {true, false, true, true, false}) observer.ObserveLookup(hit);
  observer.ObserveEntries(4);
  observer.ObserveEntries(3);  // a gauge: the last value counts
  EXPECT_EQ(Find(*metrics, "dequantd_autotune_cache_hits_total")->value, 3);
  EXPECT_EQ(Find(*metrics, "dequantd_autotune_cache_misses_total")->value, 2);
  EXPECT_EQ(Find(*metrics, "dequantd_autotune_cache_entries")->value, 3);
  AutotuneTuning done;
  done.wall_seconds = 0.02;
  observer.ObserveTuning(done);
  const std::optional<Series> tuning = Find(*metrics, "dequantd_autotune_duration_seconds");
  ASSERT_TRUE(tuning.has_value());
  EXPECT_EQ(tuning->value, 1);
  EXPECT_EQ(tuning->sum, 0.02);
}

TEST(MetricsTest, KernelTrafficAndBandwidthFractionOfTheCopyRate) {
  std::unique_ptr<Metrics> metrics = MakeMetrics();
  // No copy rate for the device yet: bytes are counted, no fraction is set.
  metrics->ObserveKernel("cuda:0", "cuda", "v4_vec16", 1000, 3000, 1e-5);
  EXPECT_EQ(SeriesCount(*metrics, "dequantd_kernel_bandwidth_fraction"), 0u);

  metrics->SetDeviceCopyBandwidth("cuda:0", 1e9);
  // (1000 + 3000) bytes / 1e-5 s = 4e8 bytes/s = 0.4 of 1e9.
  metrics->ObserveKernel("cuda:0", "cuda", "v4_vec16", 1000, 3000, 1e-5);
  EXPECT_DOUBLE_EQ(
      Find(*metrics, "dequantd_kernel_bandwidth_fraction", {{"device", "cuda:0"}})->value, 0.4);
  EXPECT_EQ(
      Find(*metrics, "dequantd_device_copy_bandwidth_bytes_per_second", {{"device", "cuda:0"}})
          ->value,
      1e9);
  const Labels kernel = {{"backend", "cuda"}, {"variant", "v4_vec16"}};
  EXPECT_EQ(Find(*metrics, "dequantd_kernel_read_bytes_total", kernel)->value, 2000);
  EXPECT_EQ(Find(*metrics, "dequantd_kernel_written_bytes_total", kernel)->value, 6000);
  EXPECT_EQ(Find(*metrics, "dequantd_kernel_duration_seconds", {{"variant", "v4_vec16"}})->value,
            2);
}

TEST(MetricsTest, StagesMemoryAndProcessInfo) {
  std::unique_ptr<Metrics> metrics = MakeMetrics();
  metrics->ObserveStage(DequantizeStage::kQueueWait, 0.001);
  metrics->ObserveStage(DequantizeStage::kHostToDevice, 0.002);
  metrics->ObserveStage(DequantizeStage::kKernel, 0.003);
  metrics->ObserveStage(DequantizeStage::kDeviceToHost, 0.004);
  metrics->ObserveStage(DequantizeStage::kSend, 0.005);
  double expected_sum = 0.001;
  for (const char* stage : {"queue_wait", "host_to_device", "kernel", "device_to_host", "send"}) {
    const std::optional<Series> series =
        Find(*metrics, "dequantd_dequantize_stage_duration_seconds", {{"stage", stage}});
    ASSERT_TRUE(series.has_value()) << stage;
    EXPECT_EQ(series->value, 1) << stage;
    EXPECT_DOUBLE_EQ(series->sum, expected_sum) << stage;
    expected_sum += 0.001;
  }

  metrics->SetDeviceMemoryUsed("cuda:1", DeviceMemoryKind::kResidentWeights, 123456);
  metrics->SetDeviceMemoryUsed("cuda:1", DeviceMemoryKind::kBuffers, 4096);
  EXPECT_EQ(Find(*metrics, "dequantd_device_memory_used_bytes",
                 {{"device", "cuda:1"}, {"kind", "resident_weights"}})
                ->value,
            123456);
  EXPECT_EQ(Find(*metrics, "dequantd_device_memory_used_bytes",
                 {{"device", "cuda:1"}, {"kind", "buffers"}})
                ->value,
            4096);

  BackendInfo info{.name = "cuda", .devices = {}, .cpu_threads = 0};
  info.devices.push_back({.index = 1,
                          .name = "NVIDIA H200",
                          .compute_capability = "9.0",
                          .memory_bytes = 1,
                          .driver_version = "13.0",
                          .label = "cuda:1",
                          .serving = true,
                          .failure = "",
                          .resident_layers = 0,
                          .resident_bytes = 0,
                          .in_flight = 0});
  metrics->SetDevices(info);
  EXPECT_EQ(Find(*metrics, "dequantd_device_info",
                 {{"device", "cuda:1"},
                  {"name", "NVIDIA H200"},
                  {"compute_capability", "9.0"},
                  {"driver", "13.0"}})
                ->value,
            1);
  metrics->SetModelLayers(210);
  EXPECT_EQ(Find(*metrics, "dequantd_model_layers")->value, 210);
  EXPECT_EQ(SeriesCount(*metrics, "dequantd_build_info"), 1u);
  for (const prometheus::MetricFamily& family : metrics->registry()->Collect()) {
    if (family.name != "dequantd_build_info") continue;
    EXPECT_EQ(family.metric[0].gauge.value, 1);
    EXPECT_THAT(family.metric[0].label,
                ::testing::Contains(prometheus::ClientMetric::Label{"version", "1.2.3"}));
  }
}

TEST(MetricsTest, PerDeviceSeriesExistFromTheStartAndFollowTheBackend) {
  std::unique_ptr<Metrics> metrics = MakeMetrics();
  BackendInfo info{.name = "cuda", .devices = {}, .cpu_threads = 0};
  for (int i = 0; i < 2; ++i) {
    info.devices.push_back({.index = 0,
                            .name = "NVIDIA H200",
                            .compute_capability = "9.0",
                            .memory_bytes = 1,
                            .driver_version = "13.0",
                            .label = i == 0 ? "cuda:0" : "cuda:0.1",
                            .serving = i == 0,
                            .failure = i == 0 ? "" : "injected",
                            .resident_layers = 0,
                            .resident_bytes = 0,
                            .in_flight = 0});
  }
  metrics->SetDeviceServing("cuda:0", true);
  metrics->SetDeviceServing("cuda:0.1", true);
  metrics->SetDeviceServing("cuda:0.1", false);  // taken out at start: counted once
  metrics->SetDevices(info);
  auto value = [&](const char* family, const char* device) {
    return Find(*metrics, family, {{"device", device}})->value;
  };
  EXPECT_EQ(value("dequantd_device_serving", "cuda:0"), 1);
  EXPECT_EQ(value("dequantd_device_serving", "cuda:0.1"), 0);
  EXPECT_EQ(value("dequantd_device_failures_total", "cuda:0"), 0);
  EXPECT_EQ(value("dequantd_device_failures_total", "cuda:0.1"), 1);
  EXPECT_EQ(value("dequantd_device_calls_in_flight", "cuda:0"), 0);
  EXPECT_EQ(value("dequantd_device_kernel_seconds_total", "cuda:0.1"), 0);
  metrics->SetDeviceInFlight("cuda:0", 3);
  EXPECT_EQ(value("dequantd_device_calls_in_flight", "cuda:0"), 3);
  metrics->ObserveKernel("cuda:0", "cuda", "v4_vec16", 1000, 4000, 0.25);
  metrics->ObserveKernel("cuda:0", "cuda", "grouped", 10, 40, 0.5);
  EXPECT_EQ(value("dequantd_device_kernel_seconds_total", "cuda:0"), 0.75);
  EXPECT_EQ(value("dequantd_device_kernel_bytes_total", "cuda:0"), 5050);
  EXPECT_EQ(value("dequantd_device_kernel_bytes_total", "cuda:0.1"), 0);
}

TEST(MetricsTest, BenchmarkGaugesComeFromTheLargestRowOfTheLastBenchmark) {
  std::unique_ptr<Metrics> metrics = MakeMetrics();
  dequant::v1::BenchmarkResponse first;
  dequant::v1::BenchmarkRow* small = first.add_rows();
  small->set_variant("v4_vec16");
  small->set_bytes_moved(100);
  small->set_fraction_of_peak(0.5);
  small->set_median_seconds(1e-6);
  dequant::v1::BenchmarkRow* large = first.add_rows();
  large->set_variant("v4_vec16");
  large->set_bytes_moved(200);
  large->set_fraction_of_peak(0.9);
  large->set_median_seconds(2e-6);
  (*large->mutable_counters())["dram__throughput.avg.pct_of_peak_sustained_elapsed"] = 85;
  (*large->mutable_counters())["lts__t_sector_hit_rate.pct"] = 12.5;
  (*large->mutable_counters())["dram__bytes_read.sum"] = 4096;
  dequant::v1::BenchmarkRow* copy = first.add_rows();
  copy->set_variant("copy");
  copy->set_bytes_moved(200);
  copy->set_fraction_of_peak(1.0);
  metrics->RecordBenchmark(first);

  const Labels v4 = {{"variant", "v4_vec16"}};
  EXPECT_EQ(Find(*metrics, "dequantd_benchmark_bandwidth_fraction", v4)->value, 0.9);
  EXPECT_EQ(Find(*metrics, "dequantd_benchmark_duration_seconds", v4)->value, 2e-6);
  EXPECT_DOUBLE_EQ(Find(*metrics, "dequantd_benchmark_dram_throughput_ratio", v4)->value, 0.85);
  EXPECT_DOUBLE_EQ(Find(*metrics, "dequantd_benchmark_l2_hit_ratio", v4)->value, 0.125);
  EXPECT_EQ(Find(*metrics, "dequantd_benchmark_dram_read_bytes", v4)->value, 4096);
  // Counters the row does not carry are not exported.
  EXPECT_EQ(SeriesCount(*metrics, "dequantd_benchmark_l1_hit_ratio"), 0u);
  EXPECT_EQ(SeriesCount(*metrics, "dequantd_benchmark_dram_written_bytes"), 0u);
  EXPECT_EQ(Find(*metrics, "dequantd_benchmark_bandwidth_fraction", {{"variant", "copy"}})->value,
            1.0);
  EXPECT_EQ(SeriesCount(*metrics, "dequantd_benchmark_dram_throughput_ratio"), 1u);

  // The next benchmark replaces the last one's series (v4_vec16 and its counters disappear).
  dequant::v1::BenchmarkResponse second;
  dequant::v1::BenchmarkRow* cpu = second.add_rows();
  cpu->set_variant("cpu_threads");
  cpu->set_bytes_moved(10);
  cpu->set_fraction_of_peak(0.25);
  metrics->RecordBenchmark(second);
  EXPECT_EQ(SeriesCount(*metrics, "dequantd_benchmark_bandwidth_fraction"), 1u);
  EXPECT_EQ(
      Find(*metrics, "dequantd_benchmark_bandwidth_fraction", {{"variant", "cpu_threads"}})->value,
      0.25);
  EXPECT_EQ(SeriesCount(*metrics, "dequantd_benchmark_dram_throughput_ratio"), 0u);
  EXPECT_EQ(SeriesCount(*metrics, "dequantd_benchmark_l2_hit_ratio"), 0u);
}

TEST(MetricsTest, PortInUseIsUnavailableNamingTheAddressAndReason) {
  // Hold a listening socket on a free port of 127.0.0.1.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string listen = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));

  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create(listen, "1.2.3");
  ::close(fd);
  ASSERT_FALSE(metrics.ok());
  EXPECT_EQ(metrics.status().code(), absl::StatusCode::kUnavailable);
  const std::string message(metrics.status().message());
  EXPECT_THAT(message, ::testing::HasSubstr("--metrics-listen \"" + listen + "\""));
  EXPECT_THAT(message, ::testing::HasSubstr("in use"));
  EXPECT_THAT(message, ::testing::Not(::testing::HasSubstr("null context")));
}

TEST(MetricsTest, ScrapeServesOnlyDequantdFamiliesOverHttp) {
  absl::StatusOr<std::unique_ptr<Metrics>> created = Metrics::Create("127.0.0.1:0", "1.2.3");
  ASSERT_TRUE(created.ok()) << created.status();
  Metrics& metrics = **created;
  ASSERT_GT(metrics.port(), 0);
  metrics.RpcStarted("Dequantize");
  metrics.RpcFinished("Dequantize", 0, 0.5);

  // Scrape twice: the first scrape is what prometheus-cpp's Exposer would count in its own
  // exposer_* families on the second.
  ASSERT_EQ(HttpGet(metrics.port(), "/metrics").status, 200);
  const Response scrape = HttpGet(metrics.port(), "/metrics");
  ASSERT_EQ(scrape.status, 200) << scrape.body;
  // Labels are serialized in name order (prometheus::Labels is a std::map).
  EXPECT_THAT(
      scrape.body,
      ::testing::HasSubstr("\ndequantd_rpc_requests_total{code=\"OK\",method=\"Dequantize\"} 1\n"));
  EXPECT_THAT(scrape.body, ::testing::HasSubstr(
                               "\ndequantd_build_info{cuda=\""));  // the value depends on the build
  int families = 0;
  std::istringstream lines(scrape.body);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_NE(line.rfind("exposer_", 0), 0u) << line;
    if (line.rfind("# TYPE ", 0) == 0) {
      ++families;
      std::istringstream fields(line.substr(7));
      std::string name, type;
      fields >> name >> type;
      EXPECT_EQ(name.rfind("dequantd_", 0), 0u) << line;
      EXPECT_NE(type, "summary") << line;
    } else if (!line.empty() && line[0] != '#') {
      EXPECT_EQ(line.rfind("dequantd_", 0), 0u) << line;
    }
  }
  // As many families on the page as in the registry (the exposer_* ones would add 3).
  EXPECT_EQ(families, static_cast<int>(metrics.registry()->Collect().size()));

  const Response index = HttpGet(metrics.port(), "/");
  EXPECT_EQ(index.status, 200);
  EXPECT_THAT(index.body, ::testing::HasSubstr("/metrics"));
  EXPECT_EQ(HttpGet(metrics.port(), "/metrics/extra").status, 404);
  EXPECT_EQ(HttpGet(metrics.port(), "/nothing").status, 404);
}

}  // namespace
}  // namespace dequantd
