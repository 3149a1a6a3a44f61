// FP8 block-scaled's row functions: its quantization_config, shapes from stored tensors, tensor
// specs and shape checks (see fp8_block.h; the layout is fp8_block_format.h).
#include "kernels/fp8_block.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "kernels/dequant.h"
#include "kernels/fp8_block_format.h"

namespace dequantd::fp8_block {
namespace {

absl::string_view View(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool Problem(StoredTensorProblem* problem, int role, const char* field, std::string what) {
  problem->role = role;
  problem->field = field;
  problem->what = std::move(what);
  return false;
}

bool ServedScaleDtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

}  // namespace

absl::StatusOr<QuantizationConfig> FromConfig(const QuantConfigReader& config) {
  QuantizationConfig out;
  out.format = Format::kFp8Block;
  out.quant_method = "fp8";
  out.bits = 8;
  out.group_size = kBlock;
  out.zero_point = false;
  absl::StatusOr<std::optional<std::string>> fmt = config.String({"fmt"});
  if (!fmt.ok()) return fmt.status();
  if (fmt->has_value() && absl::AsciiStrToLower(**fmt) != "e4m3") {
    return config.FieldError("fmt", absl::StrCat("is '", **fmt, "', only 'e4m3' is served"));
  }
  absl::StatusOr<std::optional<std::vector<int64_t>>> block =
      config.IntegerList({"weight_block_size"});
  if (!block.ok()) return block.status();
  if (!block->has_value()) {
    return config.FieldError("weight_block_size",
                             "is missing; only block-scaled FP8 (weight_block_size [128, 128], "
                             "DeepSeek-V3 style) is served");
  }
  if (**block != std::vector<int64_t>{kBlock, kBlock}) {
    return config.FieldError("weight_block_size", absl::StrCat("is [", absl::StrJoin(**block, ", "),
                                                               "], only [128, 128] is served"));
  }
  absl::StatusOr<std::optional<std::string>> scale_fmt = config.String({"scale_fmt"});
  if (!scale_fmt.ok()) return scale_fmt.status();
  if (scale_fmt->has_value()) {
    out.version = absl::AsciiStrToLower(**scale_fmt);
    if (out.version != "ue8m0") {
      return config.FieldError(
          "scale_fmt",
          absl::StrCat("is '", **scale_fmt, "', only 'ue8m0' (or no scale_fmt) is served"));
    }
  }
  return out;
}

bool ShapeFromStored(absl::Span<const StoredTensor> tensors, const StoredTensorOptions& options,
                     QuantShape* shape, StoredTensorProblem* problem) {
  const StoredTensor& weight = tensors[kWeight];
  const StoredTensor& scale = tensors[kWeightScaleInv];
  for (int r : {kWeight, kWeightScaleInv}) {
    if (!tensors[r].present) return Problem(problem, r, "presence", "is missing");
    if (tensors[r].shape.size() != 2) {
      return Problem(problem, r, "shape",
                     absl::StrCat("has ", tensors[r].shape.size(), " dims, want 2"));
    }
  }
  if (weight.dtype != "F8_E4M3") {
    return Problem(problem, kWeight, "dtype",
                   absl::StrCat("is ", View(weight.dtype), ", want F8_E4M3"));
  }
  *shape = QuantShape{};
  shape->format = Format::kFp8Block;
  shape->orientation = Orientation::kNK;
  shape->bits = 8;
  shape->group_size = kBlock;
  if (options.config != nullptr && options.config->version == "ue8m0") {
    shape->format_flags |= kScaleUe8m0;
  }
  if (scale.dtype == "F32") {
    shape->scale_dtype = DType::kF32;
  } else if (scale.dtype == "BF16") {
    shape->scale_dtype = DType::kBF16;
  } else if (scale.dtype == "F16") {
    shape->scale_dtype = DType::kF16;
  } else {
    return Problem(problem, kWeightScaleInv, "dtype",
                   absl::StrCat("is ", View(scale.dtype), ", want F32, BF16 or F16"));
  }
  const int64_t N = weight.shape[0];
  const int64_t K = weight.shape[1];
  if (N <= 0 || K <= 0 || N > kMaxOutputElements || K > kMaxOutputElements) {
    return Problem(
        problem, kWeight, "shape",
        absl::StrCat("is (", N, ", ", K, "), want positive dims of at most ", kMaxOutputElements));
  }
  if (scale.shape[0] != GridRows(N) || scale.shape[1] != GridCols(K)) {
    return Problem(problem, kWeightScaleInv, "shape",
                   absl::StrCat("is (", scale.shape[0], ", ", scale.shape[1],
                                "), want (ceil(N/128), ceil(K/128)) = (", GridRows(N), ", ",
                                GridCols(K), ") for weight (N, K) = (", N, ", ", K,
                                "): the scale grid must cover the weight in 128x128 blocks"));
  }
  shape->K = K;
  shape->N = N;
  return true;
}

TensorSpec TensorSpecOf(const QuantShape& shape, int role) {
  if (role == kWeight) return {kRoleNames[kWeight], DType::kF8E4M3, shape.N, shape.K};
  return {kRoleNames[kWeightScaleInv], shape.scale_dtype, GridRows(shape.N), GridCols(shape.K)};
}

absl::Status ValidateShape(const QuantShape& shape) {
  // `bits` is not read: an E4M3 element is 8 bits (a loaded layer says 8; an inline request's
  // shape keeps QuantShape's default).
  if ((shape.format_flags & ~kKnownFlags) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("format_flags ", shape.format_flags, " has bits fp8_block does not define"));
  }
  if (shape.group_size != kBlock) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group_size must be 128 (the 128x128 scale block) for fp8_block, got ", shape.group_size));
  }
  if (shape.N <= 0 || shape.N > kMaxOutputElements) {
    return absl::InvalidArgumentError(absl::StrCat("N must be positive, got ", shape.N));
  }
  if (shape.K > kMaxOutputElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("K must be at most ", kMaxOutputElements, ", got ", shape.K));
  }
  if (!ServedScaleDtype(shape.scale_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_scale_inv dtype must be fp32, bf16 or fp16, got ",
                     View(DTypeName(shape.scale_dtype))));
  }
  return absl::OkStatus();
}

}  // namespace dequantd::fp8_block
