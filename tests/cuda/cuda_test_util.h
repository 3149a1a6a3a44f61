// Helpers for cuda_test: device detection, an owning device buffer, and upload of a host layer.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/awq_format.h"
#include "kernels/cuda/dequant_cuda.h"
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

// Compares two results of `out` elements: each element's bits equal, or both NaN. A NaN's sign and
// payload are where a device kernel and the CPU reference may differ (a packed fp16x2 / bf16x2
// multiply gives the canonical NaN, the reference keeps sign | quiet bit or the payload); a NaN on
// one side only, or any other difference, fails the test. Returns how many elements are NaN on both
// sides with different bits.
inline int64_t ExpectEqualOrBothNan(const std::vector<uint8_t>& got,
                                    const std::vector<uint8_t>& want, DType out) {
  EXPECT_EQ(got.size(), want.size());
  const auto is_nan = [out](uint32_t b) {
    switch (out) {
      case DType::kF16:
        return (b & 0x7C00u) == 0x7C00u && (b & 0x03FFu) != 0;
      case DType::kBF16:
        return (b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0;
      default:
        return (b & 0x7F800000u) == 0x7F800000u && (b & 0x007FFFFFu) != 0;
    }
  };
  const size_t width = out == DType::kF32 ? 4 : 2;
  int64_t nan_payloads = 0, other = 0;
  size_t first = 0;
  for (size_t i = 0; i + width <= std::min(got.size(), want.size()); i += width) {
    uint32_t g = 0, w = 0;
    std::memcpy(&g, &got[i], width);
    std::memcpy(&w, &want[i], width);
    if (g == w) continue;
    if (is_nan(g) && is_nan(w)) {
      ++nan_payloads;
    } else if (other++ == 0) {
      first = i / width;
    }
  }
  EXPECT_EQ(other, 0) << "elements differing other than in a NaN's bits; the first at " << first;
  return nan_payloads;
}

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

// Runs variant `v` of the device layer `device` into a fresh buffer filled with 0xFF first (every
// element must be written) and compares the result with `want`: bit for bit, or, when
// `nan_bits_may_differ` (inputs with inf / NaN scales), up to a NaN's bits (ExpectEqualOrBothNan;
// the count of such elements is printed).
inline void ExpectLaunchResult(KernelVariant v, const QuantView& device, DType out,
                               const std::vector<uint8_t>& want, bool nan_bits_may_differ,
                               const LaunchConfig& config = LaunchConfig{}) {
  DeviceBuffer result(want.size());
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(cudaMemset(result.get(), 0xFF, result.bytes()), cudaSuccess);
  const absl::Status st = LaunchDequantize(v, config, device, out, result.get(), nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> got(want.size());
  ASSERT_EQ(cudaMemcpy(got.data(), result.get(), got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  if (!nan_bits_may_differ) {
    EXPECT_TRUE(got == want);
  } else if (const int64_t n = ExpectEqualOrBothNan(got, want, out); n > 0) {
    std::printf("  %s: %lld NaN results with other bits than the reference's\n",
                ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                static_cast<long long>(n));
  }
}

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
