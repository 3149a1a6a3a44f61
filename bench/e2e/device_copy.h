// The copy rates the end-to-end benchmark's rows are compared with (0 without a GPU): pinned
// device-to-host (streams and host regions) and device-to-device (device regions).
#pragma once

#include <cstdint>
#include <string>

namespace dequantd::e2e {

// Bytes per second of cudaMemcpyAsync device -> pinned host of `bytes` bytes (best of 5 after a
// warm-up, timed with CUDA events) on device 0; 0 when built without CUDA or with no GPU.
// `device` receives the GPU's name (empty without one).
double PinnedDeviceToHostBytesPerSecond(int64_t bytes, std::string* device);

// Device-to-device cudaMemcpyAsync of `bytes` on device 0, timed the same way: bytes copied per
// second (count read + written as twice that); 0 without a GPU.
double DeviceCopyBytesPerSecond(int64_t bytes);

}  // namespace dequantd::e2e
