// AWQ GEMM's row functions: its quantization_config, shapes from stored tensors, tensor specs and
// shape checks (see awq.h; the layout is awq_format.h).
#include "kernels/awq.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/awq_format.h"
#include "kernels/dequant.h"
#include "kernels/format_checks.h"

namespace dequantd::awq {
namespace {

constexpr DType kScaleDTypes[] = {DType::kF16, DType::kBF16};

}  // namespace

absl::StatusOr<QuantizationConfig> FromConfig(const QuantConfigReader& config) {
  QuantizationConfig out;
  out.format = Format::kAwqGemm;
  out.quant_method = "awq";
  // AutoAWQ's own quant_config.json spells these w_bit / q_group_size.
  absl::StatusOr<std::optional<int64_t>> bits = config.Integer({"bits", "w_bit"});
  if (!bits.ok()) return bits.status();
  if (!bits->has_value()) return config.FieldError("bits", "is missing");
  if (**bits != kBits) {
    return config.FieldError("bits", absl::StrCat("is ", **bits, ", only 4 is served"));
  }
  out.bits = kBits;

  absl::StatusOr<std::optional<int64_t>> group = config.Integer({"group_size", "q_group_size"});
  if (!group.ok()) return group.status();
  if (group->has_value()) out.group_size = **group;
  if (out.group_size != -1 && out.group_size <= 0) {
    return config.FieldError("group_size",
                             absl::StrCat("is ", out.group_size, ", want -1 or positive"));
  }

  absl::StatusOr<std::optional<bool>> zero = config.Boolean({"zero_point"});
  if (!zero.ok()) return zero.status();
  if (zero->has_value()) out.zero_point = **zero;
  if (!out.zero_point) {
    return config.FieldError("zero_point", "is false; only zero_point true is served");
  }

  absl::StatusOr<std::optional<std::string>> version = config.String({"version"});
  if (!version.ok()) return version.status();
  out.version = version->value_or("gemm");
  if (!absl::EqualsIgnoreCase(out.version, "gemm")) {
    return config.FieldError("version",
                             absl::StrCat("is '", out.version, "', only 'gemm' is served"));
  }
  return out;
}

bool ShapeFromStored(absl::Span<const StoredTensor> tensors, const StoredTensorOptions& options,
                     QuantShape* shape, StoredTensorProblem* problem) {
  const StoredTensor& qweight = tensors[kQweight];
  const StoredTensor& qzeros = tensors[kQzeros];
  const StoredTensor& scales = tensors[kScales];
  for (int r : {kQweight, kQzeros, kScales})
    if (!CheckStoredDims(tensors[r], r, 2, problem)) return false;
  for (int r : {kQweight, kQzeros})
    if (!CheckPackedWords(tensors[r], r, options, problem)) return false;
  *shape = QuantShape{};
  shape->format = Format::kAwqGemm;
  if (!StoredScaleDType(scales, kScales, kScaleDTypes, &shape->scale_dtype, problem)) return false;
  const int64_t packed_cols = qweight.shape[1];
  if (packed_cols > kMaxOutputElements / kPackFactor) {  // keeps N = 8 * columns in range
    return StoredProblem(problem, kQweight, "shape",
                         absl::StrCat("has ", packed_cols, " columns, over the limit of ",
                                      kMaxOutputElements / kPackFactor));
  }
  shape->K = qweight.shape[0];
  shape->N = packed_cols * kPackFactor;
  const int64_t groups = scales.shape[0];
  if (scales.shape[1] != shape->N) {
    return StoredProblem(problem, kScales, "shape",
                         absl::StrCat("is (", groups, ", ", scales.shape[1],
                                      "), want N = 8 * qweight columns = ", shape->N, " columns"));
  }
  if (groups <= 0 || shape->K % groups != 0) {
    return StoredProblem(problem, kScales, "shape",
                         absl::StrCat("has ", groups, " rows, which do not divide K = ", shape->K,
                                      " into whole groups (G = K / scales rows)"));
  }
  shape->group_size = shape->K / groups;
  if (qzeros.shape[0] != groups || qzeros.shape[1] != packed_cols) {
    return StoredProblem(problem, kQzeros, "shape",
                         absl::StrCat("is (", qzeros.shape[0], ", ", qzeros.shape[1], "), want (",
                                      groups, ", ", packed_cols, ") = (K/G, N/8)"));
  }
  return true;
}

TensorSpec TensorSpecOf(const QuantShape& shape, int role) {
  const int64_t words = shape.N / kPackFactor;
  switch (role) {
    case kQweight:
      return {kRoleNames[kQweight], DType::kI32, shape.K, words};
    case kQzeros:
      return {kRoleNames[kQzeros], DType::kI32, shape.groups(), words};
    default:
      return {kRoleNames[kScales], shape.scale_dtype, shape.groups(), shape.N};
  }
}

absl::Status ValidateShape(const QuantShape& shape) {
  if (shape.bits != kBits) {
    return absl::InvalidArgumentError(
        absl::StrCat("bits must be ", kBits, " for awq_gemm, got ", shape.bits));
  }
  if (shape.format_flags != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("format_flags must be 0 for awq_gemm, got ", shape.format_flags));
  }
  if (shape.N <= 0 || shape.N % kPackFactor != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("N must be a positive multiple of ", kPackFactor, ", got ", shape.N));
  }
  if (absl::Status s = ValidateGroupSize(shape); !s.ok()) return s;
  return ValidateScaleDType(shape, kScaleDTypes, "scales");
}

}  // namespace dequantd::awq
