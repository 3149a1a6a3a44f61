// DequantizeLayers against a checkpoint the test writes itself, served by a real in-process
// server (CPU backend) and read with the real DequantClient: every layer equals
// DequantizeReference byte for byte, in request order with duplicates, with the right headers;
// the empty list means every layer; NOT_FOUND, RESOURCE_EXHAUSTED and INVALID_ARGUMENT.
#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_support.h"

namespace dequantd::testing {
namespace {

using ::testing::HasSubstr;

class LayersTest : public SharedServerSuite<LayersTest> {
 protected:
  static void SetUpTestSuite() {
    // Results in fp16: 512*1440*2 = 1,474,560; 256*256*2 = 131,072; 128*4672*2 = 1,196,032;
    // in fp32 twice that. The limit is per tensor: layer 0 in fp32 (2,949,120) is over it.
    ServerOptions options;
    options.max_output_bytes = 2'500'000;
    // Sorted by name, as ListTensors returns them.
    StartSharedServer(
        "layers",
        {MakeRandomLayer("model.layers.0.mlp.down_proj", 512, 1440, 64, DType::kF16, 11),
         MakeRandomLayer("model.layers.0.self_attn.q_proj", 256, 256, 64, DType::kF16, 12),
         MakeRandomLayer("model.layers.1.mlp.up_proj", 128, 4672, 64, DType::kBF16, 13)},
        64, options);
  }

  static v1::DequantizeLayersRequest Request(const std::vector<std::string>& names, v1::DType dtype,
                                             int64_t chunk_bytes = 0) {
    v1::DequantizeLayersRequest request;
    for (const std::string& name : names) request.add_tensors(name);
    request.set_output_dtype(dtype);
    request.set_chunk_bytes(chunk_bytes);
    return request;
  }

  // Checks `got` against layers `want` (indices into layers_) in `dtype`, bit for bit.
  static void ExpectLayers(const std::vector<DequantizedTensor>& got, const std::vector<int>& want,
                           DType dtype, v1::DType wire) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const RandomLayer& l = layer(static_cast<size_t>(want[i]));
      SCOPED_TRACE(absl::StrCat("result ", i, ": ", l.name));
      const v1::DequantizeHeader& h = got[i].header;
      EXPECT_EQ(h.tensor(), l.name);
      EXPECT_THAT(h.shape(), ::testing::ElementsAre(l.shape.K, l.shape.N));
      EXPECT_EQ(h.dtype(), wire);
      EXPECT_EQ(h.total_bytes(), l.shape.K * l.shape.N * DTypeSize(dtype));
      EXPECT_EQ(h.backend(), "cpu");
      EXPECT_EQ(h.kernel(), "cpu threads=2");
      EXPECT_TRUE(got[i].data == l.Expected(dtype));
    }
  }
};

TEST_F(LayersTest, ThreeLayersWithADuplicateEqualTheReferenceInRequestOrder) {
  const std::vector<int> order = {2, 0, 2};  // 3,866,624 bytes in fp16, under the limit
  for (const auto& [dtype, wire] :
       {std::pair{DType::kF16, v1::DTYPE_FP16}, std::pair{DType::kBF16, v1::DTYPE_BF16}}) {
    SCOPED_TRACE(DTypeName(dtype));
    // 64 KiB chunks: every layer is several chunks, offsets restarting at 0 per layer (checked
    // by the client's per-layer ResponseStreamChecker).
    absl::StatusOr<std::vector<DequantizedTensor>> got = client().DequantizeLayersToMemory(
        Request({layer(2).name, layer(0).name, layer(2).name}, wire, 65536));
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectLayers(*got, order, dtype, wire);
  }
}

TEST_F(LayersTest, Fp32WithinTheLimit) {
  // 256*256*4 + 128*4672*4 = 2,654,208 bytes <= 4,000,000.
  absl::StatusOr<std::vector<DequantizedTensor>> got =
      client().DequantizeLayersToMemory(Request({layer(1).name, layer(2).name}, v1::DTYPE_FP32));
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectLayers(*got, {1, 2}, DType::kF32, v1::DTYPE_FP32);
}

TEST_F(LayersTest, EmptyListMeansEveryLayerInListTensorsOrder) {
  absl::StatusOr<std::vector<DequantizedTensor>> got =
      client().DequantizeLayersToMemory(Request({}, v1::DTYPE_UNSPECIFIED));
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectLayers(*got, {0, 1, 2}, DType::kF16, v1::DTYPE_FP16);
}

TEST_F(LayersTest, UnknownNameIsNotFoundNamingIt) {
  absl::StatusOr<std::vector<DequantizedTensor>> got = client().DequantizeLayersToMemory(
      Request({layer(0).name, "model.layers.9.mlp.gate_proj"}, v1::DTYPE_FP16));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("\"model.layers.9.mlp.gate_proj\""));
}

TEST_F(LayersTest, OneTensorOverTheOutputLimitIsResourceExhaustedNamingItAndTheFlag) {
  // Every layer in fp32: layer 0's result, 512 * 1440 * 4 = 2,949,120 bytes > 2,500,000.
  absl::StatusOr<std::vector<DequantizedTensor>> got =
      client().DequantizeLayersToMemory(Request({}, v1::DTYPE_FP32));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
  EXPECT_THAT(got.status().message(),
              HasSubstr("the result of tensor \"model.layers.0.mlp.down_proj\" is 2949120 bytes"));
  EXPECT_THAT(got.status().message(), HasSubstr("max_output_bytes = 2500000"));
  EXPECT_THAT(got.status().message(), HasSubstr("--max-output-bytes"));
}

TEST_F(LayersTest, TheSumOverTheLayersIsNotLimited) {
  // Issue 22: the limit bounds what a call holds (one tensor's result), not the sum it streams.
  // Layer 0 in fp16 three times: 4,423,680 bytes, more than max_output_bytes = 2,500,000.
  absl::StatusOr<std::vector<DequantizedTensor>> got = client().DequantizeLayersToMemory(
      Request({layer(0).name, layer(0).name, layer(0).name}, v1::DTYPE_FP16));
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectLayers(*got, {0, 0, 0}, DType::kF16, v1::DTYPE_FP16);
}

TEST_F(LayersTest, TooManyNamesOrBadDTypeIsInvalidArgument) {
  v1::DequantizeLayersRequest request =
      Request(std::vector<std::string>(10001, layer(1).name), v1::DTYPE_FP16);
  absl::StatusOr<std::vector<DequantizedTensor>> got = client().DequantizeLayersToMemory(request);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_TRUE(NamesField(std::string(got.status().message()), "tensors")) << got.status();

  got = client().DequantizeLayersToMemory(Request({layer(1).name}, v1::DTYPE_INT32));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_TRUE(NamesField(std::string(got.status().message()), "output_dtype")) << got.status();
}

TEST_F(LayersTest, ExactlyTenThousandNamesAreServed) {
  // 10000 names of layer 0 in fp32: each is over max_output_bytes, whose check stops the call
  // before any work (RESOURCE_EXHAUSTED, not INVALID_ARGUMENT for the count).
  absl::StatusOr<std::vector<DequantizedTensor>> got = client().DequantizeLayersToMemory(
      Request(std::vector<std::string>(10000, layer(0).name), v1::DTYPE_FP32));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
}

// Issue 22: a shutdown signal during the load (main sets ServerOptions::cancel_load) stops it:
// Start returns CANCELLED and no server is left serving.
TEST(LoadTest, ACancelledLoadIsCancelled) {
  const std::string model = BundledModelDir();
  if (!std::filesystem::exists(model)) GTEST_SKIP() << model << " is not there";
  ServerOptions options;
  options.model_dir = model;
  const std::atomic<bool> cancel{true};
  options.cancel_load = &cancel;
  absl::StatusOr<std::unique_ptr<TestServer>> server = StartServer(options, "cpu");
  EXPECT_EQ(server.status().code(), absl::StatusCode::kCancelled) << server.status();
  EXPECT_THAT(server.status().message(), HasSubstr("interrupted"));
}

// The CUDA backend's grouped launch, through a server started with backend "cuda" (skipped
// without a GPU or in a build without CUDA: the server then refuses with FAILED_PRECONDITION).
TEST(CudaLayersTest, WholeCheckpointInOneGroupedLaunchIsBitExact) {
  const std::vector<RandomLayer> layers = {
      MakeRandomLayer("model.layers.0.mlp.down_proj", 1024, 1440, 128, DType::kF16, 51),
      MakeRandomLayer("model.layers.0.mlp.up_proj", 256, 4672, 128, DType::kBF16, 52),
      MakeRandomLayer("model.layers.0.self_attn.k_proj", 576, 192, 64, DType::kF16, 53),
      MakeRandomLayer("model.layers.0.self_attn.o_proj", 96, 576, 32, DType::kBF16, 54),
  };
  const std::string dir = MakeTempDir("cuda_layers");
  ASSERT_TRUE(WriteCheckpoint(dir, layers, 128).ok());
  ServerOptions options;
  options.model_dir = dir;
  absl::StatusOr<std::unique_ptr<TestServer>> server = StartServer(options, "cuda");
  if (server.status().code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  }
  ASSERT_TRUE(server.ok()) << server.status();
  DequantClient& client = *(*server)->client;

  constexpr std::pair<v1::DType, DType> kDTypes[] = {
      {v1::DTYPE_FP16, DType::kF16}, {v1::DTYPE_BF16, DType::kBF16}, {v1::DTYPE_FP32, DType::kF32}};
  for (const auto& [wire, dtype] : kDTypes) {
    // Twice: the second call reuses the first one's cached device buffers.
    for (int pass = 0; pass < 2; ++pass) {
      SCOPED_TRACE(absl::StrCat(OutputDTypeName(wire), " pass ", pass));
      v1::DequantizeLayersRequest request;
      request.set_output_dtype(wire);
      request.set_chunk_bytes(64 << 10);
      absl::StatusOr<std::vector<DequantizedTensor>> got = client.DequantizeLayersToMemory(request);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), layers.size());
      for (size_t i = 0; i < layers.size(); ++i) {
        SCOPED_TRACE(layers[i].name);
        EXPECT_EQ((*got)[i].header.tensor(), layers[i].name);
        EXPECT_EQ((*got)[i].header.backend(), "cuda");
        EXPECT_THAT((*got)[i].header.kernel(), ::testing::StartsWith("grouped "));
        EXPECT_THAT((*got)[i].header.kernel(), HasSubstr("layers=4"));
        EXPECT_TRUE((*got)[i].data == layers[i].Expected(dtype));
      }
    }
    // A subset with a duplicate: one launch over the two distinct layers.
    SCOPED_TRACE(OutputDTypeName(wire));
    v1::DequantizeLayersRequest request;
    request.set_output_dtype(wire);
    for (int i : {3, 1, 3}) request.add_tensors(layers[static_cast<size_t>(i)].name);
    absl::StatusOr<std::vector<DequantizedTensor>> got = client.DequantizeLayersToMemory(request);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 3u);
    const int order[] = {3, 1, 3};
    for (size_t i = 0; i < 3; ++i) {
      const RandomLayer& l = layers[static_cast<size_t>(order[i])];
      EXPECT_EQ((*got)[i].header.tensor(), l.name);
      EXPECT_THAT((*got)[i].header.kernel(), HasSubstr("layers=2"));
      EXPECT_TRUE((*got)[i].data == l.Expected(dtype)) << l.name;
    }
  }
}

// A --pretune server serves DequantizeLayers like any other.
TEST(CudaLayersTest, PretunedServerServesTheModelPlan) {
  const std::vector<RandomLayer> layers = {
      MakeRandomLayer("model.layers.0.mlp.down_proj", 512, 1440, 128, DType::kF16, 61),
      MakeRandomLayer("model.layers.0.self_attn.q_proj", 256, 256, 128, DType::kBF16, 62),
  };
  const std::string dir = MakeTempDir("cuda_layers_pretune");
  ASSERT_TRUE(WriteCheckpoint(dir, layers, 128).ok());
  ServerOptions options;
  options.model_dir = dir;
  options.pretune = true;
  absl::StatusOr<std::unique_ptr<TestServer>> server = StartServer(options, "cuda");
  if (server.status().code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  }
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::vector<DequantizedTensor>> got =
      (*server)->client->DequantizeLayersToMemory(v1::DequantizeLayersRequest());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_THAT((*got)[i].header.kernel(), HasSubstr("layers=2"));
    EXPECT_TRUE((*got)[i].data == layers[i].Expected(DType::kF16)) << layers[i].name;
  }
}

}  // namespace
}  // namespace dequantd::testing
