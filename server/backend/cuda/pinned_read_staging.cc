// PinnedReadStaging (see pinned_read_staging.h).
#include "server/backend/cuda/pinned_read_staging.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"

namespace dequantd::cuda {
namespace {

constexpr int64_t kChunkAlign = 4096;

}  // namespace

PinnedReadStaging::Shape PinnedReadStaging::ShapeFor(int threads, int64_t staging_bytes) {
  Shape shape;
  shape.threads = static_cast<int>(
      std::clamp<int64_t>(staging_bytes / (2 * kMinChunkBytes), 1, std::max(1, threads)));
  shape.chunk_bytes = std::max<int64_t>(
      kMinChunkBytes, staging_bytes / (2 * shape.threads) / kChunkAlign * kChunkAlign);
  return shape;
}

absl::StatusOr<std::unique_ptr<PinnedReadStaging>> PinnedReadStaging::Make(int device,
                                                                           Shape shape) {
  std::unique_ptr<PinnedReadStaging> staging(new PinnedReadStaging(device, shape));
  int current = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  absl::Status made = staging->Allocate();
  cudaSetDevice(current);
  if (!made.ok()) return made;
  return staging;
}

absl::Status PinnedReadStaging::Allocate() {
  absl::StatusOr<UniquePinnedMemory> memory = MakePinnedMemory(pinned_bytes());
  if (!memory.ok()) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(memory.status().message());
  }
  memory_ = *std::move(memory);
  readers_.resize(static_cast<size_t>(shape_.threads));
  for (int t = 0; t < shape_.threads; ++t) {
    Reader& r = readers_[static_cast<size_t>(t)];
    absl::StatusOr<UniqueStream> stream = MakeStream();
    if (!stream.ok()) return stream.status();
    r.stream = *std::move(stream);
    for (int b = 0; b < 2; ++b) {
      r.buffer[b] = memory_.get() + (int64_t{t} * 2 + b) * shape_.chunk_bytes;
      absl::StatusOr<UniqueEvent> event = MakeEvent(/*timing=*/false);
      if (!event.ok()) return event.status();
      r.copied[b] = *std::move(event);
    }
  }
  return absl::OkStatus();
}

PinnedReadStaging::~PinnedReadStaging() { (void)Synchronize(); }

absl::StatusOr<uint8_t*> PinnedReadStaging::NextBuffer(int thread) {
  Reader& r = readers_[static_cast<size_t>(thread)];
  // Reader threads are made per read: each must make the staging's device current.
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const int b = r.next;
  if (r.pending[b]) {  // its previous chunk's copy must be done before it is overwritten
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(r.copied[b].get()));
    r.pending[b] = false;
  }
  return r.buffer[b];
}

absl::Status PinnedReadStaging::CopyToDevice(int thread, uint8_t* device_dst, int64_t bytes) {
  Reader& r = readers_[static_cast<size_t>(thread)];
  const int b = r.next;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_dst, r.buffer[b], static_cast<size_t>(bytes),
                                                cudaMemcpyHostToDevice, r.stream.get()));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.copied[b].get(), r.stream.get()));
  r.pending[b] = true;
  r.next = 1 - b;
  return absl::OkStatus();
}

absl::Status PinnedReadStaging::Synchronize() {
  absl::Status synced;
  for (Reader& r : readers_) {
    if (r.stream == nullptr) continue;
    const cudaError_t e = cudaStreamSynchronize(r.stream.get());
    if (e != cudaSuccess && synced.ok()) {
      synced = absl::InternalError(
          absl::StrCat("cudaStreamSynchronize after staged copies: ", cudaGetErrorString(e)));
    }
    r.pending = {false, false};
  }
  return synced;
}

}  // namespace dequantd::cuda
