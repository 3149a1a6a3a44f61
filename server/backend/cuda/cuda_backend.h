// The CUDA backend: one worker per GPU. The model's packed weights are uploaded once (Prepare)
// and stay resident; each request runs on a slot of its device (a stream, a pool of pinned staging
// blocks) through the one result pipeline (server/backend/cuda/result_pipeline.h): kernel or
// grouped launch per slab of results -> device -> host in pieces (or straight into the sink's
// memory) -> the sink. Compiled only when DEQUANTD_HAVE_CUDA. Parts, one job each, under
// server/backend/cuda/.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/cuda/grouped_dequant.h"
#include "kernels/dequant.h"
#include "server/backend/cuda/shard_upload.h"
#include "server/backend/device_placement.h"
#include "server/backend/failure_injection.h"
#include "server/model/startup_timeline.h"

namespace dequantd {

class Backend;
class BackendObserver;

// One kernel launch about to happen, as shown to a LaunchConfigProvider. Pointers are device
// pointers of `device` (the calling thread's current device), valid during the call.
struct LaunchQuery {
  int device = 0;  // CUDA device ordinal
  cuda::KernelVariant variant = cuda::KernelVariant::kV4Vec16;
  QuantView in;  // resident or staged packed layer; copies into it are enqueued on stream
  DType out_dtype = DType::kF16;
  void* out = nullptr;  // the request's output buffer (K * N of out_dtype); tuning may write it
  cudaStream_t stream = nullptr;  // the request's stream
};

// Picks the launch configuration of one kernel call: the seam where the autotuner plugs in, e.g.
//   [&tuner](const LaunchQuery& q) {
//     return cuda::GetOrTuneLaunchConfig(tuner, q.variant, q.in, q.out_dtype, q.out, q.stream);
//   }
// (kernels/cuda/autotune_cuda.h). Called from many requests at once: must be thread-safe. Its
// error fails the request.
using LaunchConfigProvider = std::function<absl::StatusOr<cuda::LaunchConfig>(const LaunchQuery&)>;

struct CudaBackendOptions {
  cuda::KernelVariant variant = cuda::KernelVariant::kV4Vec16;  // the kernel every request runs
  LaunchConfigProvider launch_config;  // null: cuda::DefaultConfig(variant, shape, out_dtype)
  int slots_per_device = 4;            // requests in flight per GPU; further ones wait for a slot
  // Device -> host pieces of a streamed result land in pinned staging blocks, and the gRPC stream
  // sends them from there without a copy; a block returns to its slot's pool when gRPC releases
  // the last message referencing it (server/backend/block_pool.h). Each slot owns `staging_blocks`
  // (>= 2) blocks of `staging_bytes` (>= 1), allocated at start: slots_per_device *
  // staging_blocks * staging_bytes of pinned memory per worker (4 * 8 * 4 MiB = 128 MiB by
  // default), and that is all the staging a call can hold, a stalled one included (32 MiB). The
  // pipeline holds two blocks (one piece being copied, one being handed to the sink); the other
  // six cover what the transport holds after a Write returned and before the bytes reached the
  // socket (HTTP/2 flow control bounds it to the stream window, a few MiB, plus the message being
  // written), so the copy of the next piece need not wait for the transport in steady state.
  int64_t staging_bytes = int64_t{4} << 20;  // bytes per staging block
  int staging_blocks = 8;                    // staging blocks per slot
  // How long a call waits for a staging block to come back from the transport before it fails
  // with DEADLINE_EXCEEDED (a transport that never sends; a client that stops reading is
  // normally cancelled first by --stall-timeout, 60 s, which releases its blocks). > 0.
  double staging_wait_seconds = 120.0;
  int64_t buffer_cache_bytes = int64_t{2} << 30;  // idle device buffers kept per GPU, bytes
  // Device memory for results is bounded per call: results are computed in slabs of at most
  // this many bytes (a single larger result gets a slab of its own), double-buffered, so one call
  // holds at most 2 * max(result_slab_bytes, its largest result) of result buffers (plus an inline
  // request's packed input), whatever the model's size. A GPU holds at most slots_per_device
  // calls at once. Must be >= 1.
  int64_t result_slab_bytes = int64_t{256} << 20;
  // Launch parameters of DequantizeLayers' grouped launches (one per slab).
  cuda::GroupedOptions grouped;
  // Several GPUs (docs/architecture.md "Several GPUs"). The CUDA ordinals that serve, one worker
  // each (ParseDeviceList: repeats allowed); empty = every visible GPU.
  std::vector<int> devices;
  PlacementMode placement = PlacementMode::kAuto;  // which worker holds which layers
  // Device memory kept free per worker beyond the resident layers (result slabs, buffers), bytes;
  // -1 = slots_per_device * 2 * result_slab_bytes + 1 GiB. Placement compares the packed model
  // with each GPU's free memory minus this (shared equally by workers of one GPU); what does not
  // fit stays on the host (WorkerCapacity, PlanPlacement).
  int64_t reserve_bytes = -1;
  // The packed bytes each worker may keep resident (--device-memory-limit); 0 = no limit. The
  // layers past it (and past free memory minus reserve_bytes) are served from their host copies,
  // staged to the device per call (docs/architecture.md "Models larger than the GPU").
  // MakeCudaBackend refuses a limit above a device's total memory (INVALID_ARGUMENT,
  // CheckDeviceMemoryLimit).
  int64_t device_memory_limit_bytes = 0;
  // A DequantizeLayers call is cut into parts of at least this many result bytes, one per worker
  // in rotation holding its layers (PlanLayerParts); must be >= 1.
  int64_t min_part_bytes = int64_t{256} << 20;
  // Injected failures by worker label (failure_injection.h; tests only).
  std::map<std::string, DeviceFailureInjection> inject_failures;
  // Called once per worker taken out of rotation (the server logs it), with its label and why.
  std::function<void(std::string_view device, std::string_view reason)> on_device_failed;
  // Set by --pretune. Slab launches keep no per-model plan or buffer any more (the whole-model
  // output buffer it used to build is what bounded slabs replace), so it changes nothing; kept so
  // the server's option plumbing is unchanged.
  bool build_model_plan = false;
  // How Prepare reads the layers that have no host copy (the server opens the checkpoint without
  // copies): straight from the files through bounded pinned staging
  // (server/backend/cuda/shard_upload.h).
  cuda::ShardUploadOptions load;
  // Where each worker's start records its phases (request slots, copy bandwidth); may be null.
  // Used only while MakeCudaBackend runs (it need not outlive it).
  StartupTimeline* timeline = nullptr;
};

// Number of CUDA devices; 0 when there is no driver or no device.
int CudaDeviceCount();

// Creates the backend with one worker per entry of options.devices (every visible GPU when
// empty). A worker that fails to start is taken out of rotation (on_device_failed, observer) and
// the others serve; when none starts, the first worker's error is returned. Errors:
// FAILED_PRECONDITION (no device), INVALID_ARGUMENT (bad options, an ordinal not visible),
// RESOURCE_EXHAUSTED / INTERNAL / UNAVAILABLE (injected) from the only or every worker. `observer`
// (may be null) receives stage times, kernel traffic, memory use and each GPU's copy rate (measured
// once here with a 256 MiB device-to-device copy); it must outlive the backend's calls.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options,
                                                         BackendObserver* observer = nullptr);

}  // namespace dequantd
