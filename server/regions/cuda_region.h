// Device regions: a client's CUDA allocation, exported with cudaIpcGetMemHandle and opened once
// in the server with cudaIpcOpenMemHandle (closed when the Region is destroyed).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/regions/region.h"

namespace dequantd::regions {

// Bytes of a cudaIpcMemHandle_t.
inline constexpr size_t kCudaIpcHandleBytes = 64;

// Opens `raw_handle` (kCudaIpcHandleBytes bytes) on device spec.device and checks spec.offset +
// spec.byte_size against the exported allocation's size. The caller checked that the backend
// computes on spec.device. Errors: INVALID_ARGUMENT (raw_handle's length; a handle the driver
// refuses, e.g. from this process or a freed allocation; the range past the allocation's end,
// naming offset, byte_size and the allocation's bytes), FAILED_PRECONDITION (built without CUDA,
// no such device), RESOURCE_EXHAUSTED (device out of memory / mappings).
absl::StatusOr<std::unique_ptr<Region>> OpenCudaRegion(RegionSpec spec,
                                                       const std::string& raw_handle);

}  // namespace dequantd::regions
