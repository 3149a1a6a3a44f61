// The one result pipeline (see result_pipeline.h).
#include "server/backend/cuda/result_pipeline.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "server/backend/backend_observer.h"
#include "server/backend/block_pool.h"
#include "server/backend/chunk_writer.h"
#include "server/backend/cuda/host_staging.h"
#include "server/backend/cuda/packed_upload.h"
#include "server/backend/result_slabs.h"

namespace dequantd::cuda {
namespace {

// Each result inside a slab buffer starts on this boundary (the kernels need 16 bytes).
constexpr int64_t kResultAlign = 256;
// The kernels' alignment for an output written straight into destination memory.
constexpr uintptr_t kKernelOutputAlign = 16;

using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Adds `base` to every Write offset: a range's bytes keep their result offsets.
class OffsetSink final : public ChunkSink {
 public:
  OffsetSink(ChunkSink& sink, int64_t base) : sink_(sink), base_(base) {}
  absl::Status Begin(const std::string& kernel) override { return sink_.Begin(kernel); }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> bytes) override {
    return sink_.Write(base_ + offset, bytes);
  }
  absl::Status WriteShared(int64_t offset, absl::Span<const uint8_t> bytes,
                           std::shared_ptr<const void> keepalive) override {
    return sink_.WriteShared(base_ + offset, bytes, std::move(keepalive));
  }

 private:
  ChunkSink& sink_;
  const int64_t base_;
};

// Seconds spent per stage by one call.
struct StageTimes {
  double queue = 0;
  double host_to_device = 0;
  double kernel = 0;
  double device_to_host = 0;
  double send = 0;
};

// One Run: the slot, the sink and where each entry's bytes go.
class PipelineCall {
 public:
  PipelineCall(const PipelineOptions& options, RequestSlot& slot, int64_t chunk_bytes,
               ChunkSink& sink, const ResultDestination* destination, StageTimes& times)
      : options_(options),
        slot_(slot),
        chunk_bytes_(chunk_bytes),
        sink_(sink),
        destination_(destination),
        times_(times) {}

  // Delivers `range` of the result at device address `result` (null when the kernel wrote it
  // straight into the destination at `position`). `after_last_copy` runs once, right after the
  // last copy is enqueued (or at once when there is none): it launches the next slab there, so
  // that slab computes while this one's last pieces are copied and sent, and every copy out of
  // this slab precedes the next launch in stream order.
  //
  // Without a destination, each piece is copied into a staging block of the slot's pool and its
  // chunks go to the sink with the block as keepalive (ChunkSink::WriteShared): the gRPC stream
  // sends them from the block, which returns to the pool when gRPC releases the last of them. A
  // block is handed to a copy only once it came back (BlockPool::Acquire), so no copy ever
  // writes bytes the transport may still send; a block whose copy may still be in flight is
  // never released before the stream is drained (`settle` below).
  absl::Status Deliver(const uint8_t* result, const ByteRange& range, int64_t position,
                       const std::function<absl::Status()>& after_last_copy) {
    if (result == nullptr) {
      if (absl::Status s = after_last_copy(); !s.ok()) return s;
      return Progress(destination_->data + position, range.begin, range.size());
    }
    const bool staged = destination_ == nullptr;
    const int64_t piece =
        staged ? PieceBytes(slot_.staging_bytes, chunk_bytes_)
               : PieceBytes(std::max(options_.destination_piece_bytes, chunk_bytes_), chunk_bytes_);
    const int64_t pieces = (range.size() + piece - 1) / piece;
    if (pieces == 0) return after_last_copy();
    const cudaMemcpyKind kind =
        !staged && destination_->memory == ResultDestination::Memory::kDevice
            ? cudaMemcpyDeviceToDevice
            : cudaMemcpyDeviceToHost;
    cudaStream_t stream = slot_.stream.get();
    // Staged: the block piece i lands in, held here (at i % 2) from its copy until the sink has
    // its chunks; at most two pieces are in flight.
    std::array<BlockPool::Block, 2> blocks;
    // On an early return a copy into a block held above may still be running: wait for the
    // stream before the block goes back to the pool (declared after `blocks`, so it runs first).
    absl::Cleanup settle = [&] {
      if (blocks[0] != nullptr || blocks[1] != nullptr) cudaStreamSynchronize(stream);
    };
    // Where piece i lands: a staging block (acquired here), or its own place in the destination.
    auto land = [&](int64_t i) -> absl::StatusOr<uint8_t*> {
      if (!staged) return destination_->data + position + i * piece;
      const Clock::time_point wait_start = Clock::now();
      absl::StatusOr<BlockPool::Block> block =
          slot_.staging->Acquire(std::chrono::duration_cast<Clock::duration>(
              std::chrono::duration<double>(options_.staging_wait_seconds)));
      times_.send += SecondsSince(wait_start);  // waiting for the transport to send
      if (!block.ok()) {
        return absl::Status(
            block.status().code(),
            absl::StrCat(block.status().message(),
                         " (a staging block returns when gRPC has sent the result bytes in it: "
                         "the client stopped reading or the transport is stuck)"));
      }
      blocks[i % 2] = std::move(*block);
      return blocks[i % 2].get();
    };
    auto enqueue = [&](int64_t i) -> absl::Status {
      const int64_t bytes = std::min(piece, range.size() - i * piece);
      absl::StatusOr<uint8_t*> to = land(i);
      if (!to.ok()) return to.status();
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot_.copy_start[i % 2].get(), stream));
      DEQUANTD_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(*to, result + range.begin + i * piece, bytes, kind, stream));
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot_.copied[i % 2].get(), stream));
      return absl::OkStatus();
    };
    OffsetSink offset_sink(sink_, range.begin);
    ChunkWriter writer(chunk_bytes_, offset_sink);
    if (absl::Status s = enqueue(0); !s.ok()) return s;
    if (pieces == 1) {
      if (absl::Status s = after_last_copy(); !s.ok()) return s;
    }
    for (int64_t i = 0; i < pieces; ++i) {
      // Events (i + 1) % 2 were last used by piece i - 1, whose copy was waited for.
      if (i + 1 < pieces) {
        if (absl::Status s = enqueue(i + 1); !s.ok()) return s;
        if (i + 2 == pieces) {
          if (absl::Status s = after_last_copy(); !s.ok()) return s;
        }
      }
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot_.copied[i % 2].get()));
      times_.device_to_host +=
          ElapsedSeconds(slot_.copy_start[i % 2].get(), slot_.copied[i % 2].get());
      const int64_t bytes = std::min(piece, range.size() - i * piece);
      if (!staged) {
        const uint8_t* placed = destination_->data + position + i * piece;
        if (absl::Status s = Progress(placed, range.begin + i * piece, bytes); !s.ok()) return s;
        continue;
      }
      // The copy is done: the block's bytes are final. The sink takes its own references (the
      // gRPC stream one per message); ours goes at the end of this iteration.
      const BlockPool::Block block = std::move(blocks[i % 2]);
      const absl::Span<const uint8_t> bytes_in_block(block.get(), static_cast<size_t>(bytes));
      const Clock::time_point send_start = Clock::now();
      const absl::Status s = i + 1 < pieces ? writer.Append(bytes_in_block, block)
                                            : writer.AppendLast(bytes_in_block, block);
      times_.send += SecondsSince(send_start);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  // One progress report for `bytes` placed at `placed` (result offset `offset`): the sink checks
  // bounds, cancellation and unregistration there and copies nothing. One report per placed piece
  // (a whole result when the kernel wrote it), not per chunk: a report costs the sink a few
  // microseconds (checks, metrics), which per 1 MiB chunk added up to a millisecond on a 470 MB
  // result that the kernel writes in 0.15 ms.
  absl::Status Progress(const uint8_t* placed, int64_t offset, int64_t bytes) {
    const Clock::time_point send_start = Clock::now();
    const absl::Status s =
        sink_.Write(offset, absl::MakeConstSpan(placed, static_cast<size_t>(bytes)));
    times_.send += SecondsSince(send_start);
    return s;
  }

  const PipelineOptions& options_;
  RequestSlot& slot_;
  const int64_t chunk_bytes_;
  ChunkSink& sink_;
  const ResultDestination* const destination_;
  StageTimes& times_;
};

}  // namespace

absl::Status ResultPipeline::Run(ResultJob& job, const SlabLauncher& launch, int64_t chunk_bytes,
                                 ChunkSink& sink, LayersSink* layers, PartTurn* turn) {
  const ResultDestination* destination = sink.destination();
  if (destination != nullptr && destination->memory == ResultDestination::Memory::kDevice &&
      destination->device != options_.device) {
    return absl::FailedPreconditionError(
        absl::StrCat("the destination is memory of CUDA device ", destination->device,
                     " but this call runs on CUDA device ", options_.device,
                     "; results are written only into memory of the device that computes them"));
  }
  // The bytes of each entry to deliver, and where they land in the destination.
  std::vector<ByteRange> ranges(job.entries.size());
  std::vector<int64_t> positions(job.entries.size());
  const ChunkSink::Range asked = sink.range();
  if (layers != nullptr && (asked.offset != 0 || asked.length != -1)) {
    return absl::InvalidArgumentError(
        "offset and length: DequantizeLayers delivers whole layers, not a byte range");
  }
  int64_t delivered = 0;
  bool direct = destination != nullptr && destination->memory == ResultDestination::Memory::kDevice;
  for (size_t i = 0; i < job.entries.size(); ++i) {
    absl::StatusOr<ByteRange> range = ResolveRange(asked, job.entries[i].result_bytes);
    if (!range.ok()) return range.status();
    ranges[i] = *range;
    positions[i] = delivered;
    delivered += range->size();
    direct =
        direct && range->size() == job.entries[i].result_bytes &&
        reinterpret_cast<uintptr_t>(destination->data + positions[i]) % kKernelOutputAlign == 0;
  }
  if (destination != nullptr && destination->bytes < delivered) {
    return absl::InvalidArgumentError(absl::StrCat("the destination holds ", destination->bytes,
                                                   " bytes but the result has ", delivered));
  }

  StageTimes times;
  const Clock::time_point queue_start = Clock::now();
  // A part of a call cut over several workers takes its slot only once the parts before it hold
  // theirs (PartTurn: else later parts waiting in their sink calls can hold every slot that the
  // call's first part, or another call's, needs); run again after its GPU failed, it takes a free
  // slot or none.
  absl::StatusOr<LeasePool<RequestSlot>::Lease> taken = TakeInTurn(slots_, turn, slot_name_);
  if (!taken.ok()) return taken.status();
  LeasePool<RequestSlot>::Lease slot = *std::move(taken);
  times.queue = SecondsSince(queue_start);
  cudaStream_t stream = slot->stream.get();

  // A staged input's bytes in the input buffer (each starts on kResultAlign).
  auto staged_bytes = [&](size_t i) -> int64_t {
    if (!job.entries[i].staged) return 0;
    const int64_t bytes = PackedLayout(job.entries[i].host.shape).total_bytes;
    return (bytes + kResultAlign - 1) / kResultAlign * kResultAlign;
  };
  // Slabs: consecutive entries computed by one launch. Straight into a device destination, every
  // entry is its own output and one launch computes them all, unless their staged inputs exceed
  // slab_bytes: then one launch per slab_bytes of staged input.
  std::vector<SlabEntry> slab_entries;
  for (size_t i = 0; i < job.entries.size(); ++i) {
    slab_entries.push_back(
        SlabEntry{.result = direct ? static_cast<int64_t>(i) : job.entries[i].result,
                  .result_bytes = job.entries[i].result_bytes,
                  .staged_bytes = staged_bytes(i)});
  }
  const std::vector<Slab> slabs =
      PlanSlabs(slab_entries, direct ? std::numeric_limits<int64_t>::max() : options_.slab_bytes,
                kResultAlign, options_.slab_bytes);

  // Declaration order matters: on every exit the stream is drained (cleanup below) before the
  // buffers go back to the cache and the slot to the pool.
  DeviceBuffer input;
  int64_t largest_input = 0;
  for (const Slab& slab : slabs) largest_input = std::max(largest_input, slab.staged_bytes);
  if (largest_input > 0) {
    absl::StatusOr<DeviceBuffer> buffer = buffers_.Acquire(largest_input);
    if (!buffer.ok()) {
      return absl::Status(
          buffer.status().code(),
          absl::StrCat("staged inputs need ", largest_input, " bytes of device memory on device ",
                       options_.device, ": ", buffer.status().message()));
    }
    input = std::move(*buffer);
  }
  std::vector<DeviceBuffer> slab_buffers;
  if (!direct) {
    int64_t largest = 0;
    for (const Slab& slab : slabs) largest = std::max(largest, slab.bytes);
    for (size_t b = 0; b < std::min<size_t>(2, slabs.size()); ++b) {
      absl::StatusOr<DeviceBuffer> buffer = buffers_.Acquire(largest);
      if (!buffer.ok()) {
        return absl::Status(
            buffer.status().code(),
            absl::StrCat("a result slab needs ", largest, " bytes of device memory", " on device ",
                         options_.device, ": ", buffer.status().message()));
      }
      slab_buffers.push_back(std::move(*buffer));
    }
  }
  absl::Cleanup drain = [stream] { cudaStreamSynchronize(stream); };

  // Every slab's staged inputs go into the one input buffer: in stream order, slab s's kernel has
  // read them before slab s + 1's copies overwrite them.
  PinnedStager stager({slot->upload[0].get(), slot->upload[1].get()}, kUploadBufferBytes,
                      {slot->uploaded[0].get(), slot->uploaded[1].get()}, stream);
  std::array<bool, 2> slab_staged{};  // per slab parity: h2d events recorded around its staging
  auto stage_slab = [&](size_t s) -> absl::Status {
    slab_staged[s % 2] = false;
    int64_t at = 0;
    for (size_t i : slabs[s].distinct) {
      if (!job.entries[i].staged) continue;
      if (!slab_staged[s % 2]) {
        DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot->h2d_start[s % 2].get(), stream));
        slab_staged[s % 2] = true;
      }
      absl::StatusOr<QuantView> staged = stager.CopyPacked(job.entries[i].host, input.get() + at);
      if (!staged.ok()) return staged.status();
      job.entries[i].in = *staged;
      at += staged_bytes(i);
    }
    if (slab_staged[s % 2]) {
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot->h2d_end[s % 2].get(), stream));
    }
    return absl::OkStatus();
  };
  bool any_staged = false;

  // Where entry i's result is computed: its slab buffer, or the destination itself.
  auto output_of = [&](size_t s, size_t i) -> uint8_t* {
    if (direct) return destination->data + positions[i];
    return slab_buffers[s % 2].get() + slabs[s].offsets[i - slabs[s].first];
  };
  int64_t read_bytes = 0;
  int64_t written_bytes = 0;
  auto launch_slab = [&](size_t s) -> absl::StatusOr<std::string> {
    if (absl::Status st = stage_slab(s); !st.ok()) return st;
    any_staged = any_staged || slab_staged[s % 2];
    std::vector<GroupedItem> items;
    items.reserve(slabs[s].distinct.size());
    for (size_t i : slabs[s].distinct) {
      items.push_back(GroupedItem{.in = job.entries[i].in, .out = output_of(s, i)});
      const QuantShape& shape = job.entries[i].in.shape;
      read_bytes += shape.packed_bytes();
      written_bytes += job.entries[i].result_bytes;
    }
    absl::StatusOr<std::string> kernel =
        launch(SlabLaunch{.items = items,
                          .out_dtype = job.out_dtype,
                          .stream = stream,
                          .into_destination = direct,
                          .started = slot->kernel_start[s % 2].get()});
    if (!kernel.ok()) return kernel.status();
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot->kernel_end[s % 2].get(), stream));
    return kernel;
  };

  if (!slabs.empty()) {
    absl::StatusOr<std::string> kernel = launch_slab(0);
    if (!kernel.ok()) return kernel.status();
    if (absl::Status s = sink.Begin(*kernel); !s.ok()) return s;
  }
  PipelineCall call(options_, *slot, chunk_bytes, sink, destination, times);
  for (size_t s = 0; s < slabs.size(); ++s) {
    bool next_launched = s + 1 >= slabs.size();
    const std::function<absl::Status()> no_op = [] { return absl::OkStatus(); };
    const std::function<absl::Status()> launch_next = [&]() -> absl::Status {
      if (next_launched) return absl::OkStatus();
      next_launched = true;
      absl::StatusOr<std::string> kernel = launch_slab(s + 1);
      return kernel.status();
    };
    // The slab's kernel is done before anything is copied out of its buffer; it ran while the
    // previous slab's last piece was sent. A direct destination needs no copy: its progress
    // reports (BeginLayer and one Write per result: bounds checks, a cancellation poll at most
    // every millisecond; region calls send no headers during the call) are made while the kernel
    // still writes, and the wait after the loop keeps the rule that Run returns only once the
    // bytes are there. (Reported after the kernel, the 224 results of an 8B-shaped model once
    // added ~7 ms of per-layer header writes and cancellation polls to a 4.6 ms kernel.)
    if (!direct) {
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot->kernel_end[s % 2].get()));
    }
    for (size_t i = slabs[s].first; i < slabs[s].end; ++i) {
      if (layers != nullptr) {
        if (absl::Status st = layers->BeginLayer(static_cast<int64_t>(i)); !st.ok()) return st;
      }
      if (absl::Status st = call.Deliver(direct ? nullptr : output_of(s, i), ranges[i],
                                         positions[i], i + 1 == slabs[s].end ? launch_next : no_op);
          !st.ok()) {
        return st;
      }
    }
    if (absl::Status st = launch_next(); !st.ok()) return st;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot->kernel_end[s % 2].get()));
    times.kernel += ElapsedSeconds(slot->kernel_start[s % 2].get(), slot->kernel_end[s % 2].get());
    if (slab_staged[s % 2]) {
      times.host_to_device +=
          ElapsedSeconds(slot->h2d_start[s % 2].get(), slot->h2d_end[s % 2].get());
    }
  }
  if (observer_ == nullptr) return absl::OkStatus();
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  observer_->ObserveStage(DequantizeStage::kQueueWait, times.queue);
  if (any_staged) observer_->ObserveStage(DequantizeStage::kHostToDevice, times.host_to_device);
  observer_->ObserveStage(DequantizeStage::kKernel, times.kernel);
  observer_->ObserveStage(DequantizeStage::kDeviceToHost, times.device_to_host);
  observer_->ObserveStage(DequantizeStage::kSend, times.send);
  observer_->ObserveKernel(label_, "cuda", job.variant, read_bytes, written_bytes, times.kernel);
  return absl::OkStatus();
}

}  // namespace dequantd::cuda
