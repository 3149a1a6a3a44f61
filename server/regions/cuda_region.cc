// OpenCudaRegion (see cuda_region.h).
#include "server/regions/cuda_region.h"

#include <utility>

#include "absl/strings/str_cat.h"
#if DEQUANTD_HAVE_CUDA
#include <cuda.h>  // the driver types of cuMemGetAddressRange (looked up through the runtime)
#include <cuda_runtime_api.h>

#include <cstring>
#endif

namespace dequantd::regions {

#if DEQUANTD_HAVE_CUDA
namespace {

class CudaRegion final : public Region {
 public:
  CudaRegion(RegionSpec spec, void* base) : Region(std::move(spec)), base_(base) {}
  ~CudaRegion() override {
    int current = 0;
    cudaGetDevice(&current);
    cudaSetDevice(spec().device);
    cudaIpcCloseMemHandle(base_);
    cudaSetDevice(current);
  }

  RegionKind kind() const override { return RegionKind::kDevice; }
  uint8_t* data() const override { return static_cast<uint8_t*>(base_) + spec().offset; }
  absl::Status CopyIn(int64_t offset, absl::Span<const uint8_t> bytes) override {
    // cudaMemcpy from pageable memory may return before its DMA ends: wait, so that the reply
    // means the bytes are in device memory (this is the fallback path; see RegionSink::Write).
    cudaError_t error =
        cudaMemcpy(data() + offset, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
    if (error == cudaSuccess) error = cudaStreamSynchronize(cudaStreamLegacy);
    if (error == cudaSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("region \"", spec().name, "\": copy of ", bytes.size(),
                                            " bytes to device offset ", offset,
                                            " failed: ", cudaGetErrorString(error)));
  }

 private:
  void* const base_;  // cudaIpcOpenMemHandle's pointer: the exported allocation's first byte
};

absl::Status CudaError(cudaError_t error, const std::string& what) {
  cudaGetLastError();
  const std::string message = absl::StrCat(what, ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
    case cudaErrorTooManyPeers:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidDevice:
    case cudaErrorNoDevice:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InvalidArgumentError(message);
  }
}

// The bytes of the allocation starting at `base`, via the driver's cuMemGetAddressRange (looked
// up through the runtime, so that the server needs no link against libcuda). -1 if unknown.
int64_t AllocationBytes(void* base) {
  using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr) {
    cudaGetLastError();
    return -1;
  }
  CUdeviceptr start = 0;
  size_t size = 0;
  if (reinterpret_cast<GetRange>(fn)(&start, &size, reinterpret_cast<CUdeviceptr>(base)) !=
      CUDA_SUCCESS) {
    return -1;
  }
  return static_cast<int64_t>(size - (reinterpret_cast<CUdeviceptr>(base) - start));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Region>> OpenCudaRegion(RegionSpec spec,
                                                       const std::string& raw_handle) {
  if (raw_handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("raw_handle must be ", kCudaIpcHandleBytes,
                                                   " bytes (a cudaIpcMemHandle_t), got ",
                                                   raw_handle.size()));
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  cudaGetLastError();
  if (spec.device < 0 || spec.device >= devices) {
    return absl::FailedPreconditionError(
        absl::StrCat("device_id ", spec.device, ": this host has ", devices, " CUDA device(s)"));
  }
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, raw_handle.data(), sizeof(handle));
  int current = 0;
  cudaGetDevice(&current);
  cudaSetDevice(spec.device);
  void* base = nullptr;
  const cudaError_t error = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
  cudaSetDevice(current);
  if (error != cudaSuccess) {
    return CudaError(error, absl::StrCat("raw_handle: cudaIpcOpenMemHandle on device ", spec.device,
                                         " refused it"));
  }
  const int64_t allocation = AllocationBytes(base);
  if (allocation >= 0 && (spec.offset > allocation || spec.byte_size > allocation - spec.offset)) {
    cudaSetDevice(spec.device);
    cudaIpcCloseMemHandle(base);
    cudaSetDevice(current);
    return absl::InvalidArgumentError(absl::StrCat("the exported allocation is ", allocation,
                                                   " bytes: offset ", spec.offset, " + byte_size ",
                                                   spec.byte_size, " runs past its end"));
  }
  return std::make_unique<CudaRegion>(std::move(spec), base);
}

#else

absl::StatusOr<std::unique_ptr<Region>> OpenCudaRegion(RegionSpec, const std::string&) {
  return absl::FailedPreconditionError(
      "device regions need a server built with CUDA (this one has none)");
}

#endif

}  // namespace dequantd::regions
