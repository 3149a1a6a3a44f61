// compressed-tensors' layout and definition, hand-worked (compressed_tensors_format.h): the bit
// order of int4 and int8 codes along K, zero points packed along N, the +2^(b-1) offset, the
// tensor strategy's one scale, the two roundings (scale dtype, then output dtype) and the shape
// checks. The vectors of tests/server/compressed_tensors_vectors_test.cc pin the same rules to
// the library; these values are worked out by hand.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/compressed_tensors_format.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/dequant.h"

namespace dequantd {
namespace {

namespace ct = compressed_tensors;

constexpr int64_t kShape8x2[2] = {2, 8};  // weight_shape (N, K) of the layer below

// int4, symmetric, tensor strategy (one fp32 scale 0.5), N = 2, K = 8: row 0 holds codes
// 0..7 (value k in bits [4k, 4k+4)), row 1 codes 15..8: w = (f - 8) * 0.5.
TEST(CompressedTensorsFormatTest, Int4TensorStrategyBitOrderAndOffset) {
  const int32_t packed[2] = {0x76543210, static_cast<int32_t>(0x89ABCDEFu)};
  const float scale = 0.5f;
  const QuantShape shape =
      ct::MakeShape(8, 2, 8, 4, ct::kSym | ct::kNoGidx | ct::kTensorScale, DType::kF32);
  ASSERT_TRUE(ValidateShape(shape, DType::kF32).ok());
  const QuantView view = ct::MakeView(shape, packed, &scale, nullptr, nullptr, kShape8x2);
  std::vector<float> nk(16);
  ASSERT_TRUE(DequantizeReference(view, DType::kF32, 0, 2, nk.data()).ok());
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(nk[k], (k - 8) * 0.5f) << k;
    EXPECT_EQ(nk[8 + k], (15 - k - 8) * 0.5f) << k;
  }
  std::vector<float> cpu(16);
  ASSERT_TRUE(DequantizeCpu(view, DType::kF32, 0, 2, cpu.data(), 2).ok());
  EXPECT_EQ(cpu, nk);
}

// int8, asymmetric, channel strategy, N = 2, K = 4: codes low byte first; the zero points of rows
// 0 and 1 are bytes 0 and 1 of the one word of the group's column (packed along N).
TEST(CompressedTensorsFormatTest, Int8ZeroPointsPackedAlongN) {
  const int32_t packed[2] = {0x04030201, 0x7F808182};  // row 0: 1 2 3 4; row 1: 130 129 128 127
  const int32_t zero_point[1] = {0x00008002};          // z[0] = 2, z[1] = 128 (zp 0)
  const uint16_t scale[2] = {0x3F80, 0x4000};          // bf16 1.0, 2.0
  const int64_t dims[2] = {2, 4};
  const QuantShape shape = ct::MakeShape(4, 2, 4, 8, ct::kNoGidx, DType::kBF16);
  ASSERT_TRUE(ValidateShape(shape, DType::kF32).ok());
  const QuantView view = ct::MakeView(shape, packed, scale, zero_point, nullptr, dims);
  std::vector<float> nk(8);
  ASSERT_TRUE(DequantizeReference(view, DType::kF32, 0, 2, nk.data()).ok());
  EXPECT_EQ(nk, (std::vector<float>{-1, 0, 1, 2, 4, 2, 0, -2}));
}

// bf16 scales: the product is rounded to bf16 first, so an fp32 result holds the bf16 value, while
// fp32 scales keep the fp32 product.
TEST(CompressedTensorsFormatTest, ResultIsRoundedToTheScaleDTypeFirst) {
  const int32_t packed[1] = {0x0000000B};  // row 0: codes 11, then 0s (f - 8 = 3, -8, ...)
  const uint16_t bf16_scale = 0x3F81;      // 1.0078125 in bf16
  const int64_t dims[2] = {1, 8};
  QuantShape shape =
      ct::MakeShape(8, 1, 8, 4, ct::kSym | ct::kNoGidx | ct::kTensorScale, DType::kBF16);
  std::vector<float> out(8);
  ASSERT_TRUE(DequantizeReference(ct::MakeView(shape, packed, &bf16_scale, nullptr, nullptr, dims),
                                  DType::kF32, 0, 1, out.data())
                  .ok());
  // 3 * 1.0078125 = 3.0234375 -> bf16 (8 significant bits, step 2^-6 at 3): 3.03125 (RNE).
  EXPECT_EQ(out[0], 3.03125f);
  EXPECT_EQ(out[1], -8 * 1.0078125f);
  const float f32_scale = 1.0078125f;
  shape.scale_dtype = DType::kF32;
  ASSERT_TRUE(DequantizeReference(ct::MakeView(shape, packed, &f32_scale, nullptr, nullptr, dims),
                                  DType::kF32, 0, 1, out.data())
                  .ok());
  EXPECT_EQ(out[0], 3.0234375f);
}

TEST(CompressedTensorsFormatTest, ShapeChecksNameTheField) {
  QuantShape bits3 = ct::MakeShape(64, 8, 32, 3, ct::kNoGidx);
  EXPECT_EQ(ValidateShape(bits3, DType::kF16).message(),
            "bits must be 4 or 8 for compressed_tensors, got 3");
  QuantShape partial = ct::MakeShape(60, 8, 30, 4, ct::kNoGidx);
  EXPECT_EQ(ValidateShape(partial, DType::kF16).message(),
            "K must have K * bits a multiple of 32 (whole weight_packed words), got K = 60 with "
            "bits = 4");
  QuantShape tensor_asym = ct::MakeShape(64, 8, 64, 4, ct::kNoGidx | ct::kTensorScale);
  EXPECT_EQ(ValidateShape(tensor_asym, DType::kF16).code(), absl::StatusCode::kInvalidArgument);
  QuantShape scale_i32 = ct::MakeShape(64, 8, 32, 4, ct::kNoGidx, DType::kI32);
  EXPECT_EQ(ValidateShape(scale_i32, DType::kF16).message(),
            "scale_dtype: weight_scale dtype must be fp16, bf16 or fp32, got int32");
  // N need not be a multiple of 8: the zero-point stream's last word is partial.
  const QuantShape n5 = ct::MakeShape(64, 5, 32, 4, ct::kNoGidx);
  ASSERT_TRUE(ValidateShape(n5, DType::kF16).ok());
  EXPECT_EQ(TensorSpecOf(n5, ct::kWeightZeroPoint).rows, 1);
  EXPECT_EQ(TensorSpecOf(n5, ct::kWeightZeroPoint).cols, 2);
  EXPECT_EQ(TensorSpecOf(n5, ct::kWeightShape).bytes(), 16);
}

}  // namespace
}  // namespace dequantd
