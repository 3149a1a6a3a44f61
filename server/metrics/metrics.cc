// Metrics (see metrics.h).
#include "server/metrics/metrics.h"

#include <array>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/metrics/metrics_http.h"
#include "server/metrics/series_cache.h"
#if DEQUANTD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dequantd {
namespace {

using prometheus::Histogram;

// The RPCs of dequant.v1.DequantService: their in-flight gauges exist (at 0) from the start.
constexpr std::array<const char*, 5> kRpcMethods = {"ListTensors", "Dequantize", "DequantizeLayers",
                                                    "GetServerInfo", "Benchmark"};

// Latency buckets, seconds: 10 us (a kernel on a small layer) .. 60 s (a large layer on a CPU
// through a slow link), about 2.5x apart.
const Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new Histogram::BucketBoundaries{
      0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,    0.1,      0.25,    0.5,    1,       2.5,    5,     10,     30,    60};
  return *buckets;
}

// Tuning-time buckets, seconds: 1 ms (one candidate on a small layer) .. 60 s.
const Histogram::BucketBoundaries& TuningBuckets() {
  static const auto* buckets = new Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return *buckets;
}

const char* StageName(DequantizeStage stage) {
  switch (stage) {
    case DequantizeStage::kQueueWait:
      return "queue_wait";
    case DequantizeStage::kHostToDevice:
      return "host_to_device";
    case DequantizeStage::kKernel:
      return "kernel";
    case DequantizeStage::kDeviceToHost:
      return "device_to_host";
    case DequantizeStage::kSend:
      return "send";
  }
  return "unknown";
}

const char* MemoryKindName(DeviceMemoryKind kind) {
  switch (kind) {
    case DeviceMemoryKind::kResidentWeights:
      return "resident_weights";
    case DeviceMemoryKind::kBuffers:
      return "buffers";
  }
  return "unknown";
}

// "13.0" (the CUDA runtime dequantd was built against) or "none".
std::string CudaBuildVersion() {
#if DEQUANTD_HAVE_CUDA
  return absl::StrCat(CUDART_VERSION / 1000, ".", (CUDART_VERSION % 1000) / 10);
#else
  return "none";
#endif
}

template <typename Builder>
auto& Register(Builder builder, const char* name, const char* help,
               prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& listen,
                                                         std::string_view version) {
  auto metrics = std::unique_ptr<Metrics>(new Metrics());
  metrics->registry_ = std::make_shared<prometheus::Registry>();
  metrics->CreateFamilies(version);
  if (!listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
        MetricsHttpServer::Start(listen, metrics->registry_);
    if (!http.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "--metrics-listen \"", listen, "\": cannot serve metrics: ", http.status().message()));
    }
    metrics->http_ = std::move(*http);
    metrics->port_ = metrics->http_->port();
  }
  return metrics;
}

void Metrics::CreateFamilies(std::string_view version) {
  prometheus::Registry& r = *registry_;
  auto counter = [&r](const char* name, const char* help) -> auto& {
    return Register(prometheus::BuildCounter(), name, help, r);
  };
  auto gauge = [&r](const char* name, const char* help) -> auto& {
    return Register(prometheus::BuildGauge(), name, help, r);
  };
  auto histogram = [&r](const char* name, const char* help) -> auto& {
    return Register(prometheus::BuildHistogram(), name, help, r);
  };

  rpc_requests_total_ =
      &counter("dequantd_rpc_requests_total", "RPCs finished, by method and gRPC status code");
  rpc_errors_total_ =
      &counter("dequantd_rpc_errors_total", "RPCs finished with a gRPC status code other than OK");
  rpc_duration_seconds_ = &histogram(
      "dequantd_rpc_duration_seconds",
      "RPC wall time from the handler's start to its status, in seconds (Dequantize: until the "
      "last chunk was written)");
  rpc_in_flight_ = &gauge("dequantd_rpc_in_flight", "RPCs being handled now, by method");
  for (const char* method : kRpcMethods) rpc_in_flight_->Add({{"method", method}});
  output_bytes_total_ = &counter("dequantd_dequantize_output_bytes_total",
                                 "Dequantized result bytes sent to clients, in bytes")
                             .Add({});
  rpc_in_flight_by_ = std::make_unique<SeriesCache<prometheus::Gauge, 1>>(
      rpc_in_flight_, std::array<std::string, 1>{"method"});
  rpc_requests_by_ = std::make_unique<SeriesCache<prometheus::Counter, 2>>(
      rpc_requests_total_, std::array<std::string, 2>{"method", "code"});
  rpc_errors_by_ = std::make_unique<SeriesCache<prometheus::Counter, 2>>(
      rpc_errors_total_, std::array<std::string, 2>{"method", "code"});
  rpc_duration_by_ = std::make_unique<SeriesCache<prometheus::Histogram, 2>>(
      std::array<std::string, 2>{"method", "code"},
      [family = rpc_duration_seconds_](const prometheus::Labels& labels) -> Histogram& {
        return family->Add(labels, LatencyBuckets());
      });
  stage_duration_seconds_ = &histogram(
      "dequantd_dequantize_stage_duration_seconds",
      "Time one Dequantize spent in a stage (queue_wait, host_to_device, kernel, device_to_host, "
      "send), in seconds");

  kernel_read_bytes_total_ =
      &counter("dequantd_kernel_read_bytes_total",
               "Bytes read by dequantization kernels (qweight + qzeros + scales), in bytes");
  kernel_written_bytes_total_ = &counter("dequantd_kernel_written_bytes_total",
                                         "Bytes written by dequantization kernels, in bytes");
  kernel_duration_seconds_ =
      &histogram("dequantd_kernel_duration_seconds", "One dequantization kernel run, in seconds");
  kernel_bandwidth_fraction_ = &gauge(
      "dequantd_kernel_bandwidth_fraction",
      "The last kernel's bytes read + written per second over the device's measured copy rate");
  device_copy_bandwidth_ =
      &gauge("dequantd_device_copy_bandwidth_bytes_per_second",
             "The device's copy rate measured at start (bytes read + written per second)");
  device_memory_used_bytes_ = &gauge("dequantd_device_memory_used_bytes",
                                     "Device memory held by dequantd, by kind, in bytes");
  device_kernel_seconds_total_ = &counter(
      "dequantd_device_kernel_seconds_total",
      "Kernel time on the device, in seconds (its rate is the device's kernel busy share)");
  device_kernel_bytes_total_ = &counter("dequantd_device_kernel_bytes_total",
                                        "Bytes read + written by kernels on the device, in bytes");
  device_calls_in_flight_ = &gauge("dequantd_device_calls_in_flight",
                                   "Calls on the device now (in a slot or waiting for one)");
  kernel_read_bytes_by_ = std::make_unique<SeriesCache<prometheus::Counter, 2>>(
      kernel_read_bytes_total_, std::array<std::string, 2>{"backend", "variant"});
  kernel_written_bytes_by_ = std::make_unique<SeriesCache<prometheus::Counter, 2>>(
      kernel_written_bytes_total_, std::array<std::string, 2>{"backend", "variant"});
  kernel_duration_by_ = std::make_unique<SeriesCache<prometheus::Histogram, 1>>(
      std::array<std::string, 1>{"variant"},
      [family = kernel_duration_seconds_](const prometheus::Labels& labels) -> Histogram& {
        return family->Add(labels, LatencyBuckets());
      });
  kernel_bandwidth_fraction_by_ = std::make_unique<SeriesCache<prometheus::Gauge, 1>>(
      kernel_bandwidth_fraction_, std::array<std::string, 1>{"device"});
  device_kernel_seconds_by_ = std::make_unique<SeriesCache<prometheus::Counter, 1>>(
      device_kernel_seconds_total_, std::array<std::string, 1>{"device"});
  device_kernel_bytes_by_ = std::make_unique<SeriesCache<prometheus::Counter, 1>>(
      device_kernel_bytes_total_, std::array<std::string, 1>{"device"});
  device_calls_in_flight_by_ = std::make_unique<SeriesCache<prometheus::Gauge, 1>>(
      device_calls_in_flight_, std::array<std::string, 1>{"device"});
  device_memory_used_by_ = std::make_unique<SeriesCache<prometheus::Gauge, 2>>(
      device_memory_used_bytes_, std::array<std::string, 2>{"device", "kind"});
  device_serving_ = &gauge("dequantd_device_serving",
                           "1 while the device is in rotation, 0 once it was taken out");
  device_failures_total_ = &counter("dequantd_device_failures_total",
                                    "Times the device was taken out of rotation (failed)");

  autotune_hits_total_ = &counter("dequantd_autotune_cache_hits_total",
                                  "Launch-config lookups answered from the autotune cache")
                              .Add({});
  autotune_misses_total_ = &counter("dequantd_autotune_cache_misses_total",
                                    "Launch-config lookups that found no autotune cache entry")
                                .Add({});
  autotune_entries_ =
      &gauge("dequantd_autotune_cache_entries", "Tuned keys held by the autotune cache").Add({});
  autotune_duration_seconds_ =
      &histogram("dequantd_autotune_duration_seconds",
                 "Time one autotuning (a sweep of candidate launch configs) took, in seconds")
           .Add({}, TuningBuckets());

  benchmark_bandwidth_fraction_ = &gauge(
      "dequantd_benchmark_bandwidth_fraction",
      "Last Benchmark RPC: bytes moved per second over the device's peak copy rate, by variant");
  benchmark_duration_seconds_ = &gauge("dequantd_benchmark_duration_seconds",
                                       "Last Benchmark RPC: median latency of one call, seconds");
  benchmark_dram_throughput_ratio_ =
      &gauge("dequantd_benchmark_dram_throughput_ratio",
             "Last Benchmark RPC with hardware counters: DRAM throughput over its peak "
             "(dram__throughput.avg.pct_of_peak_sustained_elapsed / 100)");
  benchmark_l2_hit_ratio_ = &gauge("dequantd_benchmark_l2_hit_ratio",
                                   "Last Benchmark RPC with hardware counters: L2 sector hit "
                                   "rate (lts__t_sector_hit_rate.pct / 100)");
  benchmark_l1_hit_ratio_ = &gauge("dequantd_benchmark_l1_hit_ratio",
                                   "Last Benchmark RPC with hardware counters: L1 sector hit "
                                   "rate (l1tex__t_sector_hit_rate.pct / 100)");
  benchmark_dram_read_bytes_ = &gauge(
      "dequantd_benchmark_dram_read_bytes",
      "Last Benchmark RPC with hardware counters: DRAM bytes read per call (dram__bytes_read.sum)");
  benchmark_dram_written_bytes_ =
      &gauge("dequantd_benchmark_dram_written_bytes",
             "Last Benchmark RPC with hardware counters: DRAM bytes written per call "
             "(dram__bytes_write.sum)");

  gauge("dequantd_build_info", "Always 1; the labels describe the running build")
      .Add({{"version", std::string(version)}, {"cuda", CudaBuildVersion()}})
      .Set(1);
  device_info_ =
      &gauge("dequantd_device_info", "Always 1; one series per device the backend computes on");
  model_layers_ =
      &gauge("dequantd_model_layers", "Quantized layers of the loaded model (0: none loaded)")
           .Add({});
  delivered_bytes_total_ =
      &counter("dequantd_delivered_bytes_total",
               "Dequantized result bytes delivered, by destination (stream: gRPC messages; "
               "host_region / device_region: written into a client's shared memory), in bytes");
  delivered_bytes_by_ = std::make_unique<SeriesCache<prometheus::Counter, 1>>(
      delivered_bytes_total_, std::array<std::string, 1>{"destination"});
  for (const char* destination : {"stream", "host_region", "device_region"}) {
    delivered_bytes_by_->Get({destination});
  }
  shared_memory_regions_ = &gauge("dequantd_shared_memory_regions",
                                  "Shared-memory regions registered now, by kind (host, device)");
  shared_memory_region_bytes_ =
      &gauge("dequantd_shared_memory_region_bytes",
             "Bytes of the shared-memory regions registered now, by kind (host, device)");
  stalled_calls_cancelled_total_ =
      &counter("dequantd_stalled_calls_cancelled_total",
               "Calls cancelled because a result write made no progress for --stall-timeout")
           .Add({});
  CreateSecurityFamilies();
}

void Metrics::CreateSecurityFamilies() {
  prometheus::Registry& r = *registry_;
  tls_certificate_expiry_ =
      &Register(prometheus::BuildGauge(), "dequantd_tls_certificate_expiry_timestamp_seconds",
                "notAfter of the TLS server certificate being served, seconds since the epoch", r);
  tls_reload_errors_total_ =
      &Register(prometheus::BuildCounter(), "dequantd_tls_reload_errors_total",
                "Changed TLS certificate/key/CA files refused at reload (the previous "
                "certificate is still served)",
                r)
           .Add({});
  auth_tokens_ = &Register(prometheus::BuildGauge(), "dequantd_auth_tokens",
                           "Tokens loaded from the --auth-tokens file", r)
                      .Add({});
  auth_tokens_reload_errors_total_ =
      &Register(prometheus::BuildCounter(), "dequantd_auth_tokens_reload_errors_total",
                "Changed --auth-tokens files refused at reload (the previous tokens stay)", r)
           .Add({});
  auth_denied_total_ =
      &Register(prometheus::BuildCounter(), "dequantd_auth_denied_total",
                "Calls refused by the token check before any handler ran, by gRPC status code", r);
}

Metrics::~Metrics() = default;

void Metrics::RpcStarted(std::string_view method) { rpc_in_flight_by_->Get({method}).Increment(); }

void Metrics::RpcFinished(std::string_view method, int code, double seconds) {
  rpc_in_flight_by_->Get({method}).Decrement();
  const std::string code_name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  rpc_requests_by_->Get({method, code_name}).Increment();
  if (code != 0) rpc_errors_by_->Get({method, code_name}).Increment();
  rpc_duration_by_->Get({method, code_name}).Observe(seconds);
}

void Metrics::AddOutputBytes(int64_t bytes) {
  output_bytes_total_->Increment(static_cast<double>(bytes));
  AddDeliveredBytes("stream", bytes);
}

void Metrics::AddDeliveredBytes(std::string_view destination, int64_t bytes) {
  delivered_bytes_by_->Get({destination}).Increment(static_cast<double>(bytes));
}

void Metrics::SetSharedMemoryRegions(std::string_view kind, int64_t count, int64_t bytes) {
  const prometheus::Labels labels = {{"kind", std::string(kind)}};
  shared_memory_regions_->Add(labels).Set(static_cast<double>(count));
  shared_memory_region_bytes_->Add(labels).Set(static_cast<double>(bytes));
}

void Metrics::SetDevices(const BackendInfo& info) {
  for (const DeviceDescription& device : info.devices) {
    device_info_
        ->Add(
            {{"device", device.label.empty() ? DeviceLabel(info.name, device.index) : device.label},
             {"name", device.name},
             {"compute_capability", device.compute_capability},
             {"driver", device.driver_version}})
        .Set(1);
    // Per-device series exist from the start: in rotation as Info says, no calls, no failures.
    const prometheus::Labels labels = {
        {"device", device.label.empty() ? DeviceLabel(info.name, device.index) : device.label}};
    device_serving_->Add(labels).Set(device.serving ? 1 : 0);
    device_calls_in_flight_->Add(labels);
    device_failures_total_->Add(labels);
    device_kernel_seconds_total_->Add(labels);
    device_kernel_bytes_total_->Add(labels);
  }
}

void Metrics::SetModelLayers(int64_t layers) { model_layers_->Set(static_cast<double>(layers)); }

void Metrics::AddStalledCall() { stalled_calls_cancelled_total_->Increment(); }

void Metrics::SetTlsCertificateExpiry(int64_t not_after_unix_seconds) {
  tls_certificate_expiry_->Add({}).Set(static_cast<double>(not_after_unix_seconds));
}

void Metrics::AddTlsReloadError() { tls_reload_errors_total_->Increment(); }

void Metrics::SetAuthTokens(int64_t tokens) { auth_tokens_->Set(static_cast<double>(tokens)); }

void Metrics::AddAuthTokensReloadError() { auth_tokens_reload_errors_total_->Increment(); }

void Metrics::AddAuthDenied(int code) {
  auth_denied_total_->Add({{"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(code))}})
      .Increment();
}

void Metrics::ObserveLookup(bool hit) {
  (hit ? autotune_hits_total_ : autotune_misses_total_)->Increment();
}

void Metrics::ObserveTuning(const AutotuneTuning& tuning) {
  autotune_duration_seconds_->Observe(tuning.wall_seconds);
}

void Metrics::ObserveEntries(size_t entries) {
  autotune_entries_->Set(static_cast<double>(entries));
}

void Metrics::RecordBenchmark(const dequant::v1::BenchmarkResponse& response) {
  std::map<std::string, const dequant::v1::BenchmarkRow*> best;  // by variant
  for (const dequant::v1::BenchmarkRow& row : response.rows()) {
    const dequant::v1::BenchmarkRow*& slot = best[row.variant()];
    if (slot == nullptr || row.bytes_moved() >= slot->bytes_moved()) slot = &row;
  }
  struct CounterGauge {
    const char* key;
    prometheus::Family<prometheus::Gauge>* family;
    double scale;
  };
  const std::array<CounterGauge, 5> counter_gauges = {{
      {"dram__throughput.avg.pct_of_peak_sustained_elapsed", benchmark_dram_throughput_ratio_,
       0.01},
      {"lts__t_sector_hit_rate.pct", benchmark_l2_hit_ratio_, 0.01},
      {"l1tex__t_sector_hit_rate.pct", benchmark_l1_hit_ratio_, 0.01},
      {"dram__bytes_read.sum", benchmark_dram_read_bytes_, 1.0},
      {"dram__bytes_write.sum", benchmark_dram_written_bytes_, 1.0},
  }};
  std::lock_guard<std::mutex> lock(mu_);  // one benchmark's gauges replace the last one's
  for (prometheus::Family<prometheus::Gauge>* family :
       {benchmark_bandwidth_fraction_, benchmark_duration_seconds_,
        benchmark_dram_throughput_ratio_, benchmark_l2_hit_ratio_, benchmark_l1_hit_ratio_,
        benchmark_dram_read_bytes_, benchmark_dram_written_bytes_}) {
    for (prometheus::Gauge* gauge : benchmark_gauges_[family]) family->Remove(gauge);
    benchmark_gauges_[family].clear();
  }
  auto set = [this](prometheus::Family<prometheus::Gauge>* family, const std::string& variant,
                    double value) {
    prometheus::Gauge& gauge = family->Add({{"variant", variant}});
    gauge.Set(value);
    benchmark_gauges_[family].push_back(&gauge);
  };
  for (const auto& [variant, row] : best) {
    set(benchmark_bandwidth_fraction_, variant, row->fraction_of_peak());
    set(benchmark_duration_seconds_, variant, row->median_seconds());
    for (const CounterGauge& c : counter_gauges) {
      auto it = row->counters().find(c.key);
      if (it != row->counters().end()) set(c.family, variant, it->second * c.scale);
    }
  }
}

void Metrics::ObserveStage(DequantizeStage stage, double seconds) {
  static_assert(static_cast<size_t>(DequantizeStage::kSend) + 1 ==
                std::tuple_size_v<decltype(stage_series_)>);  // one slot per stage
  const size_t index = static_cast<size_t>(stage);
  prometheus::Histogram* series = stage_series_[index].load(std::memory_order_acquire);
  if (series == nullptr) {  // two first observations at once get the same series from Add
    series = &stage_duration_seconds_->Add({{"stage", StageName(stage)}}, LatencyBuckets());
    stage_series_[index].store(series, std::memory_order_release);
  }
  series->Observe(seconds);
}

void Metrics::ObserveKernel(std::string_view device, std::string_view backend,
                            std::string_view variant, int64_t read_bytes, int64_t written_bytes,
                            double seconds) {
  kernel_read_bytes_by_->Get({backend, variant}).Increment(static_cast<double>(read_bytes));
  kernel_written_bytes_by_->Get({backend, variant}).Increment(static_cast<double>(written_bytes));
  kernel_duration_by_->Get({variant}).Observe(seconds);
  device_kernel_bytes_by_->Get({device}).Increment(static_cast<double>(read_bytes + written_bytes));
  if (seconds <= 0) return;
  device_kernel_seconds_by_->Get({device}).Increment(seconds);
  double copy_rate = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = copy_bytes_per_second_.find(device);
    if (it != copy_bytes_per_second_.end()) copy_rate = it->second;
  }
  if (copy_rate > 0) {
    const double rate = static_cast<double>(read_bytes + written_bytes) / seconds;
    kernel_bandwidth_fraction_by_->Get({device}).Set(rate / copy_rate);
  }
}

void Metrics::SetDeviceCopyBandwidth(std::string_view device, double bytes_per_second) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    copy_bytes_per_second_[std::string(device)] = bytes_per_second;
  }
  device_copy_bandwidth_->Add({{"device", std::string(device)}}).Set(bytes_per_second);
}

void Metrics::SetDeviceMemoryUsed(std::string_view device, DeviceMemoryKind kind, int64_t bytes) {
  device_memory_used_by_->Get({device, MemoryKindName(kind)}).Set(static_cast<double>(bytes));
}

void Metrics::SetDeviceInFlight(std::string_view device, int64_t calls) {
  device_calls_in_flight_by_->Get({device}).Set(static_cast<double>(calls));
}

void Metrics::SetDeviceServing(std::string_view device, bool serving) {
  const prometheus::Labels labels = {{"device", std::string(device)}};
  device_serving_->Add(labels).Set(serving ? 1 : 0);
  prometheus::Counter& failures = device_failures_total_->Add(labels);  // 0 from the start
  if (!serving) failures.Increment();
}

}  // namespace dequantd
