// The pinned device-to-host copy rate, a ceiling of the end-to-end benchmark (0 without a GPU).
#pragma once

#include <cstdint>
#include <string>

namespace dequantd::e2e {

// Bytes per second of cudaMemcpyAsync device -> pinned host of `bytes` bytes (best of 5 after a
// warm-up, timed with CUDA events) on device 0; 0 when built without CUDA or with no GPU.
// `device` receives the GPU's name (empty without one).
double PinnedDeviceToHostBytesPerSecond(int64_t bytes, std::string* device);

}  // namespace dequantd::e2e
