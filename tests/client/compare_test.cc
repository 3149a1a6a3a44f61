// ReferenceComparer: error statistics worked out by hand, the (N, K) transposed layout, elements
// split across chunks, reference selection, and .npy references.
#include "client/compare.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "formats/npy.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
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

// A 3-D result (E = 2 stacked (K, N) = (2, 8) matrices, MXFP4's header) against a reference
// stored per expert as (N, K): each matrix is transposed on its own. Expert 0 carries the
// hand-worked errors, expert 1 none: max 1.5, rms sqrt(2.5 / 32), relative sqrt(2.5 / 2992).
TEST(ReferenceComparerTest, StackedExpertsAreComparedMatrixByMatrix) {
  const std::vector<float> ref = Reference();
  std::vector<float> ref_t(32);
  for (int e = 0; e < 2; ++e) {
    for (int k = 0; k < 2; ++k) {
      for (int n = 0; n < 8; ++n) ref_t[e * 16 + n * 2 + k] = ref[k * 8 + n];
    }
  }
  const std::string path = TempPath("ref_experts.safetensors");
  ASSERT_TRUE(safetensors::WriteFile(path, {{"w", "F32", {2, 8, 2}, Bytes(ref_t)}}).ok());
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      ReferenceComparer::Open(path, {}, ReferenceLayout::kAuto);
  ASSERT_TRUE(c.ok()) << c.status();
  v1::DequantizeHeader h = Header(2, 8, v1::DTYPE_FP32);
  h.clear_shape();
  for (int64_t d : {2, 2, 8}) h.add_shape(d);
  h.set_total_bytes(2 * 16 * 4);
  ASSERT_TRUE((*c)->Begin(h).ok());
  EXPECT_TRUE((*c)->transposed());
  std::vector<float> out = Result();
  out.insert(out.end(), ref.begin(), ref.end());
  ASSERT_TRUE((*c)->Add(Bytes(out)).ok());
  const ErrorStats s = (*c)->Stats();
  EXPECT_EQ(s.count, 32);
  EXPECT_DOUBLE_EQ(s.max_abs_error, 1.5);
  EXPECT_DOUBLE_EQ(s.rms_error, std::sqrt(2.5 / 32.0));
  EXPECT_DOUBLE_EQ(s.relative_rms_error, std::sqrt(2.5 / 2992.0));
  // A 2-D reference does not match a 3-D result.
  const std::string flat = TempPath("ref_flat.safetensors");
  ASSERT_TRUE(safetensors::WriteFile(flat, {{"w", "F32", {2, 8}, Bytes(ref)}}).ok());
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> f =
      ReferenceComparer::Open(flat, {}, ReferenceLayout::kAuto);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->Begin(h).code(), absl::StatusCode::kInvalidArgument);
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

// A square (K = N = 4) F32 reference ref[r][c] = 4r + c + 1 and a result equal to it. With auto
// the layout is ambiguous; kn compares it as is (error 0), nk transposed: the error at [k][n] is
// ref[k][n] - ref[n][k] = 3 (k - n), so max_abs = 9 and the squared errors add up to
// 9 * sum((k - n)^2) = 9 * 40 = 360 over 16 elements.
TEST(ReferenceComparerTest, SquareReferenceNeedsAnExplicitLayout) {
  const std::string path = TempPath("ref_square.safetensors");
  std::vector<float> ref(16);
  for (int i = 0; i < 16; ++i) ref[i] = static_cast<float>(i + 1);
  ASSERT_TRUE(safetensors::WriteFile(path, {{"q.weight", "F32", {4, 4}, Bytes(ref)}}).ok());

  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      ReferenceComparer::Open(path, {}, ReferenceLayout::kAuto);
  ASSERT_TRUE(c.ok()) << c.status();
  const absl::Status s = (*c)->Begin(Header(4, 4, v1::DTYPE_FP32));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "reference '" + path +
                             ":q.weight' is square (K = N = 4): its layout is ambiguous; pass "
                             "--compare-layout kn or nk");

  c = ReferenceComparer::Open(path, {}, ReferenceLayout::kKN);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Begin(Header(4, 4, v1::DTYPE_FP32)).ok());
  EXPECT_FALSE((*c)->transposed());
  ASSERT_TRUE((*c)->Add(Bytes(ref)).ok());
  EXPECT_EQ((*c)->Stats().count, 16);
  EXPECT_EQ((*c)->Stats().max_abs_error, 0);

  c = ReferenceComparer::Open(path, {}, ReferenceLayout::kNK);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Begin(Header(4, 4, v1::DTYPE_FP32)).ok());
  EXPECT_TRUE((*c)->transposed());
  ASSERT_TRUE((*c)->Add(Bytes(ref)).ok());
  EXPECT_DOUBLE_EQ((*c)->Stats().max_abs_error, 9);
  EXPECT_DOUBLE_EQ((*c)->Stats().rms_error, std::sqrt(360.0 / 16));
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
  EXPECT_EQ(s.nonfinite, 0);
  EXPECT_EQ(s.nonfinite_mismatches, 1);  // +inf against 1.0
  EXPECT_EQ(s.max_abs_error, std::numeric_limits<double>::infinity());
  EXPECT_DOUBLE_EQ(s.rms_error, std::sqrt(1.0 / 7));
  EXPECT_EQ((*c)->Add(Bytes(out)).code(), absl::StatusCode::kOutOfRange);  // more than (K, N)
}

// Non-finite values are equal only when both sides have the same one (NaN and NaN, or the same
// infinity); any other pairing is a mismatch, and makes max_abs_error infinite (an fp16 overflow
// to -inf against a finite -90000 must not read as a perfect match).
TEST(ReferenceComparerTest, NonFiniteValuesOnOneSideOnlyAreMismatches) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::string path = TempPath("ref_nonfinite.safetensors");
  //                        agree: NaN/NaN, -inf/-inf    mismatch: finite/-inf, NaN/1, +inf/-inf
  const std::vector<float> ref = {nan, -inf, -90000.0f, nan, -inf, 2.0f};
  ASSERT_TRUE(safetensors::WriteFile(path, {{"w", "F32", {1, 6}, Bytes(ref)}}).ok());
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      ReferenceComparer::Open(path, {}, ReferenceLayout::kAuto);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Begin(Header(1, 6, v1::DTYPE_FP16)).ok());
  const std::vector<uint16_t> out = {0x7E00, 0xFC00, 0xFC00, 0x3C00, 0x7C00, 0x4000};
  ASSERT_TRUE((*c)->Add(Bytes(out)).ok());
  const ErrorStats s = (*c)->Stats();
  EXPECT_EQ(s.count, 1);  // 2.0 against 2.0
  EXPECT_EQ(s.nonfinite, 2);
  EXPECT_EQ(s.nonfinite_mismatches, 3);
  EXPECT_EQ(s.max_abs_error, inf);
  EXPECT_EQ(s.rms_error, 0);
}

// Writes a C-order .npy file through npy::NpyWriter.
void WriteNpy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
              absl::Span<const uint8_t> data) {
  absl::StatusOr<std::unique_ptr<npy::NpyWriter>> w = npy::NpyWriter::Create(path, descr, shape);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Append(data).ok());
  ASSERT_TRUE((*w)->Finish().ok());
}

TEST(ReferenceComparerTest, NpyFp64ReferenceKNFp32Result) {
  const std::string path = TempPath("ref_kn_f8.npy");
  std::vector<double> ref(16);
  for (int i = 0; i < 16; ++i) ref[i] = i + 1;  // the same values as Reference()
  WriteNpy(path, "<f8", {2, 8}, Bytes(ref));
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      ReferenceComparer::Open(path, {"ignored"}, ReferenceLayout::kAuto);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->tensor_name(), "");
  EXPECT_EQ((*c)->reference(), path);
  ASSERT_TRUE((*c)->Begin(Header(2, 8, v1::DTYPE_FP32)).ok());
  EXPECT_FALSE((*c)->transposed());
  ASSERT_TRUE((*c)->Add(Bytes(Result())).ok());
  ExpectHandWorkedStats((*c)->Stats());
}

TEST(ReferenceComparerTest, SafetensorsF64ReferenceKNFp32Result) {
  const std::string path = TempPath("ref_kn_f64.safetensors");
  std::vector<double> ref(16);
  for (int i = 0; i < 16; ++i) ref[i] = i + 1;
  ASSERT_TRUE(safetensors::WriteFile(path, {{"w", "F64", {2, 8}, Bytes(ref)}}).ok());
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      ReferenceComparer::Open(path, {}, ReferenceLayout::kKN);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->reference(), path + ":w");
  ASSERT_TRUE((*c)->Begin(Header(2, 8, v1::DTYPE_FP32)).ok());
  ASSERT_TRUE((*c)->Add(Bytes(Result())).ok());
  ExpectHandWorkedStats((*c)->Stats());
}

TEST(ReferenceComparerTest, NpyFp16ReferenceNKBf16Result) {
  // (N=8, K=2) '<f2': refT[n][k] = ref[k][n]. The result in bf16 (1..16 and the errors are exact).
  const std::vector<float> ref = Reference();
  std::vector<uint16_t> ref_t(16);
  for (int k = 0; k < 2; ++k) {
    for (int n = 0; n < 8; ++n) ref_t[n * 2 + k] = FloatToHalfBitsRne(ref[k * 8 + n]);
  }
  const std::string path = TempPath("ref_nk_f2.npy");
  WriteNpy(path, "<f2", {8, 2}, Bytes(ref_t));
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      ReferenceComparer::Open(path, {}, ReferenceLayout::kNK);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Begin(Header(2, 8, v1::DTYPE_BF16)).ok());
  EXPECT_TRUE((*c)->transposed());
  std::vector<uint16_t> out(16);
  const std::vector<float> result = Result();
  for (int i = 0; i < 16; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &result[i], 4);
    out[i] = static_cast<uint16_t>(bits >> 16);  // exact: every value has <= 8 significant bits
  }
  ASSERT_TRUE((*c)->Add(Bytes(out)).ok());
  ExpectHandWorkedStats((*c)->Stats());
}

TEST(ReferenceComparerTest, NpyFp32ReferenceInTheWrongLayoutIsRefused) {
  const std::string path = TempPath("ref_kn_f4.npy");
  WriteNpy(path, "<f4", {2, 8}, Bytes(Reference()));
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      ReferenceComparer::Open(path, {}, ReferenceLayout::kNK);
  ASSERT_TRUE(c.ok()) << c.status();
  const absl::Status s = (*c)->Begin(Header(2, 8, v1::DTYPE_FP32));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "reference '" + path +
                             "' has shape (2, 8); --compare-layout nk expects (N, K) = (8, 2)");
}

// Each layout's message says what that layout expects (K = 2, N = 8).
TEST(ReferenceComparerTest, ShapeMismatchSaysWhatTheLayoutExpects) {
  const std::string path = TempPath("ref_3x8.npy");
  WriteNpy(path, "<f4", {3, 8}, Bytes(std::vector<float>(24, 1.0f)));
  for (const auto& [layout, expected] :
       {std::pair{ReferenceLayout::kKN, "kn expects (K, N) = (2, 8)"},
        std::pair{ReferenceLayout::kNK, "nk expects (N, K) = (8, 2)"},
        std::pair{ReferenceLayout::kAuto, "auto expects (K, N) = (2, 8) or (N, K) = (8, 2)"}}) {
    absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
        ReferenceComparer::Open(path, {}, layout);
    ASSERT_TRUE(c.ok()) << c.status();
    const absl::Status s = (*c)->Begin(Header(2, 8, v1::DTYPE_FP32));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(),
              "reference '" + path + "' has shape (3, 8); --compare-layout " + expected);
  }
}

TEST(ReferenceComparerTest, NpyRefusesOtherDescrsFortranOrderAndTensorNames) {
  const std::string i4 = TempPath("ref_i4.npy");
  WriteNpy(i4, "<i4", {2, 8}, Bytes(std::vector<int32_t>(16, 1)));
  absl::Status s = ReferenceComparer::Open(i4, {}, ReferenceLayout::kAuto).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("'<i4'"));
  const std::string u2 = TempPath("ref_u2.npy");  // bf16 bits as dequantctl writes them
  WriteNpy(u2, "<u2", {2, 8}, Bytes(std::vector<uint16_t>(16, 0x3F80)));
  s = ReferenceComparer::Open(u2, {}, ReferenceLayout::kAuto).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("'<u2'"));

  // The same (2, 8) '<f4' array marked Fortran order.
  absl::StatusOr<std::string> preamble = npy::EncodePreamble("<f4", {2, 8});
  ASSERT_TRUE(preamble.ok());
  const size_t at = preamble->find("False");
  ASSERT_NE(at, std::string::npos);
  preamble->replace(at, 5, "True ");
  const std::vector<float> ref = Reference();
  const std::string fortran = TempPath("ref_fortran.npy");
  std::ofstream(fortran, std::ios::binary)
      << *preamble << std::string(reinterpret_cast<const char*>(ref.data()), 64);
  s = ReferenceComparer::Open(fortran, {}, ReferenceLayout::kAuto).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("Fortran"));

  const std::string f4 = TempPath("ref_named.npy");
  WriteNpy(f4, "<f4", {2, 8}, Bytes(ref));
  EXPECT_EQ(ReferenceComparer::Open(f4 + ":w", {}, ReferenceLayout::kAuto).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ReferenceComparer::Open(TempPath("absent.npy"), {}, ReferenceLayout::kAuto).status().code(),
      absl::StatusCode::kNotFound);
}

// The reference tensor is read at Open: truncating the file afterwards (a map would raise SIGBUS
// on the next access) leaves the statistics as worked out by hand. The tensor is the second in
// the file, so its bytes start past the first one's.
TEST(ReferenceComparerTest, SafetensorsReferenceTruncatedAfterOpenStillCompares) {
  const std::string path = TempPath("ref_truncated.safetensors");
  const std::vector<float> zeros(8, 0.0f), ref = Reference();
  ASSERT_TRUE(safetensors::WriteFile(
                  path, {{"a", "F32", {1, 8}, Bytes(zeros)}, {"w", "F32", {2, 8}, Bytes(ref)}})
                  .ok());
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      ReferenceComparer::Open(path, {"w"}, ReferenceLayout::kKN);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->tensor_name(), "w");
  fs::resize_file(path, 0);
  ASSERT_TRUE((*c)->Begin(Header(2, 8, v1::DTYPE_FP32)).ok());
  ASSERT_TRUE((*c)->Add(Bytes(Result())).ok());
  ExpectHandWorkedStats((*c)->Stats());
}

TEST(ReferenceLayoutTest, Parses) {
  EXPECT_EQ(*ParseReferenceLayout("nk"), ReferenceLayout::kNK);
  EXPECT_EQ(ParseReferenceLayout("NK").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dequantd
