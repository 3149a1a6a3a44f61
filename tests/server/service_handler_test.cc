// Tests for DequantService's common handler wrapper, calling a handler directly (no gRPC server)
// with a BenchmarkRunner that throws: the exception becomes an exact status naming the method,
// and the call is counted with that code and leaves the in-flight gauge at 0.
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include <grpcpp/grpcpp.h>

#include "dequant/v1/dequant.grpc.pb.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/backend/backend.h"
#include "server/metrics/metrics.h"
#include "server/rpc/service.h"
#include "tests/observability/metrics_series.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

using ::dequantd::testing::SeriesValue;

class ServiceHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendOptions backend_options;
    backend_options.kind = "cpu";
    backend_options.cpu_threads = 1;
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(backend_options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "0.1.0");
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    metrics_ = std::move(*metrics);
  }

  // Benchmark on a service whose runner is `runner`, called directly on this thread.
  grpc::Status CallBenchmark(BenchmarkRunner runner) {
    DequantService service({}, nullptr, backend_.get(), metrics_.get(), std::move(runner));
    grpc::ServerContext context;
    v1::BenchmarkRequest request;
    v1::BenchmarkResponse response;
    return service.Benchmark(&context, &request, &response);
  }

  std::optional<double> Requests(const std::string& code) const {
    return SeriesValue(*metrics_, "dequantd_rpc_requests_total",
                       {{"code", code}, {"method", "Benchmark"}});
  }
  std::optional<double> Errors(const std::string& code) const {
    return SeriesValue(*metrics_, "dequantd_rpc_errors_total",
                       {{"code", code}, {"method", "Benchmark"}});
  }
  std::optional<double> InFlight() const {
    return SeriesValue(*metrics_, "dequantd_rpc_in_flight", {{"method", "Benchmark"}});
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Metrics> metrics_;
};

TEST_F(ServiceHandlerTest, BadAllocIsResourceExhaustedAndCounted) {
  const grpc::Status status =
      CallBenchmark([](const v1::BenchmarkRequest&,
                       grpc::ServerContext*) -> absl::StatusOr<v1::BenchmarkResponse> {
        throw std::bad_alloc();
      });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(), "out of memory while serving Benchmark: std::bad_alloc");
  EXPECT_EQ(InFlight(), 0.0);
  EXPECT_EQ(Requests("RESOURCE_EXHAUSTED"), 1.0);
  EXPECT_EQ(Errors("RESOURCE_EXHAUSTED"), 1.0);
  EXPECT_EQ(SeriesValue(*metrics_, "dequantd_rpc_duration_seconds",
                        {{"code", "RESOURCE_EXHAUSTED"}, {"method", "Benchmark"}}),
            1.0);
}

TEST_F(ServiceHandlerTest, OtherExceptionIsInternalWithWhatAndCounted) {
  const grpc::Status status =
      CallBenchmark([](const v1::BenchmarkRequest&,
                       grpc::ServerContext*) -> absl::StatusOr<v1::BenchmarkResponse> {
        throw std::out_of_range("vector::_M_range_check: __n (which is 7) >= this->size()");
      });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(status.error_message(),
            "unexpected error while serving Benchmark: vector::_M_range_check: __n (which is 7) "
            ">= this->size()");
  EXPECT_EQ(InFlight(), 0.0);
  EXPECT_EQ(Requests("INTERNAL"), 1.0);
  EXPECT_EQ(Errors("INTERNAL"), 1.0);
}

TEST_F(ServiceHandlerTest, NonStdExceptionIsInternal) {
  const grpc::Status status = CallBenchmark(
      [](const v1::BenchmarkRequest&,
         grpc::ServerContext*) -> absl::StatusOr<v1::BenchmarkResponse> { throw 42; });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(status.error_message(),
            "unexpected error while serving Benchmark: a non-std exception");
  EXPECT_EQ(InFlight(), 0.0);
  EXPECT_EQ(Requests("INTERNAL"), 1.0);
}

TEST_F(ServiceHandlerTest, AReturnedStatusIsCountedWithItsCode) {
  const grpc::Status status =
      CallBenchmark([](const v1::BenchmarkRequest&,
                       grpc::ServerContext*) -> absl::StatusOr<v1::BenchmarkResponse> {
        return absl::FailedPreconditionError("no CUDA device 0");
      });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), "no CUDA device 0");
  EXPECT_EQ(InFlight(), 0.0);
  EXPECT_EQ(Requests("FAILED_PRECONDITION"), 1.0);
}

}  // namespace
}  // namespace dequantd
