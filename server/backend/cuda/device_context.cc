// CreatePrimaryContexts (see device_context.h).
#include "server/backend/cuda/device_context.h"

#include <cuda_runtime_api.h>

#include <thread>

namespace dequantd::cuda {

void CreatePrimaryContexts(const std::vector<int>& devices) {
  std::vector<std::thread> threads;
  threads.reserve(devices.size());
  for (int device : devices) {
    threads.emplace_back([device] {
      // cudaFree(nullptr) is the documented way to force the context's creation.
      if (cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
        cudaGetLastError();  // the backend's start reports the device's failure itself
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace dequantd::cuda
