// Creating the CUDA primary contexts of the GPUs a server will use, up front and one thread per
// GPU (issue 22): the largest fixed cost of a start (driver and context initialisation, hundreds
// of milliseconds on an H200 host), timed on its own so the startup log shows it apart from the
// backend's buffers, and run while the checkpoint's headers are read on another thread.
#pragma once

#include <vector>

namespace dequantd::cuda {

// Makes the primary context of each of `devices` (CUDA ordinals) current once, so later calls on
// it find it made. Errors are not reported here (they are cleared): a device that cannot start
// fails in the backend's own start, which names it and keeps the others (cuda_backend.h).
// Leaves the calling thread's current device unchanged.
void CreatePrimaryContexts(const std::vector<int>& devices);

}  // namespace dequantd::cuda
