// Tests for formats/quant_tensors with the AWQ row: hand-written header entries of one AWQ layer,
// the shape derived from them, and each wrong dtype or shape refused with INVALID_ARGUMENT and its
// exact message.
#include "formats/quant_tensors.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd::formats {
namespace {

using ::testing::HasSubstr;

safetensors::TensorEntry Entry(const std::string& name, const std::string& dtype,
                               std::vector<int64_t> shape) {
  safetensors::TensorEntry e;
  e.name = name;
  e.dtype = dtype;
  e.shape = std::move(shape);
  return e;
}

// A layer "l" with K = 128, N = 576, G = 32: qweight (128, 72), qzeros (4, 72), scales (4, 576).
class AwqTensorsTest : public ::testing::Test {
 protected:
  absl::StatusOr<QuantShape> Check(const StoredTensorOptions& options = {}) {
    const QuantTensorRef refs[] = {
        {"a.safetensors", &qweight_}, {"b.safetensors", &qzeros_}, {"c.safetensors", &scales_}};
    return QuantShapeFromTensors(Format::kAwqGemm, "l", refs, options);
  }
  std::string Message(const StoredTensorOptions& options = {}) {
    absl::StatusOr<QuantShape> s = Check(options);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.status().message());
  }
  safetensors::TensorEntry qweight_ = Entry("l.qweight", "I32", {128, 72});
  safetensors::TensorEntry qzeros_ = Entry("l.qzeros", "I32", {4, 72});
  safetensors::TensorEntry scales_ = Entry("l.scales", "F16", {4, 576});
};

TEST_F(AwqTensorsTest, K128N576G32F16) {
  absl::StatusOr<QuantShape> s = Check();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->K, 128);
  EXPECT_EQ(s->N, 576);
  EXPECT_EQ(s->group_size, 32);
  EXPECT_EQ(s->scale_dtype, DType::kF16);
}

TEST_F(AwqTensorsTest, BF16ScalesAndOneGroup) {
  qzeros_.shape = {1, 72};
  scales_ = Entry("l.scales", "BF16", {1, 576});
  absl::StatusOr<QuantShape> s = Check();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->group_size, 128);
  EXPECT_EQ(s->scale_dtype, DType::kBF16);
}

TEST_F(AwqTensorsTest, TransposedQzerosNamesQzerosShape) {
  qzeros_.shape = {72, 4};  // (N/8, K/G)
  EXPECT_EQ(Message(),
            "b.safetensors: tensor 'l.qzeros' (layer 'l'): field 'shape' is (72, 4), want "
            "(4, 72) = (K/G, N/8)");
}

TEST_F(AwqTensorsTest, TransposedScalesNamesScalesShape) {
  scales_.shape = {576, 4};  // (N, K/G)
  EXPECT_EQ(Message(),
            "c.safetensors: tensor 'l.scales' (layer 'l'): field 'shape' is (576, 4), want N = "
            "8 * qweight columns = 576 columns");
}

TEST_F(AwqTensorsTest, ScalesRowsNotDividingK) {
  qzeros_.shape = {3, 72};
  scales_.shape = {3, 576};
  EXPECT_EQ(Message(),
            "c.safetensors: tensor 'l.scales' (layer 'l'): field 'shape' has 3 rows, which do not "
            "divide K = 128 into whole groups (G = K / scales rows)");
  scales_.shape = {0, 576};
  EXPECT_THAT(Message(), HasSubstr("has 0 rows"));
}

TEST_F(AwqTensorsTest, NotTwoDims) {
  scales_.shape = {4, 576, 1};
  EXPECT_EQ(Message(),
            "c.safetensors: tensor 'l.scales' (layer 'l'): field 'shape' has 3 dims, want 2");
  scales_.shape = {4, 576};
  qweight_.shape = {9216};
  EXPECT_THAT(Message(), HasSubstr("tensor 'l.qweight' (layer 'l'): field 'shape' has 1 dims"));
}

TEST_F(AwqTensorsTest, PackedDTypes) {
  qzeros_.dtype = "F32";
  EXPECT_EQ(Message(),
            "b.safetensors: tensor 'l.qzeros' (layer 'l'): field 'dtype' is F32, want I32");
  qzeros_.dtype = "U32";
  EXPECT_EQ(Message(),
            "b.safetensors: tensor 'l.qzeros' (layer 'l'): field 'dtype' is U32, want I32");
  EXPECT_TRUE(Check({.packed_u32 = true}).ok());
  qweight_.dtype = "I16";
  EXPECT_EQ(Message({.packed_u32 = true}),
            "a.safetensors: tensor 'l.qweight' (layer 'l'): field 'dtype' is I16, want I32 or U32");
}

TEST_F(AwqTensorsTest, ScalesDType) {
  scales_.dtype = "F32";
  EXPECT_EQ(Message(),
            "c.safetensors: tensor 'l.scales' (layer 'l'): field 'dtype' is F32, want F16 or "
            "BF16");
}

TEST_F(AwqTensorsTest, HugeQweightColumnsAreRefusedBeforeNOverflows) {
  qweight_.shape = {0, int64_t{1} << 62};
  EXPECT_THAT(Message(), HasSubstr("tensor 'l.qweight' (layer 'l'): field 'shape' has "));
}

}  // namespace
}  // namespace dequantd::formats
