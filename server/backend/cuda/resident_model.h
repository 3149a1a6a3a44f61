// The checkpoint's packed layers held in one GPU's memory, each under a stable id: its index in
// Checkpoint::layers() (checkpoint order). Requests name layers by QuantizedLayer; Find maps one
// to its id by name and shape, so identity does not hang on a pointer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "server/backend/cuda/cuda_objects.h"
#include "server/backend/cuda/shard_upload.h"
#include "server/model/checkpoint.h"

namespace dequantd::cuda {

// Written once by Upload (before any request), read-only after: thread-safe for readers.
class ResidentModel {
 public:
  using LayerId = int64_t;

  // Uploads the layers of `checkpoint` to the current device (synchronously), replacing what was
  // resident: every layer when `keep` is empty, else layer i when keep[i] (one flag per
  // checkpoint layer; the placement of several GPUs). A layer with a host copy is copied from it
  // through `stream`; the others straight from the checkpoint's files (shard_upload.h, with
  // `load`; their pinned staging is allocated beside the device memory). `profile` (may be null)
  // gets where the time went (device_alloc_seconds includes the copies from host copies).
  // Errors: RESOURCE_EXHAUSTED (device memory, pinned staging), UploadFromShards', INTERNAL.
  absl::Status Upload(const Checkpoint& checkpoint, cudaStream_t stream,
                      const std::vector<bool>& keep = {}, const ShardUploadOptions& load = {},
                      ShardUploadProfile* profile = nullptr);

  // `layer`'s id when a layer of that name and shape is resident (LayerPositions::Find).
  std::optional<LayerId> Find(const QuantizedLayer& layer) const;
  // `layer`'s position in the uploaded checkpoint, resident here or not (LayerPositions::Find).
  std::optional<LayerId> Position(const QuantizedLayer& layer) const {
    return positions_.Find(layer);
  }
  // Device pointers of layer `id` (0 <= id < size()).
  const QuantView& view(LayerId id) const { return layers_[static_cast<size_t>(id)].view; }
  int64_t size() const { return static_cast<int64_t>(layers_.size()); }  // checkpoint layers
  int64_t resident_layers() const { return resident_layers_; }
  int64_t bytes() const { return bytes_; }  // device memory held, bytes

 private:
  // Device memory is cut in blocks of up to 2 GiB, each one cudaMalloc holding consecutive
  // layers (server/model/device_blocks.h), each layer 256-byte aligned.
  static constexpr int64_t kDeviceBlockBytes = int64_t{2} << 30;
  static constexpr int64_t kDeviceBlockAlign = 256;

  void Clear();  // no layer held, no device memory

  struct Layer {
    bool held = false;  // its stored tensors are in blocks_ (in role order, PackedLayout)
    QuantView view;     // device pointers into blocks_ when held
  };
  std::vector<UniqueDeviceMemory> blocks_;  // the layers' device memory
  std::vector<Layer> layers_;               // by id
  LayerPositions positions_;                // ids of the uploaded checkpoint's layers
  int64_t resident_layers_ = 0;             // layers held here
  int64_t bytes_ = 0;
};

}  // namespace dequantd::cuda
