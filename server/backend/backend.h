// The dequantization backends the service runs on: the CPU (kernels/dequant.h DequantizeCpu) and,
// when built with CUDA, one worker per GPU with the model's packed weights resident in device
// memory. The service talks to a Backend only through this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/dequant.h"
#include "server/backend/backend_observer.h"
#include "server/model/checkpoint.h"
#if DEQUANTD_HAVE_CUDA
#include "server/backend/cuda/cuda_backend.h"
#endif

namespace dequantd {

// One device a backend computes on (a GPU, or the host CPU for the CPU backend).
struct DeviceDescription {
  int index = 0;
  std::string name;                // e.g. "NVIDIA H200", or the CPU model name
  std::string compute_capability;  // e.g. "9.0"; empty for the CPU
  int64_t memory_bytes = 0;        // total device memory (host RAM for the CPU), bytes
  std::string driver_version;      // e.g. "13.0"; empty for the CPU
  // Several GPUs (CUDA; the CPU backend fills label "cpu", serving true, the rest 0/empty).
  std::string label;            // the metrics' device label, e.g. "cuda:1" (device_placement.h)
  bool serving = true;          // false once taken out of rotation (failed at start or later)
  std::string failure;          // why it was taken out; empty while serving
  int64_t resident_layers = 0;  // layers of the model whose packed weights it holds
  int64_t resident_bytes = 0;   // their bytes
  int64_t in_flight = 0;        // calls on it now (in a slot or waiting for one)
};

struct BackendInfo {
  std::string name;  // "cpu" or "cuda"
  std::vector<DeviceDescription> devices;
  int cpu_threads = 0;  // threads of the CPU path (0 when the backend does not use it)
};

// What to dequantize: a layer of the prepared checkpoint (resident where the backend keeps
// layers resident), or packed tensors in host memory (e.g. sent inline with a request).
struct DequantSource {
  const QuantizedLayer* layer = nullptr;  // a layer of the checkpoint given to Prepare, or null
  QuantView host;                         // used when layer is null: host pointers, 4-byte aligned
  // The result's layout (the service sets the request's, or the format's own); it replaces the
  // orientation of the layer's or host view's shape.
  Orientation orientation = Orientation::kKN;

  // The layer's (or host) view with `orientation`: what the backend dequantizes.
  QuantView view() const {
    QuantView v = layer != nullptr ? layer->view : host;
    v.shape.orientation = orientation;
    return v;
  }
  QuantShape shape() const { return view().shape; }
};

// A memory destination a result is written into directly instead of being handed to Write: a
// host shared-memory region the client registered (mapped, pinned for DMA when possible) or a
// client's device buffer opened with CUDA IPC. Owned by the sink; valid for the whole call.
struct ResultDestination {
  enum class Memory { kHost, kDevice };
  Memory memory = Memory::kHost;
  uint8_t* data = nullptr;  // where the first byte the call produces goes (the range's start)
  int64_t bytes = 0;        // capacity in bytes; the sink's creator checked it against the result
  bool pinned = false;  // kHost: registered with cudaHostRegister (device-to-host DMA lands here)
  int device = -1;      // kDevice: the CUDA device index that owns `data`
};

// Receives the result of one Dequantize call, in order. Called on the thread that called
// Dequantize. A sink is where a result goes (a gRPC stream, a host region, a device buffer): a new
// destination is a new sink, never a new path through a backend.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  // Non-null when the result goes straight into memory: the backend then writes byte `offset` of
  // the result to destination()->data + (offset - first offset of the call) itself (the CPU path
  // computes into it; CUDA copies device-to-host into it, or launches the kernel into it for
  // kDevice), and still calls Begin and Write in order, with `bytes` pointing at the bytes it
  // placed there (device memory for kDevice: the sink must not read them). Write is then only a
  // progress report, consecutive but of any size (not chunk_bytes: the CUDA backend reports each
  // placed piece once, a whole result when the kernel wrote it). For kDevice a report may come
  // while the kernel still writes (in stream order before the call returns): Dequantize's
  // return, not Write, means the bytes are there. Null (the default): the bytes arrive through
  // Write.
  virtual const ResultDestination* destination() const { return nullptr; }
  // The bytes of the result this sink wants: [offset, offset + length) of the row-major (K, N)
  // result, already validated against the result's size by whoever made the sink (the service
  // edge). The backend produces only those bytes (Write offsets stay result offsets, starting at
  // `offset`); length -1 (the default) means to the end of the result.
  struct Range {
    int64_t offset = 0;
    int64_t length = -1;
  };
  virtual Range range() const { return {}; }
  // Called once, before the first Write, with the kernel that computes the result, e.g.
  // "v4_vec16 block=256,words=4,rows=2" or "cpu threads=16". A non-OK return stops the work.
  virtual absl::Status Begin(const std::string& kernel) = 0;
  // Bytes [offset, offset + bytes.size()) of the row-major (K, N) result. Chunks are consecutive,
  // each `chunk_bytes` long except the last; boundaries need not fall on rows. `bytes` is valid
  // only during the call. A non-OK return (e.g. the client cancelled) stops the work and is
  // returned by Dequantize.
  virtual absl::Status Write(int64_t offset, absl::Span<const uint8_t> bytes) = 0;
  // Write, for bytes that stay valid as long as any copy of `keepalive` (non-null) lives: the sink
  // may keep a copy and read the bytes after it returns (the gRPC sink sends them without copying
  // and drops its copy when gRPC releases the message). The caller must not change the bytes
  // while the keepalive lives; the CUDA backend's keepalive is its pinned staging block, which
  // goes back to its pool with the last copy (server/backend/block_pool.h). Same contract as Write
  // otherwise; this default ignores the keepalive and calls Write. Sinks that forward to another
  // sink forward this too, keepalive included.
  virtual absl::Status WriteShared(int64_t offset, absl::Span<const uint8_t> bytes,
                                   std::shared_ptr<const void> keepalive) {
    (void)keepalive;
    return Write(offset, bytes);
  }
};

// Receives the result of one DequantizeLayers call, in order: Begin(kernel) once, then for each
// layer of the request, BeginLayer(index) followed by that layer's chunks through Write, whose
// offsets restart at 0 for each layer (the ChunkSink contract, one layer at a time). Called on
// the thread that called DequantizeLayers. A LayersSink's destination() holds the whole call's
// results one after another in request order (layer i starts after the bytes of layers 0..i-1);
// Write offsets still restart at 0 per layer.
class LayersSink : public ChunkSink {
 public:
  // Before the chunks of layer `index` (an index into the request's layer list, ascending).
  // A non-OK return stops the work.
  virtual absl::Status BeginLayer(int64_t index) = 0;
};

// Thread-safety: Prepare is called once, before any other call; after it, Info, IsResident and
// Dequantize may be called from many threads at once. Info is live (serving, in_flight).
class Backend {
 public:
  virtual ~Backend() = default;

  virtual BackendInfo Info() const = 0;

  // Makes the checkpoint's layers resident (uploads the packed weights to every GPU; a no-op on
  // the CPU). `checkpoint` must outlive the backend. Errors: RESOURCE_EXHAUSTED (device memory),
  // INTERNAL (device failure).
  virtual absl::Status Prepare(const Checkpoint& checkpoint) = 0;

  // Where the last Prepare's time went, for the "loaded N layers" log line (e.g. the CUDA
  // upload's device allocation, pinned staging and per-thread read and copy waits); "" when there
  // is nothing to say. Called after Prepare, from the thread that called it.
  virtual std::string DescribeLoad() const { return ""; }

  // Whether `layer`'s packed weights are held in device memory.
  virtual bool IsResident(const QuantizedLayer& layer) const = 0;

  // Dequantizes `source` into `out_dtype` (fp16, bf16 or fp32) and streams the K * N *
  // sizeof(out_dtype) bytes of the result, row-major in source.orientation, to `sink` in chunks
  // of `chunk_bytes` (>= 1).
  // Errors: INVALID_ARGUMENT (ValidateShape, a layer never prepared, chunk_bytes < 1), the sink's
  // error, RESOURCE_EXHAUSTED / INTERNAL from the device.
  virtual absl::Status Dequantize(const DequantSource& source, DType out_dtype, int64_t chunk_bytes,
                                  ChunkSink& sink) = 0;

  // Dequantizes prepared `layers` (duplicates allowed) into `out_dtype`, each result row-major in
  // `orientation`, and streams them to `sink` in request order, each as Dequantize would, in
  // chunks of `chunk_bytes` (>= 1). The CUDA backend runs them in one grouped kernel launch into
  // one device buffer (layers the grouped launch does not implement, e.g. (N, K) results or
  // other formats, one launch each); this default (the CPU backend's) runs Dequantize layer by
  // layer and reports the first layer's kernel.
  // Errors: Dequantize's; INVALID_ARGUMENT for a null layer; RESOURCE_EXHAUSTED when the
  // layers' results do not fit the device's memory at once (CUDA).
  virtual absl::Status DequantizeLayers(absl::Span<const QuantizedLayer* const> layers,
                                        DType out_dtype, Orientation orientation,
                                        int64_t chunk_bytes, LayersSink& sink);
};

// The CPU backend: DequantizeCpu with `threads` threads (0 = hardware concurrency), computed in
// row blocks and streamed as it goes. `observer` (may be null) must outlive the backend's calls.
std::unique_ptr<Backend> MakeCpuBackend(int threads, BackendObserver* observer = nullptr);

struct BackendOptions {
  std::string kind = "auto";  // "auto" (cuda when built with CUDA and a GPU exists), "cpu", "cuda"
  int cpu_threads = 0;        // CPU backend threads; 0 = hardware concurrency
  BackendObserver* observer = nullptr;  // stage times, kernel traffic, memory (e.g. Metrics)
#if DEQUANTD_HAVE_CUDA
  CudaBackendOptions cuda;  // kernel variant, launch-config provider (autotuner seam), buffers
#endif
};

// Picks and creates the backend. Errors: INVALID_ARGUMENT (unknown kind), FAILED_PRECONDITION
// ("cuda" requested in a build without CUDA or on a machine without a GPU), the CUDA backend's.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

}  // namespace dequantd
