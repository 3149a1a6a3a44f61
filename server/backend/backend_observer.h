// Where a Backend reports what it does: per-stage times of each Dequantize call, the traffic of
// each kernel run, the device's measured copy rate and its memory use. server/metrics/metrics.h
// implements it with Prometheus; kernels/ never sees it. A backend given no observer (null)
// reports nothing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dequantd {

// The stages of one Dequantize call, in order.
enum class DequantizeStage {
  kQueueWait,     // waiting for a device slot (CUDA: all slots of the GPU busy)
  kHostToDevice,  // copying inline packed inputs to the device
  kKernel,        // the dequantization kernel (CUDA: events around the launch; CPU: compute time)
  kDeviceToHost,  // copying the result to pinned host memory (CUDA: events around each piece)
  kSend,          // handing the result chunks to the sink (writing to gRPC), and waiting for a
                  // staging / row block the transport still holds (server/backend/block_pool.h)
};

// What a device's memory holds, for DeviceMemoryUsed.
enum class DeviceMemoryKind {
  kResidentWeights,  // packed layers of the loaded model kept on the device
  kBuffers,          // output / inline-input buffers (live and cached), host staging excluded
};

// The `device` label of a backend's device: "cpu" for the CPU backend, else "<backend>:<index>",
// e.g. "cuda:0".
inline std::string DeviceLabel(std::string_view backend, int index) {
  if (backend == "cpu") return "cpu";
  return std::string(backend) + ":" + std::to_string(index);
}

// Thread-safety: implementations must accept calls from many request threads at once. Calls are
// made while the backend is alive and never from its destructor.
class BackendObserver {
 public:
  virtual ~BackendObserver() = default;

  // `seconds` spent in `stage` by one Dequantize call (a stage that did not happen is not
  // reported, e.g. kHostToDevice for a resident layer).
  virtual void ObserveStage(DequantizeStage stage, double seconds) = 0;

  // One complete kernel run on `device` (e.g. "cuda:0", "cpu"): `backend` ("cuda" or "cpu"),
  // `variant` (e.g. "v4_vec16", "cpu"), the bytes it read (qweight + qzeros + scales) and wrote
  // (the K * N result), and its duration in seconds (> 0).
  virtual void ObserveKernel(std::string_view device, std::string_view backend,
                             std::string_view variant, int64_t read_bytes, int64_t written_bytes,
                             double seconds) = 0;

  // The device's copy rate, bytes read + written per second, measured once at start (CUDA: a
  // 256 MiB device-to-device cudaMemcpyAsync; CPU: a threaded host memcpy).
  virtual void SetDeviceCopyBandwidth(std::string_view device, double bytes_per_second) = 0;

  // Bytes of `device`'s memory now held for `kind`.
  virtual void SetDeviceMemoryUsed(std::string_view device, DeviceMemoryKind kind,
                                   int64_t bytes) = 0;

  // Several GPUs (CUDA backend; defaults do nothing). Calls now on `device` (in a slot or waiting
  // for one).
  virtual void SetDeviceInFlight(std::string_view /*device*/, int64_t /*calls*/) {}
  // Whether `device` is in rotation: true at start, false when it is taken out (failed at start,
  // or a device error in a call); called with false once per device.
  virtual void SetDeviceServing(std::string_view /*device*/, bool /*serving*/) {}
};

}  // namespace dequantd
