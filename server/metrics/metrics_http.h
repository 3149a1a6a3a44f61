// MetricsHttpServer: the HTTP endpoint of dequantd's metrics (--metrics-listen), a civetweb
// CivetServer that serves one prometheus::Collectable (the Metrics registry) and nothing else.
//
// prometheus-cpp's Exposer is not used: its endpoint registers a registry of its own whose
// families (exposer_transferred_bytes_total, exposer_scrapes_total and the summary
// exposer_request_latencies, in microseconds) would appear on /metrics without the dequantd_
// prefix, in other units and as a summary; prometheus-cpp 1.0 offers no way to leave them out.
//
// Routes (GET):
//   /metrics  200, Content-Type "text/plain; version=0.0.4; charset=utf-8": the Prometheus text
//             exposition format (prometheus::TextSerializer) of what the collectable collects at
//             the time of the request.
//   /         200, text/plain: one line pointing to /metrics.
//   other     404.
// Other methods (HEAD, POST, ...): 404, civetweb's answer when no handler takes the request.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

class CivetServer;

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace dequantd {

// Thread-safe: civetweb's worker threads (2) answer requests concurrently; Collect must be
// thread-safe (prometheus::Registry's is).
class MetricsHttpServer final {
 public:
  // Serves `collectable` on `listen` (HOST:PORT, IPv6 as [ADDR]:PORT; port 0 picks a free port)
  // until destroyed. Errors: UNAVAILABLE when `listen` cannot be served; the message is bind(2)'s
  // reason ("Address already in use", "Permission denied", "Cannot assign requested address"),
  // getaddrinfo's for a host that does not resolve, or civetweb's own text when neither explains
  // it. The caller names the flag and the address.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Collectable> collectable);
  // Stops accepting and waits for the requests in progress; returns in milliseconds when idle
  // (civetweb's own stop waits out a 2 s poll; see the destructor) and the port can be bound again
  // at once.
  ~MetricsHttpServer();

  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }  // the bound TCP port

 private:
  class Handler;  // the CivetHandler answering every URI (metrics_http.cc)

  MetricsHttpServer() = default;

  // Declared before server_: the server, destroyed first, stops calling the handler.
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<CivetServer> server_;
  int port_ = 0;
  std::string host_;  // the HOST of `listen`
};

}  // namespace dequantd
