// The dequant.v1.DequantService handlers (synchronous gRPC API: each call runs on one of gRPC's
// sync-server threads, never on a completion-queue poller). Handlers are thin: parse and
// validate the request (request.h), call the backend, map the absl::Status (status.h), and
// count the call in the metrics.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "dequant/v1/dequant.grpc.pb.h"
#include "kernels/autotune.h"
#include "server/backend/backend.h"
#include "server/backend/stored_tensor_copier.h"
#include "server/metrics/metrics.h"
#include "server/model/checkpoint.h"
#include "server/rpc/grpc_result_sink.h"
#include "server/rpc/region_service.h"
#include "server/rpc/stall_watchdog.h"

namespace dequantd {

// The seam for the Benchmark RPC (issue 3): given the request, times the kernels on the
// service's backend. Called on a gRPC thread; may block for the length of the benchmark.
// Unset: Benchmark answers UNIMPLEMENTED.
using BenchmarkRunner = std::function<absl::StatusOr<dequant::v1::BenchmarkResponse>(
    const dequant::v1::BenchmarkRequest& request, grpc::ServerContext* context)>;

struct ServiceOptions {
  std::string version;                             // reported by GetServerInfo, e.g. "0.1.0"
  int64_t max_request_bytes = int64_t{256} << 20;  // inline packed bytes accepted per request
  int64_t max_output_bytes = int64_t{16} << 30;    // largest result of one tensor, bytes
  int64_t default_chunk_bytes = int64_t{1} << 20;  // payload per message when chunk_bytes is 0
  const Autotuner* autotuner = nullptr;            // the CUDA backend's, for GetServerInfo's
                                                   // autotune_* fields; null: none (not owned)
  // Most Dequantize + DequantizeLayers streams served at once (server-wide); a call past it gets
  // RESOURCE_EXHAUSTED. 0 = no limit (gRPC's sync thread pool is then the bound).
  int max_concurrent_streams = 0;
  RegionService* regions = nullptr;  // shared-memory regions (issue 9); null: the region RPCs
                                     // and output_region are FAILED_PRECONDITION (not owned)
  // ReadTensor into a device region at the page cache's rate (issue 23); null: one thread reads
  // and copies each piece in (not owned).
  StoredTensorCopier* stored_copier = nullptr;
  StallWatchdog* stall_watchdog = nullptr;  // cancels result writes stalled past --stall-timeout;
                                            // null: none (not owned)
};

// Most names one DequantizeLayers request may list.
inline constexpr int kMaxLayersPerRequest = 10000;

// Thread-safe: gRPC calls the handlers from many threads at once.
class DequantService final : public dequant::v1::DequantService::Service {
 public:
  // `checkpoint` may be null (no model loaded: ListTensors is empty, every tensor NOT_FOUND,
  // DequantizeLayers FAILED_PRECONDITION).
  // `checkpoint`, `backend` and `metrics` must outlive the service; `backend` is prepared.
  DequantService(ServiceOptions options, const Checkpoint* checkpoint, Backend* backend,
                 Metrics* metrics, BenchmarkRunner benchmark = nullptr);

  grpc::Status ListTensors(grpc::ServerContext* context,
                           const dequant::v1::ListTensorsRequest* request,
                           dequant::v1::ListTensorsResponse* response) override;
  // Dequantize and DequantizeLayers are served by DequantizeStream / DequantizeLayersStream
  // (installed by the constructor in place of the generated handlers): the request is read from
  // the stream and the responses are written as grpc::ByteBuffers (grpc_result_sink.h), which
  // saves a copy of every result byte. On the wire nothing changes.
  using ByteStream = grpc::ServerReaderWriter<grpc::ByteBuffer, dequant::v1::DequantizeRequest>;
  using LayersByteStream =
      grpc::ServerReaderWriter<grpc::ByteBuffer, dequant::v1::DequantizeLayersRequest>;
  // Errors: INVALID_ARGUMENT (source not set, output_dtype, packed.* fields, offset, length),
  // NOT_FOUND (tensor), RESOURCE_EXHAUSTED (max_request_bytes, max_output_bytes,
  // max_concurrent_streams, device memory), CANCELLED (the client went away), the backend's.
  grpc::Status DequantizeStream(grpc::ServerContext* context, ByteStream* stream);
  // Layers of the loaded model (empty list = all, in order), in one backend call. Errors:
  // INVALID_ARGUMENT (output_dtype; more than kMaxLayersPerRequest "tensors"), NOT_FOUND (a name,
  // given), RESOURCE_EXHAUSTED (one tensor's result over max_output_bytes, naming it; the sum
  // over the layers is not limited; max_concurrent_streams; device memory), CANCELLED, the
  // backend's.
  grpc::Status DequantizeLayersStream(grpc::ServerContext* context, LayersByteStream* stream);
  grpc::Status GetServerInfo(grpc::ServerContext* context,
                             const dequant::v1::GetServerInfoRequest* request,
                             dequant::v1::GetServerInfoResponse* response) override;
  // Issue 10: a raw tensor of the checkpoint as stored (server/rpc/raw_tensor_service.h).
  grpc::Status ReadTensor(grpc::ServerContext* context,
                          const dequant::v1::ReadTensorRequest* request,
                          grpc::ServerWriter<dequant::v1::ReadTensorResponse>* writer) override;
  // UNIMPLEMENTED until a BenchmarkRunner is given.
  grpc::Status Benchmark(grpc::ServerContext* context, const dequant::v1::BenchmarkRequest* request,
                         dequant::v1::BenchmarkResponse* response) override;
  // Shared-memory regions (issue 9): RegionService's, with the caller's peer.
  grpc::Status RegisterSystemSharedMemory(
      grpc::ServerContext* context, const dequant::v1::RegisterSystemSharedMemoryRequest* request,
      dequant::v1::RegisterSystemSharedMemoryResponse* response) override;
  grpc::Status UnregisterSystemSharedMemory(
      grpc::ServerContext* context, const dequant::v1::UnregisterSystemSharedMemoryRequest* request,
      dequant::v1::UnregisterSystemSharedMemoryResponse* response) override;
  grpc::Status RegisterCudaSharedMemory(
      grpc::ServerContext* context, const dequant::v1::RegisterCudaSharedMemoryRequest* request,
      dequant::v1::RegisterCudaSharedMemoryResponse* response) override;
  grpc::Status UnregisterCudaSharedMemory(
      grpc::ServerContext* context, const dequant::v1::UnregisterCudaSharedMemoryRequest* request,
      dequant::v1::UnregisterCudaSharedMemoryResponse* response) override;
  grpc::Status SharedMemoryStatus(grpc::ServerContext* context,
                                  const dequant::v1::SharedMemoryStatusRequest* request,
                                  dequant::v1::SharedMemoryStatusResponse* response) override;

 private:
  // Runs `body` (returning absl::Status), times and counts it under `method`, maps the status.
  // The call is in flight until it returns, whatever happens; an exception escaping `body` is
  // logged and answered: std::bad_alloc as RESOURCE_EXHAUSTED "out of memory while serving
  // <method>: <what>", any other as INTERNAL "unexpected error while serving <method>: <what>".
  template <typename Body>
  grpc::Status Handle(const char* method, Body&& body);

  // `region_reply`: where an output_region call keeps its one reply until the handler returns.
  absl::Status DoDequantizeLayers(grpc::ServerContext* context,
                                  const dequant::v1::DequantizeLayersRequest& request,
                                  LayersByteStream* stream, grpc::ByteBuffer& region_reply);
  // An output_region call (issue 9): runs `run` (the backend) on a RegionSink for `output` that
  // places `results` (in `out_dtype`) one after another. The one reply is encoded into `reply`
  // (EncodeRegionReply, as `kind` says) at the sink's Begin, while the kernel
  // runs; once `run` returned OK it is written to `stream` as the last message, which gRPC sends
  // together with the handler's OK status. Nothing is written before; an error returns with
  // nothing written. Errors: FAILED_PRECONDITION
  // (no regions), MakeSink's, `run`'s.
  using ResultWriter = grpc::internal::WriterInterface<grpc::ByteBuffer>;
  template <typename Run>
  absl::Status RunIntoRegion(grpc::ServerContext* context, const dequant::v1::OutputRegion& output,
                             const std::vector<ResultLayer>& results, RegionReplyKind kind,
                             DType out_dtype, ResultWriter* stream, grpc::ByteBuffer& reply,
                             Run&& run);
  // The region RPCs' body: FAILED_PRECONDITION without regions, else `call(regions, peer)`.
  template <typename Call>
  grpc::Status HandleRegions(const char* method, grpc::ServerContext* context, Call&& call);
  absl::Status DoDequantize(grpc::ServerContext* context,
                            const dequant::v1::DequantizeRequest& request, ByteStream* stream,
                            grpc::ByteBuffer& region_reply);
  // Counts a stream against max_concurrent_streams for its life; `admitted()` false past it.
  class StreamSlot;

  const ServiceOptions options_;
  const Checkpoint* const checkpoint_;
  Backend* const backend_;
  Metrics* const metrics_;
  const BenchmarkRunner benchmark_;
  const BackendInfo backend_info_;
  std::atomic<int> active_streams_{0};  // Dequantize + DequantizeLayers streams being served
};

}  // namespace dequantd
