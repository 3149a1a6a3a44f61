// The CPU backend: DequantizeCpu (kernels/dequant.h) over blocks of whole rows; each block is cut
// into chunks by ChunkWriter and handed to the sink before the next block is computed, so memory
// stays at one block whatever the size of the result.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/backend.h"
#include "server/chunk_writer.h"

namespace dequantd {
namespace {

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
  explicit CpuBackend(int threads)
      : threads_(threads > 0 ? threads
                             : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {
    device_.index = 0;
    device_.name = CpuModelName();
    device_.memory_bytes = HostMemoryBytes();
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
    const int64_t block_target = std::max(chunk_bytes, kMinBlockBytes);
    const int64_t rows_per_block =
        std::clamp<int64_t>((block_target + row_bytes - 1) / row_bytes, 1, K);

    if (absl::Status s = sink.Begin(absl::StrCat("cpu threads=", threads_)); !s.ok()) return s;
    std::vector<uint8_t> block(static_cast<size_t>(rows_per_block * row_bytes));
    ChunkWriter writer(chunk_bytes, sink);
    for (int64_t row = 0; row < K; row += rows_per_block) {
      const int64_t row_end = std::min(K, row + rows_per_block);
      if (absl::Status s = DequantizeCpu(view, out_dtype, row, row_end, block.data(), threads_);
          !s.ok()) {
        return s;
      }
      const absl::Span<const uint8_t> bytes(block.data(),
                                            static_cast<size_t>((row_end - row) * row_bytes));
      if (absl::Status s = writer.Append(bytes); !s.ok()) return s;
    }
    return writer.Finish();
  }

 private:
  const int threads_;
  DeviceDescription device_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace dequantd
