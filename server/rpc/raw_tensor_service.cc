// Issue 10: ListTensors' other_tensors and the ReadTensor stream (see raw_tensor_service.h).
#include "server/rpc/raw_tensor_service.h"

#include "absl/strings/str_cat.h"
#include "server/backend/stored_tensor_copier.h"
#include "server/model/raw_tensor.h"
#include "server/rpc/quoted_name.h"
#include "server/rpc/region_service.h"
#include "server/rpc/request.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

// The pieces of the one-thread output_region path (a host region; a small tensor; no copier):
// large, so that a GPU region gets few (synchronous) host-to-device copies; one buffer of this
// size per call.
constexpr int64_t kRegionPieceBytes = int64_t{16} << 20;

void FillInfo(const RawTensor& tensor, v1::RawTensorInfo& info) {
  info.set_name(tensor.name);
  info.set_dtype(tensor.dtype);
  for (int64_t d : tensor.shape) info.add_shape(d);
  info.set_bytes(tensor.bytes);
}

}  // namespace

void AddRawTensorInfos(const Checkpoint& checkpoint, v1::ListTensorsResponse& response) {
  for (const RawTensor& tensor : checkpoint.raw_tensors()) {
    FillInfo(tensor, *response.add_other_tensors());
  }
}

absl::Status ServeReadTensor(const Checkpoint* checkpoint, int64_t default_chunk_bytes,
                             RegionService* regions, StoredTensorCopier* copier,
                             const v1::ReadTensorRequest& request, grpc::ServerContext* context,
                             grpc::ServerWriter<v1::ReadTensorResponse>* writer) {
  if (checkpoint == nullptr) {
    return absl::FailedPreconditionError(
        "no model is loaded (the server was started with --model=): ReadTensor serves the "
        "tensors of the loaded model");
  }
  if (request.name().empty()) return absl::InvalidArgumentError("name: must not be empty");
  absl::StatusOr<int64_t> chunk_bytes =
      EffectiveChunkBytes(request.chunk_bytes(), default_chunk_bytes);
  if (!chunk_bytes.ok()) return chunk_bytes.status();
  const RawTensor* tensor = checkpoint->FindRawTensor(request.name());
  if (tensor == nullptr) {
    const bool is_layer = checkpoint->Find(request.name()) != nullptr;
    return absl::NotFoundError(
        absl::StrCat("name ", QuotedName(request.name()), " is not a tensor of the loaded model",
                     is_layer ? " that is served as stored: it is a quantized layer, use Dequantize"
                              : " (see ListTensors other_tensors)"));
  }
  v1::ReadTensorResponse message;
  FillInfo(*tensor, *message.mutable_header());
  if (request.has_output_region()) {
    if (regions == nullptr) {
      return absl::FailedPreconditionError("output_region: this server serves no regions");
    }
    absl::StatusOr<std::unique_ptr<regions::RegionSink>> sink =
        regions->MakeSink(context->peer(), request.output_region(), {tensor->bytes},
                          [context] { return context->IsCancelled(); });
    if (!sink.ok()) return sink.status();
    if (absl::Status s = (*sink)->Begin("stored"); !s.ok()) return s;
    if (absl::Status s = (*sink)->BeginLayer(0); !s.ok()) return s;
    regions::RegionSink& region_sink = **sink;
    const ResultDestination* destination = region_sink.destination();
    absl::Status copied;
    if (copier != nullptr && destination != nullptr &&
        destination->memory == ResultDestination::Memory::kDevice &&
        tensor->bytes >= copier->min_bytes()) {
      // Parallel reads into pinned staging, copied to the device asynchronously; the sink's
      // Write is then a progress report (the bytes' place in the region: no copy), where it
      // checks bounds, cancellation and an Unregister before each piece's copy.
      copied = copier->CopyToDevice(
          *tensor, destination->device, destination->data, [&](int64_t offset, int64_t bytes) {
            return region_sink.Write(offset, absl::MakeConstSpan(destination->data + offset,
                                                                 static_cast<size_t>(bytes)));
          });
    } else {
      // The sink checks bounds, cancellation and an Unregister at every piece, and copies each
      // into the region (Region::CopyIn: a device region's copy has ended when it returns).
      copied = ReadRawTensor(*tensor, kRegionPieceBytes,
                             [&](int64_t offset, absl::Span<const uint8_t> bytes) {
                               return region_sink.Write(offset, bytes);
                             });
    }
    if (!copied.ok()) return copied;
    message.set_region(request.output_region().name());
    message.set_region_offset(request.output_region().offset());
    // Sent with the status (as a Dequantize output_region reply): every byte is in the region.
    if (!writer->Write(message, grpc::WriteOptions().set_last_message())) {
      return absl::CancelledError("the client closed the stream before the reply was sent");
    }
    return absl::OkStatus();
  }
  auto send = [&](const v1::ReadTensorResponse& m) -> absl::Status {
    if (context->IsCancelled()) return absl::CancelledError("the client cancelled the call");
    if (!writer->Write(m)) {
      return absl::CancelledError("the client closed the stream before the tensor was sent");
    }
    return absl::OkStatus();
  };
  if (tensor->bytes == 0) return send(message);
  return ReadRawTensor(
      *tensor, *chunk_bytes, [&](int64_t offset, absl::Span<const uint8_t> bytes) -> absl::Status {
        message.set_offset(offset);
        message.set_data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
        if (absl::Status s = send(message); !s.ok()) return s;
        message.clear_header();
        return absl::OkStatus();
      });
}

}  // namespace dequantd
