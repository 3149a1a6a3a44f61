// Helpers for cuda_test: device detection, an owning device buffer, and upload of a host layer.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/awq_format.h"
#include "kernels/dequant.h"
#include "tests/kernels/test_util.h"

namespace dequantd::cuda::testing {

// The host-side layer helpers (tests/kernels/test_util.h), visible to the tests written in this
// namespace alongside the device helpers below.
using ::dequantd::testing::HostLayer;
using ::dequantd::testing::RandomLayer;

// True when the CUDA runtime reports at least one device.
inline bool HaveCudaDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define DEQUANTD_SKIP_WITHOUT_GPU() \
  if (!::dequantd::cuda::testing::HaveCudaDevice()) GTEST_SKIP() << "no CUDA device"

// cudaMalloc'd bytes, freed on destruction. ok() is false when the allocation failed.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  bool ok() const { return ptr_ != nullptr; }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A host layer's three tensors copied to the device.
class DeviceLayer {
 public:
  explicit DeviceLayer(const dequantd::testing::HostLayer& host)
      : shape_(host.shape),
        qweight_(host.qweight.size() * sizeof(int32_t)),
        qzeros_(host.qzeros.size() * sizeof(int32_t)),
        scales_(host.scales.size() * sizeof(uint16_t)) {
    ok_ = qweight_.ok() && qzeros_.ok() && scales_.ok() &&
          cudaMemcpy(qweight_.get(), host.qweight.data(), qweight_.bytes(),
                     cudaMemcpyHostToDevice) == cudaSuccess &&
          cudaMemcpy(qzeros_.get(), host.qzeros.data(), qzeros_.bytes(), cudaMemcpyHostToDevice) ==
              cudaSuccess &&
          cudaMemcpy(scales_.get(), host.scales.data(), scales_.bytes(), cudaMemcpyHostToDevice) ==
              cudaSuccess;
  }
  bool ok() const { return ok_; }
  QuantView view() const {
    return awq::MakeView(shape_, static_cast<const int32_t*>(qweight_.get()),
                         static_cast<const int32_t*>(qzeros_.get()), scales_.get());
  }

 private:
  QuantShape shape_;
  DeviceBuffer qweight_, qzeros_, scales_;
  bool ok_ = false;
};

}  // namespace dequantd::cuda::testing
