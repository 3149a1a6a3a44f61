// UploadFromShards (see shard_upload.h).
#include "server/backend/cuda/shard_upload.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
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

constexpr int kMaxBuffers = kLoadBuffersPerThread;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One reader thread's staging: its buffers, each with the event of its last copy, and where the
// thread's time went. Touched by that thread only while the reads run.
struct ReaderStaging {
  UniqueStream stream;
  std::array<uint8_t*, kMaxBuffers> buffer{};
  std::array<UniqueEvent, kMaxBuffers> copied;
  std::array<bool, kMaxBuffers> pending{};
  int next = 0;  // the buffer the next chunk is read into
  bool device_set = false;
  Clock::time_point read_from;  // when the chunk in hand began to be read
  double pread_seconds = 0;
  double copy_wait_seconds = 0;
  double issue_seconds = 0;
};

}  // namespace

absl::StatusOr<LoadStaging> AllocateLoadStaging(const ShardUploadOptions& options) {
  LoadStaging staging;
  staging.plan = PlanLoadStaging(options.threads > 0 ? options.threads : DefaultLoadThreads(),
                                 options.staging_bytes);
  const Clock::time_point start = Clock::now();
  absl::StatusOr<UniquePinnedMemory> memory = MakePinnedMemory(staging.plan.bytes());
  if (!memory.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", staging.plan.bytes(),
                     " bytes of pinned host memory to stage the model "
                     "upload (--load-staging-bytes=",
                     options.staging_bytes, "): ", memory.status().message()));
  }
  staging.memory = *std::move(memory);
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
  int device = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  const int threads = staging.plan.threads;
  const int buffers = staging.plan.buffers;
  const int64_t chunk = staging.plan.chunk_bytes;

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

  std::vector<ReaderStaging> staged(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    ReaderStaging& s = staged[static_cast<size_t>(t)];
    absl::StatusOr<UniqueStream> stream = MakeStream();
    if (!stream.ok()) return stream.status();
    s.stream = *std::move(stream);
    for (int b = 0; b < buffers; ++b) {
      s.buffer[b] = staging.memory.get() + (int64_t{t} * buffers + b) * chunk;
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

  const Clock::time_point start = Clock::now();
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
          const Clock::time_point wait = Clock::now();
          DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.copied[b].get()));
          s.pending[b] = false;
          s.read_from = Clock::now();
          s.copy_wait_seconds += Seconds(wait, s.read_from);
        } else {
          s.read_from = Clock::now();
        }
        return s.buffer[b];
      },
      [&](int thread, const ReadChunk& c, uint8_t* data) -> absl::Status {
        ReaderStaging& s = staged[static_cast<size_t>(thread)];
        const Clock::time_point issue = Clock::now();
        s.pread_seconds += Seconds(s.read_from, issue);
        const int b = s.next;
        uint8_t* dst = device_bases[static_cast<size_t>(c.layer)] +
                       layouts[static_cast<size_t>(c.layer)].offsets[static_cast<size_t>(c.role)] +
                       c.tensor_offset;
        DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, data, static_cast<size_t>(c.bytes),
                                                      cudaMemcpyHostToDevice, s.stream.get()));
        DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.copied[b].get(), s.stream.get()));
        s.pending[b] = true;
        s.next = (b + 1) % buffers;
        s.issue_seconds += Seconds(issue, Clock::now());
        return absl::OkStatus();
      },
      options.cancel);
  const Clock::time_point read_end = Clock::now();
  // Every copy must be done (or failed) before the staging is freed, on every path.
  absl::Status synced;
  for (ReaderStaging& s : staged) {
    const cudaError_t e = cudaStreamSynchronize(s.stream.get());
    if (e != cudaSuccess && synced.ok()) {
      synced = absl::InternalError(
          absl::StrCat("cudaStreamSynchronize after the upload: ", cudaGetErrorString(e)));
    }
  }
  if (profile != nullptr) {
    profile->threads = threads;
    profile->buffers = buffers;
    profile->chunk_bytes = chunk;
    profile->staging_bytes = staging.plan.bytes();
    profile->chunks = static_cast<int64_t>(chunks.size());
    profile->bytes = bytes;
    profile->pin_seconds = staging.pin_seconds;
    profile->read_seconds = Seconds(start, read_end);
    profile->drain_seconds = Seconds(read_end, Clock::now());
    for (const ReaderStaging& s : staged) {
      profile->pread_seconds += s.pread_seconds;
      profile->copy_wait_seconds += s.copy_wait_seconds;
      profile->issue_seconds += s.issue_seconds;
      profile->max_pread_seconds = std::max(profile->max_pread_seconds, s.pread_seconds);
      profile->max_copy_wait_seconds =
          std::max(profile->max_copy_wait_seconds, s.copy_wait_seconds);
    }
  }
  if (!read.ok()) return read;
  return synced;
}

}  // namespace dequantd::cuda
