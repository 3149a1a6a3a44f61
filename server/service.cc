// DequantService (see service.h).
#include "server/service.h"

#include <chrono>
#include <exception>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/quoted_name.h"
#include "server/request.h"
#include "server/stall_watchdog.h"
#include "server/status.h"
#include "spdlog/spdlog.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

// One result a GrpcResultSink streams: its layer name (empty for Dequantize) and shape.
struct ResultLayer {
  std::string tensor;
  AwqShape shape;
};

// Streams Dequantize or DequantizeLayers results to the client: per result a header message,
// then its data chunks. For Dequantize (one result, `per_layer` false) the header goes out at
// Begin; for DequantizeLayers at each BeginLayer, carrying the layer's name.
class GrpcResultSink final : public LayersSink {
 public:
  GrpcResultSink(grpc::ServerContext* context, grpc::ServerWriter<v1::DequantizeResponse>* writer,
                 std::vector<ResultLayer> results, bool per_layer, DType out_dtype,
                 std::string backend, Metrics* metrics)
      : context_(context),
        writer_(writer),
        results_(std::move(results)),
        per_layer_(per_layer),
        out_dtype_(out_dtype),
        backend_(std::move(backend)),
        metrics_(metrics) {}

  absl::Status Begin(const std::string& kernel) override {
    kernel_ = kernel;
    return per_layer_ ? absl::OkStatus() : SendHeader(0);
  }

  absl::Status BeginLayer(int64_t index) override {
    if (index < 0 || index >= static_cast<int64_t>(results_.size())) {
      return absl::InternalError(absl::StrCat("BeginLayer(", index, ") of ", results_.size()));
    }
    return SendHeader(static_cast<size_t>(index));
  }

  // Writes that block longer than its timeout are cancelled (null: never).
  void set_stall_watchdog(StallWatchdog* watchdog) { stall_watchdog_ = watchdog; }

  absl::Status Write(int64_t offset, absl::Span<const uint8_t> bytes) override {
    chunk_.set_offset(offset);
    chunk_.set_data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    if (absl::Status s = Send(chunk_); !s.ok()) return s;
    metrics_->AddOutputBytes(static_cast<int64_t>(bytes.size()));
    return absl::OkStatus();
  }

 private:
  absl::Status SendHeader(size_t index) {
    const ResultLayer& result = results_[index];
    v1::DequantizeResponse response;
    v1::DequantizeHeader* header = response.mutable_header();
    header->add_shape(result.shape.K);
    header->add_shape(result.shape.N);
    header->set_dtype(DTypeToProto(out_dtype_));
    header->set_total_bytes(result.shape.output_bytes(out_dtype_));
    header->set_backend(backend_);
    header->set_kernel(kernel_);
    header->set_tensor(result.tensor);
    return Send(response);
  }

  absl::Status Send(const v1::DequantizeResponse& response) {
    if (context_->IsCancelled()) return absl::CancelledError("the client cancelled the call");
    StallWatchdog::Write watch(stall_watchdog_, [this] { context_->TryCancel(); });
    if (!writer_->Write(response)) {
      if (watch.stalled()) {
        return absl::DeadlineExceededError(absl::StrCat("the client read nothing for ",
                                                        stall_watchdog_->timeout_seconds(),
                                                        " s (--stall-timeout): call cancelled"));
      }
      return absl::CancelledError("the client closed the stream before the result was sent");
    }
    return absl::OkStatus();
  }

  grpc::ServerContext* const context_;
  grpc::ServerWriter<v1::DequantizeResponse>* const writer_;
  const std::vector<ResultLayer> results_;
  const bool per_layer_;
  const DType out_dtype_;
  const std::string backend_;
  Metrics* const metrics_;
  std::string kernel_;
  v1::DequantizeResponse chunk_;  // reused: its data string keeps its capacity
  StallWatchdog* stall_watchdog_ = nullptr;
};

}  // namespace

DequantService::DequantService(ServiceOptions options, const Checkpoint* checkpoint,
                               Backend* backend, Metrics* metrics, BenchmarkRunner benchmark)
    : options_(std::move(options)),
      checkpoint_(checkpoint),
      backend_(backend),
      metrics_(metrics),
      benchmark_(std::move(benchmark)),
      backend_info_(backend->Info()) {}

namespace {

// One call of `method` in the metrics for its whole life: in flight from construction, finished
// with the code given to Finish (UNKNOWN if the scope is left without it) at destruction.
class RpcScope {
 public:
  RpcScope(Metrics* metrics, const char* method)
      : metrics_(metrics), method_(method), start_(std::chrono::steady_clock::now()) {
    metrics_->RpcStarted(method_);
  }
  RpcScope(const RpcScope&) = delete;
  RpcScope& operator=(const RpcScope&) = delete;
  ~RpcScope() {
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
    metrics_->RpcFinished(method_, code_, elapsed.count());
  }

  void Finish(grpc::StatusCode code) { code_ = code; }

 private:
  Metrics* const metrics_;
  const char* const method_;
  const std::chrono::steady_clock::time_point start_;
  grpc::StatusCode code_ = grpc::StatusCode::UNKNOWN;
};

// body()'s status, or the exception escaping it as a status (logged: it is a server bug or an
// allocation failure): std::bad_alloc -> RESOURCE_EXHAUSTED, anything else -> INTERNAL.
template <typename Body>
absl::Status RunCatching(const char* method, Body& body) {
  absl::Status status;
  try {
    return body();
  } catch (const std::bad_alloc& e) {
    status = absl::ResourceExhaustedError(
        absl::StrCat("out of memory while serving ", method, ": ", e.what()));
  } catch (const std::exception& e) {
    status = absl::InternalError(
        absl::StrCat("unexpected error while serving ", method, ": ", e.what()));
  } catch (...) {
    status = absl::InternalError(
        absl::StrCat("unexpected error while serving ", method, ": a non-std exception"));
  }
  spdlog::error("{}: {}", method, status.ToString());
  return status;
}

}  // namespace

template <typename Body>
grpc::Status DequantService::Handle(const char* method, Body&& body) {
  RpcScope scope(metrics_, method);
  const grpc::Status status = ToGrpcStatus(RunCatching(method, body));
  scope.Finish(status.error_code());
  return status;
}

grpc::Status DequantService::ListTensors(grpc::ServerContext*, const v1::ListTensorsRequest*,
                                         v1::ListTensorsResponse* response) {
  return Handle("ListTensors", [&]() -> absl::Status {
    if (checkpoint_ == nullptr) return absl::OkStatus();
    response->set_model(checkpoint_->dir());
    for (const QuantizedLayer& layer : checkpoint_->layers()) {
      const AwqShape& shape = layer.view.shape;
      v1::QuantizedTensorInfo* info = response->add_tensors();
      info->set_name(layer.name);
      info->set_in_features(shape.K);
      info->set_out_features(shape.N);
      info->set_group_size(shape.group_size);
      info->set_scale_dtype(DTypeToProto(shape.scale_dtype));
      info->set_packed_bytes(shape.qweight_bytes() + shape.qzeros_bytes() + shape.scales_bytes());
      info->set_resident_on_device(backend_->IsResident(layer));
    }
    return absl::OkStatus();
  });
}

grpc::Status DequantService::Dequantize(grpc::ServerContext* context,
                                        const v1::DequantizeRequest* request,
                                        grpc::ServerWriter<v1::DequantizeResponse>* writer) {
  return Handle("Dequantize", [&] { return DoDequantize(context, *request, writer); });
}

absl::Status DequantService::DoDequantize(grpc::ServerContext* context,
                                          const v1::DequantizeRequest& request,
                                          grpc::ServerWriter<v1::DequantizeResponse>* writer) {
  DequantSource source;
  std::optional<InlineTensor> inline_tensor;
  switch (request.source_case()) {
    case v1::DequantizeRequest::kTensor: {
      source.layer = checkpoint_ != nullptr ? checkpoint_->Find(request.tensor()) : nullptr;
      if (source.layer == nullptr) {
        return absl::NotFoundError(absl::StrCat(
            "tensor ", QuotedName(request.tensor()), " is not a layer of the loaded model",
            checkpoint_ == nullptr ? " (no model is loaded)" : " (see ListTensors)"));
      }
      break;
    }
    case v1::DequantizeRequest::kPacked: {
      absl::StatusOr<InlineTensor> parsed =
          InlineTensor::FromProto(request.packed(), options_.max_request_bytes);
      if (!parsed.ok()) return parsed.status();
      inline_tensor.emplace(std::move(*parsed));
      source.host = inline_tensor->view();
      break;
    }
    case v1::DequantizeRequest::SOURCE_NOT_SET:
      return absl::InvalidArgumentError("source: set either tensor or packed");
  }
  absl::StatusOr<DType> out_dtype = OutputDTypeFromProto(request.output_dtype());
  if (!out_dtype.ok()) return out_dtype.status();

  const AwqShape& shape = source.shape();
  const int64_t output_bytes = shape.output_bytes(*out_dtype);
  if (output_bytes > options_.max_output_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the result is ", output_bytes, " bytes (K * N * ", DTypeSize(*out_dtype),
                     " = ", shape.K, " * ", shape.N, " * ", DTypeSize(*out_dtype),
                     "), more than the server's max_output_bytes = ", options_.max_output_bytes));
  }
  absl::StatusOr<int64_t> chunk_bytes =
      EffectiveChunkBytes(request.chunk_bytes(), options_.default_chunk_bytes);
  if (!chunk_bytes.ok()) return chunk_bytes.status();
  GrpcResultSink sink(context, writer, {ResultLayer{.tensor = "", .shape = shape}},
                      /*per_layer=*/false, *out_dtype, backend_info_.name, metrics_);
  sink.set_stall_watchdog(options_.stall_watchdog);
  return backend_->Dequantize(source, *out_dtype, *chunk_bytes, sink);
}

grpc::Status DequantService::DequantizeLayers(grpc::ServerContext* context,
                                              const v1::DequantizeLayersRequest* request,
                                              grpc::ServerWriter<v1::DequantizeResponse>* writer) {
  return Handle("DequantizeLayers", [&] { return DoDequantizeLayers(context, *request, writer); });
}

absl::Status DequantService::DoDequantizeLayers(
    grpc::ServerContext* context, const v1::DequantizeLayersRequest& request,
    grpc::ServerWriter<v1::DequantizeResponse>* writer) {
  // Without a model there is nothing to list: an empty list must not succeed with 0 layers.
  if (checkpoint_ == nullptr) {
    return absl::FailedPreconditionError(
        "no model is loaded (the server was started with --model=): DequantizeLayers serves the "
        "layers of the loaded model; send inline tensors to Dequantize instead");
  }
  if (request.tensors_size() > kMaxLayersPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("tensors has ", request.tensors_size(),
                                                   " names, more than ", kMaxLayersPerRequest));
  }
  absl::StatusOr<DType> out_dtype = OutputDTypeFromProto(request.output_dtype());
  if (!out_dtype.ok()) return out_dtype.status();
  std::vector<const QuantizedLayer*> layers;
  if (request.tensors().empty()) {
    for (const QuantizedLayer& layer : checkpoint_->layers()) layers.push_back(&layer);
  } else {
    for (const std::string& name : request.tensors()) {
      const QuantizedLayer* layer = checkpoint_->Find(name);
      if (layer == nullptr) {
        return absl::NotFoundError(absl::StrCat(
            "tensor ", QuotedName(name), " is not a layer of the loaded model (see ListTensors)"));
      }
      layers.push_back(layer);
    }
  }
  std::vector<ResultLayer> results;
  results.reserve(layers.size());
  int64_t output_bytes = 0;
  for (const QuantizedLayer* layer : layers) {
    output_bytes += layer->view.shape.output_bytes(*out_dtype);
    results.push_back(ResultLayer{.tensor = layer->name, .shape = layer->view.shape});
  }
  if (output_bytes > options_.max_output_bytes) {
    const std::string results =
        layers.size() == 1 ? "the result of the 1 tensor is"
                           : absl::StrCat("the results of the ", layers.size(), " tensors are");
    return absl::ResourceExhaustedError(absl::StrCat(
        results, " ", output_bytes,
        " bytes, more than the server's max_output_bytes = ", options_.max_output_bytes));
  }
  absl::StatusOr<int64_t> chunk_bytes =
      EffectiveChunkBytes(request.chunk_bytes(), options_.default_chunk_bytes);
  if (!chunk_bytes.ok()) return chunk_bytes.status();
  GrpcResultSink sink(context, writer, std::move(results), /*per_layer=*/true, *out_dtype,
                      backend_info_.name, metrics_);
  sink.set_stall_watchdog(options_.stall_watchdog);
  return backend_->DequantizeLayers(layers, *out_dtype, *chunk_bytes, sink);
}

grpc::Status DequantService::GetServerInfo(grpc::ServerContext*, const v1::GetServerInfoRequest*,
                                           v1::GetServerInfoResponse* response) {
  return Handle("GetServerInfo", [&]() -> absl::Status {
    response->set_version(options_.version);
    response->set_backend(backend_info_.name);
    for (const DeviceDescription& device : backend_info_.devices) {
      v1::DeviceInfo* info = response->add_devices();
      info->set_index(device.index);
      info->set_name(device.name);
      info->set_compute_capability(device.compute_capability);
      info->set_memory_bytes(device.memory_bytes);
      info->set_driver_version(device.driver_version);
    }
    if (checkpoint_ != nullptr) {
      response->set_model(checkpoint_->dir());
      response->set_tensor_count(static_cast<int32_t>(checkpoint_->layers().size()));
    }
    response->set_cpu_threads(backend_info_.cpu_threads);
    if (options_.autotuner != nullptr) {
      const ServerAutotuneCounters c = options_.autotuner->counters();
      response->set_autotune_entries(static_cast<int64_t>(c.entries));
      response->set_autotune_hits(static_cast<int64_t>(c.hits));
      response->set_autotune_misses(static_cast<int64_t>(c.misses));
      response->set_autotune_tunings(static_cast<int64_t>(c.tunings));
      response->set_tune_cache(options_.autotuner->cache_path());
    }
    return absl::OkStatus();
  });
}

grpc::Status DequantService::Benchmark(grpc::ServerContext* context,
                                       const v1::BenchmarkRequest* request,
                                       v1::BenchmarkResponse* response) {
  return Handle("Benchmark", [&]() -> absl::Status {
    if (!benchmark_) {
      return absl::UnimplementedError("Benchmark is not implemented by this server yet");
    }
    absl::StatusOr<v1::BenchmarkResponse> result = benchmark_(*request, context);
    if (!result.ok()) return result.status();
    metrics_->RecordBenchmark(*result);
    *response = std::move(*result);
    return absl::OkStatus();
  });
}

}  // namespace dequantd
