// ValidateShape: each bad field gives INVALID_ARGUMENT whose message names the field.
#include <string>

#include "gtest/gtest.h"
#include "kernels/dequant.h"

namespace dequantd {
namespace {

QuantShape Good() { return {.K = 4096, .N = 1440, .group_size = 128, .scale_dtype = DType::kF16}; }

void ExpectRejected(const QuantShape& shape, DType out, const std::string& field) {
  const absl::Status s = ValidateShape(shape, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_NE(s.message().find(field), absl::string_view::npos) << s.message();
}

TEST(ValidateShapeTest, AcceptsValidShapes) {
  EXPECT_TRUE(ValidateShape(Good(), DType::kF16).ok());
  EXPECT_TRUE(ValidateShape(Good(), DType::kBF16).ok());
  EXPECT_TRUE(ValidateShape(Good(), DType::kF32).ok());
  EXPECT_TRUE(
      ValidateShape({.K = 7, .N = 8, .group_size = 7, .scale_dtype = DType::kBF16}, DType::kF16)
          .ok());
  // Exactly kMaxOutputElements = 2^40 is accepted.
  EXPECT_TRUE(
      ValidateShape({.K = int64_t{1} << 20, .N = int64_t{1} << 20, .group_size = 128}, DType::kF16)
          .ok());
}

TEST(ValidateShapeTest, RejectsEachBadField) {
  QuantShape s = Good();
  s.K = 0;
  ExpectRejected(s, DType::kF16, "K");
  s.K = -128;
  ExpectRejected(s, DType::kF16, "K");
  s = Good();
  s.N = 0;
  ExpectRejected(s, DType::kF16, "N");
  s.N = -8;
  ExpectRejected(s, DType::kF16, "N");
  s.N = 1001;
  ExpectRejected(s, DType::kF16, "N must be a positive multiple of 8, got 1001");
  s = Good();
  s.group_size = 0;
  ExpectRejected(s, DType::kF16, "group_size");
  s.group_size = -1;
  ExpectRejected(s, DType::kF16, "group_size");
  s = Good();
  s.K = 1000;
  ExpectRejected(s, DType::kF16, "K (1000) must be a multiple of group_size (128)");
  s = Good();
  s.group_size = 8192;  // larger than K
  ExpectRejected(s, DType::kF16, "group_size");
  s = Good();
  s.scale_dtype = DType::kF32;
  ExpectRejected(s, DType::kF16, "scales dtype");
  s.scale_dtype = DType::kI32;
  ExpectRejected(s, DType::kF16, "scales dtype");
  ExpectRejected(Good(), DType::kI32, "output dtype");
  ExpectRejected(Good(), static_cast<DType>(17), "output dtype");
}

TEST(ValidateShapeTest, RejectsTooManyElementsWithoutOverflow) {
  // 2^40 + 2^20 elements: just over the limit.
  ExpectRejected({.K = (int64_t{1} << 20) + 1, .N = int64_t{1} << 20, .group_size = 1}, DType::kF16,
                 "K * N");
  // K * N would overflow int64 (2^62 * 2^8): must still be refused, not wrap to a small value.
  ExpectRejected({.K = int64_t{1} << 62, .N = 256, .group_size = 1}, DType::kF16, "K * N");
  ExpectRejected({.K = 1, .N = int64_t{1} << 60, .group_size = 1}, DType::kF16, "K * N");
}

TEST(DTypeTest, NamesAndParsing) {
  EXPECT_EQ(DTypeName(DType::kF16), "fp16");
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeName(DType::kF32), "fp32");
  EXPECT_EQ(DTypeName(DType::kI32), "int32");
  struct Case {
    const char* name;
    DType dtype;
  };
  for (const Case& c :
       {Case{"fp16", DType::kF16}, Case{"float16", DType::kF16}, Case{"F16", DType::kF16},
        Case{"bf16", DType::kBF16}, Case{"bfloat16", DType::kBF16}, Case{"BF16", DType::kBF16},
        Case{"fp32", DType::kF32}, Case{"float32", DType::kF32}, Case{"F32", DType::kF32},
        Case{"int32", DType::kI32}, Case{"I32", DType::kI32}, Case{"F8_E4M3", DType::kF8E4M3},
        Case{"float8_e4m3fn", DType::kF8E4M3}}) {
    DType d = DType::kI32 == c.dtype ? DType::kF16 : DType::kI32;
    EXPECT_TRUE(ParseDType(c.name, &d)) << c.name;
    EXPECT_EQ(d, c.dtype) << c.name;
  }
  DType d = DType::kF16;
  EXPECT_FALSE(ParseDType("fp8", &d));
  EXPECT_FALSE(ParseDType("", &d));
  EXPECT_FALSE(ParseDType("int4", &d));
  EXPECT_EQ(d, DType::kF16);  // untouched on failure
  for (DType t : {DType::kF16, DType::kBF16, DType::kF32, DType::kI32, DType::kF8E4M3}) {
    ASSERT_TRUE(ParseDType(DTypeName(t), &d));
    EXPECT_EQ(d, t);
  }
}

}  // namespace
}  // namespace dequantd
