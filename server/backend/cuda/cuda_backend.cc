// The CUDA backend (see cuda_backend.h): the Backend interface over one DeviceWorker per GPU.
// A worker owns its parts (server/backend/cuda/): the resident model, the request slots, the device
// buffer cache and the one result pipeline; Dequantize and DequantizeLayers only describe their
// work (a ResultJob and how to launch a slab of it) and hand it to the pipeline. Which worker
// serves a call is decided by the CUDA-free parts: device_placement.h (which layers each holds),
// device_router.h (least loaded, out of rotation, parts of a DequantizeLayers call) and
// ordered_layers.h (parts delivered in order).
#include "server/backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/validate_view.h"
#include "server/backend/backend.h"
#include "server/backend/backend_observer.h"
#include "server/backend/cuda/copy_bandwidth.h"
#include "server/backend/cuda/device_buffer_cache.h"
#include "server/backend/cuda/grouped_plan_cache.h"
#include "server/backend/cuda/packed_upload.h"
#include "server/backend/cuda/request_slot.h"
#include "server/backend/cuda/resident_model.h"
#include "server/backend/cuda/result_pipeline.h"
#include "server/backend/device_router.h"
#include "server/backend/lease_pool.h"
#include "server/backend/ordered_layers.h"

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
  static absl::StatusOr<std::unique_ptr<DeviceWorker>> Create(
      int device, std::string label, const CudaBackendOptions& options, BackendObserver* observer,
      const DeviceFailureInjection& injection) {
    if (injection.at_start) {
      return absl::UnavailableError(absl::StrCat(
          label, ": device unavailable at start (injected by ", kInjectDeviceFailureEnv, ")"));
    }
    auto worker = std::unique_ptr<DeviceWorker>(
        new DeviceWorker(device, std::move(label), options, observer, injection));
    if (absl::Status s = worker->Init(); !s.ok()) return s;
    return worker;
  }
  ~DeviceWorker() { cudaSetDevice(device_); }

  int device() const { return device_; }
  DeviceDescription description() const {
    DeviceDescription d = description_;
    d.resident_layers = model_.resident_layers();
    d.resident_bytes = model_.bytes();
    return d;
  }

  // Free device memory now, bytes.
  absl::StatusOr<int64_t> FreeBytes() const {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    size_t free = 0;
    size_t total = 0;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
    return static_cast<int64_t>(free);
  }

  // OK while the device works; else why not (an injected launch failure, or the sticky error a
  // failed device returns to every call).
  absl::Status Probe() const {
    if (launch_failures_.failed()) {
      return absl::InternalError(
          absl::StrCat("cudaErrorLaunchFailure (injected by ", kInjectDeviceFailureEnv, ")"));
    }
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    size_t free = 0;
    size_t total = 0;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
    return absl::OkStatus();
  }

  // Uploads the layers of `checkpoint` that `keep` selects (all when empty; synchronously) and
  // keeps them resident.
  absl::Status Upload(const Checkpoint& checkpoint, const std::vector<bool>& keep) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (absl::Status s = model_.Upload(checkpoint, slots_->front().stream.get(), keep,
                                       options_.load, &upload_profile_);
        !s.ok()) {
      return s;
    }
    if (observer_ != nullptr) {
      observer_->SetDeviceMemoryUsed(label_, DeviceMemoryKind::kResidentWeights, model_.bytes());
    }
    return absl::OkStatus();
  }

  bool IsResident(const QuantizedLayer& layer) const { return model_.Find(layer).has_value(); }

  // Where the last Upload's time went ("" when nothing was read from the files).
  std::string DescribeUpload() const {
    if (upload_profile_.chunks == 0) return "";
    return absl::StrCat(label_, " ", upload_profile_.Describe());
  }

  absl::Status Dequantize(const DequantSource& source, DType out_dtype, int64_t chunk_bytes,
                          ChunkSink& sink) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const QuantView host = source.view();  // the inline input (host pointers) with its orientation
    const QuantShape& shape = host.shape;
    const cuda::KernelVariant variant = VariantFor(shape.format);
    cuda::ResultJob job;
    job.out_dtype = out_dtype;
    job.variant = cuda::VariantName(variant);
    job.entries.push_back({.in = {},
                           .staged = false,
                           .host = {},
                           .result = 0,
                           .result_bytes = shape.output_bytes(out_dtype)});
    if (absl::Status s = SetInput(source.layer, host, job.entries.front()); !s.ok()) return s;
    const cuda::SlabLauncher launch =
        [this, variant](const cuda::SlabLaunch& slab) -> absl::StatusOr<std::string> {
      if (absl::Status s = InjectedLaunchFailure(); !s.ok()) return s;
      const cuda::GroupedItem& item = slab.items.front();  // one result: one slab of one item
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(slab.started, slab.stream));
      return LaunchOne(variant, item, slab.out_dtype, slab.stream);
    };
    return pipeline_->Run(job, launch, chunk_bytes, sink, /*layers=*/nullptr);
  }

  // The configured variant when `format` implements it, else the format's fastest (e.g. for a
  // format without v4).
  cuda::KernelVariant VariantFor(Format format) const {
    const std::vector<cuda::KernelVariant> offered = cuda::VariantsOf(format);
    if (offered.empty() ||
        std::find(offered.begin(), offered.end(), options_.variant) != offered.end()) {
      return options_.variant;
    }
    return offered.back();
  }

  // One layer's launch with its launch configuration (the provider's, else the default);
  // returns the kernel's description.
  absl::StatusOr<std::string> LaunchOne(cuda::KernelVariant variant, const cuda::GroupedItem& item,
                                        DType dtype, cudaStream_t stream) {
    cuda::LaunchConfig config = cuda::DefaultConfig(variant, item.in.shape, dtype);
    if (options_.launch_config) {
      absl::StatusOr<cuda::LaunchConfig> chosen =
          options_.launch_config(LaunchQuery{.device = device_,
                                             .variant = variant,
                                             .in = item.in,
                                             .out_dtype = dtype,
                                             .out = item.out,
                                             .stream = stream});
      if (!chosen.ok()) return chosen.status();
      config = *chosen;
    }
    if (absl::Status s = cuda::LaunchDequantize(variant, config, item.in, dtype, item.out, stream);
        !s.ok()) {
      return s;
    }
    return std::string(cuda::VariantName(variant)) + " " + config.ToString();
  }

  // `layers` (non-empty, duplicates allowed), resident here or staged from their host copies,
  // grouped launches slab by slab. `turn`: non-null when this is one part of a call cut over
  // several workers (the slot is taken in part order, ResultPipeline::Run).
  absl::Status DequantizeLayers(absl::Span<const QuantizedLayer* const> layers, DType out_dtype,
                                Orientation orientation, int64_t chunk_bytes, LayersSink& sink,
                                PartTurn* turn) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cuda::ResultJob job;
    job.out_dtype = out_dtype;
    job.variant = "grouped";
    job.entries.reserve(layers.size());
    std::vector<cuda::ResidentModel::LayerId> ids;
    ids.reserve(layers.size());
    for (const QuantizedLayer* layer : layers) {
      const std::optional<int64_t> position = model_.Position(*layer);
      if (!position.has_value()) return NotHeld(*layer);
      ids.push_back(*position);
      job.entries.push_back({.in = {},
                             .staged = false,
                             .host = {},
                             .result = *position,
                             .result_bytes = layer->view.shape.output_bytes(out_dtype)});
      QuantView view = layer->view;
      view.shape.orientation = orientation;
      if (absl::Status s = SetInput(layer, view, job.entries.back()); !s.ok()) return s;
    }
    std::sort(ids.begin(), ids.end());
    const auto distinct = std::unique(ids.begin(), ids.end()) - ids.begin();
    // Every launch is a GroupedPlan's: its table comes from the stream-ordered allocator and is
    // uploaded on the call's stream (the pool keeps its memory, see Init). Launches into the
    // destination itself (a device region: the same addresses whenever the call is repeated) go
    // through kept plans (grouped_plan_cache.h), so a repeated whole-model call pays no layout and
    // no upload; slab launches write the call's pooled buffers and build a plan for the one
    // launch. Programmatic dependent launch is off here: slab launches sit between device -> host
    // copies on the stream, not after another kernel.
    cuda::GroupedOptions grouped = options_.grouped;
    grouped.programmatic_launch = false;
    // (N, K) results: the tile kernel's fixed blocks, one tile each (grouped_dequant.h).
    const std::string kernel =
        orientation == Orientation::kNK
            ? absl::StrCat("grouped nk_tiles=1 layers=", distinct)
            : absl::StrCat("grouped block=", grouped.block_size, ",rows=", grouped.rows_per_thread,
                           ",units=", grouped.units_per_thread, " layers=", distinct);
    // Plans launched by this call, held until the pipeline has drained the stream (a plan's table
    // is freed when its last holder lets go).
    std::vector<std::shared_ptr<const cuda::GroupedPlan>> launched;
    const cuda::SlabLauncher launch =
        [&](const cuda::SlabLaunch& slab) -> absl::StatusOr<std::string> {
      if (absl::Status s = InjectedLaunchFailure(); !s.ok()) return s;
      // Layers the grouped launch does not implement (formats other than AWQ): the slab's items
      // one launch each, on the same stream.
      bool grouped_implements = true;
      for (const cuda::GroupedItem& item : slab.items)
        grouped_implements &= cuda::GroupedImplements(item.in.shape);
      if (!grouped_implements) {
        DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(slab.started, slab.stream));
        std::string first;
        for (const cuda::GroupedItem& item : slab.items) {
          absl::StatusOr<std::string> one =
              LaunchOne(VariantFor(item.in.shape.format), item, slab.out_dtype, slab.stream);
          if (!one.ok()) return one.status();
          if (first.empty()) first = *one;
        }
        return absl::StrCat(first, " layers=", distinct);
      }
      absl::StatusOr<std::shared_ptr<const cuda::GroupedPlan>> plan;
      if (slab.into_destination) {
        plan = plans_.Get(slab.items, slab.out_dtype, grouped, slab.stream);
      } else {
        absl::StatusOr<cuda::GroupedPlan> own =
            cuda::GroupedPlan::Create(slab.items, slab.out_dtype, grouped, slab.stream);
        if (!own.ok()) return own.status();
        plan = std::make_shared<const cuda::GroupedPlan>(*std::move(own));
      }
      if (!plan.ok()) return plan.status();
      launched.push_back(*plan);
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(slab.started, slab.stream));
      if (absl::Status s = (*plan)->Launch(slab.stream); !s.ok()) return s;
      return kernel;
    };
    return pipeline_->Run(job, launch, chunk_bytes, sink, &sink, turn);
  }

 private:
  DeviceWorker(int device, std::string label, const CudaBackendOptions& options,
               BackendObserver* observer, const DeviceFailureInjection& injection)
      : device_(device),
        options_(options),
        observer_(observer),
        label_(std::move(label)),
        launch_failures_(injection.launches_before_failure),
        cache_(device, options.buffer_cache_bytes, observer, label_) {}

  // The error of an injected launch failure (failure_injection.h), else OK.
  absl::Status InjectedLaunchFailure() {
    if (!launch_failures_.NextLaunchFails()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("cudaErrorLaunchFailure on ", label_, " (injected by ",
                                            kInjectDeviceFailureEnv, ")"));
  }

  // Where `entry`'s input comes from: `layer`'s resident copy on this device (`view`'s
  // orientation), else `view` itself staged from host memory per call (an inline input when
  // `layer` is null; the host copy of a layer no GPU holds). INVALID_ARGUMENT naming the layer
  // when it is neither resident here nor has a host copy.
  absl::Status SetInput(const QuantizedLayer* layer, const QuantView& view,
                        cuda::ResultJob::Entry& entry) const {
    if (layer != nullptr) {
      if (const std::optional<cuda::ResidentModel::LayerId> id = model_.Find(*layer)) {
        entry.in = model_.view(*id);
        entry.in.shape.orientation = view.shape.orientation;
        return absl::OkStatus();
      }
      if (view.tensors[0] == nullptr) return NotHeld(*layer);
    }
    entry.staged = true;
    entry.host = view;
    return absl::OkStatus();
  }

  absl::Status NotHeld(const QuantizedLayer& layer) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer \"", layer.name, "\" is not resident on device ", label_, " and has no host copy"));
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
    description_.label = label_;
    // The stream-ordered allocator's pool (grouped launches' descriptor tables, a few KB each)
    // keeps up to 64 MiB between calls instead of returning it at every synchronization.
    cudaMemPool_t pool = nullptr;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, device_));
    uint64_t keep_bytes = uint64_t{64} << 20;
    DEQUANTD_CUDA_RETURN_IF_ERROR(
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_bytes));

    StartupTimeline::Phase slots_phase(options_.timeline, absl::StrCat(label_, " request slots"));
    std::vector<std::unique_ptr<cuda::RequestSlot>> slots;
    for (int i = 0; i < options_.slots_per_device; ++i) {
      absl::StatusOr<std::unique_ptr<cuda::RequestSlot>> slot =
          cuda::RequestSlot::Create(options_.staging_bytes, options_.staging_blocks,
                                    /*timing=*/observer_ != nullptr, label_);
      if (!slot.ok()) return slot.status();
      slots.push_back(std::move(*slot));
    }
    slots_ = std::make_unique<LeasePool<cuda::RequestSlot>>(std::move(slots));
    slots_phase.End();
    pipeline_ = std::make_unique<cuda::ResultPipeline>(
        cuda::PipelineOptions{.device = device_,
                              .slab_bytes = options_.result_slab_bytes,
                              .staging_wait_seconds = options_.staging_wait_seconds},
        *slots_, cache_, observer_, label_);
    if (observer_ != nullptr) {
      StartupTimeline::Phase bandwidth_phase(options_.timeline,
                                             absl::StrCat(label_, " copy bandwidth"));
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
  BackendObserver* const observer_;         // may be null
  const std::string label_;                 // "cuda:<device>[.<k>]", the metrics' device label
  LaunchFailureCountdown launch_failures_;  // injected failures (none unless armed)
  DeviceDescription description_;
  cuda::ResidentModel model_;                // written only in Upload (before requests)
  cuda::ShardUploadProfile upload_profile_;  // written only in Upload
  cuda::DeviceBufferCache cache_;
  // Plans of grouped launches straight into destination memory, the 8 most recently used (a
  // whole model's table is ~30 KB of device memory).
  cuda::GroupedPlanCache plans_{8};
  std::unique_ptr<LeasePool<cuda::RequestSlot>> slots_;
  std::unique_ptr<cuda::ResultPipeline> pipeline_;
};

// One --devices entry: its worker, or null when it failed to start (then `description` stands in).
struct WorkerEntry {
  std::unique_ptr<DeviceWorker> worker;
  DeviceDescription description;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const CudaBackendOptions& options, BackendObserver* observer,
              std::vector<WorkerEntry> entries, const std::vector<std::string>& labels,
              const std::vector<std::string>& start_failures)
      : options_(options),
        observer_(observer),
        entries_(std::move(entries)),
        router_(
            labels,
            [this](int w, int64_t calls) {
              if (observer_ != nullptr) observer_->SetDeviceInFlight(router_.label(w), calls);
            },
            [this](int w, const std::string& reason) {
              if (observer_ != nullptr) observer_->SetDeviceServing(router_.label(w), false);
              if (options_.on_device_failed) options_.on_device_failed(router_.label(w), reason);
            }) {
    for (int w = 0; w < router_.size(); ++w) {
      if (observer_ != nullptr) {
        observer_->SetDeviceServing(router_.label(w), true);
        observer_->SetDeviceInFlight(router_.label(w), 0);
      }
      if (!start_failures[static_cast<size_t>(w)].empty()) {
        router_.MarkFailed(w, start_failures[static_cast<size_t>(w)]);
      }
    }
  }

  std::string DescribeLoad() const override {
    std::string text;
    for (const WorkerEntry& entry : entries_) {
      if (entry.worker == nullptr) continue;
      const std::string upload = entry.worker->DescribeUpload();
      if (!upload.empty()) absl::StrAppend(&text, text.empty() ? "" : "; ", upload);
    }
    return text;
  }

  BackendInfo Info() const override {
    BackendInfo info{.name = "cuda", .devices = {}, .cpu_threads = 0};
    for (int w = 0; w < router_.size(); ++w) {
      const WorkerEntry& entry = entries_[static_cast<size_t>(w)];
      DeviceDescription d =
          entry.worker != nullptr ? entry.worker->description() : entry.description;
      d.serving = router_.serving(w);
      d.failure = router_.failure(w);
      d.in_flight = router_.in_flight(w);
      info.devices.push_back(std::move(d));
    }
    return info;
  }

  // Places the layers (device_placement.h) over the workers in rotation and uploads each one's
  // share. A worker whose device fails during its upload is taken out of rotation; the call fails
  // only when a layer is then held by no worker in rotation, or on an error of another kind.
  absl::Status Prepare(const Checkpoint& checkpoint) override {
    const std::vector<QuantizedLayer>& layers = checkpoint.layers();
    positions_.Assign(layers);
    std::vector<int64_t> layer_bytes;
    for (size_t i = 0; i < layers.size(); ++i) {
      layer_bytes.push_back(cuda::PackedLayout(layers[i].view.shape).total_bytes);
    }
    std::vector<int> live;  // workers in rotation
    for (int w = 0; w < router_.size(); ++w) {
      if (entries_[static_cast<size_t>(w)].worker != nullptr && router_.serving(w)) {
        live.push_back(w);
      }
    }
    if (live.empty()) return absl::UnavailableError("no CUDA device is in rotation");
    std::vector<int64_t> capacity;
    std::vector<std::string> labels;
    const int64_t reserve =
        options_.reserve_bytes >= 0
            ? options_.reserve_bytes
            : options_.slots_per_device * 2 * options_.result_slab_bytes + (int64_t{1} << 30);
    for (int w : live) {
      DeviceWorker& worker = *entries_[static_cast<size_t>(w)].worker;
      const auto same_gpu = std::count_if(live.begin(), live.end(), [&](int o) {
        return entries_[static_cast<size_t>(o)].worker->device() == worker.device();
      });
      absl::StatusOr<int64_t> free = worker.FreeBytes();
      if (!free.ok()) return free.status();
      capacity.push_back(WorkerCapacity(*free, static_cast<int>(same_gpu), reserve,
                                        options_.device_memory_limit_bytes));
      labels.push_back(router_.label(w));
    }
    absl::StatusOr<Placement> placement =
        PlanPlacement(layer_bytes, capacity, labels, options_.placement);
    if (!placement.ok()) return placement.status();
    holders_.assign(layers.size(), {});
    for (size_t i = 0; i < layers.size(); ++i) {
      for (int j : placement->holders[i]) holders_[i].push_back(live[static_cast<size_t>(j)]);
    }
    for (size_t j = 0; j < live.size(); ++j) {
      const int w = live[j];
      std::vector<bool> keep(layers.size(), false);
      for (size_t i = 0; i < layers.size(); ++i) {
        keep[i] = std::find(placement->holders[i].begin(), placement->holders[i].end(),
                            static_cast<int>(j)) != placement->holders[i].end();
      }
      absl::Status s = entries_[static_cast<size_t>(w)].worker->Upload(checkpoint, keep);
      if (!s.ok() && !TakeOutIfFailed(w)) return s;
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      // (A layer no GPU was to hold is served from its host copy.)
      if (!holders_[i].empty() && std::none_of(holders_[i].begin(), holders_[i].end(),
                                               [this](int w) { return router_.serving(w); })) {
        return absl::UnavailableError(
            absl::StrCat("layer \"", layers[i].name, "\": every GPU that was to hold it failed"));
      }
    }
    return absl::OkStatus();
  }

  bool IsResident(const QuantizedLayer& layer) const override {
    const std::optional<int64_t> index = positions_.Find(layer);
    if (!index.has_value()) return false;
    for (int w : holders_[static_cast<size_t>(*index)]) {
      const WorkerEntry& entry = entries_[static_cast<size_t>(w)];
      if (entry.worker != nullptr && entry.worker->IsResident(layer)) return true;
    }
    return false;
  }

  absl::Status Dequantize(const DequantSource& source, DType out_dtype, int64_t chunk_bytes,
                          ChunkSink& sink) override {
    if (absl::Status s = ValidateShape(source.shape(), out_dtype); !s.ok()) return s;
    if (absl::Status s = CheckChunkBytes(chunk_bytes); !s.ok()) return s;
    if (source.layer == nullptr) {
      if (absl::Status s = ValidateView(source.view(), out_dtype, 0, 0, nullptr); !s.ok()) return s;
    }
    absl::StatusOr<std::vector<int>> candidates =
        Candidates(source.layer, HoldersOf(source.layer), sink.destination());
    if (!candidates.ok()) return candidates.status();
    return Serve(*candidates, /*preferred=*/-1, sink, /*layers=*/nullptr,
                 [&](DeviceWorker& worker, LayersSink& tracked) {
                   return worker.Dequantize(source, out_dtype, chunk_bytes, tracked);
                 });
  }

  absl::Status DequantizeLayers(absl::Span<const QuantizedLayer* const> layers, DType out_dtype,
                                Orientation orientation, int64_t chunk_bytes,
                                LayersSink& sink) override {
    if (absl::Status s = CheckChunkBytes(chunk_bytes); !s.ok()) return s;
    for (size_t i = 0; i < layers.size(); ++i) {
      if (layers[i] == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", i, " is null"));
      }
      if (absl::Status s = ValidateShape(layers[i]->view.shape, out_dtype); !s.ok()) return s;
    }
    if (layers.empty()) return absl::OkStatus();
    // Which workers in rotation may compute each entry; then the parts (device_router.h).
    // Consecutive layers mostly have the same holders (every layer, with one GPU or replicated
    // placement): their candidates are worked out once per run of equal holder lists.
    std::vector<std::vector<int>> candidates(layers.size());
    std::vector<int64_t> result_bytes(layers.size());
    const std::vector<int>* run_holders = nullptr;
    for (size_t i = 0; i < layers.size(); ++i) {
      result_bytes[i] = layers[i]->view.shape.output_bytes(out_dtype);
      const std::vector<int>* holders = HoldersOf(layers[i]);
      if (holders != nullptr && run_holders != nullptr && *holders == *run_holders) {
        candidates[i] = candidates[i - 1];
        continue;
      }
      run_holders = holders;
      absl::StatusOr<std::vector<int>> may = Candidates(layers[i], holders, sink.destination());
      if (!may.ok()) return may.status();
      std::string why;
      for (int w : *may) {
        if (router_.serving(w)) {
          candidates[i].push_back(w);
        } else {
          absl::StrAppend(&why, why.empty() ? "" : "; ", router_.label(w), ": ",
                          router_.failure(w));
        }
      }
      if (candidates[i].empty()) {
        return absl::UnavailableError(absl::StrCat("layer \"", layers[i]->name,
                                                   "\": every GPU holding it is out of rotation (",
                                                   why, ")"));
      }
    }
    absl::StatusOr<std::vector<LayerPart>> parts =
        PlanLayerParts(candidates, result_bytes, router_.loads(), options_.min_part_bytes);
    if (!parts.ok()) return parts.status();
    // The workers that may run entries [begin, end): those every entry of them allows.
    auto common = [&](const LayerPart& part) {
      std::vector<int> both = candidates[part.begin];
      for (size_t i = part.begin + 1; i < part.end; ++i) {
        if (candidates[i] == both) continue;
        std::vector<int> next;
        for (int w : both) {
          if (std::find(candidates[i].begin(), candidates[i].end(), w) != candidates[i].end()) {
            next.push_back(w);
          }
        }
        both = std::move(next);
      }
      return both;
    };
    auto run_part = [&](const LayerPart& part, int preferred, LayersSink& part_sink,
                        PartTurn* turn) {
      return Serve(common(part), preferred, part_sink, &part_sink,
                   [&](DeviceWorker& worker, LayersSink& tracked) {
                     return worker.DequantizeLayers(
                         layers.subspan(part.begin, part.end - part.begin), out_dtype, orientation,
                         chunk_bytes, tracked, turn);
                   });
    };
    if (parts->size() == 1) {
      return run_part(parts->front(), /*preferred=*/-1, sink, /*turn=*/nullptr);
    }
    std::vector<OrderedPart> ordered;
    for (const LayerPart& part : *parts) {
      int64_t before = 0;
      for (size_t i = 0; i < part.begin; ++i) before += result_bytes[i];
      ordered.push_back(
          OrderedPart{.first_entry = static_cast<int64_t>(part.begin), .bytes_before = before});
    }
    // Each part takes its worker's request slot in part order (PartTurn): a part holds its slot
    // while its sink calls wait for the parts before it.
    return RunOrderedParts(sink, ordered, [&](size_t k, LayersSink& part_sink, PartTurn& turn) {
      return run_part((*parts)[k], (*parts)[k].worker, part_sink, &turn);
    });
  }

 private:
  static absl::Status CheckChunkBytes(int64_t chunk_bytes) {
    if (chunk_bytes >= 1) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("chunk_bytes must be >= 1, got ", chunk_bytes));
  }

  // The workers that may compute `layer` (null: an inline input, any worker): its `holders`
  // (HoldersOf(layer)), or every started worker for a layer never prepared (null `holders`: the
  // worker then answers INVALID_ARGUMENT);
  // only those on the destination's GPU when the sink is a device buffer. Results are never
  // written across GPUs: FAILED_PRECONDITION when no holder is on that GPU.
  absl::StatusOr<std::vector<int>> Candidates(const QuantizedLayer* layer,
                                              const std::vector<int>* holders,
                                              const ResultDestination* destination) const {
    std::vector<int> all;
    if (holders != nullptr) all = *holders;
    if (all.empty()) {
      for (int w = 0; w < router_.size(); ++w) {
        if (entries_[static_cast<size_t>(w)].worker != nullptr) all.push_back(w);
      }
    }
    if (destination == nullptr || destination->memory != ResultDestination::Memory::kDevice) {
      return all;
    }
    std::vector<int> here;
    std::string held_on;
    for (int w : all) {
      absl::StrAppend(&held_on, held_on.empty() ? "" : ", ", router_.label(w));
      if (entries_[static_cast<size_t>(w)].worker->device() == destination->device) {
        here.push_back(w);
      }
    }
    if (here.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the destination is memory of CUDA device ", destination->device, " but ",
          layer != nullptr ? absl::StrCat("layer \"", layer->name, "\" is held on ", held_on)
                           : absl::StrCat("this server computes on ", held_on),
          "; results are written only into memory of the device that computes them"));
    }
    return here;
  }

  // The workers Prepare placed `layer` on; null for an inline input or a layer never prepared.
  const std::vector<int>* HoldersOf(const QuantizedLayer* layer) const {
    if (layer == nullptr) return nullptr;
    const std::optional<int64_t> index = positions_.Find(*layer);
    return index.has_value() ? &holders_[static_cast<size_t>(*index)] : nullptr;
  }

  // Runs `call` on `preferred` (when >= 0 and in rotation) or the least-loaded worker in rotation
  // among `candidates`. When it fails and the worker's device is found failed (Probe), the worker
  // is taken out of rotation; the call is retried on another candidate when its sink had seen
  // nothing, else it ends with UNAVAILABLE naming the device.
  absl::Status Serve(std::vector<int> candidates, int preferred, ChunkSink& sink,
                     LayersSink* layers,
                     const std::function<absl::Status(DeviceWorker&, LayersSink&)>& call) {
    absl::Status failed;
    while (true) {
      std::optional<DeviceRouter::Ticket> ticket;
      if (preferred >= 0 && router_.serving(preferred)) {
        ticket.emplace(router_.Acquire(preferred));
      } else {
        absl::StatusOr<DeviceRouter::Ticket> least = router_.AcquireLeastLoaded(candidates);
        if (!least.ok()) return failed.ok() ? least.status() : failed;
        ticket.emplace(std::move(*least));
      }
      preferred = -1;
      const int w = ticket->worker();
      TouchTrackingSink tracked(sink, layers);
      absl::Status s = call(*entries_[static_cast<size_t>(w)].worker, tracked);
      if (s.ok() || !TakeOutIfFailed(w)) return s;
      failed = absl::UnavailableError(
          absl::StrCat(router_.label(w),
                       " failed during this call and was taken out of rotation: ", s.message()));
      if (tracked.touched()) return failed;
      candidates.erase(std::remove(candidates.begin(), candidates.end(), w), candidates.end());
    }
  }

  // Takes worker `w` out of rotation when its device no longer works. True when it was (now or
  // before).
  bool TakeOutIfFailed(int w) {
    absl::Status probe = entries_[static_cast<size_t>(w)].worker->Probe();
    if (probe.ok()) return false;
    router_.MarkFailed(w, std::string(probe.message()));
    return true;
  }

  const CudaBackendOptions options_;
  BackendObserver* const observer_;
  std::vector<WorkerEntry> entries_;  // one per --devices entry, non-empty
  DeviceRouter router_;
  // Written by Prepare (before any call), read-only after.
  LayerPositions positions_;               // of the prepared checkpoint's layers
  std::vector<std::vector<int>> holders_;  // by checkpoint index: workers
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
  if (options.staging_blocks < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging_blocks must be >= 2 (two copies in flight), got ", options.staging_blocks));
  }
  if (!(options.staging_wait_seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_wait_seconds must be > 0, got ", options.staging_wait_seconds));
  }
  if (options.result_slab_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("result_slab_bytes must be >= 1, got ", options.result_slab_bytes));
  }
  if (options.min_part_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_part_bytes must be >= 1, got ", options.min_part_bytes));
  }
  const int count = CudaDeviceCount();
  if (count == 0) return absl::FailedPreconditionError("no CUDA device is available");
  std::vector<int> ordinals = options.devices;
  if (ordinals.empty()) {
    for (int d = 0; d < count; ++d) ordinals.push_back(d);
  }
  for (int ordinal : ordinals) {
    if (ordinal < 0 || ordinal >= count) {
      return absl::InvalidArgumentError(absl::StrCat("--devices: CUDA device ", ordinal,
                                                     " does not exist (", count, " visible)"));
    }
  }
  const std::vector<std::string> labels = WorkerLabels(ordinals);
  for (size_t i = 0; i < ordinals.size(); ++i) {
    cudaDeviceProp prop;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinals[i]));
    if (absl::Status s =
            CheckDeviceMemoryLimit(options.device_memory_limit_bytes,
                                   static_cast<int64_t>(prop.totalGlobalMem), labels[i], prop.name);
        !s.ok()) {
      return s;
    }
  }
  for (const auto& [label, injection] : options.inject_failures) {
    if (std::find(labels.begin(), labels.end(), label) == labels.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kInjectDeviceFailureEnv, ": no worker \"", label,
                       "\" (workers: ", absl::StrJoin(labels, ", "), ")"));
    }
  }
  std::vector<WorkerEntry> entries;
  std::vector<std::string> failures;
  absl::Status first_error;
  for (size_t i = 0; i < ordinals.size(); ++i) {
    auto injected = options.inject_failures.find(labels[i]);
    absl::StatusOr<std::unique_ptr<DeviceWorker>> worker = DeviceWorker::Create(
        ordinals[i], labels[i], options, observer,
        injected != options.inject_failures.end() ? injected->second : DeviceFailureInjection{});
    WorkerEntry entry;
    entry.description.index = ordinals[i];
    entry.description.label = labels[i];
    if (worker.ok()) {
      entry.worker = std::move(*worker);
      failures.emplace_back();
    } else {
      if (first_error.ok()) first_error = worker.status();
      failures.push_back(std::string(worker.status().message()));
    }
    entries.push_back(std::move(entry));
  }
  if (std::none_of(entries.begin(), entries.end(),
                   [](const WorkerEntry& e) { return e.worker != nullptr; })) {
    return first_error;
  }
  return std::make_unique<CudaBackend>(options, observer, std::move(entries), labels, failures);
}

}  // namespace dequantd
