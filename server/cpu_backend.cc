// The CPU backend: DequantizeCpu (kernels/dequant.h) over blocks of whole rows; each block is cut
// into chunks by ChunkWriter and handed to the sink before the next block is computed, so memory
// stays at one block whatever the size of the result. A sink's byte range (ChunkSink::range())
// computes only the rows that cover it and sends only its bytes.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/backend.h"
#include "server/chunk_writer.h"

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
    const PackedTensorView& view = source.layer != nullptr ? source.layer->view : source.host;
    if (absl::Status s = ValidateShape(view.shape, out_dtype); !s.ok()) return s;
    if (chunk_bytes < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk_bytes must be >= 1, got ", chunk_bytes));
    }
    const int64_t K = view.shape.K;
    const int64_t row_bytes = view.shape.N * DTypeSize(out_dtype);
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

    // A host destination (a shared-memory region): each block is computed in place there and
    // Write only reports the chunks it completed; otherwise blocks go through `block`.
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
    std::vector<uint8_t> block(
        destination != nullptr ? 0 : static_cast<size_t>(rows_per_block * row_bytes));
    BufferUse buffer_use(*this, static_cast<int64_t>(block.size()));
    double kernel_seconds = 0;
    double send_seconds = 0;
    ChunkWriter writer(chunk_bytes, sink, range_begin);
    int64_t reported = 0;  // destination: result bytes reported through Write so far
    // Reports the whole chunks of the destination's [reported, done) (all of it when `last`).
    const auto report = [&](int64_t done, bool last) -> absl::Status {
      while (reported < done && (last || done - reported >= chunk_bytes)) {
        const int64_t n = std::min(chunk_bytes, done - reported);
        if (absl::Status s =
                sink.Write(reported, absl::Span<const uint8_t>(destination->data + reported, n));
            !s.ok()) {
          return s;
        }
        reported += n;
      }
      return absl::OkStatus();
    };
    for (int64_t row = first_row; row < last_row; row += rows_per_block) {
      const int64_t row_end = std::min(last_row, row + rows_per_block);
      uint8_t* out = destination != nullptr ? destination->data + row * row_bytes : block.data();
      const Clock::time_point kernel_start = Clock::now();
      if (absl::Status s = DequantizeCpu(view, out_dtype, row, row_end, out, threads_); !s.ok()) {
        return s;
      }
      kernel_seconds += SecondsSince(kernel_start);
      // The block holds result bytes [row * row_bytes, row_end * row_bytes): send those inside
      // the range.
      const int64_t begin = std::max(range_begin, row * row_bytes);
      const int64_t end = std::min(range_end, row_end * row_bytes);
      const absl::Span<const uint8_t> bytes(out + (begin - row * row_bytes),
                                            static_cast<size_t>(end - begin));
      const Clock::time_point send_start = Clock::now();
      if (absl::Status s =
              destination != nullptr ? report(row_end * row_bytes, false) : writer.Append(bytes);
          !s.ok()) {
        return s;
      }
      send_seconds += SecondsSince(send_start);
    }
    const Clock::time_point send_start = Clock::now();
    if (absl::Status s = destination != nullptr ? report(K * row_bytes, true) : writer.Finish();
        !s.ok()) {
      return s;
    }
    send_seconds += SecondsSince(send_start);
    if (observer_ != nullptr) {
      const AwqShape& shape = view.shape;
      observer_->ObserveStage(DequantizeStage::kKernel, kernel_seconds);
      observer_->ObserveStage(DequantizeStage::kSend, send_seconds);
      // The rows computed (all of them unless the sink asked for a range): their qweight rows
      // and the qzeros/scales rows of the groups they touch read, their output written.
      const int64_t rows = last_row - first_row;
      const int64_t groups = (last_row - 1) / shape.group_size - first_row / shape.group_size + 1;
      const int64_t read =
          rows * (shape.qweight_bytes() / K) +
          groups * ((shape.qzeros_bytes() + shape.scales_bytes()) / shape.groups());
      observer_->ObserveKernel(kDevice, "cpu", "cpu", read, rows * row_bytes, kernel_seconds);
    }
    return absl::OkStatus();
  }

 private:
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
