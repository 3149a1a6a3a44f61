// The CPU backend: DequantizeCpu (kernels/dequant.h) over blocks of whole rows, each handed to
// the sink in chunks before the next block is computed, so memory stays at a few blocks whatever
// the size of the result. Streamed, a block is lent to the sink (ChunkSink::WriteShared) and
// reused once the transport released it: no host copy of a result byte (CpuBackend::Stream).
// A sink's byte range (ChunkSink::range()) computes only the rows that cover it and sends only
// its bytes.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/backend/backend.h"
#include "server/backend/block_pool.h"

namespace dequantd {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The host's copy rate with `threads` threads, bytes read + written per second: one warm-up, then
// one timed memcpy of 64 MiB (above the last-level cache of most hosts) cut into `threads` slices.
double MeasureHostCopyRate(int threads) {
  constexpr size_t kBytes = size_t{64} << 20;
  std::vector<uint8_t> src(kBytes, 1);
  std::vector<uint8_t> dst(kBytes, 0);
  auto copy = [&] {
    const size_t slice = (kBytes + threads - 1) / threads;
    std::vector<std::thread> workers;
    for (size_t begin = 0; begin < kBytes; begin += slice) {
      workers.emplace_back([&, begin] {
        std::memcpy(dst.data() + begin, src.data() + begin, std::min(slice, kBytes - begin));
      });
    }
    for (std::thread& worker : workers) worker.join();
  };
  copy();
  const Clock::time_point start = Clock::now();
  copy();
  const double seconds = SecondsSince(start);
  return seconds > 0 ? 2.0 * static_cast<double>(kBytes) / seconds : 0;
}

// Rows are computed in blocks of at least this many bytes, so that each threaded DequantizeCpu
// call has enough work to amortize starting its threads.
constexpr int64_t kMinBlockBytes = int64_t{1} << 20;
// A streamed call's row blocks (CpuBackend::Stream): the one being computed and the ones the
// transport still holds (bounded by HTTP/2 flow control: the stream window, a few MiB, plus the
// message being written). So a call holds at most kStreamBlocks * (window + 2 rows) of host
// memory, a stalled one included (8 MiB + 16 rows at the default 1 MiB chunks).
constexpr int kStreamBlocks = 8;
// How long a streamed call waits for one of its row blocks to come back from the transport;
// then DEADLINE_EXCEEDED (a client that stops reading is cancelled first by --stall-timeout).
constexpr std::chrono::seconds kBlockWait{120};

// Heap memory for the row blocks (freed on whichever thread releases a block last).
BlockPool::Allocator HeapAllocator() {
  return BlockPool::Allocator{
      .allocate = [](int64_t bytes) -> absl::StatusOr<uint8_t*> {
        void* block = std::malloc(static_cast<size_t>(bytes));
        if (block == nullptr) {
          return absl::ResourceExhaustedError(
              absl::StrCat("cannot allocate a row block of ", bytes, " bytes"));
        }
        return static_cast<uint8_t*>(block);
      },
      .free = [](uint8_t* block) { std::free(block); },
  };
}

// "model name" from /proc/cpuinfo, or "cpu".
std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "model name")) {
      const size_t colon = rest.find(':');
      if (colon != absl::string_view::npos) {
        return std::string(absl::StripAsciiWhitespace(rest.substr(colon + 1)));
      }
    }
  }
  return "cpu";
}

int64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? int64_t{pages} * page_size : 0;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, BackendObserver* observer)
      : threads_(threads > 0 ? threads
                             : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
        observer_(observer) {
    device_.index = 0;
    device_.name = CpuModelName();
    device_.memory_bytes = HostMemoryBytes();
    device_.label = "cpu";
    if (observer_ != nullptr) {
      observer_->SetDeviceCopyBandwidth(kDevice, MeasureHostCopyRate(threads_));
      observer_->SetDeviceMemoryUsed(kDevice, DeviceMemoryKind::kResidentWeights, 0);
      observer_->SetDeviceMemoryUsed(kDevice, DeviceMemoryKind::kBuffers, 0);
    }
  }

  BackendInfo Info() const override {
    return BackendInfo{.name = "cpu", .devices = {device_}, .cpu_threads = threads_};
  }

  absl::Status Prepare(const Checkpoint&) override { return absl::OkStatus(); }

  bool IsResident(const QuantizedLayer&) const override { return false; }

  absl::Status Dequantize(const DequantSource& source, DType out_dtype, int64_t chunk_bytes,
                          ChunkSink& sink) override {
    const QuantView view = source.view();
    if (absl::Status s = ValidateShape(view.shape, out_dtype); !s.ok()) return s;
    if (chunk_bytes < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk_bytes must be >= 1, got ", chunk_bytes));
    }
    // Rows of the result in its orientation: K rows of N for (K, N), N rows of K for (N, K).
    const int64_t K = view.shape.result_rows();
    const int64_t row_bytes = view.shape.result_cols() * DTypeSize(out_dtype);
    // The sink's byte range, and the rows that cover it: only those are computed.
    const ChunkSink::Range range = sink.range();
    const int64_t range_begin = range.offset;
    const int64_t range_end =
        range.length < 0 ? K * row_bytes : std::min(K * row_bytes, range.offset + range.length);
    if (range_begin < 0 || range_begin >= range_end) {
      return absl::InvalidArgumentError(absl::StrCat("the sink's range [", range_begin, ", ",
                                                     range_end, ") is empty or outside the ",
                                                     K * row_bytes, " bytes of the result"));
    }
    const int64_t first_row = range_begin / row_bytes;
    const int64_t last_row = (range_end + row_bytes - 1) / row_bytes;  // exclusive
    const int64_t block_target = std::max(chunk_bytes, kMinBlockBytes);
    const int64_t rows_per_block =
        std::clamp<int64_t>((block_target + row_bytes - 1) / row_bytes, 1, last_row - first_row);

    // A host destination: each block is computed in place there and Write only reports the
    // chunks it completed (Place); otherwise they are streamed (Stream). The server gives the CPU
    // backend no destination for a region (RegionSink offers one only for pinned host regions,
    // which only the CUDA backend pins), so Place serves callers that pass their own memory.
    const ResultDestination* destination = sink.destination();
    if (destination != nullptr && destination->memory != ResultDestination::Memory::kHost) {
      return absl::FailedPreconditionError(
          "the cpu backend cannot write into device memory (a device region)");
    }
    if (destination != nullptr && (range_begin != 0 || range_end != K * row_bytes)) {
      return absl::InvalidArgumentError(
          "a byte range cannot be combined with a destination: the whole result is placed there");
    }
    if (destination != nullptr && destination->bytes < K * row_bytes) {
      return absl::InternalError(absl::StrCat("the destination holds ", destination->bytes,
                                              " bytes, the result is ", K * row_bytes));
    }
    if (absl::Status s = sink.Begin(absl::StrCat("cpu threads=", threads_)); !s.ok()) return s;
    Times times;
    const absl::Status status =
        destination != nullptr
            ? Place(view, out_dtype, chunk_bytes, rows_per_block, *destination, sink, times)
            : Stream(view, out_dtype, chunk_bytes, range_begin, range_end, sink, times);
    if (!status.ok()) return status;
    if (observer_ != nullptr) {
      const QuantShape& shape = view.shape;
      observer_->ObserveStage(DequantizeStage::kKernel, times.kernel);
      observer_->ObserveStage(DequantizeStage::kSend, times.send);
      // The rows computed (all of them unless the sink asked for a range; a row a streamed
      // window boundary cuts is computed twice but counted once): their qweight rows and the
      // qzeros/scales rows of the groups they touch read, their output written. Generic: a
      // stored tensor with K rows is read for the rows computed, one with K/G rows for the groups
      // they touch, any other whole. (An (N, K) result's rows are columns n: every stored tensor
      // is counted whole.)
      const int64_t rows = last_row - first_row;
      const int64_t groups = (last_row - 1) / shape.group_size - first_row / shape.group_size + 1;
      const bool kn = shape.orientation == Orientation::kKN;
      int64_t read = 0;
      for (int r = 0; r < TensorRoleCount(shape.format); ++r) {
        const TensorSpec spec = TensorSpecOf(shape, r);
        if (!kn) {
          read += spec.bytes();
        } else if (spec.rows == K) {
          read += rows * (spec.bytes() / K);
        } else if (spec.rows == shape.groups() && spec.rows > 0) {
          read += groups * (spec.bytes() / shape.groups());
        } else {
          read += spec.bytes();
        }
      }
      observer_->ObserveKernel(kDevice, "cpu", "cpu", read, rows * row_bytes, times.kernel);
    }
    return absl::OkStatus();
  }

 private:
  struct Times {
    double kernel = 0;
    double send = 0;
  };

  // Streams result bytes [range_begin, range_end) to `sink` with no copy on the host: in windows
  // of whole chunks (at least kMinBlockBytes), each computed into a row block of a per-call
  // BlockPool and handed to the sink with the block as keepalive (ChunkSink::WriteShared; the
  // gRPC stream sends from the block and returns it to the pool when gRPC releases it). A window
  // starts on a chunk boundary, so its chunks never span two blocks; its block holds the whole
  // rows covering it, so the row a window boundary cuts is computed by both windows (at most one
  // row per window, e.g. 1.6% more work for 4096-column fp32 rows in 1 MiB windows).
  absl::Status Stream(const QuantView& view, DType out_dtype, int64_t chunk_bytes,
                      int64_t range_begin, int64_t range_end, ChunkSink& sink, Times& times) {
    const int64_t row_bytes = view.shape.result_cols() * DTypeSize(out_dtype);
    const int64_t window = (kMinBlockBytes + chunk_bytes - 1) / chunk_bytes * chunk_bytes;
    const int64_t windows = (range_end - range_begin + window - 1) / window;
    // Rows covering `window` bytes from any offset: at most ceil(window / row) + 1.
    const int64_t range_rows = (range_end + row_bytes - 1) / row_bytes - range_begin / row_bytes;
    const int64_t block_rows = std::min((window + row_bytes - 1) / row_bytes + 1, range_rows);
    absl::StatusOr<std::unique_ptr<BlockPool>> pool = BlockPool::Create(
        static_cast<int>(std::min<int64_t>(kStreamBlocks, windows)), block_rows * row_bytes,
        HeapAllocator(), "the row blocks of a cpu backend call");
    if (!pool.ok()) return pool.status();
    BufferUse buffer_use(*this, (*pool)->count() * (*pool)->block_bytes());
    for (int64_t begin = range_begin; begin < range_end;) {
      const int64_t end = std::min(range_end, begin + window);
      const int64_t row = begin / row_bytes;
      const int64_t row_end = (end + row_bytes - 1) / row_bytes;
      const Clock::time_point wait_start = Clock::now();
      absl::StatusOr<BlockPool::Block> block = (*pool)->Acquire(kBlockWait);
      times.send += SecondsSince(wait_start);  // waiting for the transport to send
      if (!block.ok()) return block.status();
      const Clock::time_point kernel_start = Clock::now();
      if (absl::Status s = DequantizeCpu(view, out_dtype, row, row_end, block->get(), threads_);
          !s.ok()) {
        return s;
      }
      times.kernel += SecondsSince(kernel_start);
      const Clock::time_point send_start = Clock::now();
      for (int64_t at = begin; at < end; at += chunk_bytes) {
        const absl::Span<const uint8_t> chunk(block->get() + (at - row * row_bytes),
                                              static_cast<size_t>(std::min(chunk_bytes, end - at)));
        if (absl::Status s = sink.WriteShared(at, chunk, *block); !s.ok()) return s;
      }
      times.send += SecondsSince(send_start);
      begin = end;
    }
    return absl::OkStatus();
  }

  // Computes the whole result in place in `destination` (a host shared-memory region), block by
  // block, and reports the whole chunks each block completed through Write.
  absl::Status Place(const QuantView& view, DType out_dtype, int64_t chunk_bytes,
                     int64_t rows_per_block, const ResultDestination& destination, ChunkSink& sink,
                     Times& times) {
    const int64_t K = view.shape.result_rows();  // rows of the result (N for (N, K))
    const int64_t row_bytes = view.shape.result_cols() * DTypeSize(out_dtype);
    int64_t reported = 0;  // result bytes reported through Write so far
    // Reports the whole chunks of [reported, done) (all of it when `last`).
    const auto report = [&](int64_t done, bool last) -> absl::Status {
      while (reported < done && (last || done - reported >= chunk_bytes)) {
        const int64_t n = std::min(chunk_bytes, done - reported);
        if (absl::Status s =
                sink.Write(reported, absl::Span<const uint8_t>(destination.data + reported, n));
            !s.ok()) {
          return s;
        }
        reported += n;
      }
      return absl::OkStatus();
    };
    for (int64_t row = 0; row < K; row += rows_per_block) {
      const int64_t row_end = std::min(K, row + rows_per_block);
      const Clock::time_point kernel_start = Clock::now();
      if (absl::Status s = DequantizeCpu(view, out_dtype, row, row_end,
                                         destination.data + row * row_bytes, threads_);
          !s.ok()) {
        return s;
      }
      times.kernel += SecondsSince(kernel_start);
      const Clock::time_point send_start = Clock::now();
      if (absl::Status s = report(row_end * row_bytes, false); !s.ok()) return s;
      times.send += SecondsSince(send_start);
    }
    const Clock::time_point send_start = Clock::now();
    if (absl::Status s = report(K * row_bytes, true); !s.ok()) return s;
    times.send += SecondsSince(send_start);
    return absl::OkStatus();
  }

  static constexpr char kDevice[] = "cpu";  // the `device` label (DeviceLabel("cpu", 0))

  // Counts a request's block buffer in the kBuffers memory reported while it lives.
  class BufferUse {
   public:
    BufferUse(CpuBackend& backend, int64_t bytes) : backend_(backend), bytes_(bytes) {
      backend_.AddBufferBytes(bytes_);
    }
    ~BufferUse() { backend_.AddBufferBytes(-bytes_); }
    BufferUse(const BufferUse&) = delete;
    BufferUse& operator=(const BufferUse&) = delete;

   private:
    CpuBackend& backend_;
    const int64_t bytes_;
  };

  // Reported under the lock so that the last report is the current total.
  void AddBufferBytes(int64_t delta) {
    if (observer_ == nullptr) return;
    std::lock_guard<std::mutex> lock(buffer_mu_);
    buffer_bytes_ += delta;
    observer_->SetDeviceMemoryUsed(kDevice, DeviceMemoryKind::kBuffers, buffer_bytes_);
  }

  const int threads_;
  BackendObserver* const observer_;
  DeviceDescription device_;
  std::mutex buffer_mu_;
  int64_t buffer_bytes_ = 0;  // block buffers of the requests running now; guarded by buffer_mu_
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads, BackendObserver* observer) {
  return std::make_unique<CpuBackend>(threads, observer);
}

}  // namespace dequantd
