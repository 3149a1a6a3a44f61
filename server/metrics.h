// The one room for dequantd's Prometheus metrics: every family is defined here, with its unit.
// Served as text at http://<metrics_listen>/metrics by prometheus-cpp's Exposer.
//
//   dequantd_requests_total{method,code}          counter: RPCs finished, by gRPC code name
//   dequantd_request_duration_seconds{method}     histogram: RPC wall time, seconds
//   dequantd_requests_in_flight                   gauge: RPCs being handled now
//   dequantd_output_bytes_total                   counter: dequantized result bytes sent, bytes
//   dequantd_build_info{version,backend,cuda}     gauge: always 1; labels describe the build
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Registry;
template <typename T>
class Family;
class Histogram;
}  // namespace prometheus

namespace dequantd {

// Thread-safe: every method may be called from many RPC threads at once.
class Metrics {
 public:
  // Creates the families and, unless `listen` is empty, serves them on `listen` (HOST:PORT; port
  // 0 picks a free port). Errors: UNAVAILABLE (cannot bind `listen`).
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& listen,
                                                         std::string_view version,
                                                         std::string_view backend);
  ~Metrics();

  int port() const { return port_; }  // bound HTTP port; 0 when not served
  // The registry, for families added elsewhere (prefer adding them here).
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Marks one RPC of `method` started (in-flight gauge).
  void RequestStarted();
  // Marks it finished with gRPC status code `code` (0..16) after `seconds` of wall time.
  void RequestFinished(std::string_view method, int code, double seconds);
  // Adds `bytes` of dequantized output sent to a client.
  void AddOutputBytes(int64_t bytes);

 private:
  Metrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  prometheus::Family<prometheus::Counter>* requests_total_ = nullptr;
  prometheus::Family<prometheus::Histogram>* request_duration_seconds_ = nullptr;
  prometheus::Gauge* requests_in_flight_ = nullptr;
  prometheus::Counter* output_bytes_total_ = nullptr;
};

}  // namespace dequantd
