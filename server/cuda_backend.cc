// The CUDA backend (see cuda_backend.h): the Backend interface over one DeviceWorker per GPU.
// A worker owns its parts (server/cuda/): the resident model, the request slots, the device
// buffer cache and the one result pipeline; Dequantize and DequantizeLayers only describe their
// work (a ResultJob and how to launch a slab of it) and hand it to the pipeline.
#include "server/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "server/backend.h"
#include "server/backend_observer.h"
#include "server/cuda/copy_bandwidth.h"
#include "server/cuda/device_buffer_cache.h"
#include "server/cuda/request_slot.h"
#include "server/cuda/resident_model.h"
#include "server/cuda/result_pipeline.h"
#include "server/lease_pool.h"

namespace dequantd {
namespace {

std::string DriverVersionString() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) return "";
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

// One GPU. Members are destroyed in reverse order: the pipeline, the slots (streams, pinned
// buffers, events), the buffer cache, the resident model; none reports to the observer then.
class DeviceWorker {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceWorker>> Create(int device,
                                                              const CudaBackendOptions& options,
                                                              BackendObserver* observer) {
    auto worker = std::unique_ptr<DeviceWorker>(new DeviceWorker(device, options, observer));
    if (absl::Status s = worker->Init(); !s.ok()) return s;
    return worker;
  }
  ~DeviceWorker() { cudaSetDevice(device_); }

  const DeviceDescription& description() const { return description_; }

  // Uploads every layer of `checkpoint` (synchronously) and keeps it resident.
  absl::Status Upload(const Checkpoint& checkpoint) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (absl::Status s = model_.Upload(checkpoint, slots_->front().stream.get()); !s.ok()) {
      return s;
    }
    if (observer_ != nullptr) {
      observer_->SetDeviceMemoryUsed(label_, DeviceMemoryKind::kResidentWeights, model_.bytes());
    }
    return absl::OkStatus();
  }

  bool IsResident(const QuantizedLayer& layer) const { return model_.Find(layer).has_value(); }

  absl::Status Dequantize(const DequantSource& source, DType out_dtype, int64_t chunk_bytes,
                          ChunkSink& sink) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const AwqShape& shape = source.shape();
    cuda::ResultJob job;
    job.out_dtype = out_dtype;
    job.variant = cuda::VariantName(options_.variant);
    job.entries.push_back({.in = {}, .result = 0, .result_bytes = shape.output_bytes(out_dtype)});
    if (source.layer != nullptr) {
      absl::StatusOr<cuda::ResidentModel::LayerId> id = Resident(*source.layer);
      if (!id.ok()) return id.status();
      job.entries.front().in = model_.view(*id);
    } else {
      job.host_input = &source.host;
    }
    const cuda::SlabLauncher launch = [this](absl::Span<const cuda::GroupedItem> items, DType dtype,
                                             cudaStream_t stream) -> absl::StatusOr<std::string> {
      const cuda::GroupedItem& item = items.front();  // one result: one slab of one item
      cuda::LaunchConfig config = cuda::DefaultConfig(options_.variant, item.in.shape, dtype);
      if (options_.launch_config) {
        absl::StatusOr<cuda::LaunchConfig> chosen =
            options_.launch_config(LaunchQuery{.device = device_,
                                               .variant = options_.variant,
                                               .in = item.in,
                                               .out_dtype = dtype,
                                               .out = item.out,
                                               .stream = stream});
        if (!chosen.ok()) return chosen.status();
        config = *chosen;
      }
      if (absl::Status s =
              cuda::LaunchDequantize(options_.variant, config, item.in, dtype, item.out, stream);
          !s.ok()) {
        return s;
      }
      return std::string(cuda::VariantName(options_.variant)) + " " + config.ToString();
    };
    return pipeline_->Run(job, launch, chunk_bytes, sink, /*layers=*/nullptr);
  }

  // The resident `layers` (non-empty, duplicates allowed), grouped launches slab by slab.
  absl::Status DequantizeLayers(absl::Span<const QuantizedLayer* const> layers, DType out_dtype,
                                int64_t chunk_bytes, LayersSink& sink) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cuda::ResultJob job;
    job.out_dtype = out_dtype;
    job.variant = "grouped";
    std::unordered_set<cuda::ResidentModel::LayerId> distinct;
    for (const QuantizedLayer* layer : layers) {
      absl::StatusOr<cuda::ResidentModel::LayerId> id = Resident(*layer);
      if (!id.ok()) return id.status();
      distinct.insert(*id);
      job.entries.push_back({.in = model_.view(*id),
                             .result = *id,
                             .result_bytes = layer->view.shape.output_bytes(out_dtype)});
    }
    // Each slab's descriptor table is uploaded synchronously (GroupedPlan) and kept until the call
    // returns (after the pipeline drained the stream). Programmatic dependent launch is off here:
    // slab launches sit between device -> host copies on the stream, not after another kernel.
    cuda::GroupedOptions grouped = options_.grouped;
    grouped.programmatic_launch = false;
    const std::string kernel =
        absl::StrCat("grouped block=", grouped.block_size, ",rows=", grouped.rows_per_thread,
                     ",units=", grouped.units_per_thread, " layers=", distinct.size());
    std::vector<cuda::GroupedPlan> plans;
    const cuda::SlabLauncher launch = [&](absl::Span<const cuda::GroupedItem> items, DType dtype,
                                          cudaStream_t stream) -> absl::StatusOr<std::string> {
      absl::StatusOr<cuda::GroupedPlan> plan = cuda::GroupedPlan::Create(items, dtype, grouped);
      if (!plan.ok()) return plan.status();
      plans.push_back(std::move(*plan));
      if (absl::Status s = plans.back().Launch(stream); !s.ok()) return s;
      return kernel;
    };
    return pipeline_->Run(job, launch, chunk_bytes, sink, &sink);
  }

 private:
  DeviceWorker(int device, const CudaBackendOptions& options, BackendObserver* observer)
      : device_(device),
        options_(options),
        observer_(observer),
        label_(DeviceLabel("cuda", device)),
        cache_(device, options.buffer_cache_bytes, observer, label_) {}

  // INVALID_ARGUMENT naming the layer when it is not resident here.
  absl::StatusOr<cuda::ResidentModel::LayerId> Resident(const QuantizedLayer& layer) const {
    std::optional<cuda::ResidentModel::LayerId> id = model_.Find(layer);
    if (!id.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer \"", layer.name, "\" is not resident on device ", device_));
    }
    return *id;
  }

  absl::Status Init() {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaDeviceProp prop;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
    description_.index = device_;
    description_.name = prop.name;
    description_.compute_capability = absl::StrCat(prop.major, ".", prop.minor);
    description_.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    description_.driver_version = DriverVersionString();

    std::vector<std::unique_ptr<cuda::RequestSlot>> slots;
    for (int i = 0; i < options_.slots_per_device; ++i) {
      absl::StatusOr<std::unique_ptr<cuda::RequestSlot>> slot =
          cuda::RequestSlot::Create(options_.staging_bytes, /*timing=*/observer_ != nullptr);
      if (!slot.ok()) return slot.status();
      slots.push_back(std::move(*slot));
    }
    slots_ = std::make_unique<LeasePool<cuda::RequestSlot>>(std::move(slots));
    pipeline_ = std::make_unique<cuda::ResultPipeline>(
        cuda::PipelineOptions{.device = device_, .slab_bytes = options_.result_slab_bytes}, *slots_,
        cache_, observer_, label_);
    if (observer_ != nullptr) {
      absl::StatusOr<double> copy_rate = cuda::MeasureCopyBandwidth(slots_->front().stream.get());
      if (!copy_rate.ok()) return copy_rate.status();
      if (*copy_rate > 0) observer_->SetDeviceCopyBandwidth(label_, *copy_rate);
      observer_->SetDeviceMemoryUsed(label_, DeviceMemoryKind::kResidentWeights, 0);
      observer_->SetDeviceMemoryUsed(label_, DeviceMemoryKind::kBuffers, 0);
    }
    return absl::OkStatus();
  }

  const int device_;
  const CudaBackendOptions options_;
  BackendObserver* const observer_;  // may be null
  const std::string label_;          // "cuda:<device>", the metrics' device label
  DeviceDescription description_;
  cuda::ResidentModel model_;  // written only in Upload (before requests)
  cuda::DeviceBufferCache cache_;
  std::unique_ptr<LeasePool<cuda::RequestSlot>> slots_;
  std::unique_ptr<cuda::ResultPipeline> pipeline_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(std::vector<std::unique_ptr<DeviceWorker>> workers)
      : workers_(std::move(workers)) {}

  BackendInfo Info() const override {
    BackendInfo info{.name = "cuda", .devices = {}, .cpu_threads = 0};
    for (const auto& worker : workers_) info.devices.push_back(worker->description());
    return info;
  }

  absl::Status Prepare(const Checkpoint& checkpoint) override {
    for (const auto& worker : workers_) {
      if (absl::Status s = worker->Upload(checkpoint); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  bool IsResident(const QuantizedLayer& layer) const override {
    return workers_.front()->IsResident(layer);
  }

  absl::Status Dequantize(const DequantSource& source, DType out_dtype, int64_t chunk_bytes,
                          ChunkSink& sink) override {
    if (absl::Status s = ValidateShape(source.shape(), out_dtype); !s.ok()) return s;
    if (absl::Status s = CheckChunkBytes(chunk_bytes); !s.ok()) return s;
    if (source.layer == nullptr &&
        (source.host.qweight == nullptr || source.host.qzeros == nullptr ||
         source.host.scales == nullptr)) {
      return absl::InvalidArgumentError("qweight, qzeros and scales must not be null");
    }
    return NextWorker().Dequantize(source, out_dtype, chunk_bytes, sink);
  }

  absl::Status DequantizeLayers(absl::Span<const QuantizedLayer* const> layers, DType out_dtype,
                                int64_t chunk_bytes, LayersSink& sink) override {
    if (absl::Status s = CheckChunkBytes(chunk_bytes); !s.ok()) return s;
    for (size_t i = 0; i < layers.size(); ++i) {
      if (layers[i] == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", i, " is null"));
      }
      if (absl::Status s = ValidateShape(layers[i]->view.shape, out_dtype); !s.ok()) return s;
    }
    if (layers.empty()) return absl::OkStatus();
    return NextWorker().DequantizeLayers(layers, out_dtype, chunk_bytes, sink);
  }

 private:
  static absl::Status CheckChunkBytes(int64_t chunk_bytes) {
    if (chunk_bytes >= 1) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("chunk_bytes must be >= 1, got ", chunk_bytes));
  }
  // Round robin over the GPUs; each worker queues requests beyond its slots.
  DeviceWorker& NextWorker() {
    return *workers_[next_.fetch_add(1, std::memory_order_relaxed) % workers_.size()];
  }

  std::vector<std::unique_ptr<DeviceWorker>> workers_;  // one per GPU, non-empty
  std::atomic<size_t> next_{0};
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls do not see it
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options,
                                                         BackendObserver* observer) {
  if (options.slots_per_device < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots_per_device must be >= 1, got ", options.slots_per_device));
  }
  if (options.staging_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_bytes must be >= 1, got ", options.staging_bytes));
  }
  if (options.result_slab_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("result_slab_bytes must be >= 1, got ", options.result_slab_bytes));
  }
  const int count = CudaDeviceCount();
  if (count == 0) return absl::FailedPreconditionError("no CUDA device is available");
  std::vector<std::unique_ptr<DeviceWorker>> workers;
  for (int device = 0; device < count; ++device) {
    absl::StatusOr<std::unique_ptr<DeviceWorker>> worker =
        DeviceWorker::Create(device, options, observer);
    if (!worker.ok()) return worker.status();
    workers.push_back(std::move(*worker));
  }
  return std::make_unique<CudaBackend>(std::move(workers));
}

}  // namespace dequantd
