// Tests for the CUDA backend (server/backend/cuda/cuda_backend.cc), run on a GPU and skipped
// without one: every streamed result equals DequantizeReference byte for byte, for inline inputs
// and for layers made resident by Prepare; chunking (including chunks larger than a staging
// buffer); the LaunchConfigProvider seam; a sink error releasing the slot; concurrent requests;
// several workers on one GPU (routing, spreading, split placement, failure); a model larger than
// its
// --device-memory-limit (layers served from host copies, staged per call).
#if DEQUANTD_HAVE_CUDA

#include <stdlib.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend/backend.h"
#include "server/backend/cuda/cuda_backend.h"
#include "server/backend/cuda/packed_upload.h"
#include "server/model/checkpoint.h"
#include "tests/server/holding_sink.h"
#include "tests/server/test_layer.h"

namespace dequantd {
namespace {

using ::dequantd::testing::HoldingSink;
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
  QuantShape shape;
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
    EXPECT_NE(awq::Qweight(q.in), nullptr);
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

// Writes `layers` (named "l0", "l1", ...) as a checkpoint in a new temporary directory.
std::unique_ptr<Checkpoint> WriteCheckpoint(const std::vector<const PackedLayer*>& layers) {
  std::string dir = ::testing::TempDir() + "/cuda_backend_test.XXXXXX";
  EXPECT_NE(::mkdtemp(dir.data()), nullptr);
  std::ofstream(dir + "/config.json")
      << R"({"quantization_config":{"quant_method":"awq","bits":4,"group_size":128,)"
      << R"("zero_point":true,"version":"gemm"}})";
  auto span = [](const auto& v) {
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(v[0]));
  };
  std::vector<safetensors::TensorToWrite> tensors;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string name = "l" + std::to_string(i);
    const QuantShape& s = layers[i]->shape;
    tensors.push_back({name + ".qweight", "I32", {s.K, s.N / 8}, span(layers[i]->qweight)});
    tensors.push_back({name + ".qzeros", "I32", {s.groups(), s.N / 8}, span(layers[i]->qzeros)});
    tensors.push_back({name + ".scales",
                       s.scale_dtype == DType::kBF16 ? "BF16" : "F16",
                       {s.groups(), s.N},
                       span(layers[i]->scales)});
  }
  EXPECT_TRUE(safetensors::WriteFile(dir + "/model.safetensors", tensors).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
  return checkpoint.ok() ? std::move(*checkpoint) : nullptr;
}

// WriteCheckpoint of every layer of `layers`, in order.
std::unique_ptr<Checkpoint> WriteCheckpointOf(const std::vector<PackedLayer>& layers) {
  std::vector<const PackedLayer*> pointers;
  for (const PackedLayer& p : layers) pointers.push_back(&p);
  return WriteCheckpoint(pointers);
}

// `count` random layers of mixed shapes: layer i is (128 * (1 + i % k_kinds)) x
// (64 * (1 + (i * n_step) % n_kinds)), group size 64, fp16 scales for odd i and bf16 for even
// ones, seeded `seed` + i.
std::vector<PackedLayer> MixedLayers(int count, int k_kinds, int n_step, int n_kinds,
                                     uint32_t seed) {
  std::vector<PackedLayer> packed;
  for (int i = 0; i < count; ++i) {
    packed.push_back(RandomPackedLayer({.K = 128 * (1 + i % k_kinds),
                                        .N = 64 * (1 + (i * n_step) % n_kinds),
                                        .group_size = 64,
                                        .scale_dtype = i % 2 ? DType::kF16 : DType::kBF16},
                                       seed + static_cast<uint32_t>(i)));
  }
  return packed;
}

// A two-layer checkpoint on disk, made resident by Prepare, dequantized by layer from 8 threads
// at once (more threads than slots), each result checked against the reference.
TEST_F(CudaBackendTest, ResidentLayersConcurrently) {
  const PackedLayer a = RandomPackedLayer({.K = 1536, .N = 576, .group_size = 128}, 8);
  const PackedLayer b = RandomPackedLayer({.K = 576, .N = 1536, .group_size = 64}, 9);
  std::unique_ptr<Checkpoint> checkpoint = WriteCheckpoint({&a, &b});
  ASSERT_NE(checkpoint, nullptr);

  CudaBackendOptions options;
  options.slots_per_device = 2;
  std::unique_ptr<Backend> backend = Make(options);
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->Prepare(*checkpoint).ok());
  const QuantizedLayer* layer_a = checkpoint->Find("l0");
  const QuantizedLayer* layer_b = checkpoint->Find("l1");
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

// A sink that wants bytes [offset, offset + length) of the result, optionally placed in memory.
class RangeSink : public CollectingSink {
 public:
  RangeSink(Range range, const ResultDestination* destination = nullptr)
      : range_(range), destination_(destination) {}
  Range range() const override { return range_; }
  const ResultDestination* destination() const override { return destination_; }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> data) override {
    if (first_offset < 0) first_offset = offset;
    if (offset != next_offset && next_offset >= 0) gaps = true;
    next_offset = offset + static_cast<int64_t>(data.size());
    pointers.push_back(data.data());
    offsets.push_back(offset);
    if (destination_ == nullptr) bytes.insert(bytes.end(), data.begin(), data.end());
    chunk_sizes.push_back(static_cast<int64_t>(data.size()));
    return absl::OkStatus();
  }
  int64_t first_offset = -1;
  int64_t next_offset = -1;
  std::vector<const uint8_t*> pointers;
  std::vector<int64_t> offsets;

 private:
  Range range_;
  const ResultDestination* destination_;
};

// A random inline layer, its reference result in `dtype`, and a source naming it. Not movable
// (source points into layer).
struct InlineLayer {
  InlineLayer(const QuantShape& shape, uint32_t seed, DType dtype)
      : layer(RandomPackedLayer(shape, seed)), expected(ReferenceBytes(layer, dtype)) {
    source.host = layer.view();
  }
  InlineLayer(const InlineLayer&) = delete;
  const PackedLayer layer;
  const std::vector<uint8_t> expected;
  DequantSource source;
};

// The staged path sends every chunk from a staging block with the block as keepalive, and hands
// a block to a copy again only after the sink let go of it: a sink lagging by one block's worth
// of chunks (the most 4 blocks allow: 2 in the pipeline, 2 held) still receives every byte as the
// reference, read when it releases them.
TEST_F(CudaBackendTest, StagingBlocksHeldByTheSinkAreNotReusedUntilReleased) {
  CudaBackendOptions options;
  options.staging_bytes = 64 << 10;  // 4 chunks of 16 KiB per block
  options.staging_blocks = 4;
  options.slots_per_device = 1;
  std::unique_ptr<Backend> backend = Make(options);
  ASSERT_NE(backend, nullptr);
  const InlineLayer in({.K = 1024, .N = 1024, .group_size = 128}, 31, DType::kF16);  // 2 MiB
  const int64_t total = static_cast<int64_t>(in.expected.size());
  for (const ChunkSink::Range range :
       {ChunkSink::Range{}, ChunkSink::Range{.offset = 2050, .length = total - 2050 - 4000}}) {
    const int64_t length = range.length < 0 ? total - range.offset : range.length;
    SCOPED_TRACE(::testing::Message() << "offset=" << range.offset << " length=" << length);
    HoldingSink sink(/*hold=*/4, total, range);
    ASSERT_TRUE(backend->Dequantize(in.source, DType::kF16, 16 << 10, sink).ok());
    sink.Release();
    EXPECT_FALSE(sink.gaps);
    EXPECT_EQ(sink.copied_writes, 0);  // the last, short chunk too
    EXPECT_EQ(sink.shared_writes, (length + (16 << 10) - 1) / (16 << 10));
    EXPECT_TRUE(std::equal(sink.bytes.begin() + range.offset,
                           sink.bytes.begin() + range.offset + length,
                           in.expected.begin() + range.offset));
  }
}

// A sink that never lets its blocks go (a transport that never sends) fails the call with
// DEADLINE_EXCEEDED naming the staging blocks, instead of waiting forever; once it lets them go,
// the slot serves the next call.
TEST_F(CudaBackendTest, BlocksNeverReleasedAreDeadlineExceededAndTheSlotRecovers) {
  CudaBackendOptions options;
  options.staging_bytes = 64 << 10;
  options.staging_blocks = 2;
  options.slots_per_device = 1;
  options.staging_wait_seconds = 0.05;
  std::unique_ptr<Backend> backend = Make(options);
  ASSERT_NE(backend, nullptr);
  const InlineLayer in({.K = 1024, .N = 1024, .group_size = 128}, 32, DType::kF16);  // 32 blocks
  const int64_t total = static_cast<int64_t>(in.expected.size());
  HoldingSink stuck(/*hold=*/-1, total);
  const absl::Status s = backend->Dequantize(in.source, DType::kF16, 16 << 10, stuck);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("the pinned staging blocks of a request slot on cuda:"));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("all 2 blocks of 65536 bytes"));
  EXPECT_EQ(stuck.held(), 4u);  // the first block's chunks; the second waited in the pipeline
  stuck.Release();
  HoldingSink sink(/*hold=*/0, total);
  ASSERT_TRUE(backend->Dequantize(in.source, DType::kF16, 16 << 10, sink).ok());
  EXPECT_TRUE(sink.bytes == in.expected);
}

// gRPC may release a message after the call, its slot and even the backend are gone: the block's
// pinned memory stays valid until then, and is freed by that last release.
TEST_F(CudaBackendTest, HeldBlocksOutliveTheBackend) {
  CudaBackendOptions options;
  options.staging_bytes = 1 << 20;
  options.staging_blocks = 4;
  std::unique_ptr<Backend> backend = Make(options);
  ASSERT_NE(backend, nullptr);
  const InlineLayer in({.K = 512, .N = 1024, .group_size = 128}, 33, DType::kF32);  // 2 MiB
  HoldingSink sink(/*hold=*/-1, static_cast<int64_t>(in.expected.size()));
  ASSERT_TRUE(backend->Dequantize(in.source, DType::kF32, 256 << 10, sink).ok());
  EXPECT_EQ(sink.held(), 8u);
  backend.reset();
  sink.Release();  // reads the bytes from the blocks, then frees them (cudaFreeHost)
  EXPECT_TRUE(sink.bytes == in.expected);
}

TEST_F(CudaBackendTest, RangeDeliversOnlyItsBytesAtResultOffsets) {
  std::unique_ptr<Backend> backend = Make();
  ASSERT_NE(backend, nullptr);
  const InlineLayer in({.K = 1024, .N = 2048, .group_size = 128}, 21, DType::kF16);
  const int64_t total = static_cast<int64_t>(in.expected.size());
  for (const ChunkSink::Range range : {ChunkSink::Range{.offset = 4096, .length = 100000},
                                       ChunkSink::Range{.offset = 6, .length = -1},
                                       ChunkSink::Range{.offset = total - 10, .length = 10}}) {
    SCOPED_TRACE(::testing::Message() << "offset=" << range.offset << " length=" << range.length);
    RangeSink sink(range);
    ASSERT_TRUE(backend->Dequantize(in.source, DType::kF16, 30000, sink).ok());
    const int64_t length = range.length < 0 ? total - range.offset : range.length;
    EXPECT_EQ(sink.begins, 1);
    EXPECT_FALSE(sink.gaps);
    EXPECT_EQ(sink.first_offset, range.offset);
    EXPECT_EQ(sink.next_offset, range.offset + length);
    ASSERT_EQ(static_cast<int64_t>(sink.bytes.size()), length);
    EXPECT_TRUE(
        std::equal(sink.bytes.begin(), sink.bytes.end(), in.expected.begin() + range.offset));
    for (size_t i = 0; i + 1 < sink.chunk_sizes.size(); ++i) EXPECT_EQ(sink.chunk_sizes[i], 30000);
  }
  RangeSink past({.offset = total - 10, .length = 11});
  const absl::Status s = backend->Dequantize(in.source, DType::kF16, 30000, past);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("length"));
}

TEST_F(CudaBackendTest, HostDestinationReceivesTheBytesAndWritesPointIntoIt) {
  CudaBackendOptions options;
  options.staging_bytes = 1 << 20;
  std::unique_ptr<Backend> backend = Make(options);
  ASSERT_NE(backend, nullptr);
  const InlineLayer in({.K = 2048, .N = 1024, .group_size = 128}, 22, DType::kF32);
  const int64_t offset = 1 << 16;
  const int64_t length = static_cast<int64_t>(in.expected.size()) - offset;
  std::vector<uint8_t> memory(static_cast<size_t>(length), 0xAB);
  ResultDestination destination{
      .memory = ResultDestination::Memory::kHost, .data = memory.data(), .bytes = length};
  RangeSink sink({.offset = offset, .length = -1}, &destination);
  ASSERT_TRUE(backend->Dequantize(in.source, DType::kF32, 1 << 20, sink).ok());
  EXPECT_TRUE(std::equal(memory.begin(), memory.end(), in.expected.begin() + offset));
  EXPECT_FALSE(sink.gaps);
  ASSERT_FALSE(sink.pointers.empty());
  for (size_t i = 0; i < sink.pointers.size(); ++i) {
    EXPECT_EQ(sink.pointers[i], memory.data() + (sink.offsets[i] - offset));
  }
  EXPECT_EQ(sink.next_offset, offset + length);
}

TEST_F(CudaBackendTest, DeviceDestinationGetsTheKernelOutputDirectly) {
  std::unique_ptr<Backend> backend = Make();
  ASSERT_NE(backend, nullptr);
  const InlineLayer in({.K = 1024, .N = 4096, .group_size = 128}, 23, DType::kBF16);
  void* device_memory = nullptr;
  ASSERT_EQ(cudaMalloc(&device_memory, in.expected.size()), cudaSuccess);
  ASSERT_EQ(cudaMemset(device_memory, 0x5A, in.expected.size()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the fill is done before the call
  ResultDestination destination{.memory = ResultDestination::Memory::kDevice,
                                .data = static_cast<uint8_t*>(device_memory),
                                .bytes = static_cast<int64_t>(in.expected.size()),
                                .device = 0};
  RangeSink sink({}, &destination);
  ASSERT_TRUE(backend->Dequantize(in.source, DType::kBF16, 1 << 20, sink).ok());
  std::vector<uint8_t> got(in.expected.size());
  ASSERT_EQ(cudaMemcpy(got.data(), device_memory, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(got == in.expected);
  // One progress report for the whole result (the kernel wrote it), pointing into it.
  ASSERT_EQ(sink.pointers.size(), 1u);
  EXPECT_EQ(sink.pointers.front(), static_cast<const uint8_t*>(device_memory));
  EXPECT_EQ(sink.chunk_sizes.front(), static_cast<int64_t>(in.expected.size()));

  // A range into device memory: computed whole, the range copied device to device.
  ASSERT_EQ(cudaMemset(device_memory, 0x5A, in.expected.size()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the fill is done before the call
  RangeSink partial({.offset = 512, .length = 4096}, &destination);
  ASSERT_TRUE(backend->Dequantize(in.source, DType::kBF16, 1000, partial).ok());
  std::vector<uint8_t> part(4096);
  ASSERT_EQ(cudaMemcpy(part.data(), device_memory, part.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), in.expected.begin() + 512));
  EXPECT_EQ(partial.first_offset, 512);
  EXPECT_EQ(partial.next_offset, 512 + 4096);

  // Another device's memory: refused before any work, naming the device.
  ResultDestination elsewhere = destination;
  elsewhere.device = 7;
  RangeSink refused({}, &elsewhere);
  const absl::Status s = backend->Dequantize(in.source, DType::kBF16, 1 << 20, refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("device 7"));
  EXPECT_EQ(refused.begins, 0);
  cudaFree(device_memory);
}

// Collects a DequantizeLayers result per layer.
class LayersCollector : public LayersSink {
 public:
  explicit LayersCollector(const ResultDestination* destination = nullptr)
      : destination_(destination) {}
  const ResultDestination* destination() const override { return destination_; }
  absl::Status Begin(const std::string& k) override {
    kernel = k;
    ++begins;
    return absl::OkStatus();
  }
  absl::Status BeginLayer(int64_t index) override {
    if (index != static_cast<int64_t>(layers.size())) out_of_order = true;
    layers.emplace_back();
    return absl::OkStatus();
  }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> data) override {
    if (offset != static_cast<int64_t>(layers.back().size()) && destination_ == nullptr) {
      gaps = true;
    }
    if (destination_ == nullptr) {
      layers.back().insert(layers.back().end(), data.begin(), data.end());
    } else {
      layers.back().resize(static_cast<size_t>(offset) + data.size());
    }
    return absl::OkStatus();
  }
  std::string kernel;
  int begins = 0;
  bool out_of_order = false;
  bool gaps = false;
  std::vector<std::vector<uint8_t>> layers;

 private:
  const ResultDestination* destination_;
};

// The reference's (N, K) result of `layer` (rows are output columns n).
std::vector<uint8_t> ReferenceNkBytes(const PackedLayer& layer, DType out_dtype) {
  QuantView view = layer.view();
  view.shape.orientation = Orientation::kNK;
  std::vector<uint8_t> out(static_cast<size_t>(view.shape.output_bytes(out_dtype)));
  if (!DequantizeReference(view, out_dtype, 0, view.shape.N, out.data()).ok()) return {};
  return out;
}

// (N, K) results: DequantizeLayers launches them one layer at a time (the grouped launch writes
// (K, N) only), through small slabs and into a host destination, and Dequantize of one resident
// layer and of an inline one runs v4_vec16's transpose kernel: every byte as the reference's
// (N, K) result.
TEST_F(CudaBackendTest, NkResultsOfLayersAndSingleCallsAreBitExact) {
  std::vector<PackedLayer> packed;
  for (int i = 0; i < 6; ++i) {
    packed.push_back(RandomPackedLayer({.K = 128 * (1 + i % 3),
                                        .N = 64 * (1 + (i * 5) % 7),
                                        .group_size = 128,
                                        .scale_dtype = i % 2 ? DType::kF16 : DType::kBF16},
                                       static_cast<uint32_t>(700 + i)));
  }
  std::unique_ptr<Checkpoint> checkpoint = WriteCheckpointOf(packed);
  ASSERT_NE(checkpoint, nullptr);
  CudaBackendOptions options;
  options.result_slab_bytes = 100 << 10;
  options.staging_bytes = 64 << 10;
  std::unique_ptr<Backend> backend = Make(options);
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->Prepare(*checkpoint).ok());
  const std::vector<int> order = {0, 1, 2, 3, 4, 5, 2, 0};
  std::vector<const QuantizedLayer*> request;
  for (int i : order) {
    request.push_back(checkpoint->Find("l" + std::to_string(i)));
    ASSERT_NE(request.back(), nullptr);
  }
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    LayersCollector sink;
    ASSERT_TRUE(backend->DequantizeLayers(request, dtype, Orientation::kNK, 10000, sink).ok());
    EXPECT_FALSE(sink.out_of_order);
    EXPECT_FALSE(sink.gaps);
    ASSERT_EQ(sink.layers.size(), order.size());
    int64_t total = 0;
    std::vector<uint8_t> concatenated;
    for (size_t i = 0; i < order.size(); ++i) {
      const std::vector<uint8_t> expected =
          ReferenceNkBytes(packed[static_cast<size_t>(order[i])], dtype);
      EXPECT_TRUE(sink.layers[i] == expected) << "entry " << i << " (layer " << order[i] << ")";
      total += static_cast<int64_t>(expected.size());
      concatenated.insert(concatenated.end(), expected.begin(), expected.end());
    }
    std::vector<uint8_t> memory(static_cast<size_t>(total), 0);
    ResultDestination destination{
        .memory = ResultDestination::Memory::kHost, .data = memory.data(), .bytes = total};
    LayersCollector placed(&destination);
    ASSERT_TRUE(backend->DequantizeLayers(request, dtype, Orientation::kNK, 10000, placed).ok());
    EXPECT_TRUE(memory == concatenated);

    DequantSource resident;
    resident.layer = request[3];
    resident.orientation = Orientation::kNK;
    CollectingSink one;
    ASSERT_TRUE(backend->Dequantize(resident, dtype, 1 << 20, one).ok());
    EXPECT_TRUE(one.bytes == ReferenceNkBytes(packed[3], dtype));
    DequantSource host;
    host.host = packed[4].view();
    host.orientation = Orientation::kNK;
    CollectingSink inline_sink;
    ASSERT_TRUE(backend->Dequantize(host, dtype, 1 << 20, inline_sink).ok());
    EXPECT_TRUE(inline_sink.bytes == ReferenceNkBytes(packed[4], dtype));
  }
}

// Many layers through small slabs (several launches, double-buffered), with duplicates inside and
// across slabs, to the staging path and into a host destination: every byte as the reference.
TEST_F(CudaBackendTest, LayersInSmallSlabsAreBitExact) {
  std::vector<PackedLayer> packed;
  for (int i = 0; i < 12; ++i) {
    const int64_t k = 128 * (1 + i % 4);
    const int64_t n = 64 * (1 + (i * 5) % 7);
    packed.push_back(RandomPackedLayer(
        {.K = k, .N = n, .group_size = 128, .scale_dtype = i % 3 ? DType::kF16 : DType::kBF16},
        static_cast<uint32_t>(300 + i)));
  }
  std::unique_ptr<Checkpoint> checkpoint = WriteCheckpointOf(packed);
  ASSERT_NE(checkpoint, nullptr);
  CudaBackendOptions options;
  options.result_slab_bytes = 100 << 10;  // 100 KiB: several slabs
  options.staging_bytes = 64 << 10;
  std::unique_ptr<Backend> backend = Make(options);
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->Prepare(*checkpoint).ok());
  const std::vector<int> order = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 3, 0, 11, 7};
  std::vector<const QuantizedLayer*> request;
  for (int i : order) {  // by name: the checkpoint orders its layers by name (l0, l1, l10, ...)
    request.push_back(checkpoint->Find("l" + std::to_string(i)));
    ASSERT_NE(request.back(), nullptr);
  }
  for (DType dtype : {DType::kF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    LayersCollector sink;
    ASSERT_TRUE(backend->DequantizeLayers(request, dtype, Orientation::kKN, 10000, sink).ok());
    EXPECT_EQ(sink.begins, 1);
    EXPECT_FALSE(sink.out_of_order);
    EXPECT_FALSE(sink.gaps);
    EXPECT_THAT(sink.kernel, ::testing::HasSubstr("layers=12"));
    ASSERT_EQ(sink.layers.size(), order.size());
    int64_t total = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      const std::vector<uint8_t> expected =
          ReferenceBytes(packed[static_cast<size_t>(order[i])], dtype);
      EXPECT_TRUE(sink.layers[i] == expected) << "entry " << i << " (layer " << order[i] << ")";
      total += static_cast<int64_t>(expected.size());
    }
    // The same into host memory: layers back to back in request order.
    std::vector<uint8_t> memory(static_cast<size_t>(total), 0);
    ResultDestination destination{
        .memory = ResultDestination::Memory::kHost, .data = memory.data(), .bytes = total};
    LayersCollector placed(&destination);
    ASSERT_TRUE(backend->DequantizeLayers(request, dtype, Orientation::kKN, 10000, placed).ok());
    std::vector<uint8_t> concatenated;
    for (const std::vector<uint8_t>& layer : sink.layers) {
      concatenated.insert(concatenated.end(), layer.begin(), layer.end());
    }
    EXPECT_TRUE(memory == concatenated);
  }
}

// DequantizeLayers straight into device memory, repeated (the second call launches a kept plan,
// grouped_plan_cache.h), then at another offset and with another dtype (new plans): every call
// rewrites every byte of a poisoned buffer as the reference, and nothing outside its range.
TEST_F(CudaBackendTest, RepeatedLayersIntoDeviceMemoryAreBitExactEveryTime) {
  const std::vector<PackedLayer> packed = MixedLayers(6, 3, 3, 5, 700);
  std::unique_ptr<Checkpoint> checkpoint = WriteCheckpointOf(packed);
  ASSERT_NE(checkpoint, nullptr);
  std::unique_ptr<Backend> backend = Make();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->Prepare(*checkpoint).ok());
  const std::vector<int> order = {5, 0, 3, 3, 1, 4, 2};
  std::vector<const QuantizedLayer*> request;
  for (int i : order) {
    request.push_back(checkpoint->Find("l" + std::to_string(i)));
    ASSERT_NE(request.back(), nullptr);
  }
  // A layer object not from this checkpoint whose index names another position (a copy, renumbered)
  // is still found by its name: entry 1 is l0's data under l0's name with index 5.
  QuantizedLayer renumbered = *checkpoint->Find("l0");
  renumbered.index = 5;
  request[1] = &renumbered;
  constexpr int64_t kCapacity = 4 << 20;
  void* memory = nullptr;
  ASSERT_EQ(cudaMalloc(&memory, kCapacity), cudaSuccess);
  struct Call {
    DType dtype;
    int64_t offset;
  };
  for (const Call& call : {Call{DType::kF16, 0}, Call{DType::kF16, 0}, Call{DType::kF16, 4096},
                           Call{DType::kF32, 4096}, Call{DType::kF16, 0}}) {
    SCOPED_TRACE(std::string(DTypeName(call.dtype)) + " at " + std::to_string(call.offset));
    std::vector<uint8_t> expected(static_cast<size_t>(call.offset), 0x6B);
    for (int i : order) {
      const std::vector<uint8_t> layer = ReferenceBytes(packed[static_cast<size_t>(i)], call.dtype);
      expected.insert(expected.end(), layer.begin(), layer.end());
    }
    expected.resize(expected.size() + 256, 0x6B);
    ASSERT_LE(static_cast<int64_t>(expected.size()), kCapacity);
    ASSERT_EQ(cudaMemset(memory, 0x6B, kCapacity), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the fill is done before the call
    ResultDestination destination{
        .memory = ResultDestination::Memory::kDevice,
        .data = static_cast<uint8_t*>(memory) + call.offset,
        .bytes = static_cast<int64_t>(expected.size()) - call.offset - 256,
        .device = 0};
    LayersCollector placed(&destination);
    ASSERT_TRUE(
        backend->DequantizeLayers(request, call.dtype, Orientation::kKN, 1 << 20, placed).ok());
    EXPECT_THAT(placed.kernel, ::testing::HasSubstr("layers=6"));
    std::vector<uint8_t> got(expected.size());
    ASSERT_EQ(cudaMemcpy(got.data(), memory, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(got == expected);
  }
  cudaFree(memory);
}

// Several workers (issue 14) on one GPU (--devices 0,0): a whole-model call spread over both
// workers, replicated and split placement, every byte as the reference; an injected launch
// failure takes one worker out of rotation while every call still succeeds; an injected start
// failure leaves the other serving, and fails the backend when it was the only worker.
TEST_F(CudaBackendTest, TwoWorkersOnOneGpuSpreadSplitAndSurviveAFailure) {
  std::vector<PackedLayer> packed;
  for (int i = 0; i < 12; ++i) {
    packed.push_back(
        RandomPackedLayer({.K = 128 * (1 + i % 4), .N = 64 * (1 + (i * 5) % 7), .group_size = 128},
                          static_cast<uint32_t>(500 + i)));
  }
  std::unique_ptr<Checkpoint> checkpoint = WriteCheckpointOf(packed);
  ASSERT_NE(checkpoint, nullptr);
  std::vector<const QuantizedLayer*> request;
  for (int i = 0; i < 12; ++i) request.push_back(checkpoint->Find("l" + std::to_string(i)));
  auto expect_exact = [&](Backend& backend) {
    LayersCollector sink;
    ASSERT_TRUE(backend.DequantizeLayers(request, DType::kF16, Orientation::kKN, 10000, sink).ok());
    EXPECT_EQ(sink.begins, 1);
    EXPECT_FALSE(sink.out_of_order);
    ASSERT_EQ(sink.layers.size(), 12u);
    for (int i = 0; i < 12; ++i) {
      EXPECT_TRUE(sink.layers[static_cast<size_t>(i)] == ReferenceBytes(packed[i], DType::kF16))
          << "layer " << i;
      DequantSource source;
      source.layer = request[static_cast<size_t>(i)];
      CollectingSink one;
      ASSERT_TRUE(backend.Dequantize(source, DType::kF16, 1 << 20, one).ok());
      EXPECT_TRUE(one.bytes == ReferenceBytes(packed[i], DType::kF16)) << "layer " << i;
    }
  };
  CudaBackendOptions options;
  options.devices = {0, 0};
  options.min_part_bytes = 1;  // every whole-model call is cut into one part per worker
  options.result_slab_bytes = 100 << 10;
  options.staging_bytes = 64 << 10;
  for (PlacementMode mode : {PlacementMode::kReplicated, PlacementMode::kSplit}) {
    SCOPED_TRACE(std::string(PlacementModeName(mode)));
    options.placement = mode;
    std::unique_ptr<Backend> backend = Make(options);
    ASSERT_NE(backend, nullptr);
    ASSERT_TRUE(backend->Prepare(*checkpoint).ok());
    const BackendInfo info = backend->Info();
    ASSERT_EQ(info.devices.size(), 2u);
    EXPECT_EQ(info.devices[0].label, "cuda:0");
    EXPECT_EQ(info.devices[1].label, "cuda:0.1");
    const int64_t l0 = info.devices[0].resident_layers;
    const int64_t l1 = info.devices[1].resident_layers;
    if (mode == PlacementMode::kSplit) {
      EXPECT_GT(l0, 0);
      EXPECT_GT(l1, 0);
      EXPECT_EQ(l0 + l1, 12);
    } else {
      EXPECT_EQ(l0, 12);
      EXPECT_EQ(l1, 12);
    }
    for (const QuantizedLayer* layer : request) EXPECT_TRUE(backend->IsResident(*layer));
    expect_exact(*backend);
  }

  options.placement = PlacementMode::kReplicated;
  options.inject_failures["cuda:0.1"] =
      DeviceFailureInjection{.at_start = false, .launches_before_failure = 0};
  std::vector<std::string> failed;
  options.on_device_failed = [&failed](std::string_view device, std::string_view) {
    failed.emplace_back(device);
  };
  std::unique_ptr<Backend> backend = Make(options);
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->Prepare(*checkpoint).ok());
  expect_exact(*backend);  // the first call that lands on cuda:0.1 is retried on cuda:0
  EXPECT_EQ(failed, std::vector<std::string>{"cuda:0.1"});
  BackendInfo info = backend->Info();
  EXPECT_TRUE(info.devices[0].serving);
  EXPECT_FALSE(info.devices[1].serving);
  EXPECT_THAT(info.devices[1].failure, ::testing::HasSubstr("injected"));

  options.inject_failures["cuda:0.1"] =
      DeviceFailureInjection{.at_start = true, .launches_before_failure = -1};
  backend = Make(options);
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->Prepare(*checkpoint).ok());
  info = backend->Info();
  EXPECT_FALSE(info.devices[1].serving);
  EXPECT_EQ(info.devices[1].resident_layers, 0);
  expect_exact(*backend);

  options.devices = {0};
  options.inject_failures = {
      {"cuda:0", DeviceFailureInjection{.at_start = true, .launches_before_failure = -1}}};
  absl::StatusOr<std::unique_ptr<Backend>> none = MakeCudaBackend(options);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
}

// Concurrent calls straight into device memory at many distinct offsets (more than the kept plans:
// evictions while other calls hold launched plans), one worker and two workers on one GPU,
// replicated and split placement, parts spread over both workers: every byte and the guard bytes
// around each result checked.
TEST_F(CudaBackendTest, ConcurrentCallsIntoDeviceMemoryWithPlanEvictionsAreBitExact) {
  const std::vector<PackedLayer> packed = MixedLayers(10, 4, 5, 7, 900);
  std::unique_ptr<Checkpoint> checkpoint = WriteCheckpointOf(packed);
  ASSERT_NE(checkpoint, nullptr);
  const std::vector<int> order = {3, 0, 9, 9, 1, 4, 2, 8, 5, 7, 6};
  std::vector<const QuantizedLayer*> request;
  for (int i : order) request.push_back(checkpoint->Find("l" + std::to_string(i)));
  std::vector<std::vector<uint8_t>> expected_by_dtype;
  for (DType d : {DType::kF16, DType::kF32}) {
    std::vector<uint8_t> e;
    for (int i : order) {
      const std::vector<uint8_t> l = ReferenceBytes(packed[static_cast<size_t>(i)], d);
      e.insert(e.end(), l.begin(), l.end());
    }
    expected_by_dtype.push_back(std::move(e));
  }
  for (std::vector<int> devices : {std::vector<int>{0}, std::vector<int>{0, 0}}) {
    for (PlacementMode mode : {PlacementMode::kReplicated, PlacementMode::kSplit}) {
      if (devices.size() == 1 && mode == PlacementMode::kSplit) continue;
      SCOPED_TRACE(std::string(PlacementModeName(mode)) +
                   " workers=" + std::to_string(devices.size()));
      CudaBackendOptions options;
      options.devices = devices;
      options.placement = mode;
      options.min_part_bytes = 1;
      options.slots_per_device = 3;
      std::unique_ptr<Backend> backend = Make(options);
      ASSERT_NE(backend, nullptr);
      ASSERT_TRUE(backend->Prepare(*checkpoint).ok());
      constexpr int kThreads = 6;
      constexpr int64_t kBuffer = 8 << 20;
      std::atomic<int> failures{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          cudaSetDevice(0);
          cudaStream_t s;
          cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
          void* memory = nullptr;
          if (cudaMalloc(&memory, kBuffer) != cudaSuccess) {
            ++failures;
            return;
          }
          std::vector<uint8_t> got;
          for (int it = 0; it < 40; ++it) {
            const int which = (it / 3) % 2;
            const DType dtype = which == 0 ? DType::kF16 : DType::kF32;
            const std::vector<uint8_t>& expected = expected_by_dtype[static_cast<size_t>(which)];
            const int64_t offset = int64_t{4096} * ((it * 7 + t) % 13);
            cudaMemsetAsync(memory, 0x6B, kBuffer, s);
            cudaStreamSynchronize(s);
            ResultDestination destination{.memory = ResultDestination::Memory::kDevice,
                                          .data = static_cast<uint8_t*>(memory) + offset,
                                          .bytes = static_cast<int64_t>(expected.size()),
                                          .device = 0};
            LayersCollector placed(&destination);
            const absl::Status st =
                backend->DequantizeLayers(request, dtype, Orientation::kKN, 1 << 20, placed);
            if (!st.ok()) {
              ADD_FAILURE() << st;
              ++failures;
              continue;
            }
            got.assign(expected.size() + 512, 0);
            cudaMemcpy(got.data(),
                       static_cast<uint8_t*>(memory) + offset - (offset >= 256 ? 256 : 0),
                       got.size(), cudaMemcpyDeviceToHost);
            const size_t pre = offset >= 256 ? 256 : 0;
            bool ok = std::equal(expected.begin(), expected.end(), got.begin() + pre);
            for (size_t i = 0; i < pre; ++i) ok = ok && got[i] == 0x6B;
            for (size_t i = pre + expected.size(); i < pre + expected.size() + 256; ++i)
              ok = ok && got[i] == 0x6B;
            if (!ok) ++failures;
          }
          cudaFree(memory);
          cudaStreamDestroy(s);
        });
      }
      for (std::thread& th : threads) th.join();
      EXPECT_EQ(failures.load(), 0);
    }
  }
}

// A sink error after the launch into device memory (BeginLayer fails), then a good call, round
// after round at rotating offsets: the kept plans stay right and every byte is the reference.
class FailingLayersSink : public LayersCollector {
 public:
  using LayersCollector::LayersCollector;
  absl::Status BeginLayer(int64_t index) override {
    if (index == 2) return absl::CancelledError("gone");
    return LayersCollector::BeginLayer(index);
  }
};

TEST_F(CudaBackendTest, ASinkErrorAfterALaunchIntoDeviceMemoryLeavesLaterCallsBitExact) {
  std::vector<PackedLayer> packed;
  for (int i = 0; i < 5; ++i) {
    packed.push_back(RandomPackedLayer({.K = 256, .N = 64 * (1 + i), .group_size = 128},
                                       static_cast<uint32_t>(950 + i)));
  }
  std::unique_ptr<Checkpoint> checkpoint = WriteCheckpointOf(packed);
  ASSERT_NE(checkpoint, nullptr);
  std::unique_ptr<Backend> backend = Make();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->Prepare(*checkpoint).ok());
  std::vector<const QuantizedLayer*> request;
  std::vector<uint8_t> expected;
  for (int i = 0; i < 5; ++i) {
    request.push_back(checkpoint->Find("l" + std::to_string(i)));
    const std::vector<uint8_t> l = ReferenceBytes(packed[static_cast<size_t>(i)], DType::kF16);
    expected.insert(expected.end(), l.begin(), l.end());
  }
  void* memory = nullptr;
  ASSERT_EQ(cudaMalloc(&memory, 64 << 20), cudaSuccess);
  for (int round = 0; round < 30; ++round) {
    const int64_t offset = int64_t{4096} * (round % 12);
    ResultDestination destination{.memory = ResultDestination::Memory::kDevice,
                                  .data = static_cast<uint8_t*>(memory) + offset,
                                  .bytes = static_cast<int64_t>(expected.size()),
                                  .device = 0};
    FailingLayersSink failing(&destination);
    EXPECT_EQ(
        backend->DequantizeLayers(request, DType::kF16, Orientation::kKN, 1 << 20, failing).code(),
        absl::StatusCode::kCancelled);
    ASSERT_EQ(cudaMemset(memory, 0, 64 << 20), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    LayersCollector placed(&destination);
    ASSERT_TRUE(
        backend->DequantizeLayers(request, DType::kF16, Orientation::kKN, 1 << 20, placed).ok());
    std::vector<uint8_t> got(expected.size());
    ASSERT_EQ(cudaMemcpy(got.data(), destination.data, got.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_TRUE(got == expected) << "round " << round;
  }
  cudaFree(memory);
}

// Models larger than the GPU (issue 22 part 4; docs/architecture.md "Models larger than the
// GPU"): a --device-memory-limit of about half the packed model keeps the first layers that fit
// resident and serves the rest from their host copies, staged per call. Every layer, through
// Dequantize (streamed, host and device destinations) and DequantizeLayers (streamed, into a
// poisoned host buffer, into poisoned device memory with guard bytes; (K, N) grouped and (N, K)
// per layer; duplicates; small slabs), is the CPU reference byte for byte. Also one worker with a
// limit below every layer (every layer on the host), and two workers on one GPU with split
// placement and a limit of a quarter each.
TEST_F(CudaBackendTest, ModelLimitedToHalfItsPackedSizeServesEveryLayerBitExact) {
  std::vector<PackedLayer> packed;
  // Layers of 8 MiB of qweight (several 4 MiB upload chunks) among small ones of mixed shapes.
  const QuantShape shapes[] = {
      {.K = 4096, .N = 4096, .group_size = 128},
      {.K = 576, .N = 1536, .group_size = 64},
      {.K = 1024, .N = 2048, .group_size = 128, .scale_dtype = DType::kBF16},
      {.K = 256, .N = 64, .group_size = 128},
      {.K = 4096, .N = 4096, .group_size = 128, .scale_dtype = DType::kBF16},
      {.K = 1536, .N = 576, .group_size = 128},
      {.K = 2048, .N = 1024, .group_size = 64},
      {.K = 128, .N = 448, .group_size = 64, .scale_dtype = DType::kBF16},
  };
  int64_t total = 0;
  for (size_t i = 0; i < std::size(shapes); ++i) {
    packed.push_back(RandomPackedLayer(shapes[i], static_cast<uint32_t>(1200 + i)));
    total += cuda::PackedLayout(shapes[i]).total_bytes;
  }
  std::unique_ptr<Checkpoint> checkpoint = WriteCheckpointOf(packed);
  ASSERT_NE(checkpoint, nullptr);
  const size_t n = packed.size();
  // The request: every layer, resident and host-only interleaved (checkpoint order is by name:
  // l0..l7), with duplicates.
  const std::vector<int> order = {0, 1, 2, 3, 4, 5, 6, 7, 4, 0, 3, 3};
  std::vector<const QuantizedLayer*> request;
  for (int i : order) {
    request.push_back(checkpoint->Find("l" + std::to_string(i)));
    ASSERT_NE(request.back(), nullptr);
  }
  struct Config {
    std::string name;
    std::vector<int> devices;
    PlacementMode placement;
    int64_t limit;
  };
  const Config configs[] = {
      {"one GPU, half", {0}, PlacementMode::kAuto, total / 2},
      {"one GPU, below every layer", {0}, PlacementMode::kAuto, 1},
      {"two workers split, a quarter each", {0, 0}, PlacementMode::kSplit, total / 4},
  };
  for (const Config& config : configs) {
    SCOPED_TRACE(config.name);
    CudaBackendOptions options;
    options.devices = config.devices;
    options.placement = config.placement;
    options.device_memory_limit_bytes = config.limit;
    options.min_part_bytes = 1;           // whole-model calls spread over both workers
    options.result_slab_bytes = 1 << 20;  // several slabs; staged inputs bounded per slab
    options.staging_bytes = 64 << 10;
    std::unique_ptr<Backend> backend = Make(options);
    ASSERT_NE(backend, nullptr);
    ASSERT_TRUE(backend->Prepare(*checkpoint).ok());
    int64_t resident_layers = 0;
    for (const DeviceDescription& d : backend->Info().devices) {
      EXPECT_LE(d.resident_bytes, config.limit) << d.label;
      resident_layers += d.resident_layers;
    }
    int host_only = 0;
    for (size_t i = 0; i < n; ++i) {
      host_only += backend->IsResident(*checkpoint->Find("l" + std::to_string(i))) ? 0 : 1;
    }
    if (config.limit == 1) {
      EXPECT_EQ(resident_layers, 0);
      EXPECT_EQ(host_only, static_cast<int>(n));
    } else {
      EXPECT_GT(resident_layers, 0);
      EXPECT_GT(host_only, 0);
      EXPECT_LT(host_only, static_cast<int>(n));
    }
    for (DType dtype : {DType::kF16, DType::kF32}) {
      SCOPED_TRACE(DTypeName(dtype));
      std::vector<std::vector<uint8_t>> expected;
      for (const PackedLayer& p : packed) expected.push_back(ReferenceBytes(p, dtype));
      std::vector<uint8_t> concatenated;
      for (int i : order) {
        const std::vector<uint8_t>& e = expected[static_cast<size_t>(i)];
        concatenated.insert(concatenated.end(), e.begin(), e.end());
      }
      const int64_t whole = static_cast<int64_t>(concatenated.size());
      // One layer per call: streamed, and into a poisoned host buffer.
      for (size_t i = 0; i < n; ++i) {
        DequantSource source;
        source.layer = checkpoint->Find("l" + std::to_string(i));
        CollectingSink one;
        ASSERT_TRUE(backend->Dequantize(source, dtype, 100000, one).ok());
        ExpectChunks(one, 100000, static_cast<int64_t>(expected[i].size()));
        EXPECT_TRUE(one.bytes == expected[i]) << "layer " << i;
        std::vector<uint8_t> memory(expected[i].size(), 0xAB);
        ResultDestination host{.memory = ResultDestination::Memory::kHost,
                               .data = memory.data(),
                               .bytes = static_cast<int64_t>(memory.size())};
        RangeSink placed({}, &host);
        ASSERT_TRUE(backend->Dequantize(source, dtype, 1 << 20, placed).ok());
        EXPECT_TRUE(memory == expected[i]) << "layer " << i << " into host memory";
      }
      // The whole request, streamed.
      LayersCollector streamed;
      ASSERT_TRUE(
          backend->DequantizeLayers(request, dtype, Orientation::kKN, 1 << 16, streamed).ok());
      EXPECT_EQ(streamed.begins, 1);
      EXPECT_FALSE(streamed.out_of_order);
      EXPECT_FALSE(streamed.gaps);
      ASSERT_EQ(streamed.layers.size(), order.size());
      for (size_t k = 0; k < order.size(); ++k) {
        EXPECT_TRUE(streamed.layers[k] == expected[static_cast<size_t>(order[k])])
            << "entry " << k << " (layer " << order[k] << ")";
      }
      // Into a poisoned host buffer: every byte written.
      std::vector<uint8_t> memory(static_cast<size_t>(whole), 0xAB);
      ResultDestination host{
          .memory = ResultDestination::Memory::kHost, .data = memory.data(), .bytes = whole};
      LayersCollector into_host(&host);
      ASSERT_TRUE(
          backend->DequantizeLayers(request, dtype, Orientation::kKN, 1 << 20, into_host).ok());
      EXPECT_TRUE(memory == concatenated);
      // Into poisoned device memory with 256 guard bytes each side, twice (the second call
      // launches kept plans).
      void* device = nullptr;
      ASSERT_EQ(cudaMalloc(&device, static_cast<size_t>(whole) + 512), cudaSuccess);
      for (int round = 0; round < 2; ++round) {
        ASSERT_EQ(cudaMemset(device, 0x6B, static_cast<size_t>(whole) + 512), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ResultDestination on_device{.memory = ResultDestination::Memory::kDevice,
                                    .data = static_cast<uint8_t*>(device) + 256,
                                    .bytes = whole,
                                    .device = 0};
        LayersCollector into_device(&on_device);
        ASSERT_TRUE(
            backend->DequantizeLayers(request, dtype, Orientation::kKN, 1 << 20, into_device).ok());
        std::vector<uint8_t> got(static_cast<size_t>(whole) + 512);
        ASSERT_EQ(cudaMemcpy(got.data(), device, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_TRUE(std::equal(concatenated.begin(), concatenated.end(), got.begin() + 256))
            << "round " << round;
        EXPECT_TRUE(
            std::all_of(got.begin(), got.begin() + 256, [](uint8_t b) { return b == 0x6B; }));
        EXPECT_TRUE(std::all_of(got.end() - 256, got.end(), [](uint8_t b) { return b == 0x6B; }));
        // One layer into device memory.
        ASSERT_EQ(cudaMemset(device, 0x6B, static_cast<size_t>(whole) + 512), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        DequantSource source;
        source.layer = request[4];  // l4, an 8 MiB-qweight layer
        RangeSink one({}, &on_device);
        ASSERT_TRUE(backend->Dequantize(source, dtype, 1 << 20, one).ok());
        ASSERT_EQ(cudaMemcpy(got.data(), device, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_TRUE(std::equal(expected[4].begin(), expected[4].end(), got.begin() + 256));
        EXPECT_EQ(got[256 + expected[4].size()], 0x6B);
      }
      cudaFree(device);
    }
    // (N, K) results: one launch per layer, staged ones too.
    LayersCollector nk;
    ASSERT_TRUE(
        backend->DequantizeLayers(request, DType::kBF16, Orientation::kNK, 1 << 16, nk).ok());
    ASSERT_EQ(nk.layers.size(), order.size());
    for (size_t k = 0; k < order.size(); ++k) {
      EXPECT_TRUE(nk.layers[k] ==
                  ReferenceNkBytes(packed[static_cast<size_t>(order[k])], DType::kBF16))
          << "(N, K) entry " << k;
    }
  }
}

// A --device-memory-limit above the GPU's memory is refused at start, naming the flag and the
// device's memory.
TEST_F(CudaBackendTest, ADeviceMemoryLimitAboveTheGpuIsInvalidArgument) {
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  CudaBackendOptions options;
  options.devices = {0};
  options.device_memory_limit_bytes = static_cast<int64_t>(prop.totalGlobalMem) + 1;
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(options);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(backend.status().message()),
              ::testing::HasSubstr(absl::StrCat("--device-memory-limit=", prop.totalGlobalMem + 1,
                                                " is more than the memory of cuda:0 (", prop.name,
                                                ": ", prop.totalGlobalMem, " bytes)")));
  options.device_memory_limit_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  EXPECT_TRUE(MakeCudaBackend(options).ok());
}

// Bad staging options are refused before any device is touched (so this runs without a GPU too).
TEST(CudaBackendOptionsTest, BadStagingOptionsAreInvalidArgumentNamingTheOption) {
  CudaBackendOptions one_block;
  one_block.staging_blocks = 1;
  CudaBackendOptions no_wait;
  no_wait.staging_wait_seconds = 0;
  for (const auto& [options, name] : {std::pair{one_block, "staging_blocks must be >= 2"},
                                      std::pair{no_wait, "staging_wait_seconds must be > 0"}}) {
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(options);
    ASSERT_FALSE(backend.ok());
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(backend.status().message()), ::testing::HasSubstr(name));
  }
}

}  // namespace
}  // namespace dequantd

#endif  // DEQUANTD_HAVE_CUDA
