// DequantServer::Start and the running server (see server.h).
#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/backend.h"
#include "server/checkpoint.h"
#include "server/metrics.h"
#include "server/service.h"

namespace dequantd {

const char kDequantdVersion[] = DEQUANTD_VERSION;

namespace {

// gRPC's receive limit: above max_request_bytes (plus the request's other fields and framing) so
// that an oversized inline request reaches our own check and gets its precise message.
int ReceiveLimitBytes(int64_t max_request_bytes) {
  const int64_t limit = max_request_bytes + max_request_bytes / 16 + (int64_t{1} << 20);
  return static_cast<int>(std::min<int64_t>(limit, INT_MAX));
}

// The backend options for `options`. The seam for the autotuner (issue 3): on CUDA, set
// `cuda.launch_config` to a provider backed by the tune cache (options.tune_cache).
BackendOptions MakeBackendOptions(const ServerOptions& options) {
  BackendOptions backend;
  backend.kind = options.backend;
  backend.cpu_threads = options.cpu_threads;
  return backend;
}

std::string DescribeDevices(const BackendInfo& info) {
  if (info.devices.empty()) return info.name;
  const DeviceDescription& first = info.devices.front();
  std::string text = first.name;
  if (info.name == "cpu") {
    absl::StrAppend(&text, " (", info.cpu_threads, " threads)");
  } else if (!first.compute_capability.empty()) {
    std::string sm = first.compute_capability;
    sm.erase(std::remove(sm.begin(), sm.end(), '.'), sm.end());
    absl::StrAppend(&text, " (sm_", sm, ")");
  }
  if (info.devices.size() > 1) text = absl::StrCat(info.devices.size(), " x ", text);
  return text;
}

absl::Status CheckOptions(const ServerOptions& options) {
  if (options.max_request_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_request_bytes must be positive, got ", options.max_request_bytes));
  }
  if (options.max_output_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_output_bytes must be positive, got ", options.max_output_bytes));
  }
  if (options.default_chunk_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("default_chunk_bytes must be positive, got ", options.default_chunk_bytes));
  }
  if (options.cpu_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu_threads must be >= 0, got ", options.cpu_threads));
  }
  if (options.listen.empty()) return absl::InvalidArgumentError("listen must not be empty");
  return absl::OkStatus();
}

class RunningServer final : public DequantServer {
 public:
  ~RunningServer() override { Shutdown(5.0); }

  int port() const override { return port_; }
  int metrics_port() const override { return metrics_port_; }
  std::string backend_name() const override { return backend_info_.name; }
  std::string device_description() const override { return DescribeDevices(backend_info_); }
  int layer_count() const override {
    return checkpoint_ != nullptr ? static_cast<int>(checkpoint_->layers().size()) : 0;
  }

  void Shutdown(double deadline_seconds) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (shutting_down_) {
      done_cv_.wait(lock, [this] { return shut_down_; });
      return;
    }
    shutting_down_ = true;
    lock.unlock();
    if (server_ != nullptr) {
      const auto deadline = std::chrono::system_clock::now() +
                            std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                std::chrono::duration<double>(std::max(0.0, deadline_seconds)));
      server_->Shutdown(deadline);  // returns when every handler has returned
      server_->Wait();
    }
    metrics_.reset();  // stops the HTTP endpoint; no handler uses it any more
    lock.lock();
    shut_down_ = true;
    done_cv_.notify_all();
  }

  void Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return shut_down_; });
  }

 private:
  friend absl::StatusOr<std::unique_ptr<DequantServer>> DequantServer::Start(
      const ServerOptions& options);

  // Destroyed in reverse order: gRPC first, the checkpoint last.
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Backend> backend_;
  BackendInfo backend_info_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<DequantService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  int metrics_port_ = 0;

  std::mutex mu_;
  std::condition_variable done_cv_;
  bool shutting_down_ = false;  // guarded by mu_
  bool shut_down_ = false;      // guarded by mu_
};

}  // namespace

absl::StatusOr<std::unique_ptr<DequantServer>> DequantServer::Start(const ServerOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  auto server = std::make_unique<RunningServer>();

  if (!options.model_dir.empty()) {
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(options.model_dir);
    if (!checkpoint.ok()) return checkpoint.status();
    server->checkpoint_ = std::move(*checkpoint);
  }

  // Metrics first: the backend reports its stages, kernels and memory into them.
  absl::StatusOr<std::unique_ptr<Metrics>> metrics =
      Metrics::Create(options.metrics_listen, kDequantdVersion);
  if (!metrics.ok()) return metrics.status();
  server->metrics_ = std::move(*metrics);
  server->metrics_port_ = server->metrics_->port();

  BackendOptions backend_options = MakeBackendOptions(options);
  backend_options.observer = server->metrics_.get();
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(backend_options);
  if (!backend.ok()) return backend.status();
  server->backend_ = std::move(*backend);
  server->backend_info_ = server->backend_->Info();
  server->metrics_->SetDevices(server->backend_info_);
  if (server->checkpoint_ != nullptr) {
    if (absl::Status s = server->backend_->Prepare(*server->checkpoint_); !s.ok()) return s;
  }
  server->metrics_->SetModelLayers(server->layer_count());

  ServiceOptions service_options;
  service_options.version = kDequantdVersion;
  service_options.max_request_bytes = options.max_request_bytes;
  service_options.max_output_bytes = options.max_output_bytes;
  service_options.default_chunk_bytes = options.default_chunk_bytes;
  // The Benchmark seam (issue 3): pass a BenchmarkRunner here.
  server->service_ = std::make_unique<DequantService>(
      service_options, server->checkpoint_.get(), server->backend_.get(), server->metrics_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.SetMaxReceiveMessageSize(ReceiveLimitBytes(options.max_request_bytes));
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    server->server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on \"", options.listen,
                                               "\" (address in use or not HOST:PORT?)"));
  }
  return server;
}

}  // namespace dequantd
