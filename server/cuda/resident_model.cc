// ResidentModel (see resident_model.h).
#include "server/cuda/resident_model.h"

#include "kernels/cuda/cuda_status.h"
#include "server/cuda/packed_upload.h"

namespace dequantd::cuda {

absl::Status ResidentModel::Upload(const Checkpoint& checkpoint, cudaStream_t stream,
                                   const std::vector<bool>& keep) {
  layers_.clear();
  positions_.Assign(checkpoint.layers());
  resident_layers_ = 0;
  bytes_ = 0;
  for (size_t i = 0; i < checkpoint.layers().size(); ++i) {
    const QuantizedLayer& layer = checkpoint.layers()[i];
    if (!keep.empty() && !keep[i]) {
      layers_.push_back(Layer{.memory = {}, .view = QuantView{}});
      continue;
    }
    const PackedLayout layout(layer.view.shape);
    absl::StatusOr<UniqueDeviceMemory> memory = MakeDeviceMemory(layout.total_bytes);
    if (!memory.ok()) return memory.status();
    absl::StatusOr<QuantView> view =
        CopyPackedToDevice(layer.view, static_cast<uint8_t*>(memory->get()), stream);
    if (!view.ok()) return view.status();
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    layers_.push_back(Layer{.memory = std::move(*memory), .view = *view});
    ++resident_layers_;
    bytes_ += layout.total_bytes;
  }
  return absl::OkStatus();
}

std::optional<ResidentModel::LayerId> ResidentModel::Find(const QuantizedLayer& layer) const {
  const std::optional<LayerId> found = positions_.Find(layer);
  // (An upload that failed part way holds fewer layers than the checkpoint has.)
  if (!found.has_value() || *found >= size() ||
      layers_[static_cast<size_t>(*found)].memory == nullptr) {
    return std::nullopt;
  }
  const LayerId id = *found;
  const QuantShape& resident = view(id).shape;
  const QuantShape& asked = layer.view.shape;
  if (resident.K != asked.K || resident.N != asked.N || resident.group_size != asked.group_size ||
      resident.scale_dtype != asked.scale_dtype) {
    return std::nullopt;
  }
  return id;
}

}  // namespace dequantd::cuda
