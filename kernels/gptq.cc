// GPTQ's row functions: its quantization_config, shapes from stored tensors, tensor specs, shape
// and data checks (see gptq.h; the layout is gptq_format.h).
#include "kernels/gptq.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/dequant.h"
#include "kernels/format_checks.h"
#include "kernels/gptq_format.h"

namespace dequantd::gptq {
namespace {

constexpr DType kScaleDTypes[] = {DType::kF16, DType::kBF16};

bool ServedBits(int64_t bits) { return bits == 2 || bits == 3 || bits == 4 || bits == 8; }

}  // namespace

absl::StatusOr<QuantizationConfig> FromConfig(const QuantConfigReader& config) {
  QuantizationConfig out;
  out.format = Format::kGptq;
  out.quant_method = "gptq";
  absl::StatusOr<std::optional<int64_t>> bits = config.Integer({"bits"});
  if (!bits.ok()) return bits.status();
  out.bits = 4;
  if (bits->has_value()) {
    if (!ServedBits(**bits)) {
      return config.FieldError("bits",
                               absl::StrCat("is ", **bits, ", only 2, 3, 4 and 8 are served"));
    }
    out.bits = static_cast<int>(**bits);
  }
  absl::StatusOr<std::optional<int64_t>> group = config.Integer({"group_size"});
  if (!group.ok()) return group.status();
  if (group->has_value()) out.group_size = **group;
  if (out.group_size != -1 && out.group_size <= 0) {
    return config.FieldError("group_size",
                             absl::StrCat("is ", out.group_size, ", want -1 or positive"));
  }
  absl::StatusOr<std::optional<bool>> sym = config.Boolean({"sym"});
  if (!sym.ok()) return sym.status();
  out.zero_point = !sym->value_or(true);
  absl::StatusOr<std::optional<bool>> desc_act = config.Boolean({"desc_act"});
  if (!desc_act.ok()) return desc_act.status();
  out.desc_act = desc_act->value_or(false);
  absl::StatusOr<std::optional<bool>> marlin = config.Boolean({"is_marlin_format"});
  if (!marlin.ok()) return marlin.status();
  if (marlin->value_or(false)) {
    return config.FieldError("is_marlin_format",
                             "is true; Marlin-serialized GPTQ is not served (only 'gptq' and "
                             "'gptq_v2' checkpoint formats)");
  }
  // GPTQModel writes `format` (current) and `checkpoint_format` (legacy alias) with one value.
  absl::StatusOr<std::optional<std::string>> legacy = config.String({"checkpoint_format"});
  if (!legacy.ok()) return legacy.status();
  absl::StatusOr<std::optional<std::string>> current = config.String({"format"});
  if (!current.ok()) return current.status();
  if (legacy->has_value() && current->has_value() &&
      absl::AsciiStrToLower(**legacy) != absl::AsciiStrToLower(**current)) {
    return config.FieldError("checkpoint_format",
                             absl::StrCat("is '", **legacy, "' but field 'format' is '", **current,
                                          "'; they must agree"));
  }
  const char* format_field = legacy->has_value() ? "checkpoint_format" : "format";
  // Missing: v1, as GPTQModel's offline converter assumes (_uses_gptq_v1_qzeros).
  out.version = absl::AsciiStrToLower(legacy->has_value() ? **legacy
                                                          : current->value_or(std::string("gptq")));
  if (out.version != "gptq" && out.version != "gptq_v2") {
    return config.FieldError(
        format_field,
        absl::StrCat("is '", out.version, "', only 'gptq' (v1 zeros) and 'gptq_v2' are served"));
  }
  absl::StatusOr<std::optional<std::string>> pack_dtype = config.String({"pack_dtype"});
  if (!pack_dtype.ok()) return pack_dtype.status();
  if (pack_dtype->has_value() && absl::AsciiStrToLower(**pack_dtype) != "int32") {
    return config.FieldError("pack_dtype",
                             absl::StrCat("is '", **pack_dtype, "', only 'int32' is served"));
  }
  return out;
}

bool ShapeFromStored(absl::Span<const StoredTensor> tensors, const StoredTensorOptions& options,
                     QuantShape* shape, StoredTensorProblem* problem) {
  const QuantizationConfig* config = options.config;
  const int bits = config != nullptr ? config->bits : 4;
  const bool desc_act = config != nullptr && config->desc_act;
  const StoredTensor& qweight = tensors[kQweight];
  const StoredTensor& qzeros = tensors[kQzeros];
  const StoredTensor& scales = tensors[kScales];
  const StoredTensor& g_idx = tensors[kGidx];
  for (int r : {kQweight, kQzeros, kScales}) {
    if (!tensors[r].present) return StoredProblem(problem, r, "presence", "is missing");
    if (!CheckStoredDims(tensors[r], r, 2, problem)) return false;
  }
  for (int r : {kQweight, kQzeros})
    if (!CheckPackedWords(tensors[r], r, options, problem)) return false;
  *shape = QuantShape{};
  shape->format = Format::kGptq;
  shape->orientation = Orientation::kNK;
  shape->bits = bits;
  if (config != nullptr && config->version == "gptq") shape->format_flags |= kZerosV1;
  if (config != nullptr && !config->zero_point) shape->format_flags |= kSym;
  if (!StoredScaleDType(scales, kScales, kScaleDTypes, &shape->scale_dtype, problem)) return false;
  const int64_t N = qweight.shape[1];
  if (N > kMaxOutputElements) {
    return StoredProblem(
        problem, kQweight, "shape",
        absl::StrCat("has ", N, " columns, over the limit of ", kMaxOutputElements));
  }
  if (g_idx.present) {
    if (!CheckStoredDims(g_idx, kGidx, 1, problem)) return false;
    if (g_idx.dtype != "I32") {
      return StoredProblem(problem, kGidx, "dtype",
                           absl::StrCat("is ", AbslView(g_idx.dtype), ", want I32"));
    }
    shape->K = g_idx.shape[0];
    if (qweight.shape[0] > kMaxOutputElements || shape->K > kMaxOutputElements ||
        qweight.shape[0] * 32 != shape->K * bits) {
      return StoredProblem(problem, kQweight, "shape",
                           absl::StrCat("has ", qweight.shape[0], " rows, want K * bits / 32 = ",
                                        shape->K, " * ", bits, " / 32 (K = g_idx length)"));
    }
  } else {
    if (desc_act) {
      return StoredProblem(
          problem, kGidx, "presence",
          "is missing; desc_act is true, so each row's group must come from g_idx");
    }
    shape->format_flags |= kNoGidx;
    if (qweight.shape[0] > kMaxOutputElements / 32 || qweight.shape[0] * 32 % bits != 0) {
      return StoredProblem(problem, kQweight, "shape",
                           absl::StrCat("has ", qweight.shape[0], " rows, not a whole number of ",
                                        bits, "-bit rows (K = 32 * rows / bits)"));
    }
    shape->K = qweight.shape[0] * 32 / bits;
  }
  const int64_t groups = scales.shape[0];
  if (scales.shape[1] != N) {
    return StoredProblem(problem, kScales, "shape",
                         absl::StrCat("is (", groups, ", ", scales.shape[1],
                                      "), want N = qweight columns = ", N, " columns"));
  }
  int64_t G = 0;
  if (config != nullptr) {
    G = config->group_size == -1 ? shape->K : config->group_size;
  } else if (groups > 0 && shape->K % groups == 0) {
    G = shape->K / groups;
  }
  if (G <= 0 || shape->K % G != 0 || groups != shape->K / G) {
    return StoredProblem(problem, kScales, "shape",
                         absl::StrCat("has ", groups, " rows, want K / group_size = ", shape->K,
                                      " / ", G, " (whole groups)"));
  }
  shape->group_size = G;
  shape->N = N;
  if (N * bits % 32 != 0 || qzeros.shape[0] != groups || qzeros.shape[1] != N * bits / 32) {
    return StoredProblem(problem, kQzeros, "shape",
                         absl::StrCat("is (", qzeros.shape[0], ", ", qzeros.shape[1], "), want (",
                                      groups, ", ", N, " * ", bits, " / 32) = (K/G, N*bits/32)"));
  }
  return true;
}

TensorSpec TensorSpecOf(const QuantShape& shape, int role) {
  switch (role) {
    case kQweight:
      return {kRoleNames[kQweight], DType::kI32, StreamWords(shape.K, shape.bits), shape.N};
    case kQzeros:
      return {kRoleNames[kQzeros], DType::kI32, shape.groups(), StreamWords(shape.N, shape.bits)};
    case kScales:
      return {kRoleNames[kScales], shape.scale_dtype, shape.groups(), shape.N};
    default:
      if ((shape.format_flags & kNoGidx) != 0) return {kRoleNames[kGidx], DType::kI32, 0, 0};
      return {kRoleNames[kGidx], DType::kI32, shape.K, 1};
  }
}

absl::Status ValidateShape(const QuantShape& shape) {
  if (!ServedBits(shape.bits)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bits must be 2, 3, 4 or 8 for gptq, got ", shape.bits));
  }
  if ((shape.format_flags & ~kKnownFlags) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("format_flags ", shape.format_flags, " has bits gptq does not define"));
  }
  if (shape.N <= 0 || shape.N > kMaxOutputElements || shape.N * shape.bits % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "N must be positive with N * bits a multiple of 32 (whole qzeros words), got N = ", shape.N,
        " with bits = ", shape.bits));
  }
  if (shape.K > kMaxOutputElements || shape.K * shape.bits % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "K must have K * bits a multiple of 32 (whole qweight words), got K = ", shape.K,
        " with bits = ", shape.bits));
  }
  if (absl::Status s = ValidateGroupSize(shape); !s.ok()) return s;
  return ValidateScaleDType(shape, kScaleDTypes, "scales");
}

absl::Status CheckStored(const QuantView& in) {
  const QuantShape& shape = in.shape;
  const int64_t groups = shape.groups();
  if (const int32_t* g_idx = Gidx(in); g_idx != nullptr) {
    for (int64_t k = 0; k < shape.K; ++k) {
      if (g_idx[k] < 0 || g_idx[k] >= groups) {
        return absl::InvalidArgumentError(
            absl::StrCat("g_idx[", k, "] is ", g_idx[k], ", want [0, ", groups,
                         ") (groups = K / group_size = ", shape.K, " / ", shape.group_size, ")"));
      }
    }
  }
  if ((shape.format_flags & kSym) != 0) {
    const uint32_t want = 1u << (shape.bits - 1);
    const int64_t words = StreamWords(shape.N, shape.bits);
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t n = 0; n < shape.N; ++n) {
        const uint32_t z = ZeroAt(Qzeros(in) + g * words, n, shape.bits, shape.format_flags);
        if (z == want) continue;
        const bool v1 = (shape.format_flags & kZerosV1) != 0;
        const bool other = v1 ? z == want + 1 : z + 1 == want;
        return absl::FailedPreconditionError(absl::StrCat(
            "qzeros: sym is true, so every zero point must be ", want, ", but group ", g,
            " column ", n, " decodes to ", z, " under checkpoint_format '", v1 ? "gptq" : "gptq_v2",
            "'",
            other
                ? absl::StrCat("; the stored zeros are the symmetric zeros of checkpoint_format '",
                               v1 ? "gptq_v2" : "gptq",
                               "': the checkpoint declares one format and stores the other "
                               "(fix checkpoint_format/format in its config.json)")
                : ""));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace dequantd::gptq
