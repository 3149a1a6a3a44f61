// The client side of a device region in the end-to-end benchmark (issue 9): a device buffer this
// process allocates on CUDA device 0 and exports with cudaIpcGetMemHandle for dequantd to open,
// and the device-to-device copy rate, the device region's ceiling.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dequantd::e2e {

class DeviceRegionBuffer {
 public:
  // `bytes` (>= 1) of cudaMalloc memory on device 0. Errors: FAILED_PRECONDITION (built without
  // CUDA, or no GPU), RESOURCE_EXHAUSTED (device memory), INTERNAL (another CUDA error).
  static absl::StatusOr<std::unique_ptr<DeviceRegionBuffer>> Create(int64_t bytes);
  ~DeviceRegionBuffer();  // cudaFree: unregister the region first
  DeviceRegionBuffer(const DeviceRegionBuffer&) = delete;
  DeviceRegionBuffer& operator=(const DeviceRegionBuffer&) = delete;

  int64_t bytes() const { return bytes_; }
  // The cudaIpcMemHandle_t of the allocation, 64 bytes (RegisterCudaSharedMemory's raw_handle).
  const std::string& ipc_handle() const { return handle_; }
  // Sets every byte to `value` and waits (poison before a call). INTERNAL on a CUDA error.
  absl::Status Fill(uint8_t value);
  // Copies bytes [offset, offset + out.size()) to `out` and waits. INTERNAL on a CUDA error
  // (the caller keeps the range inside bytes()).
  absl::Status CopyToHost(int64_t offset, absl::Span<uint8_t> out) const;

 private:
  DeviceRegionBuffer(void* data, int64_t bytes, std::string handle)
      : data_(data), bytes_(bytes), handle_(std::move(handle)) {}
  void* const data_;
  const int64_t bytes_;
  const std::string handle_;
};

}  // namespace dequantd::e2e
