// Metrics (see metrics.h).
#include "server/metrics.h"

#include <exception>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dequantd {
namespace {

// Request latency buckets, seconds: 100 us .. 60 s (a small layer on a GPU to a large one on a
// CPU through a slow link).
const prometheus::Histogram::BucketBoundaries& DurationBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
  return *buckets;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& listen,
                                                         std::string_view version,
                                                         std::string_view backend) {
  auto metrics = std::unique_ptr<Metrics>(new Metrics());
  metrics->registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Registry& registry = *metrics->registry_;

  metrics->requests_total_ = &prometheus::BuildCounter()
                                  .Name("dequantd_requests_total")
                                  .Help("RPCs finished, by method and gRPC status code")
                                  .Register(registry);
  metrics->request_duration_seconds_ = &prometheus::BuildHistogram()
                                            .Name("dequantd_request_duration_seconds")
                                            .Help(
                                                "RPC wall time from arrival to the last byte "
                                                "sent, in seconds")
                                            .Register(registry);
  metrics->requests_in_flight_ = &prometheus::BuildGauge()
                                      .Name("dequantd_requests_in_flight")
                                      .Help("RPCs being handled now")
                                      .Register(registry)
                                      .Add({});
  metrics->output_bytes_total_ = &prometheus::BuildCounter()
                                      .Name("dequantd_output_bytes_total")
                                      .Help("Dequantized result bytes sent to clients, in bytes")
                                      .Register(registry)
                                      .Add({});
  prometheus::BuildGauge()
      .Name("dequantd_build_info")
      .Help("Always 1; the labels describe the running build")
      .Register(registry)
      .Add({
        {"version", std::string(version)}, {"backend", std::string(backend)},
#if DEQUANTD_HAVE_CUDA
            {"cuda", "true"}
#else
        {
          "cuda", "false"
        }
#endif
      })
      .Set(1);

  if (!listen.empty()) {
    try {
      metrics->exposer_ = std::make_unique<prometheus::Exposer>(listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve metrics on \"", listen, "\": ", e.what()));
    }
    metrics->exposer_->RegisterCollectable(metrics->registry_);
    const std::vector<int> ports = metrics->exposer_->GetListeningPorts();
    metrics->port_ = ports.empty() ? 0 : ports.front();
  }
  return metrics;
}

Metrics::~Metrics() = default;

void Metrics::RequestStarted() { requests_in_flight_->Increment(); }

void Metrics::RequestFinished(std::string_view method, int code, double seconds) {
  requests_in_flight_->Decrement();
  const std::string code_name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  requests_total_->Add({{"method", std::string(method)}, {"code", code_name}}).Increment();
  request_duration_seconds_->Add({{"method", std::string(method)}}, DurationBuckets())
      .Observe(seconds);
}

void Metrics::AddOutputBytes(int64_t bytes) {
  output_bytes_total_->Increment(static_cast<double>(bytes));
}

}  // namespace dequantd
