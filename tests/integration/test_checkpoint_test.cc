// ListTensors, GetServerInfo and Dequantize against a small checkpoint the test writes itself,
// served by a real in-process server (CPU backend) and read with the real DequantClient.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_support.h"

namespace dequantd::testing {
namespace {

class TestCheckpointTest : public SharedServerSuite<TestCheckpointTest> {
 protected:
  static void SetUpTestSuite() {
    // Sorted by name, as ListTensors returns them. N = 1440 and 4672 are not multiples of 64.
    StartSharedServer(
        "test_checkpoint",
        {MakeRandomLayer("model.layers.0.mlp.down_proj", 512, 1440, 64, DType::kF16, 1),
         MakeRandomLayer("model.layers.0.self_attn.q_proj", 256, 256, 64, DType::kF16, 2),
         MakeRandomLayer("model.layers.1.mlp.up_proj", 128, 4672, 64, DType::kBF16, 3)},
        64);
  }
};

TEST_F(TestCheckpointTest, ListTensorsReportsEveryLayerWithShapesAndBytes) {
  absl::StatusOr<v1::ListTensorsResponse> list = client().ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->model(), *dir_);
  ASSERT_EQ(list->tensors_size(), 3);
  for (int i = 0; i < 3; ++i) {
    const v1::QuantizedTensorInfo& t = list->tensors(i);
    const QuantShape& s = layer(i).shape;
    SCOPED_TRACE(t.name());
    EXPECT_EQ(t.name(), layer(i).name);
    EXPECT_EQ(t.in_features(), s.K);
    EXPECT_EQ(t.out_features(), s.N);
    EXPECT_EQ(t.group_size(), 64);
    EXPECT_EQ(t.scale_dtype(), s.scale_dtype == DType::kBF16 ? v1::DTYPE_BF16 : v1::DTYPE_FP16);
    // qweight K*N/8*4 + qzeros K/G*N/8*4 + scales K/G*N*2, worked out by hand:
    const int64_t want[] = {512 * 180 * 4 + 8 * 180 * 4 + 8 * 1440 * 2,
                            256 * 32 * 4 + 4 * 32 * 4 + 4 * 256 * 2,
                            128 * 584 * 4 + 2 * 584 * 4 + 2 * 4672 * 2};
    EXPECT_EQ(t.packed_bytes(), want[i]);
    EXPECT_FALSE(t.resident_on_device());  // CPU backend
  }
}

TEST_F(TestCheckpointTest, GetServerInfoNamesCpuBackendAndModel) {
  absl::StatusOr<v1::GetServerInfoResponse> info = client().GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->backend(), "cpu");
  EXPECT_EQ(info->model(), *dir_);
  EXPECT_EQ(info->tensor_count(), 3);
  EXPECT_EQ(info->cpu_threads(), 2);
  EXPECT_FALSE(info->version().empty());
}

struct LayerAndDType {
  int layer;
  v1::DType wire;  // requested
  DType kernel;    // computed (UNSPECIFIED means fp16)
};

class TestCheckpointDequantizeTest : public TestCheckpointTest,
                                     public ::testing::WithParamInterface<LayerAndDType> {};

TEST_P(TestCheckpointDequantizeTest, MatchesReferenceBitForBit) {
  const RandomLayer& l = layer(GetParam().layer);
  v1::DequantizeRequest request;
  request.set_tensor(l.name);
  request.set_output_dtype(GetParam().wire);
  absl::StatusOr<DequantizedTensor> result = client().DequantizeToMemory(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->header.shape(), ::testing::ElementsAre(l.shape.K, l.shape.N));
  const v1::DType served = GetParam().kernel == DType::kF16    ? v1::DTYPE_FP16
                           : GetParam().kernel == DType::kBF16 ? v1::DTYPE_BF16
                                                               : v1::DTYPE_FP32;
  EXPECT_EQ(result->header.dtype(), served);
  EXPECT_EQ(result->header.total_bytes(), l.shape.output_bytes(GetParam().kernel));
  EXPECT_EQ(result->header.backend(), "cpu");
  EXPECT_TRUE(result->data == l.Expected(GetParam().kernel)) << "result differs from reference";
}

std::string LayerAndDTypeName(const ::testing::TestParamInfo<LayerAndDType>& info) {
  static const char* const kNames[] = {"K512_N1440_G64", "K256_N256_G64",
                                       "K128_N4672_G64_bf16scales"};
  return absl::StrCat(kNames[info.param.layer], "_", OutputDTypeName(info.param.wire));
}

INSTANTIATE_TEST_SUITE_P(AllLayersAllDTypes, TestCheckpointDequantizeTest,
                         ::testing::Values(LayerAndDType{0, v1::DTYPE_FP16, DType::kF16},
                                           LayerAndDType{0, v1::DTYPE_BF16, DType::kBF16},
                                           LayerAndDType{0, v1::DTYPE_FP32, DType::kF32},
                                           LayerAndDType{1, v1::DTYPE_FP16, DType::kF16},
                                           LayerAndDType{1, v1::DTYPE_UNSPECIFIED,
                                                         DType::kF16},  // default fp16
                                           LayerAndDType{2, v1::DTYPE_FP16, DType::kF16},
                                           LayerAndDType{2, v1::DTYPE_BF16, DType::kBF16},
                                           LayerAndDType{2, v1::DTYPE_FP32, DType::kF32}),
                         LayerAndDTypeName);

TEST_F(TestCheckpointTest, SmallChunksSpanManyMessagesAndReassembleExactly) {
  const RandomLayer& l = layer(0);  // K=512, N=1440 fp32: 2949120 bytes = 45 chunks of 64 KiB
  v1::DequantizeRequest request;
  request.set_tensor(l.name);
  request.set_output_dtype(v1::DTYPE_FP32);
  request.set_chunk_bytes(64 << 10);
  std::vector<uint8_t> data;
  int chunks = 0;
  int64_t largest = 0;
  DequantizeSink sink;
  sink.on_chunk = [&](int64_t offset, absl::Span<const uint8_t> bytes) {
    EXPECT_EQ(offset, static_cast<int64_t>(data.size()));
    data.insert(data.end(), bytes.begin(), bytes.end());
    return absl::OkStatus();
  };
  sink.on_message = [&](int64_t offset, int64_t bytes) {  // the server's messages
    EXPECT_EQ(offset, static_cast<int64_t>(data.size()));
    largest = std::max(largest, bytes);
    ++chunks;
  };
  absl::StatusOr<v1::DequantizeHeader> header = client().Dequantize(request, sink);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->total_bytes(), 2949120);
  EXPECT_EQ(largest, 64 << 10);
  EXPECT_EQ(chunks, 45);  // ceil(2949120 / 65536)
  EXPECT_TRUE(data == l.Expected(DType::kF32));
}

TEST_F(TestCheckpointTest, ChunkBytesBelowMinimumIsClampedTo64KiB) {
  const RandomLayer& l = layer(1);  // K=256, N=256 fp16: 131072 bytes = 2 chunks of 64 KiB
  v1::DequantizeRequest request;
  request.set_tensor(l.name);
  request.set_chunk_bytes(100);
  int chunks = 0;
  DequantizeSink sink;
  sink.on_message = [&](int64_t, int64_t) { ++chunks; };
  absl::StatusOr<v1::DequantizeHeader> header = client().Dequantize(request, sink);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(chunks, 2);
}

TEST_F(TestCheckpointTest, SinkErrorCancelsTheCallAndServerKeepsServing) {
  v1::DequantizeRequest request;
  request.set_tensor(layer(0).name);
  request.set_chunk_bytes(64 << 10);
  DequantizeSink sink;
  sink.on_chunk = [](int64_t offset, absl::Span<const uint8_t>) {
    return offset >= (128 << 10) ? absl::AbortedError("disk full (test)") : absl::OkStatus();
  };
  absl::StatusOr<v1::DequantizeHeader> header = client().Dequantize(request, sink);
  EXPECT_EQ(header.status(), absl::AbortedError("disk full (test)"));

  absl::StatusOr<DequantizedTensor> again = client().DequantizeToMemory(request);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->data == layer(0).Expected(DType::kF16));
}

TEST_F(TestCheckpointTest, ConcurrentCallsAllGetTheirOwnExactResult) {
  std::vector<std::thread> threads;
  std::atomic<int> exact{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      const RandomLayer& l = layer(t % 3);
      v1::DequantizeRequest request;
      request.set_tensor(l.name);
      request.set_output_dtype(t < 3 ? v1::DTYPE_FP16 : v1::DTYPE_FP32);
      absl::StatusOr<DequantizedTensor> r = client().DequantizeToMemory(request);
      if (r.ok() && r->data == l.Expected(t < 3 ? DType::kF16 : DType::kF32)) ++exact;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(exact.load(), 6);
}

TEST_F(TestCheckpointTest, InlineRoundTripMatchesReference) {
  // Not in the checkpoint; N = 136 is a multiple of 8 but not of 16/32/64.
  const RandomLayer l = MakeRandomLayer("inline", 192, 136, 64, DType::kF16, 11);
  for (const auto& [wire, kernel] :
       {std::pair{v1::DTYPE_FP16, DType::kF16}, std::pair{v1::DTYPE_BF16, DType::kBF16},
        std::pair{v1::DTYPE_FP32, DType::kF32}}) {
    SCOPED_TRACE(OutputDTypeName(wire));
    v1::DequantizeRequest request;
    *request.mutable_packed() = l.ToInline();
    request.set_output_dtype(wire);
    absl::StatusOr<DequantizedTensor> result = client().DequantizeToMemory(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_THAT(result->header.shape(), ::testing::ElementsAre(192, 136));
    EXPECT_TRUE(result->data == l.Expected(kernel));
  }
}

TEST_F(TestCheckpointTest, InlineGroupSizeMinusOneMeansK) {
  // A checkpoint's group_size -1: one scale/zero row for all K rows. bf16 scales.
  const RandomLayer l = MakeRandomLayer("inline", 96, 64, 96, DType::kBF16, 12);
  v1::DequantizeRequest request;
  *request.mutable_packed() = l.ToInline();
  request.mutable_packed()->set_group_size(-1);
  request.set_output_dtype(v1::DTYPE_FP32);
  absl::StatusOr<DequantizedTensor> result = client().DequantizeToMemory(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->data == l.Expected(DType::kF32));
}

}  // namespace
}  // namespace dequantd::testing
