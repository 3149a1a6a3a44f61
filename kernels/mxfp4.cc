// MXFP4's row functions: its quantization_config, shapes from stored tensors, tensor specs and
// shape checks (see mxfp4.h; the layout is mxfp4_format.h).
#include "kernels/mxfp4.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/dequant.h"
#include "kernels/format_checks.h"
#include "kernels/mxfp4_format.h"

namespace dequantd::mxfp4 {
namespace {

std::string Dims(absl::Span<const int64_t> dims) {
  std::string out = "(";
  for (size_t i = 0; i < dims.size(); ++i) absl::StrAppend(&out, i == 0 ? "" : ", ", dims[i]);
  return out + ")";
}

}  // namespace

absl::StatusOr<QuantizationConfig> FromConfig(const QuantConfigReader&) {
  QuantizationConfig out;
  out.format = Format::kMxfp4;
  out.quant_method = "mxfp4";
  out.bits = 4;
  out.group_size = kBlockValues;
  out.zero_point = false;
  return out;
}

bool ShapeFromStored(absl::Span<const StoredTensor> tensors, const StoredTensorOptions&,
                     QuantShape* shape, StoredTensorProblem* problem) {
  const StoredTensor& blocks = tensors[kBlocks];
  const StoredTensor& scales = tensors[kScales];
  for (int r : {kBlocks, kScales}) {
    if (!tensors[r].present) return StoredProblem(problem, r, "presence", "is missing");
    if (tensors[r].dtype != "U8") {
      return StoredProblem(problem, r, "dtype",
                           absl::StrCat("is ", AbslView(tensors[r].dtype), ", want U8"));
    }
  }
  const size_t dims = blocks.shape.size();
  if (dims != 4 && dims != 3) {
    return StoredProblem(problem, kBlocks, "shape",
                         absl::StrCat("has ", dims,
                                      " dims, want 4 (E, N, K/32, 16) or 3 "
                                      "(N, K/32, 16)"));
  }
  for (int64_t d : blocks.shape) {
    if (d <= 0 || d > kMaxOutputElements) {
      return StoredProblem(problem, kBlocks, "shape",
                           absl::StrCat("is ", Dims(blocks.shape),
                                        ", want positive dims of at most ", kMaxOutputElements));
    }
  }
  if (blocks.shape[dims - 1] != kBlockBytes) {
    return StoredProblem(problem, kBlocks, "shape",
                         absl::StrCat("is ", Dims(blocks.shape), ", want a last dim of ",
                                      kBlockBytes, " bytes (", kBlockValues, " E2M1 values)"));
  }
  const bool want_scales =
      scales.shape.size() == dims - 1 &&
      std::equal(scales.shape.begin(), scales.shape.end(), blocks.shape.begin());
  if (!want_scales) {
    const std::string leading = Dims(blocks.shape.subspan(0, dims - 1));
    return StoredProblem(
        problem, kScales, "shape",
        absl::StrCat("is ", Dims(scales.shape), ", want ", dims == 4 ? "(E, N, K/32)" : "(N, K/32)",
                     " = ", leading, " for blocks ", Dims(blocks.shape)));
  }
  const int64_t groups = blocks.shape[dims - 2];
  if (groups > kMaxOutputElements / kBlockValues) {
    return StoredProblem(problem, kBlocks, "shape",
                         absl::StrCat("is ", Dims(blocks.shape), ": K = 32 * ", groups, " exceeds ",
                                      kMaxOutputElements));
  }
  *shape =
      MakeShape(groups * kBlockValues, blocks.shape[dims - 3], dims == 4 ? blocks.shape[0] : 1);
  return true;
}

TensorSpec TensorSpecOf(const QuantShape& shape, int role) {
  const int64_t rows = shape.experts * shape.N;
  if (role == kBlocks) return {kRoleNames[kBlocks], DType::kU8, rows, shape.K / 2};
  return {kRoleNames[kScales], DType::kU8, rows, shape.K / kBlockValues};
}

absl::Status ValidateShape(const QuantShape& shape) {
  if (shape.format_flags != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("format_flags must be 0 for mxfp4, got ", shape.format_flags));
  }
  if (shape.bits != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("bits must be 4 for mxfp4 (E2M1), got ", shape.bits));
  }
  if (shape.group_size != kBlockValues) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group_size must be 32 for mxfp4 (one E8M0 scale per 32 values), got ", shape.group_size));
  }
  if (shape.K % kBlockValues != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("K must be a multiple of 32 for mxfp4 (whole blocks), got ", shape.K));
  }
  if (shape.N <= 0 || shape.N > kMaxOutputElements) {
    return absl::InvalidArgumentError(absl::StrCat("N must be positive, got ", shape.N));
  }
  if (shape.scale_dtype != DType::kU8) {
    return absl::InvalidArgumentError(
        absl::StrCat("scales dtype must be uint8 (E8M0) for mxfp4, got ",
                     AbslView(DTypeName(shape.scale_dtype))));
  }
  return absl::OkStatus();
}

}  // namespace dequantd::mxfp4
