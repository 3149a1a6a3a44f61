// ResidentModel (see resident_model.h).
#include "server/cuda/resident_model.h"

#include "kernels/cuda/cuda_status.h"
#include "server/cuda/packed_upload.h"

namespace dequantd::cuda {

absl::Status ResidentModel::Upload(const Checkpoint& checkpoint, cudaStream_t stream,
                                   const std::vector<bool>& keep) {
  layers_.clear();
  by_name_.clear();
  bytes_ = 0;
  for (size_t i = 0; i < checkpoint.layers().size(); ++i) {
    const QuantizedLayer& layer = checkpoint.layers()[i];
    if (!keep.empty() && !keep[i]) {
      layers_.push_back(Layer{.memory = {}, .view = PackedTensorView{}, .name = layer.name});
      continue;
    }
    const PackedLayout layout(layer.view.shape);
    absl::StatusOr<UniqueDeviceMemory> memory = MakeDeviceMemory(layout.total_bytes);
    if (!memory.ok()) return memory.status();
    absl::StatusOr<PackedTensorView> view =
        CopyPackedToDevice(layer.view, static_cast<uint8_t*>(memory->get()), stream);
    if (!view.ok()) return view.status();
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    by_name_[layer.name] = static_cast<LayerId>(layers_.size());
    layers_.push_back(Layer{.memory = std::move(*memory), .view = *view, .name = layer.name});
    bytes_ += layout.total_bytes;
  }
  return absl::OkStatus();
}

std::optional<ResidentModel::LayerId> ResidentModel::Find(const QuantizedLayer& layer) const {
  LayerId id = -1;
  if (layer.index >= 0 && layer.index < size() &&
      layers_[static_cast<size_t>(layer.index)].name == layer.name) {
    if (layers_[static_cast<size_t>(layer.index)].memory == nullptr) return std::nullopt;
    id = layer.index;
  } else {
    auto it = by_name_.find(layer.name);
    if (it == by_name_.end()) return std::nullopt;
    id = it->second;
  }
  const AwqShape& resident = view(id).shape;
  const AwqShape& asked = layer.view.shape;
  if (resident.K != asked.K || resident.N != asked.N || resident.group_size != asked.group_size ||
      resident.scale_dtype != asked.scale_dtype) {
    return std::nullopt;
  }
  return id;
}

}  // namespace dequantd::cuda
