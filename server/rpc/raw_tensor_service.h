// Issue 10: the service side of the checkpoint's other tensors (embeddings, norms, biases,
// lm_head) and config.json: listing them, streaming one as stored (ReadTensor). Called by the
// DequantService handlers (server/rpc/service.cc), which count and map the returned status.
#pragma once

#include <cstdint>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "dequant/v1/dequant.grpc.pb.h"
#include "server/model/checkpoint.h"

namespace dequantd {

class RegionService;       // server/rpc/region_service.h
class StoredTensorCopier;  // server/backend/stored_tensor_copier.h

// Appends one RawTensorInfo per raw tensor of `checkpoint` (in name order) to `response`.
void AddRawTensorInfos(const Checkpoint& checkpoint, dequant::v1::ListTensorsResponse& response);

// Streams raw tensor `request.name()` of `checkpoint` (null: no model loaded): a first message
// with the header (and, for a non-empty tensor, the first chunk), then chunks of the effective
// chunk_bytes (request.h, EffectiveChunkBytes) with consecutive offsets from 0 (not counted as
// dequantized output bytes in the metrics: nothing is dequantized). Errors: FAILED_PRECONDITION (no
// model loaded), INVALID_ARGUMENT (name empty; chunk_bytes negative), NOT_FOUND (name: not a raw
// tensor; a quantized layer's name says so), DATA_LOSS (file replaced or truncated, see
// raw_tensor.h), CANCELLED (the client went away). With request.output_region the bytes go into
// that region of `regions` (null: FAILED_PRECONDITION) and the stream is one message, the header
// with region and region_offset, sent with the status; the region's errors are those of
// RegionService::MakeSink and RegionSink::Write. Into a device region, a tensor of at least
// copier->min_bytes() goes through `copier` (may be null: every tensor then takes the one-thread
// path: 16 MiB pieces, each read and copied in before the next), with its errors too.
// Thread-safe.
absl::Status ServeReadTensor(const Checkpoint* checkpoint, int64_t default_chunk_bytes,
                             RegionService* regions, StoredTensorCopier* copier,
                             const dequant::v1::ReadTensorRequest& request,
                             grpc::ServerContext* context,
                             grpc::ServerWriter<dequant::v1::ReadTensorResponse>* writer);

}  // namespace dequantd
