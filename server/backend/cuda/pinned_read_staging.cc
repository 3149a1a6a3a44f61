// PinnedReadStaging (see pinned_read_staging.h).
#include "server/backend/cuda/pinned_read_staging.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"

namespace dequantd::cuda {

absl::StatusOr<std::unique_ptr<PinnedReadStaging>> PinnedReadStaging::Make(int device,
                                                                           LoadStagingPlan plan) {
  if (plan.threads < 1 || plan.buffers < 1 || plan.buffers > kLoadBuffersPerThread ||
      plan.chunk_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned staging: ", plan.threads, " threads x ", plan.buffers, " buffers x ",
                     plan.chunk_bytes, " bytes (threads and chunk bytes >= 1, buffers 1..",
                     kLoadBuffersPerThread, ")"));
  }
  std::unique_ptr<PinnedReadStaging> staging(new PinnedReadStaging(device, plan));
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
  readers_.resize(static_cast<size_t>(plan_.threads));
  for (int t = 0; t < plan_.threads; ++t) {
    Reader& r = readers_[static_cast<size_t>(t)];
    absl::StatusOr<UniqueStream> stream = MakeStream();
    if (!stream.ok()) return stream.status();
    r.stream = *std::move(stream);
    for (int b = 0; b < plan_.buffers; ++b) {
      r.buffer[b] = memory_.get() + (int64_t{t} * plan_.buffers + b) * plan_.chunk_bytes;
      absl::StatusOr<UniqueEvent> event = MakeEvent(/*timing=*/false);
      if (!event.ok()) return event.status();
      r.copied[b] = *std::move(event);
    }
  }
  return absl::OkStatus();
}

PinnedReadStaging::~PinnedReadStaging() { (void)Synchronize(); }

absl::StatusOr<uint8_t*> PinnedReadStaging::NextBuffer(int thread, double* waited_seconds) {
  Reader& r = readers_[static_cast<size_t>(thread)];
  // Reader threads are made per read: each must make the staging's device current.
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const int b = r.next;
  if (r.pending[b]) {  // its previous chunk's copy must be done before it is overwritten
    const auto start = std::chrono::steady_clock::now();
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(r.copied[b].get()));
    r.pending[b] = false;
    if (waited_seconds != nullptr) {
      *waited_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }
  return r.buffer[b];
}

absl::Status PinnedReadStaging::CopyToDevice(int thread, const uint8_t* buffer, uint8_t* device_dst,
                                             int64_t bytes) {
  Reader& r = readers_[static_cast<size_t>(thread)];
  const int b = r.next;
  if (buffer != r.buffer[b] || bytes < 0 || bytes > plan_.chunk_bytes) {
    return absl::InternalError(absl::StrCat(
        "pinned staging: reader ", thread, " copies ", bytes,
        " bytes from a buffer that is not the one NextBuffer gave it (or more than a chunk)"));
  }
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_dst, r.buffer[b], static_cast<size_t>(bytes),
                                                cudaMemcpyHostToDevice, r.stream.get()));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.copied[b].get(), r.stream.get()));
  r.pending[b] = true;
  r.next = (b + 1) % plan_.buffers;
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
    r.pending = {};
  }
  return synced;
}

}  // namespace dequantd::cuda
