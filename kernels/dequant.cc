// The generic entry points of kernels/dequant.h and quant_tensor.h: the checks every format shares,
// then the format's row (kernels/format_registry.h). No format knowledge here.
#include "kernels/dequant.h"

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/format_checks.h"
#include "kernels/format_registry.h"
#include "kernels/validate_view.h"

namespace dequantd {
namespace {

// DTypeName as absl::string_view: this Abseil build's string_view is not std::string_view.
absl::string_view Name(DType t) {
  const std::string_view name = DTypeName(t);
  return absl::string_view(name.data(), name.size());
}

bool KnownFormat(Format format) {
  for (const FormatRow& row : FormatRows())
    if (row.format == format) return true;
  return false;
}

}  // namespace

std::string_view FormatName(Format format) {
  return KnownFormat(format) ? FormatRowOf(format).name : "unknown";
}

bool ParseFormat(std::string_view name, Format* out) {
  for (const FormatRow& row : FormatRows()) {
    if (absl::EqualsIgnoreCase(absl::string_view(name.data(), name.size()),
                               absl::string_view(row.name.data(), row.name.size()))) {
      if (out != nullptr) *out = row.format;
      return true;
    }
  }
  return false;
}

int TensorRoleCount(Format format) { return FormatRowOf(format).role_count; }

std::string_view OrientationName(Orientation orientation) {
  return orientation == Orientation::kKN   ? "kn"
         : orientation == Orientation::kNK ? "nk"
                                           : "unknown";
}

bool ParseOrientation(std::string_view name, Orientation* out) {
  for (Orientation o : {Orientation::kKN, Orientation::kNK}) {
    const std::string_view spelled = OrientationName(o);
    if (absl::EqualsIgnoreCase(absl::string_view(name.data(), name.size()),
                               absl::string_view(spelled.data(), spelled.size()))) {
      if (out != nullptr) *out = o;
      return true;
    }
  }
  return false;
}

bool RoleAbsent(const QuantShape& shape, int role) {
  const FormatRow& row = FormatRowOf(shape.format);
  return (row.optional_roles >> role & 1u) != 0 && row.tensor_spec(shape, role).elements() == 0;
}

uint32_t AbsentRoleFlags(Format format, uint32_t absent_roles) {
  const FormatRow& row = FormatRowOf(format);
  uint32_t flags = 0;
  for (int r = 0; r < row.role_count; ++r) {
    if ((absent_roles & row.optional_roles) >> r & 1u) {
      flags |= row.absent_role_flags[static_cast<size_t>(r)];
    }
  }
  return flags;
}

TensorSpec TensorSpecOf(const QuantShape& shape, int role) {
  return FormatRowOf(shape.format).tensor_spec(shape, role);
}

int64_t QuantShape::packed_bytes() const {
  int64_t bytes = 0;
  const FormatRow& row = FormatRowOf(format);
  for (int r = 0; r < row.role_count; ++r) bytes += row.tensor_spec(*this, r).bytes();
  return bytes;
}

absl::Status ValidateShape(const QuantShape& shape, DType out_dtype) {
  if (!KnownFormat(shape.format)) {
    return absl::InvalidArgumentError(
        absl::StrCat("format ", static_cast<int>(shape.format), " is not known"));
  }
  if (shape.orientation != Orientation::kKN && shape.orientation != Orientation::kNK) {
    return absl::InvalidArgumentError(
        absl::StrCat("orientation must be kn or nk, got ", static_cast<int>(shape.orientation)));
  }
  if (shape.K <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("K must be positive, got ", shape.K));
  }
  if (absl::Status s = FormatRowOf(shape.format).validate(shape); !s.ok()) return s;
  if (shape.N <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("N must be positive, got ", shape.N));
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
  const FormatRow& row = FormatRowOf(shape.format);
  if (!row.stacked_experts && shape.experts != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("experts must be 1 for ", AbslView(row.name), ", got ", shape.experts));
  }
  if (shape.experts < 1 || shape.experts > kMaxOutputElements / (shape.K * shape.N)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "experts must be in [1, ", kMaxOutputElements / (shape.K * shape.N),
        "] (E * K * N at most ", kMaxOutputElements, " output elements), got ", shape.experts));
  }
  return absl::OkStatus();
}

absl::Status ValidateView(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                          const void* out) {
  if (absl::Status s = ValidateShape(in.shape, out_dtype); !s.ok()) return s;
  const FormatRow& row = FormatRowOf(in.shape.format);
  for (int r = 0; r < row.role_count; ++r) {
    if (in.tensors[static_cast<size_t>(r)] == nullptr && !RoleAbsent(in.shape, r)) {
      const std::string_view role = row.roles[static_cast<size_t>(r)];
      return absl::InvalidArgumentError(
          absl::StrCat(absl::string_view(role.data(), role.size()), " must not be null"));
    }
  }
  const int64_t rows = in.shape.result_rows();
  if (row_begin < 0 || row_begin > row_end || row_end > rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row range [", row_begin, ", ", row_end, ") must lie within [0, ",
        in.shape.experts != 1 ? "E * " : "", in.shape.orientation == Orientation::kKN ? "K" : "N",
        " = ", rows, "] with row_begin <= row_end"));
  }
  if (out == nullptr && row_end > row_begin) {
    return absl::InvalidArgumentError("out must not be null");
  }
  return absl::OkStatus();
}

absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out) {
  if (absl::Status s = ValidateView(in, out_dtype, row_begin, row_end, out); !s.ok()) return s;
  return FormatRowOf(in.shape.format).reference(in, out_dtype, row_begin, row_end, out);
}

namespace cpu {

absl::Status DequantizeCpuWithOptions(const QuantView& in, DType out_dtype, int64_t row_begin,
                                      int64_t row_end, void* out,
                                      const CpuDequantOptions& options) {
  if (absl::Status s = ValidateView(in, out_dtype, row_begin, row_end, out); !s.ok()) return s;
  if (options.threads < 0) return absl::InvalidArgumentError("threads must be >= 0");
  if (options.stream_min_bytes < 0) {
    return absl::InvalidArgumentError("stream_min_bytes must be >= 0");
  }
  if (options.min_elements_per_thread < 1) {
    return absl::InvalidArgumentError("min_elements_per_thread must be >= 1");
  }
  if (options.isa == CpuIsa::kAvx2 && !CpuHasAvx2()) {
    return absl::FailedPreconditionError("this CPU lacks AVX2/F16C for the AVX2 row kernel");
  }
  if (row_end == row_begin) return absl::OkStatus();
  return FormatRowOf(in.shape.format).cpu(in, out_dtype, row_begin, row_end, out, options);
}

}  // namespace cpu

absl::Status DequantizeCpu(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, int threads) {
  return cpu::DequantizeCpuWithOptions(in, out_dtype, row_begin, row_end, out,
                                       cpu::CpuDequantOptions{.threads = threads});
}

}  // namespace dequantd
