// The CUDA backend (see cuda_backend.h): per GPU, resident packed weights, a pool of request
// slots (stream + two pinned staging buffers + events), and a small cache of device buffers for
// outputs and inline inputs.
#include "server/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "server/backend.h"
#include "server/backend_observer.h"
#include "server/chunk_writer.h"

namespace dequantd {
namespace {

// Alignment of each tensor inside one device allocation (cudaMalloc itself gives 256).
constexpr int64_t kDeviceAlign = 256;
constexpr int64_t AlignUp(int64_t bytes) {
  return (bytes + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;
}

// Byte offsets of qweight, qzeros and scales in one device allocation holding a packed layer.
struct PackedLayout {
  explicit PackedLayout(const AwqShape& shape)
      : qzeros_offset(AlignUp(shape.qweight_bytes())),
        scales_offset(qzeros_offset + AlignUp(shape.qzeros_bytes())),
        total_bytes(scales_offset + shape.scales_bytes()) {}
  int64_t qzeros_offset;
  int64_t scales_offset;
  int64_t total_bytes;
};

// Enqueues the copy of `host`'s three tensors into `device_base` (laid out as PackedLayout) on
// `stream` and returns the device view. The host memory must stay valid until the stream is done.
absl::StatusOr<PackedTensorView> CopyPackedToDevice(const PackedTensorView& host, void* device_base,
                                                    cudaStream_t stream) {
  const AwqShape& shape = host.shape;
  const PackedLayout layout(shape);
  auto* base = static_cast<uint8_t*>(device_base);
  PackedTensorView view;
  view.shape = shape;
  view.qweight = reinterpret_cast<const int32_t*>(base);
  view.qzeros = reinterpret_cast<const int32_t*>(base + layout.qzeros_offset);
  view.scales = base + layout.scales_offset;
  DEQUANTD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(base, host.qweight, shape.qweight_bytes(), cudaMemcpyHostToDevice, stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + layout.qzeros_offset, host.qzeros,
                                                shape.qzeros_bytes(), cudaMemcpyHostToDevice,
                                                stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + layout.scales_offset, host.scales,
                                                shape.scales_bytes(), cudaMemcpyHostToDevice,
                                                stream));
  return view;
}

class DeviceBufferCache;

// A device allocation borrowed from a DeviceBufferCache; returned to it on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBufferCache* cache, void* ptr, int64_t bytes)
      : cache_(cache), ptr_(ptr), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : cache_(std::exchange(other.cache_, nullptr)),
        ptr_(std::exchange(other.ptr_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(cache_, other.cache_);
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~DeviceBuffer();

  void* get() const { return ptr_; }

 private:
  DeviceBufferCache* cache_ = nullptr;
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

// Idle device buffers of one GPU kept for reuse, up to `limit_bytes` in total. Thread-safe.
// Acquire and Release expect the calling thread's current device to be this GPU. Reports the
// bytes it holds (live and idle) to `observer` (may be null) as kBuffers of `label`.
class DeviceBufferCache {
 public:
  DeviceBufferCache(int device, int64_t limit_bytes, BackendObserver* observer, std::string label)
      : device_(device), limit_bytes_(limit_bytes), observer_(observer), label_(std::move(label)) {}
  ~DeviceBufferCache() {
    cudaSetDevice(device_);
    for (auto& [bytes, ptr] : idle_) cudaFree(ptr);
  }

  // The smallest idle buffer of at least `bytes` (and at most twice that), else a new one. On
  // out-of-memory, frees the idle buffers and tries once more (RESOURCE_EXHAUSTED after that).
  absl::StatusOr<DeviceBuffer> Acquire(int64_t bytes) {
    bytes = AlignUp(std::max<int64_t>(bytes, 1));
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = idle_.lower_bound(bytes);
      if (it != idle_.end() && it->first <= 2 * bytes) {
        DeviceBuffer buffer(this, it->second, it->first);
        idle_bytes_ -= it->first;
        idle_.erase(it);
        return buffer;
      }
    }
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the (non-sticky) allocation error
      FreeIdle();
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, bytes));
    }
    AddAllocated(bytes);
    return DeviceBuffer(this, ptr, bytes);
  }

  void Release(void* ptr, int64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (idle_bytes_ + bytes <= limit_bytes_) {
        idle_.emplace(bytes, ptr);
        idle_bytes_ += bytes;
        return;
      }
    }
    cudaFree(ptr);
    AddAllocated(-bytes);
  }

 private:
  void FreeIdle() {
    std::multimap<int64_t, void*> idle;
    {
      std::lock_guard<std::mutex> lock(mu_);
      idle.swap(idle_);
      idle_bytes_ = 0;
    }
    for (auto& [bytes, ptr] : idle) {
      cudaFree(ptr);
      AddAllocated(-bytes);
    }
  }

  // Reported under the lock so that the last report is the current total.
  void AddAllocated(int64_t delta) {
    if (observer_ == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    allocated_bytes_ += delta;
    observer_->SetDeviceMemoryUsed(label_, DeviceMemoryKind::kBuffers, allocated_bytes_);
  }

  const int device_;
  const int64_t limit_bytes_;
  BackendObserver* const observer_;
  const std::string label_;
  std::mutex mu_;
  std::multimap<int64_t, void*> idle_;  // bytes -> buffer
  int64_t idle_bytes_ = 0;
  int64_t allocated_bytes_ = 0;  // live + idle buffers; guarded by mu_
};

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cache_->Release(ptr_, bytes_);
}

// What one request holds on a GPU: its stream, two pinned staging buffers for device -> host
// copies and an event per buffer marking its copy done. With an observer, the events time the
// stages: `copied` then records timing, and `copy_start`, `h2d`, `kernel` exist.
struct Slot {
  cudaStream_t stream = nullptr;
  std::array<uint8_t*, 2> staging = {nullptr, nullptr};
  std::array<cudaEvent_t, 2> copied = {nullptr, nullptr};
  std::array<cudaEvent_t, 2> copy_start = {nullptr, nullptr};  // before each staging copy
  std::array<cudaEvent_t, 2> h2d = {nullptr, nullptr};         // around the inline-input copy
  std::array<cudaEvent_t, 2> kernel = {nullptr, nullptr};      // around the launch
};

// Milliseconds between two completed events, in seconds (0 if they cannot be read).
double ElapsedSeconds(cudaEvent_t start, cudaEvent_t end) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, start, end) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<double>(ms) * 1e-3;
}

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The device-to-device copy rate of the current device, bytes read + written per second: one
// warm-up, then one event-timed cudaMemcpyAsync of 256 MiB. 0 when the buffers do not fit.
absl::StatusOr<double> MeasureCopyBandwidth(cudaStream_t stream) {
  constexpr int64_t kBytes = int64_t{256} << 20;
  void* src = nullptr;
  void* dst = nullptr;
  if (cudaMalloc(&src, kBytes) != cudaSuccess || cudaMalloc(&dst, kBytes) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(src);
    return 0.0;
  }
  std::array<cudaEvent_t, 2> events = {nullptr, nullptr};
  absl::Cleanup release = [&] {
    for (cudaEvent_t e : events) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    cudaFree(src);
    cudaFree(dst);
  };
  for (cudaEvent_t& e : events) DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src, 1, kBytes, stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice, stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(events[0], stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice, stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(events[1], stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events[1]));
  const double seconds = ElapsedSeconds(events[0], events[1]);
  return seconds > 0 ? 2.0 * static_cast<double>(kBytes) / seconds : 0.0;
}

std::string DriverVersionString() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) return "";
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

// One GPU: resident layers, request slots, buffer cache.
class DeviceWorker {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceWorker>> Create(int device,
                                                              const CudaBackendOptions& options,
                                                              BackendObserver* observer) {
    auto worker = std::unique_ptr<DeviceWorker>(new DeviceWorker(device, options, observer));
    if (absl::Status s = worker->Init(); !s.ok()) return s;
    return worker;
  }

  ~DeviceWorker() {
    cudaSetDevice(device_);
    for (auto& [layer, resident] : resident_) cudaFree(resident.base);
    for (Slot& slot : slots_) {
      if (slot.stream != nullptr) cudaStreamSynchronize(slot.stream);
      for (const auto* events : {&slot.copied, &slot.copy_start, &slot.h2d, &slot.kernel}) {
        for (cudaEvent_t e : *events) {
          if (e != nullptr) cudaEventDestroy(e);
        }
      }
      for (uint8_t* p : slot.staging) {
        if (p != nullptr) cudaFreeHost(p);
      }
      if (slot.stream != nullptr) cudaStreamDestroy(slot.stream);
    }
  }

  const DeviceDescription& description() const { return description_; }

  // Uploads every layer of `checkpoint` (synchronously) and keeps it resident.
  absl::Status Upload(const Checkpoint& checkpoint) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    int64_t resident_bytes = 0;
    for (const QuantizedLayer& layer : checkpoint.layers()) {
      const PackedLayout layout(layer.view.shape);
      void* base = nullptr;
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMalloc(&base, layout.total_bytes));
      resident_bytes += layout.total_bytes;
      resident_[&layer] = ResidentLayer{.base = base, .view = {}};
      absl::StatusOr<PackedTensorView> view =
          CopyPackedToDevice(layer.view, base, slots_.front().stream);
      if (!view.ok()) return view.status();
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(slots_.front().stream));
      resident_[&layer].view = *view;
      model_layers_.push_back(&layer);
    }
    if (observer_ != nullptr) {
      observer_->SetDeviceMemoryUsed(label_, DeviceMemoryKind::kResidentWeights, resident_bytes);
    }
    if (options_.build_model_plan) return BuildModelPlan(DType::kF16);
    return absl::OkStatus();
  }

  bool IsResident(const QuantizedLayer& layer) const { return resident_.contains(&layer); }

  absl::Status Dequantize(const DequantSource& source, DType out_dtype, int64_t chunk_bytes,
                          ChunkSink& sink) {
    const AwqShape& shape = source.shape();
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    PackedTensorView device_view;
    if (source.layer != nullptr) {
      auto it = resident_.find(source.layer);
      if (it == resident_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer \"", source.layer->name, "\" is not resident on device ", device_));
      }
      device_view = it->second.view;
    }
    // Declaration order matters: on every exit the stream is drained (cleanup below) before the
    // buffers go back to the cache and the slot to the pool.
    const Clock::time_point queue_start = Clock::now();
    SlotLease slot(*this);
    const double queue_seconds = SecondsSince(queue_start);
    DeviceBuffer input;
    if (source.layer == nullptr) {
      absl::StatusOr<DeviceBuffer> buffer = cache_.Acquire(PackedLayout(shape).total_bytes);
      if (!buffer.ok()) return buffer.status();
      input = std::move(*buffer);
    }
    const int64_t total = shape.output_bytes(out_dtype);
    absl::StatusOr<DeviceBuffer> output = cache_.Acquire(total);
    if (!output.ok()) return output.status();
    absl::Cleanup drain = [&slot] { cudaStreamSynchronize(slot->stream); };

    if (source.layer == nullptr) {
      if (absl::Status s = RecordTiming(slot->h2d[0], *slot); !s.ok()) return s;
      absl::StatusOr<PackedTensorView> staged =
          CopyPackedToDevice(source.host, input.get(), slot->stream);
      if (!staged.ok()) return staged.status();
      device_view = *staged;
      if (absl::Status s = RecordTiming(slot->h2d[1], *slot); !s.ok()) return s;
    }
    cuda::LaunchConfig config = cuda::DefaultConfig(options_.variant, shape, out_dtype);
    if (options_.launch_config) {
      absl::StatusOr<cuda::LaunchConfig> chosen =
          options_.launch_config(LaunchQuery{.device = device_,
                                             .variant = options_.variant,
                                             .in = device_view,
                                             .out_dtype = out_dtype,
                                             .out = output->get(),
                                             .stream = slot->stream});
      if (!chosen.ok()) return chosen.status();
      config = *chosen;
    }
    if (absl::Status s = cuda::CanImplement(options_.variant, config, shape, out_dtype); !s.ok()) {
      return s;
    }
    if (absl::Status s =
            sink.Begin(std::string(cuda::VariantName(options_.variant)) + " " + config.ToString());
        !s.ok()) {
      return s;
    }
    if (absl::Status s = RecordTiming(slot->kernel[0], *slot); !s.ok()) return s;
    if (absl::Status s = cuda::LaunchDequantize(options_.variant, config, device_view, out_dtype,
                                                output->get(), slot->stream);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = RecordTiming(slot->kernel[1], *slot); !s.ok()) return s;
    StreamTimes times;
    if (absl::Status s = StreamToSink(*slot, static_cast<const uint8_t*>(output->get()), total,
                                      chunk_bytes, sink, times);
        !s.ok()) {
      return s;
    }
    if (observer_ != nullptr) {  // every event recorded above has completed
      const double kernel_seconds = ElapsedSeconds(slot->kernel[0], slot->kernel[1]);
      observer_->ObserveStage(DequantizeStage::kQueueWait, queue_seconds);
      if (source.layer == nullptr) {
        observer_->ObserveStage(DequantizeStage::kHostToDevice,
                                ElapsedSeconds(slot->h2d[0], slot->h2d[1]));
      }
      observer_->ObserveStage(DequantizeStage::kKernel, kernel_seconds);
      observer_->ObserveStage(DequantizeStage::kDeviceToHost, times.device_to_host_seconds);
      observer_->ObserveStage(DequantizeStage::kSend, times.send_seconds);
      observer_->ObserveKernel(label_, "cuda", cuda::VariantName(options_.variant),
                               shape.qweight_bytes() + shape.qzeros_bytes() + shape.scales_bytes(),
                               total, kernel_seconds);
    }
    return absl::OkStatus();
  }

  // Builds the kept grouped plan of the whole model for `out_dtype` now (--pretune) rather than
  // on first use. Errors: as DequantizeLayers' device errors (RESOURCE_EXHAUSTED when the whole
  // model's result does not fit).
  absl::Status BuildModelPlan(DType out_dtype) {
    if (model_layers_.empty()) return absl::OkStatus();
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    absl::StatusOr<GroupedWork> work = PlanWork(model_layers_, out_dtype);
    if (!work.ok()) return work.status();
    FullModelPlan& full = full_plans_[static_cast<size_t>(out_dtype)];
    std::lock_guard<std::mutex> lock(full.mu);
    return EnsureModelPlan(full, *work, out_dtype);
  }

  // Runs the resident `layers` (non-empty, duplicates allowed) in one grouped launch into one
  // output buffer, then streams each listed layer's bytes to `sink` in list order.
  absl::Status DequantizeLayers(absl::Span<const QuantizedLayer* const> layers, DType out_dtype,
                                int64_t chunk_bytes, LayersSink& sink) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    absl::StatusOr<GroupedWork> planned = PlanWork(layers, out_dtype);
    if (!planned.ok()) return planned.status();
    GroupedWork& work = *planned;
    const std::vector<const QuantizedLayer*>& unique = work.unique;
    const std::vector<size_t>& which = work.which;
    const std::vector<int64_t>& offsets = work.offsets;
    const std::vector<cuda::GroupedItem>& items = work.items;

    // Declaration order matters: on every exit the stream is drained (cleanup below) before the
    // output buffer goes back to the cache, the cached plan is unlocked and the slot returned.
    const Clock::time_point queue_start = Clock::now();
    SlotLease slot(*this);
    const double queue_seconds = SecondsSince(queue_start);
    // The whole model in checkpoint order uses the kept plan, unless another request holds it.
    FullModelPlan* cached = nullptr;
    std::unique_lock<std::mutex> cached_lock;
    if (unique == model_layers_) {
      FullModelPlan& full = full_plans_[static_cast<size_t>(out_dtype)];
      cached_lock = std::unique_lock<std::mutex>(full.mu, std::try_to_lock);
      if (cached_lock.owns_lock()) cached = &full;
    }
    DeviceBuffer one_shot_output;
    const uint8_t* out_base = nullptr;
    if (cached != nullptr) {
      if (absl::Status s = EnsureModelPlan(*cached, work, out_dtype); !s.ok()) return s;
      out_base = static_cast<const uint8_t*>(cached->output.get());
    } else {
      absl::StatusOr<DeviceBuffer> output = AcquireOutput(work);
      if (!output.ok()) return output.status();
      one_shot_output = std::move(*output);
      out_base = static_cast<const uint8_t*>(one_shot_output.get());
    }
    absl::Cleanup drain = [&slot] { cudaStreamSynchronize(slot->stream); };

    const cuda::GroupedOptions& grouped = options_.grouped;
    if (absl::Status s = sink.Begin(
            absl::StrCat("grouped block=", grouped.block_size, ",rows=", grouped.rows_per_thread,
                         ",units=", grouped.units_per_thread, " layers=", unique.size(),
                         cached != nullptr ? " plan=model" : " plan=one_shot"));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = RecordTiming(slot->kernel[0], *slot); !s.ok()) return s;
    if (absl::Status s = cached != nullptr ? cached->plan->Launch(slot->stream)
                                           : cuda::LaunchGroupedDequantize(items, out_dtype,
                                                                           slot->stream, grouped);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = RecordTiming(slot->kernel[1], *slot); !s.ok()) return s;
    StreamTimes times;
    for (size_t i = 0; i < layers.size(); ++i) {
      if (absl::Status s = sink.BeginLayer(static_cast<int64_t>(i)); !s.ok()) return s;
      if (absl::Status s =
              StreamToSink(*slot, out_base + offsets[which[i]],
                           layers[i]->view.shape.output_bytes(out_dtype), chunk_bytes, sink, times);
          !s.ok()) {
        return s;
      }
    }
    if (observer_ != nullptr) {  // every event recorded above has completed
      const double kernel_seconds = ElapsedSeconds(slot->kernel[0], slot->kernel[1]);
      observer_->ObserveStage(DequantizeStage::kQueueWait, queue_seconds);
      observer_->ObserveStage(DequantizeStage::kKernel, kernel_seconds);
      observer_->ObserveStage(DequantizeStage::kDeviceToHost, times.device_to_host_seconds);
      observer_->ObserveStage(DequantizeStage::kSend, times.send_seconds);
      observer_->ObserveKernel(label_, "cuda", "grouped", work.read_bytes, work.written_bytes,
                               kernel_seconds);
    }
    return absl::OkStatus();
  }

 private:
  // One grouped call: each distinct layer computed once, laid out in one output buffer.
  struct GroupedWork {
    std::vector<const QuantizedLayer*> unique;  // distinct layers, first appearance order
    std::vector<size_t> which;                  // request entry i -> index in `unique`
    std::vector<cuda::GroupedItem> items;       // per distinct layer; `out` set by AcquireOutput
    std::vector<int64_t> offsets;               // of each distinct result in the output buffer
    int64_t total = 0;                          // output buffer bytes (results 256-aligned)
    int64_t read_bytes = 0;                     // packed bytes of the distinct layers
    int64_t written_bytes = 0;                  // result bytes of the distinct layers
  };

  // INVALID_ARGUMENT for a layer that is not resident here.
  absl::StatusOr<GroupedWork> PlanWork(absl::Span<const QuantizedLayer* const> layers,
                                       DType out_dtype) const {
    GroupedWork work;
    work.which.resize(layers.size());
    std::unordered_map<const QuantizedLayer*, size_t> index;
    for (size_t i = 0; i < layers.size(); ++i) {
      auto [it, inserted] = index.emplace(layers[i], work.unique.size());
      if (inserted) work.unique.push_back(layers[i]);
      work.which[i] = it->second;
    }
    work.items.resize(work.unique.size());
    work.offsets.resize(work.unique.size());
    for (size_t u = 0; u < work.unique.size(); ++u) {
      auto it = resident_.find(work.unique[u]);
      if (it == resident_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("layer \"", work.unique[u]->name,
                                                       "\" is not resident on device ", device_));
      }
      const AwqShape& shape = it->second.view.shape;
      work.items[u].in = it->second.view;
      work.offsets[u] = work.total;
      work.total += AlignUp(shape.output_bytes(out_dtype));
      work.read_bytes += shape.qweight_bytes() + shape.qzeros_bytes() + shape.scales_bytes();
      work.written_bytes += shape.output_bytes(out_dtype);
    }
    return work;
  }

  // One device buffer for all of `work`'s results; points its items' outputs into it.
  absl::StatusOr<DeviceBuffer> AcquireOutput(GroupedWork& work) {
    absl::StatusOr<DeviceBuffer> buffer = cache_.Acquire(work.total);
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(),
                          absl::StrCat("the results of ", work.unique.size(), " layers need ",
                                       work.total, " bytes of device memory at once on device ",
                                       device_, ": ", buffer.status().message()));
    }
    for (size_t u = 0; u < work.unique.size(); ++u) {
      work.items[u].out = static_cast<uint8_t*>(buffer->get()) + work.offsets[u];
    }
    return buffer;
  }

  struct FullModelPlan;
  // Builds `full`'s plan and output buffer for the whole model's `work` if not built yet. The
  // caller holds full.mu.
  absl::Status EnsureModelPlan(FullModelPlan& full, GroupedWork& work, DType out_dtype) {
    if (full.plan.has_value()) return absl::OkStatus();
    absl::StatusOr<DeviceBuffer> output = AcquireOutput(work);
    if (!output.ok()) return output.status();
    absl::StatusOr<cuda::GroupedPlan> plan =
        cuda::GroupedPlan::Create(work.items, out_dtype, options_.grouped);
    if (!plan.ok()) return plan.status();
    full.plan.emplace(std::move(*plan));
    full.output = std::move(*output);
    return absl::OkStatus();
  }

  // The kept grouped plan of the whole model for one output dtype, and the output buffer its
  // descriptors point into. `mu` is held by the request using them, from the launch until its
  // last byte is streamed.
  struct FullModelPlan {
    std::mutex mu;
    std::optional<cuda::GroupedPlan> plan;  // built on first use
    DeviceBuffer output;
  };

  struct ResidentLayer {
    void* base = nullptr;  // one allocation: qweight | qzeros | scales (PackedLayout)
    PackedTensorView view;
  };

  // A slot taken from the pool for one request (waits while all are busy).
  class SlotLease {
   public:
    explicit SlotLease(DeviceWorker& worker) : worker_(worker) {
      std::unique_lock<std::mutex> lock(worker_.slots_mu_);
      worker_.slot_free_.wait(lock, [this] { return !worker_.free_slots_.empty(); });
      slot_ = worker_.free_slots_.back();
      worker_.free_slots_.pop_back();
    }
    ~SlotLease() {
      {
        std::lock_guard<std::mutex> lock(worker_.slots_mu_);
        worker_.free_slots_.push_back(slot_);
      }
      worker_.slot_free_.notify_one();
    }
    SlotLease(const SlotLease&) = delete;
    SlotLease& operator=(const SlotLease&) = delete;
    Slot* operator->() const { return slot_; }
    Slot& operator*() const { return *slot_; }

   private:
    DeviceWorker& worker_;
    Slot* slot_ = nullptr;
  };

  // Seconds StreamToSink spent copying device -> host (events) and in the sink (host clock).
  struct StreamTimes {
    double device_to_host_seconds = 0;
    double send_seconds = 0;
  };

  DeviceWorker(int device, const CudaBackendOptions& options, BackendObserver* observer)
      : device_(device),
        options_(options),
        observer_(observer),
        label_(DeviceLabel("cuda", device)),
        cache_(device, options.buffer_cache_bytes, observer, label_) {}

  // Records timing event `event` on the slot's stream when there is an observer.
  absl::Status RecordTiming(cudaEvent_t event, const Slot& slot) const {
    if (observer_ == nullptr) return absl::OkStatus();
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, slot.stream));
    return absl::OkStatus();
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

    slots_.resize(static_cast<size_t>(options_.slots_per_device));
    for (Slot& slot : slots_) {
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&slot.stream, cudaStreamNonBlocking));
      for (int i = 0; i < 2; ++i) {
        void* pinned = nullptr;
        DEQUANTD_CUDA_RETURN_IF_ERROR(
            cudaHostAlloc(&pinned, options_.staging_bytes, cudaHostAllocDefault));
        slot.staging[i] = static_cast<uint8_t*>(pinned);
        DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(
            &slot.copied[i], observer_ != nullptr ? cudaEventDefault : cudaEventDisableTiming));
      }
      if (observer_ != nullptr) {
        for (auto* events : {&slot.copy_start, &slot.h2d, &slot.kernel}) {
          for (cudaEvent_t& e : *events) DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
        }
      }
      free_slots_.push_back(&slot);
    }
    if (observer_ != nullptr) {
      absl::StatusOr<double> copy_rate = MeasureCopyBandwidth(slots_.front().stream);
      if (!copy_rate.ok()) return copy_rate.status();
      if (*copy_rate > 0) observer_->SetDeviceCopyBandwidth(label_, *copy_rate);
      observer_->SetDeviceMemoryUsed(label_, DeviceMemoryKind::kResidentWeights, 0);
      observer_->SetDeviceMemoryUsed(label_, DeviceMemoryKind::kBuffers, 0);
    }
    return absl::OkStatus();
  }

  // Copies `total` bytes at `device_out` to the host in pieces through the slot's two staging
  // buffers (piece i + 1 is copied while piece i is handed to the sink) and cuts them into
  // `chunk_bytes` chunks. Pieces are the largest multiple of chunk_bytes that fits a staging
  // buffer, so chunks go to the sink straight from pinned memory. Adds the stage times to `times`
  // (the copy time only with an observer).
  absl::Status StreamToSink(Slot& slot, const uint8_t* device_out, int64_t total,
                            int64_t chunk_bytes, ChunkSink& sink, StreamTimes& times) {
    const int64_t piece = chunk_bytes <= options_.staging_bytes
                              ? options_.staging_bytes / chunk_bytes * chunk_bytes
                              : options_.staging_bytes;
    const int64_t pieces = (total + piece - 1) / piece;
    auto enqueue = [&](int64_t i) -> absl::Status {
      const int64_t offset = i * piece;
      const int64_t bytes = std::min(piece, total - offset);
      if (absl::Status s = RecordTiming(slot.copy_start[i % 2], slot); !s.ok()) return s;
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot.staging[i % 2], device_out + offset, bytes,
                                                    cudaMemcpyDeviceToHost, slot.stream));
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.copied[i % 2], slot.stream));
      return absl::OkStatus();
    };
    ChunkWriter writer(chunk_bytes, sink);
    if (absl::Status s = enqueue(0); !s.ok()) return s;
    for (int64_t i = 0; i < pieces; ++i) {
      // Staging buffer (i + 1) % 2 was last read by the sink for piece i - 1, which has returned.
      if (i + 1 < pieces) {
        if (absl::Status s = enqueue(i + 1); !s.ok()) return s;
      }
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.copied[i % 2]));
      if (observer_ != nullptr) {
        times.device_to_host_seconds += ElapsedSeconds(slot.copy_start[i % 2], slot.copied[i % 2]);
      }
      const int64_t bytes = std::min(piece, total - i * piece);
      const Clock::time_point send_start = Clock::now();
      if (absl::Status s =
              writer.Append(absl::MakeConstSpan(slot.staging[i % 2], static_cast<size_t>(bytes)));
          !s.ok()) {
        return s;
      }
      times.send_seconds += SecondsSince(send_start);
    }
    const Clock::time_point send_start = Clock::now();
    if (absl::Status s = writer.Finish(); !s.ok()) return s;
    times.send_seconds += SecondsSince(send_start);
    return absl::OkStatus();
  }

  const int device_;
  const CudaBackendOptions options_;
  BackendObserver* const observer_;  // may be null
  const std::string label_;          // "cuda:<device>", the metrics' device label
  DeviceDescription description_;
  std::vector<Slot> slots_;  // sized once in Init; never reallocated
  std::mutex slots_mu_;
  std::condition_variable slot_free_;
  std::vector<Slot*> free_slots_;  // guarded by slots_mu_
  DeviceBufferCache cache_;
  std::unordered_map<const QuantizedLayer*, ResidentLayer> resident_;  // written only in Upload
  std::vector<const QuantizedLayer*> model_layers_;  // checkpoint order; written only in Upload
  // Indexed by DType (kF16, kBF16, kF32). Declared after cache_: destroyed before it, so the
  // kept output buffers go back to a live cache.
  std::array<FullModelPlan, 4> full_plans_;
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
    if (chunk_bytes < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk_bytes must be >= 1, got ", chunk_bytes));
    }
    if (source.layer == nullptr &&
        (source.host.qweight == nullptr || source.host.qzeros == nullptr ||
         source.host.scales == nullptr)) {
      return absl::InvalidArgumentError("qweight, qzeros and scales must not be null");
    }
    // Round robin over the GPUs; each worker queues requests beyond its slots.
    const size_t index = next_.fetch_add(1, std::memory_order_relaxed) % workers_.size();
    return workers_[index]->Dequantize(source, out_dtype, chunk_bytes, sink);
  }

  absl::Status DequantizeLayers(absl::Span<const QuantizedLayer* const> layers, DType out_dtype,
                                int64_t chunk_bytes, LayersSink& sink) override {
    if (chunk_bytes < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk_bytes must be >= 1, got ", chunk_bytes));
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      if (layers[i] == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", i, " is null"));
      }
      if (absl::Status s = ValidateShape(layers[i]->view.shape, out_dtype); !s.ok()) return s;
    }
    if (layers.empty()) return absl::OkStatus();
    const size_t index = next_.fetch_add(1, std::memory_order_relaxed) % workers_.size();
    return workers_[index]->DequantizeLayers(layers, out_dtype, chunk_bytes, sink);
  }

 private:
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
