// ReferenceComparer: error statistics worked out by hand, the (N, K) transposed layout, elements
// split across chunks, and reference selection.
#include "client/compare.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/awq_format.h"
#include "tests/client/test_dir.h"

namespace dequantd {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::dequant::v1;

using client_test::TempPath;

template <typename T>
absl::Span<const uint8_t> Bytes(const std::vector<T>& v) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T));
}

v1::DequantizeHeader Header(int64_t K, int64_t N, v1::DType dtype) {
  v1::DequantizeHeader h;
  h.add_shape(K);
  h.add_shape(N);
  h.set_dtype(dtype);
  h.set_total_bytes(K * N * (dtype == v1::DTYPE_FP32 ? 4 : 2));
  return h;
}

// Reference (K=2, N=8) F32: ref[k][n] = k * 8 + n + 1 (1..16). Result: ref plus an error of
// +0.5 at [0][0] and -1.5 at [1][7] (exact in fp16 and fp32).
//   max_abs = 1.5; rms = sqrt((0.25 + 2.25) / 16) = sqrt(0.15625);
//   rms(ref) = sqrt(sum(i^2, 1..16) / 16) = sqrt(1496 / 16); relative = sqrt(2.5 / 1496).
std::vector<float> Reference() {
  std::vector<float> ref(16);
  for (int i = 0; i < 16; ++i) ref[i] = static_cast<float>(i + 1);
  return ref;
}
std::vector<float> Result() {
  std::vector<float> out = Reference();
  out[0] += 0.5f;
  out[15] -= 1.5f;
  return out;
}

void ExpectHandWorkedStats(const ErrorStats& s) {
  EXPECT_EQ(s.count, 16);
  EXPECT_EQ(s.nonfinite, 0);
  EXPECT_DOUBLE_EQ(s.max_abs_error, 1.5);
  EXPECT_DOUBLE_EQ(s.rms_error, std::sqrt(0.15625));
  EXPECT_DOUBLE_EQ(s.relative_rms_error, std::sqrt(2.5 / 1496.0));
}

TEST(ReferenceComparerTest, HandWorkedStatsFp32ResultSplitAtOddBytes) {
  const std::string path = TempPath("ref_kn.safetensors");
  const std::vector<float> ref = Reference();
  ASSERT_TRUE(safetensors::WriteFile(path, {{"w", "F32", {2, 8}, Bytes(ref)}}).ok());
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      ReferenceComparer::Open(path, {}, ReferenceLayout::kAuto);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->tensor_name(), "w");  // the only tensor
  ASSERT_TRUE((*c)->Begin(Header(2, 8, v1::DTYPE_FP32)).ok());
  EXPECT_FALSE((*c)->transposed());
  const std::vector<float> out = Result();
  const absl::Span<const uint8_t> bytes = Bytes(out);
  ASSERT_TRUE((*c)->Add(bytes.subspan(0, 3)).ok());
  ASSERT_TRUE((*c)->Add(bytes.subspan(3, 30)).ok());
  ASSERT_TRUE((*c)->Add(bytes.subspan(33)).ok());
  ExpectHandWorkedStats((*c)->Stats());
}

TEST(ReferenceComparerTest, TransposedNKReferenceAndFp16Result) {
  // The same reference stored as (N=8, K=2): refT[n][k] = ref[k][n]; named among defaults.
  const std::vector<float> ref = Reference();
  std::vector<uint16_t> ref_t(16);
  for (int k = 0; k < 2; ++k) {
    for (int n = 0; n < 8; ++n) ref_t[n * 2 + k] = FloatToHalfBitsRne(ref[k * 8 + n]);
  }
  const std::string path = TempPath("ref_nk.safetensors");
  std::vector<uint16_t> other(8, 0);
  ASSERT_TRUE(safetensors::WriteFile(path, {{"layer.weight", "F16", {8, 2}, Bytes(ref_t)},
                                            {"other", "F16", {1, 8}, Bytes(other)}})
                  .ok());
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      ReferenceComparer::Open(path, {"missing", "layer.weight"}, ReferenceLayout::kAuto);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->tensor_name(), "layer.weight");
  ASSERT_TRUE((*c)->Begin(Header(2, 8, v1::DTYPE_FP16)).ok());
  EXPECT_TRUE((*c)->transposed());
  std::vector<uint16_t> out(16);
  const std::vector<float> result = Result();
  for (int i = 0; i < 16; ++i) out[i] = FloatToHalfBitsRne(result[i]);
  ASSERT_TRUE((*c)->Add(Bytes(out)).ok());
  ExpectHandWorkedStats((*c)->Stats());
}

TEST(ReferenceComparerTest, ExplicitTensorAndLayoutMismatch) {
  const std::string path = TempPath("ref_explicit.safetensors");
  const std::vector<float> ref = Reference();
  ASSERT_TRUE(safetensors::WriteFile(
                  path, {{"a", "F32", {2, 8}, Bytes(ref)}, {"b", "F32", {8, 2}, Bytes(ref)}})
                  .ok());
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      ReferenceComparer::Open(path + ":a", {}, ReferenceLayout::kNK);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->Begin(Header(2, 8, v1::DTYPE_FP32)).code(),
            absl::StatusCode::kInvalidArgument);  // (2, 8) is not (N, K)
  EXPECT_EQ(ReferenceComparer::Open(path + ":zzz", {}, ReferenceLayout::kAuto).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ReferenceComparer::Open(path, {"nope"}, ReferenceLayout::kAuto).status().code(),
            absl::StatusCode::kInvalidArgument);  // two tensors, none named
  EXPECT_EQ(ReferenceComparer::Open(TempPath("absent.safetensors"), {}, ReferenceLayout::kAuto)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST(ReferenceComparerTest, NonFiniteValuesAreCountedNotAveraged) {
  const std::string path = TempPath("ref_inf.safetensors");
  std::vector<float> ref(8, 1.0f);
  ASSERT_TRUE(safetensors::WriteFile(path, {{"w", "F32", {1, 8}, Bytes(ref)}}).ok());
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      ReferenceComparer::Open(path, {}, ReferenceLayout::kAuto);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Begin(Header(1, 8, v1::DTYPE_FP16)).ok());
  std::vector<uint16_t> out(8, 0x3C00);  // 1.0
  out[3] = 0x7C00;                       // +inf
  out[5] = 0x4000;                       // 2.0
  ASSERT_TRUE((*c)->Add(Bytes(out)).ok());
  const ErrorStats s = (*c)->Stats();
  EXPECT_EQ(s.count, 7);
  EXPECT_EQ(s.nonfinite, 1);
  EXPECT_DOUBLE_EQ(s.max_abs_error, 1.0);
  EXPECT_DOUBLE_EQ(s.rms_error, std::sqrt(1.0 / 7));
  EXPECT_EQ((*c)->Add(Bytes(out)).code(), absl::StatusCode::kOutOfRange);  // more than (K, N)
}

TEST(ReferenceLayoutTest, Parses) {
  EXPECT_EQ(*ParseReferenceLayout("nk"), ReferenceLayout::kNK);
  EXPECT_EQ(ParseReferenceLayout("NK").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dequantd
