// DequantService (see service.h).
#include "server/rpc/service.h"

#include <chrono>
#include <exception>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/format_registry.h"
#include "server/rpc/grpc_result_sink.h"
#include "server/rpc/protobuf_errors.h"
#include "server/rpc/quoted_name.h"
#include "server/rpc/raw_tensor_service.h"
#include "server/rpc/request.h"
#include "server/rpc/stall_watchdog.h"
#include "server/rpc/status.h"
#include "spdlog/spdlog.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

}  // namespace

DequantService::DequantService(ServiceOptions options, const Checkpoint* checkpoint,
                               Backend* backend, Metrics* metrics, BenchmarkRunner benchmark)
    : options_(std::move(options)),
      checkpoint_(checkpoint),
      backend_(backend),
      metrics_(metrics),
      benchmark_(std::move(benchmark)),
      backend_info_(backend->Info()) {
  // The generated handlers of the two streaming methods are replaced by handlers that read the
  // one request themselves and write ByteBuffers. The numbers are the methods' positions in the
  // service definition (proto/dequant/v1/dequant.proto), which the generated code follows.
  constexpr int kDequantizeMethod = 1;
  constexpr int kDequantizeLayersMethod = 4;
  MarkMethodStreamed(kDequantizeMethod,
                     new grpc::internal::BidiStreamingHandler<DequantService, v1::DequantizeRequest,
                                                              grpc::ByteBuffer>(
                         &DequantService::DequantizeStream, this));
  MarkMethodStreamed(
      kDequantizeLayersMethod,
      new grpc::internal::BidiStreamingHandler<DequantService, v1::DequantizeLayersRequest,
                                               grpc::ByteBuffer>(
          &DequantService::DequantizeLayersStream, this));
}

class DequantService::StreamSlot {
 public:
  StreamSlot(std::atomic<int>& active, int max)
      : active_(active), admitted_(active.fetch_add(1) < max || max <= 0) {}
  ~StreamSlot() { active_.fetch_sub(1); }
  StreamSlot(const StreamSlot&) = delete;
  StreamSlot& operator=(const StreamSlot&) = delete;
  bool admitted() const { return admitted_; }

 private:
  std::atomic<int>& active_;
  const bool admitted_;
};

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
      const QuantShape& shape = layer.view.shape;
      v1::QuantizedTensorInfo* info = response->add_tensors();
      info->set_name(layer.name);
      info->set_in_features(shape.K);
      info->set_out_features(shape.N);
      info->set_group_size(shape.group_size);
      info->set_scale_dtype(DTypeToProto(shape.scale_dtype));
      info->set_packed_bytes(shape.packed_bytes());
      info->set_resident_on_device(backend_->IsResident(layer));
      info->set_format(std::string(FormatName(shape.format)));
      info->set_orientation(OrientationToProto(FormatRowOf(shape.format).default_orientation));
      info->set_experts(shape.experts);
      for (int r = 0; r < TensorRoleCount(shape.format); ++r) {
        const TensorSpec spec = TensorSpecOf(shape, r);
        v1::StoredTensorInfo* stored = info->add_stored_tensors();
        stored->set_role(std::string(spec.role));
        stored->set_dtype(DTypeToProto(spec.dtype));
        stored->add_shape(spec.rows);
        stored->add_shape(spec.cols);
      }
    }
    AddRawTensorInfos(*checkpoint_, *response);
    return absl::OkStatus();
  });
}

namespace {

// The one request of a streaming call: INVALID_ARGUMENT if the client sent none or one that does
// not parse (naming libprotobuf's reason, e.g. a string field that is not UTF-8, when it gave one:
// these handlers read the request themselves, so protobuf_errors.h's interceptor never sees it).
// The two streaming methods are registered as bidirectional (MarkMethodStreamed), so gRPC starts
// the handler, and gives it a thread, before the request has arrived: a client that opens calls
// and never sends a request would otherwise hold a thread each for as long as it likes, and 256
// such calls take every thread of the server. The read is watched like a blocked write
// (--stall-timeout): past the timeout the call is cancelled (DEADLINE_EXCEEDED here, counted in
// dequantd_stalled_calls_cancelled_total) and the thread is free again.
template <typename Request, typename Stream>
absl::Status ReadRequest(grpc::ServerContext* context, StallWatchdog* watchdog, Stream* stream,
                         Request* request) {
  bool read = false;
  bool stalled = false;
  {
    StallWatchdog::Write watch(watchdog, [context] { context->TryCancel(); });
    read = stream->Read(request);
    stalled = watch.stalled();
  }
  if (stalled) {
    return absl::DeadlineExceededError(
        absl::StrCat("no request arrived within ", watchdog->timeout_seconds(),
                     " s of the call's start (--stall-timeout): call cancelled"));
  }
  if (!read) {
    std::string reason = TakeLastProtobufError();
    if (reason.empty()) reason = "it does not parse as protobuf, or the call carried none";
    return absl::InvalidArgumentError(
        absl::StrCat("request is not a valid ", Request::descriptor()->full_name(), ": ", reason));
  }
  return absl::OkStatus();
}

// RESOURCE_EXHAUSTED when one tensor's result (K * N * sizeof(dtype)) is more than
// max_output_bytes (--max-output-bytes); `tensor` names it (empty: an inline tensor).
absl::Status CheckOutputBytes(const QuantShape& shape, DType dtype, int64_t max_output_bytes,
                              absl::string_view tensor) {
  const int64_t bytes = shape.output_bytes(dtype);
  if (bytes <= max_output_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      tensor.empty() ? "the result" : absl::StrCat("the result of tensor ", QuotedName(tensor)),
      " is ", bytes, " bytes (", shape.experts != 1 ? "E * " : "", "K * N * ", DTypeSize(dtype),
      " = ", shape.experts != 1 ? absl::StrCat(shape.experts, " * ") : "", shape.K, " * ", shape.N,
      " * ", DTypeSize(dtype), "), more than the server's max_output_bytes = ", max_output_bytes,
      " (--max-output-bytes: the largest result of one tensor)"));
}

absl::Status TooManyStreams(int max) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "the server is serving its max_concurrent_streams = ", max,
      " Dequantize/DequantizeLayers streams; retry later or use fewer parallel streams"));
}

}  // namespace

grpc::Status DequantService::DequantizeStream(grpc::ServerContext* context, ByteStream* stream) {
  // An output_region call's one reply: gRPC sends it with the status, after this returns.
  grpc::ByteBuffer region_reply;
  return Handle("Dequantize", [&]() -> absl::Status {
    StreamSlot slot(active_streams_, options_.max_concurrent_streams);
    if (!slot.admitted()) return TooManyStreams(options_.max_concurrent_streams);
    v1::DequantizeRequest request;
    if (absl::Status s = ReadRequest(context, options_.stall_watchdog, stream, &request); !s.ok())
      return s;
    return DoDequantize(context, request, stream, region_reply);
  });
}

absl::Status DequantService::DoDequantize(grpc::ServerContext* context,
                                          const v1::DequantizeRequest& request, ByteStream* stream,
                                          grpc::ByteBuffer& region_reply) {
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
  absl::StatusOr<Orientation> orientation =
      OrientationFromProto(request.orientation(), source.shape().format);
  if (!orientation.ok()) return orientation.status();
  source.orientation = *orientation;

  const QuantShape& shape = source.shape();
  if (absl::Status s = CheckOutputBytes(shape, *out_dtype, options_.max_output_bytes,
                                        request.has_tensor() ? request.tensor() : "");
      !s.ok()) {
    return s;
  }
  const int64_t output_bytes = shape.output_bytes(*out_dtype);
  absl::StatusOr<int64_t> chunk_bytes =
      EffectiveChunkBytes(request.chunk_bytes(), options_.default_chunk_bytes);
  if (!chunk_bytes.ok()) return chunk_bytes.status();
  absl::StatusOr<ResultRange> range =
      RequestedRange(request.offset(), request.length(), output_bytes, DTypeSize(*out_dtype));
  if (!range.ok()) return range.status();
  std::vector<ResultLayer> results = {ResultLayer{.tensor = "", .shape = shape}};
  if (request.has_output_region()) {
    if (request.offset() != 0 || request.length() != 0) {
      return absl::InvalidArgumentError(
          "output_region: a byte range (offset, length) cannot be combined with an output region; "
          "the whole result is written into the region");
    }
    return RunIntoRegion(context, request.output_region(), results, RegionReplyKind::kHeader,
                         *out_dtype, stream, region_reply, [&](regions::RegionSink& s) {
                           return backend_->Dequantize(source, *out_dtype, *chunk_bytes, s);
                         });
  }
  GrpcResultSink sink(context, stream, std::move(results), /*per_layer=*/false, *out_dtype,
                      backend_info_.name, metrics_,
                      ChunkSink::Range{.offset = range->offset, .length = range->length});
  sink.set_stall_watchdog(options_.stall_watchdog);
  return backend_->Dequantize(source, *out_dtype, *chunk_bytes, sink);
}

grpc::Status DequantService::DequantizeLayersStream(grpc::ServerContext* context,
                                                    LayersByteStream* stream) {
  grpc::ByteBuffer region_reply;  // as in DequantizeStream
  return Handle("DequantizeLayers", [&]() -> absl::Status {
    StreamSlot slot(active_streams_, options_.max_concurrent_streams);
    if (!slot.admitted()) return TooManyStreams(options_.max_concurrent_streams);
    v1::DequantizeLayersRequest request;
    if (absl::Status s = ReadRequest(context, options_.stall_watchdog, stream, &request); !s.ok())
      return s;
    return DoDequantizeLayers(context, request, stream, region_reply);
  });
}

absl::Status DequantService::DoDequantizeLayers(grpc::ServerContext* context,
                                                const v1::DequantizeLayersRequest& request,
                                                LayersByteStream* stream,
                                                grpc::ByteBuffer& region_reply) {
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
  absl::StatusOr<Orientation> orientation =
      OrientationFromProto(request.orientation(), checkpoint_->config().format);
  if (!orientation.ok()) return orientation.status();
  absl::StatusOr<RegionReplyKind> reply_kind =
      RegionReplyFromProto(request.region_reply(), request.has_output_region());
  if (!reply_kind.ok()) return reply_kind.status();
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
  // max_output_bytes bounds each tensor's result, what a call holds at once (the CUDA pipeline's
  // slab buffers are max(slab, largest single result)); the sum over the layers holds nothing
  // and is not limited: streamed results go through bounded slabs, region results into the
  // client's own memory (issue 22).
  // A summary reply names no layer: the results then carry no copy of the names.
  const bool named = *reply_kind != RegionReplyKind::kSummary;
  std::vector<ResultLayer> results;
  results.reserve(layers.size());
  for (const QuantizedLayer* layer : layers) {
    if (absl::Status s =
            CheckOutputBytes(layer->view.shape, *out_dtype, options_.max_output_bytes, layer->name);
        !s.ok()) {
      return s;
    }
    results.push_back(
        ResultLayer{.tensor = named ? layer->name : std::string(), .shape = layer->view.shape});
    results.back().shape.orientation = *orientation;
  }
  absl::StatusOr<int64_t> chunk_bytes =
      EffectiveChunkBytes(request.chunk_bytes(), options_.default_chunk_bytes);
  if (!chunk_bytes.ok()) return chunk_bytes.status();
  if (request.has_output_region()) {
    return RunIntoRegion(context, request.output_region(), results, *reply_kind, *out_dtype, stream,
                         region_reply, [&](regions::RegionSink& s) {
                           return backend_->DequantizeLayers(layers, *out_dtype, *orientation,
                                                             *chunk_bytes, s);
                         });
  }
  GrpcResultSink sink(context, stream, std::move(results), /*per_layer=*/true, *out_dtype,
                      backend_info_.name, metrics_);
  sink.set_stall_watchdog(options_.stall_watchdog);
  return backend_->DequantizeLayers(layers, *out_dtype, *orientation, *chunk_bytes, sink);
}

template <typename Run>
absl::Status DequantService::RunIntoRegion(grpc::ServerContext* context,
                                           const v1::OutputRegion& output,
                                           const std::vector<ResultLayer>& results,
                                           RegionReplyKind kind, DType out_dtype,
                                           ResultWriter* stream, grpc::ByteBuffer& reply,
                                           Run&& run) {
  if (options_.regions == nullptr) {
    return absl::FailedPreconditionError("output_region: this server serves no regions");
  }
  std::vector<int64_t> result_bytes;
  result_bytes.reserve(results.size());
  for (const ResultLayer& result : results) {
    result_bytes.push_back(result.shape.output_bytes(out_dtype));
  }
  absl::StatusOr<std::unique_ptr<regions::RegionSink>> region =
      options_.regions->MakeSink(context->peer(), output, std::move(result_bytes),
                                 [context] { return context->IsCancelled(); });
  if (!region.ok()) return region.status();
  // The reply is encoded at Begin, right after the first launch, so that it overlaps the kernel
  // (224 headers take ~130 us on the development VM; after the kernel they added that much to the
  // call).
  std::optional<absl::StatusOr<grpc::ByteBuffer>> encoded;
  const auto encode = [&] {
    encoded = EncodeRegionReply(results, kind, out_dtype, backend_info_.name, (*region)->kernel(),
                                output.name(), (*region)->result_offsets());
  };
  (*region)->set_on_begin(encode);
  if (absl::Status s = run(**region); !s.ok()) return s;
  if (!encoded.has_value()) encode();  // a call with nothing to launch never began
  if (!encoded->ok()) return encoded->status();
  reply = std::move(**encoded);
  // The reply is not sent here: with set_last_message gRPC keeps a pointer to it and sends it in
  // one batch with the status (and the initial metadata), once the handler has returned; so the
  // client sees one message and the OK status together, after every byte is in the region. A
  // write that cannot be queued means the call is gone.
  if (!stream->Write(reply, grpc::WriteOptions().set_last_message())) {
    return absl::CancelledError("the client closed the stream before the reply was sent");
  }
  return absl::OkStatus();
}

template <typename Call>
grpc::Status DequantService::HandleRegions(const char* method, grpc::ServerContext* context,
                                           Call&& call) {
  return Handle(method, [&]() -> absl::Status {
    if (options_.regions == nullptr) {
      return absl::FailedPreconditionError("this server serves no shared-memory regions");
    }
    return call(*options_.regions, context->peer());
  });
}

grpc::Status DequantService::RegisterSystemSharedMemory(
    grpc::ServerContext* context, const v1::RegisterSystemSharedMemoryRequest* request,
    v1::RegisterSystemSharedMemoryResponse* response) {
  return HandleRegions("RegisterSystemSharedMemory", context, [&](RegionService& r, auto peer) {
    return r.RegisterSystem(peer, *request, response);
  });
}

grpc::Status DequantService::UnregisterSystemSharedMemory(
    grpc::ServerContext* context, const v1::UnregisterSystemSharedMemoryRequest* request,
    v1::UnregisterSystemSharedMemoryResponse* response) {
  return HandleRegions("UnregisterSystemSharedMemory", context, [&](RegionService& r, auto peer) {
    return r.UnregisterSystem(peer, *request, response);
  });
}

grpc::Status DequantService::RegisterCudaSharedMemory(
    grpc::ServerContext* context, const v1::RegisterCudaSharedMemoryRequest* request,
    v1::RegisterCudaSharedMemoryResponse* response) {
  return HandleRegions("RegisterCudaSharedMemory", context, [&](RegionService& r, auto peer) {
    return r.RegisterCuda(peer, *request, response);
  });
}

grpc::Status DequantService::UnregisterCudaSharedMemory(
    grpc::ServerContext* context, const v1::UnregisterCudaSharedMemoryRequest* request,
    v1::UnregisterCudaSharedMemoryResponse* response) {
  return HandleRegions("UnregisterCudaSharedMemory", context, [&](RegionService& r, auto peer) {
    return r.UnregisterCuda(peer, *request, response);
  });
}

grpc::Status DequantService::SharedMemoryStatus(grpc::ServerContext* context,
                                                const v1::SharedMemoryStatusRequest*,
                                                v1::SharedMemoryStatusResponse* response) {
  return HandleRegions("SharedMemoryStatus", context,
                       [&](RegionService& r, auto peer) { return r.Status(peer, response); });
}

grpc::Status DequantService::GetServerInfo(grpc::ServerContext*, const v1::GetServerInfoRequest*,
                                           v1::GetServerInfoResponse* response) {
  return Handle("GetServerInfo", [&]() -> absl::Status {
    response->set_version(options_.version);
    response->set_backend(backend_info_.name);
    for (const DeviceDescription& device : backend_->Info().devices) {  // live: serving, load
      v1::DeviceInfo* info = response->add_devices();
      info->set_index(device.index);
      info->set_name(device.name);
      info->set_compute_capability(device.compute_capability);
      info->set_memory_bytes(device.memory_bytes);
      info->set_driver_version(device.driver_version);
      info->set_label(device.label);
      info->set_serving(device.serving);
      info->set_failure(device.failure);
      info->set_resident_layers(device.resident_layers);
      info->set_resident_bytes(device.resident_bytes);
      info->set_calls_in_flight(device.in_flight);
    }
    if (checkpoint_ != nullptr) {
      response->set_model(checkpoint_->dir());
      response->set_tensor_count(static_cast<int32_t>(checkpoint_->layers().size()));
      response->set_model_config_json(checkpoint_->config_json());
    }
    response->set_cpu_threads(backend_info_.cpu_threads);
    if (options_.autotuner != nullptr) {
      const AutotuneCounters c = options_.autotuner->counters();
      response->set_autotune_entries(static_cast<int64_t>(c.entries));
      response->set_autotune_hits(static_cast<int64_t>(c.hits));
      response->set_autotune_misses(static_cast<int64_t>(c.misses));
      response->set_autotune_tunings(static_cast<int64_t>(c.tunings));
      response->set_tune_cache(options_.autotuner->store_description());
    }
    return absl::OkStatus();
  });
}

grpc::Status DequantService::ReadTensor(grpc::ServerContext* context,
                                        const v1::ReadTensorRequest* request,
                                        grpc::ServerWriter<v1::ReadTensorResponse>* writer) {
  return Handle("ReadTensor", [&] {
    return ServeReadTensor(checkpoint_, options_.default_chunk_bytes, options_.regions,
                           options_.stored_copier, *request, context, writer);
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
