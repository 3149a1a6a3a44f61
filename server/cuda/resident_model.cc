// ResidentModel (see resident_model.h).
#include "server/cuda/resident_model.h"

#include <chrono>
#include <future>
#include <utility>

#include "kernels/cuda/cuda_status.h"
#include "server/cuda/packed_upload.h"

namespace dequantd::cuda {

absl::Status ResidentModel::Upload(const Checkpoint& checkpoint, cudaStream_t stream,
                                   const std::vector<bool>& keep, const ShardUploadOptions& load,
                                   ShardUploadProfile* profile) {
  using Clock = std::chrono::steady_clock;
  layers_.clear();
  positions_.Assign(checkpoint.layers());
  resident_layers_ = 0;
  bytes_ = 0;
  std::vector<int64_t> from_files;  // layers without a host copy: read from the shards
  std::vector<uint8_t*> from_files_bases;
  // The pinned staging of the reads from the files is allocated on a thread of its own while the
  // layers' device memory is allocated here: both are driver calls of tens of milliseconds.
  std::future<absl::StatusOr<LoadStaging>> staging;
  for (size_t i = 0; i < checkpoint.layers().size(); ++i) {
    if ((keep.empty() || keep[i]) && checkpoint.layers()[i].view.tensors[0] == nullptr) {
      int device = 0;
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
      staging = std::async(std::launch::async, [device, &load]() -> absl::StatusOr<LoadStaging> {
        DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
        return AllocateLoadStaging(load);
      });
      break;
    }
  }
  const Clock::time_point alloc_start = Clock::now();
  for (size_t i = 0; i < checkpoint.layers().size(); ++i) {
    const QuantizedLayer& layer = checkpoint.layers()[i];
    if (!keep.empty() && !keep[i]) {
      layers_.push_back(Layer{.memory = {}, .view = QuantView{}});
      continue;
    }
    const PackedLayout layout(layer.view.shape);
    absl::StatusOr<UniqueDeviceMemory> memory = MakeDeviceMemory(layout.total_bytes);
    if (!memory.ok()) return memory.status();
    uint8_t* base = static_cast<uint8_t*>(memory->get());
    QuantView view;
    if (layer.view.tensors[0] != nullptr) {
      absl::StatusOr<QuantView> copied = CopyPackedToDevice(layer.view, base, stream);
      if (!copied.ok()) return copied.status();
      view = *copied;
    } else {
      view.shape = layer.view.shape;
      for (int r = 0; r < TensorRoleCount(view.shape.format); ++r)
        view.tensors[static_cast<size_t>(r)] = base + layout.offsets[static_cast<size_t>(r)];
      from_files.push_back(static_cast<int64_t>(i));
      from_files_bases.push_back(base);
    }
    layers_.push_back(Layer{.memory = std::move(*memory), .view = view});
    ++resident_layers_;
    bytes_ += layout.total_bytes;
  }
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const Clock::time_point allocated = Clock::now();
  if (!staging.valid()) return absl::OkStatus();  // every layer kept here had a host copy
  absl::StatusOr<LoadStaging> staged = staging.get();
  ShardUploadProfile times;
  times.device_alloc_seconds = std::chrono::duration<double>(allocated - alloc_start).count();
  times.pin_wait_seconds = std::chrono::duration<double>(Clock::now() - allocated).count();
  absl::Status s = staged.ok() ? UploadFromShards(checkpoint, from_files, from_files_bases, *staged,
                                                  load, &times)
                               : staged.status();
  if (profile != nullptr) *profile = times;
  if (!s.ok()) {
    layers_.clear();  // nothing half-uploaded is served
    resident_layers_ = 0;
    bytes_ = 0;
    return s;
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
      resident.scale_dtype != asked.scale_dtype || resident.experts != asked.experts) {
    return std::nullopt;
  }
  return id;
}

}  // namespace dequantd::cuda
