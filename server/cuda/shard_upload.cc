// UploadFromShards (see shard_upload.h).
#include "server/cuda/shard_upload.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "server/cuda/cuda_objects.h"
#include "server/cuda/packed_upload.h"
#include "server/shard_reader.h"

namespace dequantd::cuda {
namespace {

constexpr int64_t kMinChunkBytes = int64_t{1} << 20;
constexpr int64_t kChunkAlign = 4096;

// One reader thread's staging: two pinned buffers, each with the event of its last copy.
struct ReaderStaging {
  UniqueStream stream;
  std::array<uint8_t*, 2> buffer{};
  std::array<UniqueEvent, 2> copied;
  std::array<bool, 2> pending{};
  int next = 0;  // the buffer the next chunk is read into
  bool device_set = false;
};

}  // namespace

absl::Status UploadFromShards(const Checkpoint& checkpoint, const std::vector<int64_t>& layers,
                              const std::vector<uint8_t*>& device_bases,
                              const ShardUploadOptions& options) {
  if (layers.empty()) return absl::OkStatus();
  int device = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  // Threads x 2 buffers of `chunk` bytes within the staging asked for; fewer threads when it
  // cannot give each 2 x 1 MiB.
  int threads = options.threads > 0 ? options.threads : DefaultLoadThreads();
  threads = static_cast<int>(
      std::clamp<int64_t>(options.staging_bytes / (2 * kMinChunkBytes), 1, threads));
  const int64_t chunk = std::max<int64_t>(
      kMinChunkBytes, options.staging_bytes / (2 * threads) / kChunkAlign * kChunkAlign);

  std::vector<ReadChunk> chunks;
  for (size_t j = 0; j < layers.size(); ++j) {
    const QuantizedLayer& layer = checkpoint.layers()[static_cast<size_t>(layers[j])];
    for (int r = 0; r < TensorRoleCount(layer.view.shape.format); ++r) {
      const StoredRange& range = layer.stored[static_cast<size_t>(r)];
      if (range.shard < 0) continue;  // an absent optional role (GPTQ's g_idx without desc_act)
      AppendChunks(range.shard, range.offset, range.bytes, static_cast<int64_t>(j), r, chunk,
                   &chunks);
    }
  }
  absl::StatusOr<ShardReader> reader = ShardReader::Open(checkpoint.shards());
  if (!reader.ok()) return reader.status();

  const int64_t staging_bytes = int64_t{threads} * 2 * chunk;
  absl::StatusOr<UniquePinnedMemory> staging = MakePinnedMemory(staging_bytes);
  if (!staging.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", staging_bytes,
                     " bytes of pinned host memory to stage the model "
                     "upload (--load-staging-bytes=",
                     options.staging_bytes, "): ", staging.status().message()));
  }
  std::vector<ReaderStaging> staged(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    ReaderStaging& s = staged[static_cast<size_t>(t)];
    absl::StatusOr<UniqueStream> stream = MakeStream();
    if (!stream.ok()) return stream.status();
    s.stream = *std::move(stream);
    for (int b = 0; b < 2; ++b) {
      s.buffer[b] = staging->get() + (int64_t{t} * 2 + b) * chunk;
      absl::StatusOr<UniqueEvent> event = MakeEvent(/*timing=*/false);
      if (!event.ok()) return event.status();
      s.copied[b] = *std::move(event);
    }
  }
  std::vector<PackedLayout> layouts;
  layouts.reserve(layers.size());
  for (int64_t id : layers) {
    layouts.emplace_back(checkpoint.layers()[static_cast<size_t>(id)].view.shape);
  }

  const absl::Status read = reader->Read(
      chunks, threads,
      [&](int64_t j, int role) {
        return checkpoint.StoredTensorName(layers[static_cast<size_t>(j)], role);
      },
      [&](int thread, const ReadChunk&) -> absl::StatusOr<uint8_t*> {
        ReaderStaging& s = staged[static_cast<size_t>(thread)];
        if (!s.device_set) {
          DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
          s.device_set = true;
        }
        const int b = s.next;
        if (s.pending[b]) {  // its previous chunk's copy must be done before it is overwritten
          DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.copied[b].get()));
          s.pending[b] = false;
        }
        return s.buffer[b];
      },
      [&](int thread, const ReadChunk& c, uint8_t* data) -> absl::Status {
        ReaderStaging& s = staged[static_cast<size_t>(thread)];
        const int b = s.next;
        uint8_t* dst = device_bases[static_cast<size_t>(c.layer)] +
                       layouts[static_cast<size_t>(c.layer)].offsets[static_cast<size_t>(c.role)] +
                       c.tensor_offset;
        DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, data, static_cast<size_t>(c.bytes),
                                                      cudaMemcpyHostToDevice, s.stream.get()));
        DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.copied[b].get(), s.stream.get()));
        s.pending[b] = true;
        s.next = 1 - b;
        return absl::OkStatus();
      },
      options.cancel);
  // Every copy must be done (or failed) before the staging is freed, on every path.
  absl::Status synced;
  for (ReaderStaging& s : staged) {
    const cudaError_t e = cudaStreamSynchronize(s.stream.get());
    if (e != cudaSuccess && synced.ok()) {
      synced = absl::InternalError(
          absl::StrCat("cudaStreamSynchronize after the upload: ", cudaGetErrorString(e)));
    }
  }
  if (!read.ok()) return read;
  return synced;
}

}  // namespace dequantd::cuda
