// UploadFromShards (see shard_upload.h).
#include "server/backend/cuda/shard_upload.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_status.h"
#include "server/backend/cuda/packed_upload.h"
#include "server/model/load_staging_plan.h"
#include "server/model/shard_reader.h"

namespace dequantd::cuda {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Where one reader thread's time went. Touched by that thread only while the reads run.
struct ReaderTimes {
  Clock::time_point read_from;  // when the chunk in hand began to be read
  double pread_seconds = 0;
  double copy_wait_seconds = 0;
  double issue_seconds = 0;
};

}  // namespace

absl::StatusOr<LoadStaging> AllocateLoadStaging(const ShardUploadOptions& options) {
  const LoadStagingPlan plan = PlanLoadStaging(
      options.threads > 0 ? options.threads : DefaultLoadThreads(), options.staging_bytes);
  int device = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  const Clock::time_point start = Clock::now();
  absl::StatusOr<std::unique_ptr<PinnedReadStaging>> pinned = PinnedReadStaging::Make(device, plan);
  if (!pinned.ok()) {
    if (pinned.status().code() != absl::StatusCode::kResourceExhausted) return pinned.status();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", plan.bytes(),
                     " bytes of pinned host memory to stage the model "
                     "upload (--load-staging-bytes=",
                     options.staging_bytes, "): ", pinned.status().message()));
  }
  LoadStaging staging;
  staging.pinned = *std::move(pinned);
  staging.pin_seconds = Seconds(start, Clock::now());
  return staging;
}

std::string ShardUploadProfile::Describe() const {
  return absl::StrFormat(
      "upload %d threads x %d buffers x %d MiB (%d MiB pinned): cudaMalloc %.3f s (%d blocks), "
      "pin %.3f s (waited %.3f s), reads %.3f s + drain %.3f s for %d chunks, %.2f GB; per thread "
      "(sum/max s): pread %.3f/%.3f, copy wait %.3f/%.3f, copy issue %.3f",
      threads, buffers, chunk_bytes >> 20, staging_bytes >> 20, device_alloc_seconds, device_blocks,
      pin_seconds, pin_wait_seconds, read_seconds, drain_seconds, chunks,
      static_cast<double>(bytes) / 1e9, pread_seconds, max_pread_seconds, copy_wait_seconds,
      max_copy_wait_seconds, issue_seconds);
}

absl::Status UploadFromShards(const Checkpoint& checkpoint, const std::vector<int64_t>& layers,
                              const std::vector<uint8_t*>& device_bases, const LoadStaging& staging,
                              const ShardUploadOptions& options, ShardUploadProfile* profile) {
  if (layers.empty()) return absl::OkStatus();
  PinnedReadStaging& pinned = *staging.pinned;
  const int threads = pinned.threads();
  const int64_t chunk = pinned.chunk_bytes();

  std::vector<ReadChunk> chunks;
  int64_t bytes = 0;
  for (size_t j = 0; j < layers.size(); ++j) {
    const QuantizedLayer& layer = checkpoint.layers()[static_cast<size_t>(layers[j])];
    for (int r = 0; r < TensorRoleCount(layer.view.shape.format); ++r) {
      const StoredRange& range = layer.stored[static_cast<size_t>(r)];
      if (range.shard < 0) continue;  // an absent optional role (GPTQ's g_idx without desc_act)
      AppendChunks(range.shard, range.offset, range.bytes, static_cast<int64_t>(j), r, chunk,
                   &chunks);
      bytes += range.bytes;
    }
  }
  absl::StatusOr<ShardReader> reader = ShardReader::Open(checkpoint.shards());
  if (!reader.ok()) return reader.status();

  std::vector<ReaderTimes> times(static_cast<size_t>(threads));
  std::vector<PackedLayout> layouts;
  layouts.reserve(layers.size());
  for (int64_t id : layers) {
    layouts.emplace_back(checkpoint.layers()[static_cast<size_t>(id)].view.shape);
  }

  const Clock::time_point start = Clock::now();
  const absl::Status read = reader->Read(
      chunks, threads,
      [&](int64_t j, int role) {
        return checkpoint.StoredTensorName(layers[static_cast<size_t>(j)], role);
      },
      [&](int thread, const ReadChunk&) -> absl::StatusOr<uint8_t*> {
        ReaderTimes& t = times[static_cast<size_t>(thread)];
        absl::StatusOr<uint8_t*> buffer = pinned.NextBuffer(thread, &t.copy_wait_seconds);
        t.read_from = Clock::now();
        return buffer;
      },
      [&](int thread, const ReadChunk& c, uint8_t* data) -> absl::Status {
        ReaderTimes& t = times[static_cast<size_t>(thread)];
        const Clock::time_point issue = Clock::now();
        t.pread_seconds += Seconds(t.read_from, issue);
        uint8_t* dst = device_bases[static_cast<size_t>(c.layer)] +
                       layouts[static_cast<size_t>(c.layer)].offsets[static_cast<size_t>(c.role)] +
                       c.tensor_offset;
        const absl::Status copy = pinned.CopyToDevice(thread, data, dst, c.bytes);
        t.issue_seconds += Seconds(issue, Clock::now());
        return copy;
      },
      options.cancel);
  const Clock::time_point read_end = Clock::now();
  // Every copy must be done (or failed) before the staging is freed, on every path.
  const absl::Status synced = pinned.Synchronize();
  if (profile != nullptr) {
    profile->threads = threads;
    profile->buffers = pinned.plan().buffers;
    profile->chunk_bytes = chunk;
    profile->staging_bytes = pinned.pinned_bytes();
    profile->chunks = static_cast<int64_t>(chunks.size());
    profile->bytes = bytes;
    profile->pin_seconds = staging.pin_seconds;
    profile->read_seconds = Seconds(start, read_end);
    profile->drain_seconds = Seconds(read_end, Clock::now());
    for (const ReaderTimes& t : times) {
      profile->pread_seconds += t.pread_seconds;
      profile->copy_wait_seconds += t.copy_wait_seconds;
      profile->issue_seconds += t.issue_seconds;
      profile->max_pread_seconds = std::max(profile->max_pread_seconds, t.pread_seconds);
      profile->max_copy_wait_seconds =
          std::max(profile->max_copy_wait_seconds, t.copy_wait_seconds);
    }
  }
  if (!read.ok()) return read;
  return synced;
}

}  // namespace dequantd::cuda
