// ValidateShape: the one check every entry point (CPU, CUDA, server) runs before any work.
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/dequant.h"
#include "kernels/validate_view.h"

namespace dequantd {
namespace {

// DTypeName as absl::string_view: this Abseil build's string_view is not std::string_view.
absl::string_view Name(DType t) {
  const std::string_view name = DTypeName(t);
  return absl::string_view(name.data(), name.size());
}

}  // namespace

absl::Status ValidateShape(const AwqShape& shape, DType out_dtype) {
  if (shape.K <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("K must be positive, got ", shape.K));
  }
  if (shape.N <= 0 || shape.N % awq::kPackFactor != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("N must be a positive multiple of ", awq::kPackFactor, ", got ", shape.N));
  }
  if (shape.group_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("group_size must be positive, got ", shape.group_size));
  }
  if (shape.K % shape.group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "K (", shape.K, ") must be a multiple of group_size (", shape.group_size, ")"));
  }
  if (shape.scale_dtype != DType::kF16 && shape.scale_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("scales dtype must be fp16 or bf16, got ", Name(shape.scale_dtype)));
  }
  if (out_dtype != DType::kF16 && out_dtype != DType::kBF16 && out_dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("output dtype must be fp16, bf16 or fp32, got ", Name(out_dtype)));
  }
  // K * N > kMaxOutputElements, checked without forming the product (K, N > 0 here).
  if (shape.N > kMaxOutputElements / shape.K) {
    return absl::InvalidArgumentError(absl::StrCat("K * N (", shape.K, " * ", shape.N,
                                                   ") exceeds the limit of ", kMaxOutputElements,
                                                   " output elements"));
  }
  return absl::OkStatus();
}

absl::Status ValidateView(const PackedTensorView& in, DType out_dtype, int64_t row_begin,
                          int64_t row_end, const void* out) {
  if (absl::Status s = ValidateShape(in.shape, out_dtype); !s.ok()) return s;
  if (in.qweight == nullptr) return absl::InvalidArgumentError("qweight must not be null");
  if (in.qzeros == nullptr) return absl::InvalidArgumentError("qzeros must not be null");
  if (in.scales == nullptr) return absl::InvalidArgumentError("scales must not be null");
  if (row_begin < 0 || row_begin > row_end || row_end > in.shape.K) {
    return absl::InvalidArgumentError(absl::StrCat("row range [", row_begin, ", ", row_end,
                                                   ") must lie within [0, K = ", in.shape.K,
                                                   "] with row_begin <= row_end"));
  }
  if (out == nullptr && row_end > row_begin) {
    return absl::InvalidArgumentError("out must not be null");
  }
  return absl::OkStatus();
}

}  // namespace dequantd
