// The CUDA backend's one result pipeline, used by Dequantize and DequantizeLayers alike:
//
//   slot (queue) -> [inline input: host -> device] -> kernel / grouped launch per slab
//        -> device -> host in pieces into the slot's pinned staging blocks ->
//        ChunkSink::WriteShared
//           (the block as keepalive: the gRPC stream sends from it, no host copy), or straight
//           into the sink's destination memory -> ChunkSink::Write (a progress report)
//
// Results are computed in slabs of bounded device memory (result_slabs.h): at most two slab
// buffers per call, each max(slab_bytes, largest single result) bytes; slab s + 1 is computed
// while slab s is copied and sent. Staged inputs (inline, or layers no GPU holds) are copied to
// one input buffer per call of at most max(slab_bytes, largest staged input) bytes, slab by slab
// (a slab's staged inputs stay within slab_bytes), so no call holds a model's worth of inputs. A
// sink with a kDevice destination on this device gets the kernel's output written into it directly
// (no buffer, no copy) when it wants whole results.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/cuda/grouped_dequant.h"
#include "server/backend/backend.h"
#include "server/backend/cuda/device_buffer_cache.h"
#include "server/backend/cuda/request_slot.h"
#include "server/backend/lease_pool.h"
#include "server/backend/ordered_layers.h"

namespace dequantd::cuda {

// One call's work: the results to deliver, in sink order.
struct ResultJob {
  struct Entry {
    // Device pointers of a resident layer; for a staged entry set by the pipeline when it stages.
    QuantView in;
    // Staged entry (an inline input, a layer no GPU holds): host pointers of its packed input,
    // copied into the call's input buffer through the slot's pinned upload buffers
    // (host_staging.h) right before the launch of each slab that computes it; must stay valid
    // during Run.
    bool staged = false;
    QuantView host;
    int64_t result = 0;        // equal values: the same result (computed once per slab)
    int64_t result_bytes = 0;  // K * N * sizeof(out_dtype)
  };
  std::vector<Entry> entries;
  DType out_dtype = DType::kF16;
  std::string_view variant;  // the observer's kernel variant label, e.g. "v4_vec16", "grouped"
};

// One slab's launch, as the pipeline asks for it.
struct SlabLaunch {
  absl::Span<const GroupedItem> items;  // device `in` -> device `out`, one per distinct result
  DType out_dtype = DType::kF16;
  cudaStream_t stream = nullptr;
  // The outputs are the sink's destination memory itself (the same addresses when the call is
  // repeated), not the call's slab buffers.
  bool into_destination = false;
  // To be recorded on `stream` right before the kernel(s), after any host-side preparation
  // (launch configuration, layout, plan): the kernel time is from it to the pipeline's end event.
  cudaEvent_t started = nullptr;
};

// Enqueues on launch.stream `started` and then the kernel(s) computing every item of one slab,
// and returns the kernel's description for ChunkSink::Begin. Its error fails the call (before
// Begin when it is the first slab's).
using SlabLauncher = std::function<absl::StatusOr<std::string>(const SlabLaunch& launch)>;

struct PipelineOptions {
  int device = 0;
  int64_t slab_bytes = int64_t{256} << 20;  // result bytes computed per launch (bound above)
  int64_t destination_piece_bytes = int64_t{64} << 20;  // copy piece into destination memory
  // How long a call waits for one of its slot's staging blocks to come back from the transport
  // (CudaBackendOptions::staging_wait_seconds); then DEADLINE_EXCEEDED.
  double staging_wait_seconds = 120.0;
};

// Thread-safe (each call runs on its own slot).
class ResultPipeline {
 public:
  // All references must outlive the pipeline; `observer` may be null.
  ResultPipeline(const PipelineOptions& options, LeasePool<RequestSlot>& slots,
                 DeviceBufferCache& buffers, BackendObserver* observer, std::string label)
      : options_(options),
        slots_(slots),
        buffers_(buffers),
        observer_(observer),
        label_(std::move(label)),
        slot_name_(absl::StrCat("request slot of ", label_)) {}

  // Computes `job` and delivers it to `sink` in `chunk_bytes` chunks (>= 1): for a `layers` sink
  // (DequantizeLayers) BeginLayer(i) precedes entry i's bytes and every entry is whole; otherwise
  // the single entry's sink.range() is delivered. The current device must be options.device.
  // Errors: FAILED_PRECONDITION for a kDevice destination on another device (naming it),
  // INVALID_ARGUMENT for a bad range or a destination too small, the launcher's, the sink's,
  // DEADLINE_EXCEEDED when no staging block came back from the sink within
  // options.staging_wait_seconds, RESOURCE_EXHAUSTED / INTERNAL from CUDA. `turn` (non-null for
  // one part of a DequantizeLayers call cut over several workers, RunOrderedParts): the slot is
  // taken in the call's part order (turn->Wait() before, turn->Took() after), since the part then
  // holds it while its sink calls wait for the parts before it; CANCELLED from turn->Wait().
  absl::Status Run(ResultJob& job, const SlabLauncher& launch, int64_t chunk_bytes, ChunkSink& sink,
                   LayersSink* layers, PartTurn* turn = nullptr);

 private:
  const PipelineOptions options_;
  LeasePool<RequestSlot>& slots_;
  DeviceBufferCache& buffers_;
  BackendObserver* const observer_;
  const std::string label_;
  const std::string slot_name_;  // "request slot of <label>": TakeInTurn's refusal names it
};

}  // namespace dequantd::cuda
