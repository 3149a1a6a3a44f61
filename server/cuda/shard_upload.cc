// UploadFromShards (see shard_upload.h).
#include "server/cuda/shard_upload.h"

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "server/cuda/packed_upload.h"
#include "server/cuda/pinned_read_staging.h"
#include "server/shard_reader.h"

namespace dequantd::cuda {

absl::Status UploadFromShards(const Checkpoint& checkpoint, const std::vector<int64_t>& layers,
                              const std::vector<uint8_t*>& device_bases,
                              const ShardUploadOptions& options) {
  if (layers.empty()) return absl::OkStatus();
  int device = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  const PinnedReadStaging::Shape shape = PinnedReadStaging::ShapeFor(
      options.threads > 0 ? options.threads : DefaultLoadThreads(), options.staging_bytes);

  std::vector<ReadChunk> chunks;
  for (size_t j = 0; j < layers.size(); ++j) {
    const QuantizedLayer& layer = checkpoint.layers()[static_cast<size_t>(layers[j])];
    for (int r = 0; r < TensorRoleCount(layer.view.shape.format); ++r) {
      const StoredRange& range = layer.stored[static_cast<size_t>(r)];
      if (range.shard < 0) continue;  // an absent optional role (GPTQ's g_idx without desc_act)
      AppendChunks(range.shard, range.offset, range.bytes, static_cast<int64_t>(j), r,
                   shape.chunk_bytes, &chunks);
    }
  }
  absl::StatusOr<ShardReader> reader = ShardReader::Open(checkpoint.shards());
  if (!reader.ok()) return reader.status();

  absl::StatusOr<std::unique_ptr<PinnedReadStaging>> staging =
      PinnedReadStaging::Make(device, shape);
  if (!staging.ok()) {
    if (staging.status().code() != absl::StatusCode::kResourceExhausted) return staging.status();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", int64_t{shape.threads} * 2 * shape.chunk_bytes,
                     " bytes of pinned host memory to stage the model "
                     "upload (--load-staging-bytes=",
                     options.staging_bytes, "): ", staging.status().message()));
  }
  std::vector<PackedLayout> layouts;
  layouts.reserve(layers.size());
  for (int64_t id : layers) {
    layouts.emplace_back(checkpoint.layers()[static_cast<size_t>(id)].view.shape);
  }

  PinnedReadStaging& pinned = **staging;
  const absl::Status read = reader->Read(
      chunks, pinned.threads(),
      [&](int64_t j, int role) {
        return checkpoint.StoredTensorName(layers[static_cast<size_t>(j)], role);
      },
      [&](int thread, const ReadChunk&) { return pinned.NextBuffer(thread); },
      [&](int thread, const ReadChunk& c, uint8_t*) {
        uint8_t* dst = device_bases[static_cast<size_t>(c.layer)] +
                       layouts[static_cast<size_t>(c.layer)].offsets[static_cast<size_t>(c.role)] +
                       c.tensor_offset;
        return pinned.CopyToDevice(thread, dst, c.bytes);
      },
      options.cancel);
  // Every copy must be done (or failed) before the staging is freed, on every path.
  const absl::Status synced = pinned.Synchronize();
  if (!read.ok()) return read;
  return synced;
}

}  // namespace dequantd::cuda
