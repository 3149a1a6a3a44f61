// RAII owners of CUDA runtime objects: a stream, an event, device memory, pinned host memory.
// Each is a std::unique_ptr with a deleter that releases the object, so an owner is destroyed
// exactly once, in member order, and never leaks on an error path. Destroy them while the CUDA
// context is alive (before main returns, not from static destructors).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace dequantd::cuda {

struct StreamDeleter {
  void operator()(cudaStream_t stream) const { cudaStreamDestroy(stream); }
};
struct EventDeleter {
  void operator()(cudaEvent_t event) const { cudaEventDestroy(event); }
};
struct DeviceFree {
  void operator()(void* ptr) const { cudaFree(ptr); }
};
struct PinnedFree {
  void operator()(uint8_t* ptr) const { cudaFreeHost(ptr); }
};

using UniqueStream = std::unique_ptr<CUstream_st, StreamDeleter>;
using UniqueEvent = std::unique_ptr<CUevent_st, EventDeleter>;
using UniqueDeviceMemory = std::unique_ptr<void, DeviceFree>;
using UniquePinnedMemory = std::unique_ptr<uint8_t[], PinnedFree>;

// A non-blocking stream on the current device. INTERNAL on failure.
absl::StatusOr<UniqueStream> MakeStream();
// An event on the current device; `timing` false makes it cheaper (cudaEventDisableTiming).
absl::StatusOr<UniqueEvent> MakeEvent(bool timing);
// `bytes` (>= 1) of device memory on the current device. RESOURCE_EXHAUSTED when it does not fit.
absl::StatusOr<UniqueDeviceMemory> MakeDeviceMemory(int64_t bytes);
// `bytes` (>= 1) of page-locked host memory (cudaHostAlloc). RESOURCE_EXHAUSTED when refused.
absl::StatusOr<UniquePinnedMemory> MakePinnedMemory(int64_t bytes);

// Seconds between two completed events (0 if they cannot be read, e.g. timing disabled).
double ElapsedSeconds(cudaEvent_t start, cudaEvent_t end);

}  // namespace dequantd::cuda
