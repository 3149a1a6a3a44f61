// ResidentModel (see resident_model.h).
#include "server/backend/cuda/resident_model.h"

#include <chrono>
#include <future>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "kernels/cuda/cuda_status.h"
#include "server/backend/cuda/packed_upload.h"
#include "server/model/device_blocks.h"

namespace dequantd::cuda {

absl::Status ResidentModel::Upload(const Checkpoint& checkpoint, cudaStream_t stream,
                                   const std::vector<bool>& keep, const ShardUploadOptions& load,
                                   ShardUploadProfile* profile) {
  using Clock = std::chrono::steady_clock;
  const std::vector<QuantizedLayer>& layers = checkpoint.layers();
  Clear();
  positions_.Assign(layers);
  // Nothing half-uploaded is served: every error below leaves no layer held.
  absl::Cleanup clear_on_error = [this] { Clear(); };
  const auto held = [&](size_t i) { return keep.empty() || keep[i]; };
  // The pinned staging of the reads from the files is allocated on a thread of its own while the
  // layers' device memory is allocated here: both are driver calls of tens of milliseconds.
  std::future<absl::StatusOr<LoadStaging>> staging;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (held(i) && layers[i].view.tensors[0] == nullptr) {
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
  std::vector<int64_t> sizes(layers.size(), 0);
  for (size_t i = 0; i < layers.size(); ++i) {
    if (held(i)) sizes[i] = PackedLayout(layers[i].view.shape).total_bytes;
  }
  const DeviceBlockPlan plan = PlanDeviceBlocks(sizes, kDeviceBlockBytes, kDeviceBlockAlign);
  for (int64_t bytes : plan.block_bytes) {
    absl::StatusOr<UniqueDeviceMemory> block = MakeDeviceMemory(bytes);
    if (!block.ok()) return block.status();
    blocks_.push_back(*std::move(block));
  }
  std::vector<int64_t> from_files;  // layers without a host copy: read from the shards
  std::vector<uint8_t*> from_files_bases;
  layers_.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!held(i)) continue;
    const QuantizedLayer& layer = layers[i];
    uint8_t* base =
        static_cast<uint8_t*>(blocks_[static_cast<size_t>(plan.block[i])].get()) + plan.offset[i];
    const PackedLayout layout(layer.view.shape);
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
    layers_[i] = Layer{.held = true, .view = view};
    ++resident_layers_;
    bytes_ += layout.total_bytes;
  }
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const Clock::time_point allocated = Clock::now();
  if (!staging.valid()) {  // every layer kept here had a host copy
    std::move(clear_on_error).Cancel();
    return absl::OkStatus();
  }
  absl::StatusOr<LoadStaging> staged = staging.get();
  ShardUploadProfile times;
  times.device_blocks = static_cast<int64_t>(blocks_.size());
  times.device_alloc_seconds = std::chrono::duration<double>(allocated - alloc_start).count();
  times.pin_wait_seconds = std::chrono::duration<double>(Clock::now() - allocated).count();
  absl::Status s = staged.ok() ? UploadFromShards(checkpoint, from_files, from_files_bases, *staged,
                                                  load, &times)
                               : staged.status();
  if (profile != nullptr) *profile = times;
  if (!s.ok()) return s;
  std::move(clear_on_error).Cancel();
  return absl::OkStatus();
}

void ResidentModel::Clear() {
  layers_.clear();
  blocks_.clear();
  resident_layers_ = 0;
  bytes_ = 0;
}

std::optional<ResidentModel::LayerId> ResidentModel::Find(const QuantizedLayer& layer) const {
  const std::optional<LayerId> found = positions_.Find(layer);
  // (An upload that failed part way holds fewer layers than the checkpoint has.)
  if (!found.has_value() || *found >= size() || !layers_[static_cast<size_t>(*found)].held) {
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
