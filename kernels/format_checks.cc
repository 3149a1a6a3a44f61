// The shared stored-tensor and shape checks (see format_checks.h).
#include "kernels/format_checks.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace dequantd {
namespace {

// The safetensors dtype code of a scale dtype.
std::string_view SafetensorsCode(DType t) {
  switch (t) {
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF32:
      return "F32";
    default:
      return "?";
  }
}

// "a", "a or b", "a, b or c" of `allowed`, spelled by `name`.
template <class Name>
std::string Alternatives(absl::Span<const DType> allowed, const Name& name) {
  std::string out;
  for (size_t i = 0; i < allowed.size(); ++i) {
    const char* sep = i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ";
    absl::StrAppend(&out, sep, AbslView(name(allowed[i])));
  }
  return out;
}

}  // namespace

bool StoredProblem(StoredTensorProblem* problem, int role, const char* field, std::string what) {
  problem->role = role;
  problem->field = field;
  problem->what = std::move(what);
  return false;
}

bool CheckStoredDims(const StoredTensor& t, int role, size_t dims, StoredTensorProblem* problem) {
  if (t.shape.size() == dims) return true;
  return StoredProblem(problem, role, "shape",
                       absl::StrCat("has ", t.shape.size(), " dims, want ", dims));
}

bool CheckPackedWords(const StoredTensor& t, int role, const StoredTensorOptions& options,
                      StoredTensorProblem* problem) {
  if (t.dtype == "I32" || (options.packed_u32 && t.dtype == "U32")) return true;
  return StoredProblem(
      problem, role, "dtype",
      absl::StrCat("is ", AbslView(t.dtype), ", want I32", options.packed_u32 ? " or U32" : ""));
}

bool StoredScaleDType(const StoredTensor& t, int role, absl::Span<const DType> allowed, DType* out,
                      StoredTensorProblem* problem) {
  for (DType d : allowed) {
    if (t.dtype == SafetensorsCode(d)) {
      *out = d;
      return true;
    }
  }
  return StoredProblem(
      problem, role, "dtype",
      absl::StrCat("is ", AbslView(t.dtype), ", want ", Alternatives(allowed, SafetensorsCode)));
}

absl::Status ValidateGroupSize(const QuantShape& shape) {
  if (shape.group_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("group_size must be positive, got ", shape.group_size));
  }
  if (shape.K % shape.group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "K (", shape.K, ") must be a multiple of group_size (", shape.group_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateScaleDType(const QuantShape& shape, absl::Span<const DType> allowed,
                                std::string_view role) {
  for (DType d : allowed)
    if (shape.scale_dtype == d) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("scale_dtype: ", AbslView(role), " dtype must be ",
                                                 Alternatives(allowed, DTypeName), ", got ",
                                                 AbslView(DTypeName(shape.scale_dtype))));
}

}  // namespace dequantd
