// The one room for dequantd's Prometheus metrics: every family is defined here, with its unit.
// Served as text at http://<metrics_listen>/metrics by MetricsHttpServer
// (server/metrics/metrics_http.h: these families only, none of prometheus-cpp Exposer's own). Names
// follow the Prometheus conventions (prefix dequantd_, base units, counters end in _total,
// latencies are histograms); labels have few values (no tensor names). docs/observability.md
// explains each.
//
// RPCs
//   dequantd_rpc_requests_total{method,code}          counter: RPCs finished (code: gRPC name)
//   dequantd_rpc_errors_total{method,code}            counter: RPCs finished with a code != OK
//   dequantd_rpc_duration_seconds{method,code}        histogram: RPC wall time, seconds
//   dequantd_rpc_in_flight{method}                    gauge: RPCs being handled now
//   dequantd_dequantize_output_bytes_total            counter: result bytes sent, bytes
//   dequantd_dequantize_stage_duration_seconds{stage} histogram: seconds per stage of a
//       Dequantize (stage: queue_wait, host_to_device, kernel, device_to_host, send)
// Kernels
//   dequantd_kernel_read_bytes_total{backend,variant}     counter: bytes kernels read, bytes
//   dequantd_kernel_written_bytes_total{backend,variant}  counter: bytes kernels wrote, bytes
//   dequantd_kernel_duration_seconds{variant}             histogram: one kernel run, seconds
//   dequantd_kernel_bandwidth_fraction{device}            gauge: last kernel's (read + written)
//       bytes/s over dequantd_device_copy_bandwidth_bytes_per_second, ratio
//   dequantd_device_copy_bandwidth_bytes_per_second{device}  gauge: measured copy rate, bytes/s
//   dequantd_device_memory_used_bytes{device,kind}        gauge: kind resident_weights|buffers
// Several GPUs (one series per worker; device e.g. cuda:0, cuda:1; docs/architecture.md)
//   dequantd_device_kernel_seconds_total{device}     counter: kernel time, seconds (rate = busy)
//   dequantd_device_kernel_bytes_total{device}       counter: kernel bytes read + written, bytes
//   dequantd_device_calls_in_flight{device}          gauge: calls in a slot or waiting for one
//   dequantd_device_serving{device}                  gauge: 1 in rotation, 0 taken out
//   dequantd_device_failures_total{device}           counter: times taken out of rotation
// Autotuner
//   dequantd_autotune_cache_hits_total                counter: GetOrTune calls answered from memory
//   dequantd_autotune_cache_misses_total              counter: GetOrTune calls that found no entry
//   dequantd_autotune_cache_entries                   gauge: tuned keys held
//   dequantd_autotune_duration_seconds                histogram: one tuning, seconds
// Last Benchmark RPC, per variant (the row moving the most bytes; issue 4 part 2 fills the
// hardware-counter gauges from BenchmarkRow.counters, see RecordBenchmark)
//   dequantd_benchmark_bandwidth_fraction{variant}     gauge: fraction_of_peak, ratio
//   dequantd_benchmark_duration_seconds{variant}       gauge: median latency, seconds
//   dequantd_benchmark_dram_throughput_ratio{variant}  gauge: DRAM throughput / peak, ratio
//   dequantd_benchmark_l2_hit_ratio{variant}           gauge: L2 (lts) sector hit rate, ratio
//   dequantd_benchmark_l1_hit_ratio{variant}           gauge: L1 (l1tex) sector hit rate, ratio
//   dequantd_benchmark_dram_read_bytes{variant}        gauge: DRAM bytes read per call, bytes
//   dequantd_benchmark_dram_written_bytes{variant}     gauge: DRAM bytes written per call, bytes
// Process
//   dequantd_build_info{version,cuda}                 gauge: always 1 (cuda: runtime or "none")
//   dequantd_device_info{device,name,compute_capability,driver}  gauge: always 1
//   dequantd_model_layers                             gauge: quantized layers of the model
// Security (server/auth/, README "Security")
//   dequantd_tls_certificate_expiry_timestamp_seconds  gauge: notAfter of the served server
//       certificate, seconds since the epoch (absent without --tls-cert)
//   dequantd_tls_reload_errors_total                   counter: changed TLS files refused (the
//       previous certificate is still served)
//   dequantd_auth_tokens                               gauge: tokens loaded from --auth-tokens
//   dequantd_auth_tokens_reload_errors_total           counter: changed token files refused
//   dequantd_auth_denied_total{code}                   counter: calls refused before any handler
//       (code: UNAUTHENTICATED or PERMISSION_DENIED)
// Shared-memory regions (issue 9)
//   dequantd_delivered_bytes_total{destination}       counter: result bytes delivered, bytes
//       (destination: stream, host_region, device_region)
//   dequantd_shared_memory_regions{kind}              gauge: regions registered (host, device)
//   dequantd_shared_memory_region_bytes{kind}         gauge: their registered bytes, bytes
// Abuse limits
//   dequantd_stalled_calls_cancelled_total            counter: calls cancelled by --stall-timeout
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "dequant/v1/dequant.pb.h"
#include "kernels/autotune.h"
#include "server/backend/backend.h"
#include "server/backend/backend_observer.h"

namespace prometheus {
class Counter;
class Gauge;
class Registry;
template <typename T>
class Family;
class Histogram;
}  // namespace prometheus

namespace dequantd {

class MetricsHttpServer;
template <typename Metric, size_t kLabels>
class SeriesCache;  // series_cache.h

// Thread-safe: every method may be called from many threads at once.
class Metrics final : public BackendObserver, public AutotuneObserver {
 public:
  // Creates the families and, unless `listen` is empty, serves them on `listen` (HOST:PORT; port
  // 0 picks a free port). `version` labels dequantd_build_info. Errors: UNAVAILABLE when `listen`
  // cannot be served; the message names --metrics-listen and the address, and gives bind(2)'s
  // reason (e.g. "Address already in use", "Permission denied", "Cannot assign requested
  // address") or getaddrinfo's for a host that does not resolve.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& listen,
                                                         std::string_view version);
  ~Metrics() override;

  int port() const { return port_; }  // bound HTTP port; 0 when not served
  // The registry, for families added elsewhere (prefer adding them here).
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // --- RPCs (server/rpc/service.cc) ---
  // Marks one RPC of `method` (e.g. "Dequantize") started.
  void RpcStarted(std::string_view method);
  // Marks it finished with gRPC status code `code` (0..16) after `seconds` of wall time.
  void RpcFinished(std::string_view method, int code, double seconds);
  // Adds `bytes` of dequantized output sent to a client (also delivered{destination="stream"}).
  void AddOutputBytes(int64_t bytes);

  // --- Shared-memory regions (server/rpc/region_service.cc) ---
  // Adds `bytes` of result written into a region; `destination` "host_region" or
  // "device_region".
  void AddDeliveredBytes(std::string_view destination, int64_t bytes);
  // The regions of `kind` ("host" or "device") registered now: how many, and their bytes.
  void SetSharedMemoryRegions(std::string_view kind, int64_t count, int64_t bytes);

  // --- Process (server/server.cc, once at start) ---
  // One dequantd_device_info series per device of the backend.
  void SetDevices(const BackendInfo& info);
  void SetModelLayers(int64_t layers);

  // --- AutotuneObserver (the autotuner, kernels/autotune.h; through server.cc's log) ---
  // A hit or a miss: +1 on the counter.
  void ObserveLookup(bool hit) override;
  // The tuning's wall time into the duration histogram.
  void ObserveTuning(const AutotuneTuning& tuning) override;
  // Sets the entries gauge.
  void ObserveEntries(size_t entries) override;

  // --- Benchmark RPC (server/rpc/service.cc) ---
  // Sets the dequantd_benchmark_* gauges from a Benchmark reply: per variant, the row with the
  // largest bytes_moved (the last such row on ties). Hardware-counter keys read from
  // BenchmarkRow.counters (percentages are divided by 100):
  //   "dram__throughput.avg.pct_of_peak_sustained_elapsed" -> dram_throughput_ratio
  //   "lts__t_sector_hit_rate.pct"                         -> l2_hit_ratio
  //   "l1tex__t_sector_hit_rate.pct"                       -> l1_hit_ratio
  //   "dram__bytes_read.sum"                               -> dram_read_bytes
  //   "dram__bytes_write.sum"                              -> dram_written_bytes
  void RecordBenchmark(const dequant::v1::BenchmarkResponse& response);

  // --- Security (server/auth/ through server.cc) ---
  void SetTlsCertificateExpiry(int64_t not_after_unix_seconds);
  void AddTlsReloadError();
  void SetAuthTokens(int64_t tokens);
  void AddAuthTokensReloadError();
  // One call refused by the token check with gRPC status code `code` (16 or 7).
  void AddAuthDenied(int code);
  // --- Abuse limits (server/rpc/stall_watchdog.h via server.cc) ---
  // One call cancelled by --stall-timeout: dequantd_stalled_calls_cancelled_total.
  void AddStalledCall();

  // --- BackendObserver (backends) ---
  void ObserveStage(DequantizeStage stage, double seconds) override;
  void ObserveKernel(std::string_view device, std::string_view backend, std::string_view variant,
                     int64_t read_bytes, int64_t written_bytes, double seconds) override;
  void SetDeviceCopyBandwidth(std::string_view device, double bytes_per_second) override;
  void SetDeviceMemoryUsed(std::string_view device, DeviceMemoryKind kind, int64_t bytes) override;
  void SetDeviceInFlight(std::string_view device, int64_t calls) override;
  void SetDeviceServing(std::string_view device, bool serving) override;

 private:
  Metrics() = default;
  void CreateFamilies(std::string_view version);
  void CreateSecurityFamilies();

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsHttpServer> http_;  // null when not served
  int port_ = 0;

  prometheus::Family<prometheus::Counter>* rpc_requests_total_ = nullptr;
  prometheus::Family<prometheus::Counter>* rpc_errors_total_ = nullptr;
  prometheus::Family<prometheus::Histogram>* rpc_duration_seconds_ = nullptr;
  prometheus::Family<prometheus::Gauge>* rpc_in_flight_ = nullptr;
  prometheus::Counter* output_bytes_total_ = nullptr;
  prometheus::Family<prometheus::Histogram>* stage_duration_seconds_ = nullptr;
  // Each stage's series of stage_duration_seconds_, made at its first observation (so /metrics
  // lists only stages that ran, as before) and looked up here afterwards: Family::Add builds and
  // hashes a label map under the family's lock, about 0.6 us, five times per call after the kernel.
  std::array<std::atomic<prometheus::Histogram*>, 5> stage_series_{};
  // The per-call series of the families above, by label values (series_cache.h): every RPC and
  // every kernel report looks its series up here instead of through Family::Add.
  std::unique_ptr<SeriesCache<prometheus::Gauge, 1>> rpc_in_flight_by_;
  std::unique_ptr<SeriesCache<prometheus::Counter, 2>> rpc_requests_by_;
  std::unique_ptr<SeriesCache<prometheus::Counter, 2>> rpc_errors_by_;
  std::unique_ptr<SeriesCache<prometheus::Histogram, 2>> rpc_duration_by_;
  std::unique_ptr<SeriesCache<prometheus::Counter, 2>> kernel_read_bytes_by_;
  std::unique_ptr<SeriesCache<prometheus::Counter, 2>> kernel_written_bytes_by_;
  std::unique_ptr<SeriesCache<prometheus::Histogram, 1>> kernel_duration_by_;
  std::unique_ptr<SeriesCache<prometheus::Gauge, 1>> kernel_bandwidth_fraction_by_;
  std::unique_ptr<SeriesCache<prometheus::Counter, 1>> device_kernel_seconds_by_;
  std::unique_ptr<SeriesCache<prometheus::Counter, 1>> device_kernel_bytes_by_;
  std::unique_ptr<SeriesCache<prometheus::Gauge, 1>> device_calls_in_flight_by_;
  std::unique_ptr<SeriesCache<prometheus::Gauge, 2>> device_memory_used_by_;
  std::unique_ptr<SeriesCache<prometheus::Counter, 1>> delivered_bytes_by_;

  prometheus::Family<prometheus::Counter>* kernel_read_bytes_total_ = nullptr;
  prometheus::Family<prometheus::Counter>* kernel_written_bytes_total_ = nullptr;
  prometheus::Family<prometheus::Histogram>* kernel_duration_seconds_ = nullptr;
  prometheus::Family<prometheus::Gauge>* kernel_bandwidth_fraction_ = nullptr;
  prometheus::Family<prometheus::Gauge>* device_copy_bandwidth_ = nullptr;
  prometheus::Family<prometheus::Gauge>* device_memory_used_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_kernel_seconds_total_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_kernel_bytes_total_ = nullptr;
  prometheus::Family<prometheus::Gauge>* device_calls_in_flight_ = nullptr;
  prometheus::Family<prometheus::Gauge>* device_serving_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_failures_total_ = nullptr;

  prometheus::Counter* autotune_hits_total_ = nullptr;
  prometheus::Counter* autotune_misses_total_ = nullptr;
  prometheus::Gauge* autotune_entries_ = nullptr;
  prometheus::Histogram* autotune_duration_seconds_ = nullptr;

  prometheus::Family<prometheus::Gauge>* benchmark_bandwidth_fraction_ = nullptr;
  prometheus::Family<prometheus::Gauge>* benchmark_duration_seconds_ = nullptr;
  prometheus::Family<prometheus::Gauge>* benchmark_dram_throughput_ratio_ = nullptr;
  prometheus::Family<prometheus::Gauge>* benchmark_l2_hit_ratio_ = nullptr;
  prometheus::Family<prometheus::Gauge>* benchmark_l1_hit_ratio_ = nullptr;
  prometheus::Family<prometheus::Gauge>* benchmark_dram_read_bytes_ = nullptr;
  prometheus::Family<prometheus::Gauge>* benchmark_dram_written_bytes_ = nullptr;

  prometheus::Family<prometheus::Gauge>* device_info_ = nullptr;
  prometheus::Gauge* model_layers_ = nullptr;

  prometheus::Family<prometheus::Gauge>* tls_certificate_expiry_ = nullptr;
  prometheus::Counter* tls_reload_errors_total_ = nullptr;
  prometheus::Gauge* auth_tokens_ = nullptr;
  prometheus::Counter* auth_tokens_reload_errors_total_ = nullptr;
  prometheus::Family<prometheus::Counter>* auth_denied_total_ = nullptr;
  prometheus::Family<prometheus::Counter>* delivered_bytes_total_ = nullptr;
  prometheus::Family<prometheus::Gauge>* shared_memory_regions_ = nullptr;
  prometheus::Family<prometheus::Gauge>* shared_memory_region_bytes_ = nullptr;
  prometheus::Counter* stalled_calls_cancelled_total_ = nullptr;

  std::mutex mu_;
  std::map<std::string, double, std::less<>> copy_bytes_per_second_;  // by device; guarded by mu_
  // The dequantd_benchmark_* series of the last RecordBenchmark, by family; guarded by mu_.
  std::map<prometheus::Family<prometheus::Gauge>*, std::vector<prometheus::Gauge*>>
      benchmark_gauges_;
};

}  // namespace dequantd
