// Tests for the CUDA backend (server/cuda_backend.cc), run on a GPU and skipped without one:
// every streamed result equals DequantizeReference byte for byte, for inline inputs and for
// layers made resident by Prepare; chunking (including chunks larger than a staging buffer);
// the LaunchConfigProvider seam; a sink error releasing the slot; concurrent requests.
#if DEQUANTD_HAVE_CUDA

#include <stdlib.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend.h"
#include "server/checkpoint.h"
#include "server/cuda_backend.h"
#include "tests/server/test_layer.h"

namespace dequantd {
namespace {

using ::dequantd::testing::PackedLayer;
using ::dequantd::testing::RandomPackedLayer;
using ::dequantd::testing::ReferenceBytes;

// Collects a streamed result and checks the ChunkSink contract.
class CollectingSink : public ChunkSink {
 public:
  explicit CollectingSink(int fail_at = -1) : fail_at_(fail_at) {}
  absl::Status Begin(const std::string& kernel) override {
    ++begins;
    this->kernel = kernel;
    return absl::OkStatus();
  }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> data) override {
    if (offset != static_cast<int64_t>(bytes.size())) gaps = true;
    if (static_cast<int>(chunk_sizes.size()) == fail_at_) return absl::CancelledError("gone");
    chunk_sizes.push_back(static_cast<int64_t>(data.size()));
    bytes.insert(bytes.end(), data.begin(), data.end());
    return absl::OkStatus();
  }
  int begins = 0;
  bool gaps = false;
  std::string kernel;
  std::vector<int64_t> chunk_sizes;
  std::vector<uint8_t> bytes;

 private:
  int fail_at_;
};

void ExpectChunks(const CollectingSink& sink, int64_t chunk_bytes, int64_t total) {
  EXPECT_EQ(sink.begins, 1);
  EXPECT_FALSE(sink.gaps);
  const int64_t chunks = (total + chunk_bytes - 1) / chunk_bytes;
  ASSERT_EQ(static_cast<int64_t>(sink.chunk_sizes.size()), chunks);
  for (int64_t i = 0; i + 1 < chunks; ++i) EXPECT_EQ(sink.chunk_sizes[i], chunk_bytes);
  EXPECT_EQ(sink.chunk_sizes.back(), total - (chunks - 1) * chunk_bytes);
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
  std::unique_ptr<Backend> Make(CudaBackendOptions options = {}) {
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(options);
    EXPECT_TRUE(backend.ok()) << backend.status();
    return backend.ok() ? std::move(*backend) : nullptr;
  }
};

struct InlineCase {
  AwqShape shape;
  DType out_dtype;
  int64_t chunk_bytes;
};

TEST_F(CudaBackendTest, InlineResultsEqualReference) {
  CudaBackendOptions options;
  options.staging_bytes = 1 << 20;  // 1 MiB: some cases use chunks larger than a staging buffer
  std::unique_ptr<Backend> backend = Make(options);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->Info().name, "cuda");
  ASSERT_FALSE(backend->Info().devices.empty());
  const InlineCase cases[] = {
      {{.K = 64, .N = 24, .group_size = 32}, DType::kF16, 100},
      {{.K = 576, .N = 1440, .group_size = 64}, DType::kF16, 64 << 10},
      {{.K = 1024, .N = 4672, .group_size = 128, .scale_dtype = DType::kBF16},
       DType::kBF16,
       1 << 20},
      {{.K = 2048, .N = 1024, .group_size = 2048}, DType::kF32, 3 << 20},  // chunk > staging
      {{.K = 4096, .N = 4096, .group_size = 128}, DType::kF16, 4 << 20},
  };
  uint32_t seed = 100;
  for (const InlineCase& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "K=" << c.shape.K << " N=" << c.shape.N << " G=" << c.shape.group_size
                 << " out=" << DTypeName(c.out_dtype) << " chunk=" << c.chunk_bytes);
    const PackedLayer layer = RandomPackedLayer(c.shape, seed++);
    DequantSource source;
    source.host = layer.view();
    CollectingSink sink;
    ASSERT_TRUE(backend->Dequantize(source, c.out_dtype, c.chunk_bytes, sink).ok());
    const std::vector<uint8_t> expected = ReferenceBytes(layer, c.out_dtype);
    ExpectChunks(sink, c.chunk_bytes, static_cast<int64_t>(expected.size()));
    EXPECT_TRUE(sink.bytes == expected);
    EXPECT_THAT(sink.kernel, ::testing::StartsWith("v4_vec16 "));
  }
}

TEST_F(CudaBackendTest, LaunchConfigProviderIsAskedAndItsErrorFailsTheRequest) {
  std::atomic<int> calls{0};
  CudaBackendOptions options;
  options.launch_config = [&](const LaunchQuery& q) -> absl::StatusOr<cuda::LaunchConfig> {
    ++calls;
    EXPECT_EQ(q.device, 0);
    EXPECT_NE(q.in.qweight, nullptr);
    EXPECT_NE(q.out, nullptr);
    EXPECT_NE(q.stream, nullptr);
    if (q.in.shape.N == 16) return absl::UnavailableError("tuner unavailable");
    return cuda::DefaultConfig(q.variant, q.in.shape, q.out_dtype);
  };
  std::unique_ptr<Backend> backend = Make(options);
  ASSERT_NE(backend, nullptr);
  const PackedLayer layer = RandomPackedLayer({.K = 256, .N = 64, .group_size = 128}, 5);
  DequantSource source;
  source.host = layer.view();
  CollectingSink sink;
  ASSERT_TRUE(backend->Dequantize(source, DType::kF16, 1000, sink).ok());
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(
      sink.kernel,
      "v4_vec16 " +
          cuda::DefaultConfig(cuda::KernelVariant::kV4Vec16, layer.shape, DType::kF16).ToString());

  const PackedLayer other = RandomPackedLayer({.K = 256, .N = 16, .group_size = 128}, 6);
  source.host = other.view();
  CollectingSink failing;
  EXPECT_EQ(backend->Dequantize(source, DType::kF16, 1000, failing).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(failing.begins, 0);
}

TEST_F(CudaBackendTest, SinkErrorReleasesTheSlot) {
  CudaBackendOptions options;
  options.slots_per_device = 1;  // a leaked slot would hang the second request
  std::unique_ptr<Backend> backend = Make(options);
  ASSERT_NE(backend, nullptr);
  const PackedLayer layer = RandomPackedLayer({.K = 1024, .N = 1024, .group_size = 128}, 7);
  DequantSource source;
  source.host = layer.view();
  CollectingSink failing(/*fail_at=*/2);
  EXPECT_EQ(backend->Dequantize(source, DType::kF32, 64 << 10, failing).code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(failing.chunk_sizes.size(), 2u);
  CollectingSink sink;
  ASSERT_TRUE(backend->Dequantize(source, DType::kF32, 64 << 10, sink).ok());
  EXPECT_TRUE(sink.bytes == ReferenceBytes(layer, DType::kF32));
}

// A two-layer checkpoint on disk, made resident by Prepare, dequantized by layer from 8 threads
// at once (more threads than slots), each result checked against the reference.
TEST_F(CudaBackendTest, ResidentLayersConcurrently) {
  std::string dir = ::testing::TempDir() + "/cuda_backend_test.XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  std::ofstream(dir + "/config.json")
      << R"({"quantization_config":{"quant_method":"awq","bits":4,"group_size":128,)"
      << R"("zero_point":true,"version":"gemm"}})";
  const PackedLayer a = RandomPackedLayer({.K = 1536, .N = 576, .group_size = 128}, 8);
  const PackedLayer b = RandomPackedLayer({.K = 576, .N = 1536, .group_size = 64}, 9);
  auto span = [](const auto& v) {
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(v[0]));
  };
  std::vector<safetensors::TensorToWrite> tensors;
  for (const auto& [name, layer] : {std::pair<std::string, const PackedLayer*>{"a", &a},
                                    std::pair<std::string, const PackedLayer*>{"b", &b}}) {
    const AwqShape& s = layer->shape;
    tensors.push_back({name + ".qweight", "I32", {s.K, s.N / 8}, span(layer->qweight)});
    tensors.push_back({name + ".qzeros", "I32", {s.groups(), s.N / 8}, span(layer->qzeros)});
    tensors.push_back({name + ".scales", "F16", {s.groups(), s.N}, span(layer->scales)});
  }
  ASSERT_TRUE(safetensors::WriteFile(dir + "/model.safetensors", tensors).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();

  CudaBackendOptions options;
  options.slots_per_device = 2;
  std::unique_ptr<Backend> backend = Make(options);
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->Prepare(**checkpoint).ok());
  const QuantizedLayer* layer_a = (*checkpoint)->Find("a");
  const QuantizedLayer* layer_b = (*checkpoint)->Find("b");
  ASSERT_NE(layer_a, nullptr);
  ASSERT_NE(layer_b, nullptr);
  EXPECT_TRUE(backend->IsResident(*layer_a));

  const std::vector<uint8_t> expected_a = ReferenceBytes(a, DType::kF16);
  const std::vector<uint8_t> expected_b = ReferenceBytes(b, DType::kBF16);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        const bool use_a = (t + i) % 2 == 0;
        DequantSource source;
        source.layer = use_a ? layer_a : layer_b;
        CollectingSink sink;
        const absl::Status s =
            backend->Dequantize(source, use_a ? DType::kF16 : DType::kBF16, 64 << 10, sink);
        if (!s.ok() || sink.bytes != (use_a ? expected_a : expected_b)) ++mismatches;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace dequantd

#endif  // DEQUANTD_HAVE_CUDA
