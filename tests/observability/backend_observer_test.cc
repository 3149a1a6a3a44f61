// What the backends report to their BackendObserver (server/backend/backend_observer.h): the copy
// rate and memory at start, the stages of a Dequantize call, and one kernel run with its exact
// bytes. The CUDA cases skip without a GPU.
#include "server/backend/backend_observer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/backend/backend.h"
#include "tests/server/test_layer.h"
#if DEQUANTD_HAVE_CUDA
#include "server/backend/cuda/cuda_backend.h"
#endif

namespace dequantd {
namespace {

using ::dequantd::testing::PackedLayer;
using ::dequantd::testing::RandomPackedLayer;
using ::testing::ElementsAre;

struct KernelRun {
  std::string device, backend, variant;
  int64_t read_bytes = 0;
  int64_t written_bytes = 0;
  double seconds = 0;
};

// Records every call (thread-safe, as the interface requires).
class RecordingObserver final : public BackendObserver {
 public:
  void ObserveStage(DequantizeStage stage, double seconds) override {
    std::lock_guard<std::mutex> lock(mu_);
    stages.emplace_back(stage, seconds);
  }
  void ObserveKernel(std::string_view device, std::string_view backend, std::string_view variant,
                     int64_t read_bytes, int64_t written_bytes, double seconds) override {
    std::lock_guard<std::mutex> lock(mu_);
    kernels.push_back({std::string(device), std::string(backend), std::string(variant), read_bytes,
                       written_bytes, seconds});
  }
  void SetDeviceCopyBandwidth(std::string_view device, double bytes_per_second) override {
    std::lock_guard<std::mutex> lock(mu_);
    copy_rate[std::string(device)] = bytes_per_second;
  }
  void SetDeviceMemoryUsed(std::string_view device, DeviceMemoryKind kind, int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    memory[{std::string(device), kind}] = bytes;
    if (kind == DeviceMemoryKind::kBuffers) peak_buffers = std::max(peak_buffers, bytes);
  }

  std::vector<DequantizeStage> StageNames() const {
    std::vector<DequantizeStage> names;
    for (const auto& [stage, seconds] : stages) names.push_back(stage);
    return names;
  }

  std::vector<std::pair<DequantizeStage, double>> stages;
  std::vector<KernelRun> kernels;
  std::map<std::string, double> copy_rate;
  std::map<std::pair<std::string, DeviceMemoryKind>, int64_t> memory;
  int64_t peak_buffers = 0;

 private:
  std::mutex mu_;
};

// Accepts everything; fails the Write number `fail_at` (0-based) when >= 0.
class CountingSink final : public ChunkSink {
 public:
  explicit CountingSink(int fail_at = -1) : fail_at_(fail_at) {}
  absl::Status Begin(const std::string&) override { return absl::OkStatus(); }
  absl::Status Write(int64_t, absl::Span<const uint8_t> bytes) override {
    if (writes_++ == fail_at_) return absl::CancelledError("client went away");
    bytes_ += static_cast<int64_t>(bytes.size());
    return absl::OkStatus();
  }
  int64_t bytes() const { return bytes_; }

 private:
  const int fail_at_;
  int writes_ = 0;
  int64_t bytes_ = 0;
};

// 256 x 512, G = 128: qweight 256 * 64 * 4 = 65536, qzeros 2 * 64 * 4 = 512, scales 2 * 512 * 2 =
// 2048 bytes read; 256 * 512 * 2 = 262144 bytes of fp16 written.
constexpr int64_t kReadBytes = 65536 + 512 + 2048;
constexpr int64_t kWrittenBytes = 262144;

PackedLayer TestLayer() { return RandomPackedLayer({.K = 256, .N = 512, .group_size = 128}, 7); }

TEST(BackendObserverTest, CpuBackendReportsCopyRateKernelAndSendStagesAndExactBytes) {
  RecordingObserver observer;
  std::unique_ptr<Backend> backend = MakeCpuBackend(2, &observer);
  EXPECT_GT(observer.copy_rate["cpu"], 0);
  EXPECT_EQ((observer.memory[{"cpu", DeviceMemoryKind::kResidentWeights}]), 0);

  const PackedLayer layer = TestLayer();
  DequantSource source;
  source.host = layer.view();
  CountingSink sink;
  ASSERT_TRUE(backend->Dequantize(source, DType::kF16, 64 << 10, sink).ok());
  EXPECT_EQ(sink.bytes(), kWrittenBytes);

  EXPECT_THAT(observer.StageNames(), ElementsAre(DequantizeStage::kKernel, DequantizeStage::kSend));
  ASSERT_EQ(observer.kernels.size(), 1u);
  const KernelRun& run = observer.kernels[0];
  EXPECT_EQ(run.device, "cpu");
  EXPECT_EQ(run.backend, "cpu");
  EXPECT_EQ(run.variant, "cpu");
  EXPECT_EQ(run.read_bytes, kReadBytes);
  EXPECT_EQ(run.written_bytes, kWrittenBytes);
  EXPECT_GT(run.seconds, 0);
  // The row-block buffer was counted while the call ran and released after it.
  EXPECT_GT(observer.peak_buffers, 0);
  EXPECT_EQ((observer.memory[{"cpu", DeviceMemoryKind::kBuffers}]), 0);
}

TEST(BackendObserverTest, CpuBackendReportsNoKernelForACallThatFailed) {
  RecordingObserver observer;
  std::unique_ptr<Backend> backend = MakeCpuBackend(1, &observer);
  const PackedLayer layer = TestLayer();
  DequantSource source;
  source.host = layer.view();
  CountingSink sink(/*fail_at=*/0);
  EXPECT_EQ(backend->Dequantize(source, DType::kF16, 64 << 10, sink).code(),
            absl::StatusCode::kCancelled);
  EXPECT_TRUE(observer.stages.empty());
  EXPECT_TRUE(observer.kernels.empty());
  EXPECT_EQ((observer.memory[{"cpu", DeviceMemoryKind::kBuffers}]), 0);
}

TEST(BackendObserverTest, BackendWithoutObserverStillWorks) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1, nullptr);
  const PackedLayer layer = TestLayer();
  DequantSource source;
  source.host = layer.view();
  CountingSink sink;
  ASSERT_TRUE(backend->Dequantize(source, DType::kF16, 64 << 10, sink).ok());
  EXPECT_EQ(sink.bytes(), kWrittenBytes);
}

TEST(BackendObserverTest, DeviceLabels) {
  EXPECT_EQ(DeviceLabel("cpu", 0), "cpu");
  EXPECT_EQ(DeviceLabel("cuda", 0), "cuda:0");
  EXPECT_EQ(DeviceLabel("cuda", 3), "cuda:3");
}

#if DEQUANTD_HAVE_CUDA
TEST(BackendObserverTest, CudaBackendReportsEveryStageOfAnInlineCallAndTheCopyRate) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  RecordingObserver observer;
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend({}, &observer);
  ASSERT_TRUE(backend.ok()) << backend.status();
  // Measured once at start with a 256 MiB device-to-device copy: more than 10 GB/s on any GPU.
  EXPECT_GT(observer.copy_rate["cuda:0"], 1e10);
  EXPECT_EQ((observer.memory[{"cuda:0", DeviceMemoryKind::kBuffers}]), 0);

  const PackedLayer layer = TestLayer();
  DequantSource source;
  source.host = layer.view();
  CountingSink sink;
  ASSERT_TRUE((*backend)->Dequantize(source, DType::kF16, 64 << 10, sink).ok());
  EXPECT_EQ(sink.bytes(), kWrittenBytes);

  EXPECT_THAT(observer.StageNames(),
              ElementsAre(DequantizeStage::kQueueWait, DequantizeStage::kHostToDevice,
                          DequantizeStage::kKernel, DequantizeStage::kDeviceToHost,
                          DequantizeStage::kSend));
  for (const auto& [stage, seconds] : observer.stages) {
    if (stage != DequantizeStage::kQueueWait) {
      EXPECT_GT(seconds, 0) << static_cast<int>(stage);
    }
  }
  ASSERT_EQ(observer.kernels.size(), 1u);
  const KernelRun& run = observer.kernels[0];
  EXPECT_EQ(run.device, "cuda:0");
  EXPECT_EQ(run.backend, "cuda");
  EXPECT_EQ(run.variant, "v4_vec16");
  EXPECT_EQ(run.read_bytes, kReadBytes);
  EXPECT_EQ(run.written_bytes, kWrittenBytes);
  EXPECT_GT(run.seconds, 0);
  // Output + inline-input buffers stay cached: at least the output is still held.
  EXPECT_GE((observer.memory[{"cuda:0", DeviceMemoryKind::kBuffers}]), kWrittenBytes);
}
#endif

}  // namespace
}  // namespace dequantd
