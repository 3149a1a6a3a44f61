// compressed-tensors' row functions: its quantization_config, shapes from stored tensors, tensor
// specs, shape and data checks (see compressed_tensors.h; the layout is
// compressed_tensors_format.h).
#include "kernels/compressed_tensors.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/compressed_tensors_format.h"
#include "kernels/compressed_tensors_fp8_format.h"
#include "kernels/dequant.h"
#include "kernels/format_checks.h"

namespace dequantd::compressed_tensors {
namespace {

constexpr DType kScaleDTypes[] = {DType::kF16, DType::kBF16, DType::kF32};
constexpr char kPackQuantized[] = "pack-quantized";
using compressed_tensors_fp8::kFloatQuantized;

bool ServedBits(int64_t bits) { return bits == 4 || bits == 8; }

// One config group's weights scheme, as declared.
struct WeightScheme {
  int bits = 0;
  bool symmetric = true;
  std::string strategy;
  int64_t group_size = -1;
  bool actorder_group = false;
  std::vector<int64_t> block_structure;  // strategy block (float-quantized): [rows, cols]
  bool operator==(const WeightScheme&) const = default;
};

// The float-quantized (FP8) rules of a weights scheme that ReadWeightScheme's shared ones (num_bits
// 8, type "float", strategy tensor, channel, group or block) leave: symmetric, actorder not
// "group", and block's block_structure [rows, cols] of positive integers.
absl::Status CheckFloatScheme(const QuantConfigReader& config, const std::string& w,
                              WeightScheme* s) {
  const auto key = [&](const char* name) { return absl::StrCat(w, name); };
  if (!s->symmetric) {
    return config.FieldError(key("symmetric"),
                             absl::StrCat("is false; only symmetric FP8 weights are served for "
                                          "format '",
                                          kFloatQuantized, "'"));
  }
  if (s->actorder_group) {
    return config.FieldError(key("actorder"),
                             absl::StrCat("is 'group'; not served for format '", kFloatQuantized,
                                          "' (no weight_g_idx in FP8 checkpoints)"));
  }
  if (s->strategy == "block") {
    absl::StatusOr<std::optional<std::vector<int64_t>>> block =
        config.IntegerList({key("block_structure").c_str()});
    if (!block.ok()) return block.status();
    const auto served = [](int64_t v) { return v > 0 && v <= kMaxOutputElements; };
    if (!block->has_value() || (*block)->size() != 2 || !served((**block)[0]) ||
        !served((**block)[1])) {
      return config.FieldError(
          key("block_structure"),
          absl::StrCat("must be [rows, cols] of two integers in [1, ", kMaxOutputElements,
                       "] for strategy 'block' (e.g. [128, 128])"));
    }
    s->block_structure = **block;
  }
  return absl::OkStatus();
}

// Reads and checks config_groups/<group>/weights/*; nullopt when the group has no weights scheme.
// `format` is the checkpoint's (pack-quantized or float-quantized): its rules apply.
absl::StatusOr<std::optional<WeightScheme>> ReadWeightScheme(const QuantConfigReader& config,
                                                             const std::string& group,
                                                             const std::string& format) {
  const bool is_float = format == kFloatQuantized;
  const std::string base = absl::StrCat("config_groups/", group, "/");
  const std::string w = base + "weights/";
  const auto key = [&](const char* name) { return absl::StrCat(w, name); };
  absl::StatusOr<std::vector<std::string>> members = config.Members((base + "weights").c_str());
  if (!members.ok()) return members.status();
  if (members->empty()) return std::nullopt;
  absl::StatusOr<std::optional<std::string>> group_format =
      config.String({(base + "format").c_str()});
  if (!group_format.ok()) return group_format.status();
  if (group_format->has_value() && **group_format != format) {
    return config.FieldError(
        base + "format",
        absl::StrCat("is '", **group_format, "', the checkpoint's format is '", format,
                     "'; one format per checkpoint is served (mixed formats are not)"));
  }
  WeightScheme s;
  absl::StatusOr<std::optional<int64_t>> bits = config.Integer({key("num_bits").c_str()});
  if (!bits.ok()) return bits.status();
  if (!bits->has_value()) return config.FieldError(key("num_bits"), "is missing");
  if (is_float ? **bits != 8 : !ServedBits(**bits)) {
    return config.FieldError(
        key("num_bits"),
        is_float ? absl::StrCat("is ", **bits, ", only 8 (FP8 E4M3) is served for format '",
                                kFloatQuantized, "'")
                 : absl::StrCat("is ", **bits, ", only 4 and 8 are served"));
  }
  s.bits = static_cast<int>(**bits);
  absl::StatusOr<std::optional<std::string>> type = config.String({key("type").c_str()});
  if (!type.ok()) return type.status();
  const char* want_type = is_float ? "float" : "int";
  if (type->value_or(want_type) != want_type) {
    return config.FieldError(key("type"), absl::StrCat("is '", **type, "', only '", want_type,
                                                       "' is served for format '", format, "'"));
  }
  absl::StatusOr<std::optional<bool>> symmetric = config.Boolean({key("symmetric").c_str()});
  if (!symmetric.ok()) return symmetric.status();
  s.symmetric = symmetric->value_or(true);
  absl::StatusOr<std::optional<bool>> dynamic = config.Boolean({key("dynamic").c_str()});
  if (!dynamic.ok()) return dynamic.status();
  if (dynamic->value_or(false)) {
    return config.FieldError(key("dynamic"),
                             "is true; dynamic weights are not stored quantized, nothing to serve");
  }
  absl::StatusOr<std::optional<int64_t>> group_size = config.Integer({key("group_size").c_str()});
  if (!group_size.ok()) return group_size.status();
  absl::StatusOr<std::optional<std::string>> strategy = config.String({key("strategy").c_str()});
  if (!strategy.ok()) return strategy.status();
  // Missing strategy: QuantizationArgs' inference from group_size.
  s.strategy = strategy->has_value()      ? **strategy
               : !group_size->has_value() ? "tensor"
               : **group_size == -1       ? "channel"
                                          : "group";
  if (s.strategy == "group") {
    if (!group_size->has_value() || **group_size <= 0) {
      return config.FieldError(
          key("group_size"),
          absl::StrCat(group_size->has_value() ? absl::StrCat("is ", **group_size) : "is missing",
                       "; strategy 'group' needs a positive group_size"));
    }
    s.group_size = **group_size;
  } else if (s.strategy == "tensor") {
    if (!s.symmetric) {
      return config.FieldError(key("strategy"),
                               "is 'tensor' with symmetric false; an asymmetric tensor strategy is "
                               "not served (only symmetric)");
    }
  } else if (s.strategy != "channel" && !(is_float && s.strategy == "block")) {
    return config.FieldError(key("strategy"),
                             absl::StrCat("is '", s.strategy, "', only 'group', 'channel'",
                                          is_float ? ", 'tensor' and 'block'" : " and 'tensor'",
                                          " are served for format '", format, "'"));
  }
  absl::StatusOr<std::optional<std::string>> actorder = config.String({key("actorder").c_str()});
  if (!actorder.ok()) return actorder.status();
  if (actorder->has_value()) {
    const std::string& a = **actorder;
    if (a == "group") {
      s.actorder_group = true;
    } else if (a != "static" && a != "weight") {
      return config.FieldError(
          key("actorder"), absl::StrCat("is '", a, "', want null, 'static', 'weight' or 'group'"));
    }
  }
  if (is_float) {
    if (absl::Status st = CheckFloatScheme(config, w, &s); !st.ok()) return st;
  }
  return s;
}

// "num_bits 4 vs 8": the first field two schemes disagree on.
std::string Difference(const WeightScheme& a, const WeightScheme& b) {
  if (a.bits != b.bits) return absl::StrCat("num_bits ", a.bits, " vs ", b.bits);
  if (a.symmetric != b.symmetric) {
    return absl::StrCat("symmetric ", a.symmetric ? "true" : "false", " vs ",
                        b.symmetric ? "true" : "false");
  }
  if (a.strategy != b.strategy) return absl::StrCat("strategy ", a.strategy, " vs ", b.strategy);
  if (a.group_size != b.group_size) {
    return absl::StrCat("group_size ", a.group_size, " vs ", b.group_size);
  }
  if (a.block_structure != b.block_structure) return "block_structure";
  return "actorder";
}

std::string Dims(absl::Span<const int64_t> dims) {
  std::string out = "(";
  for (size_t i = 0; i < dims.size(); ++i) absl::StrAppend(&out, i == 0 ? "" : ", ", dims[i]);
  return out + ")";
}

}  // namespace

absl::StatusOr<QuantizationConfig> FromConfig(const QuantConfigReader& config) {
  QuantizationConfig out;
  out.format = Format::kCompressedTensors;
  out.quant_method = "compressed-tensors";
  absl::StatusOr<std::optional<std::string>> format = config.String({"format"});
  if (!format.ok()) return format.status();
  if (!format->has_value()) return config.FieldError("format", "is missing");
  if (**format != kPackQuantized && **format != kFloatQuantized) {
    return config.FieldError(
        "format", absl::StrCat("is '", **format, "', only 'pack-quantized' and '", kFloatQuantized,
                               "' are served (one format per checkpoint)"));
  }
  // The row of the checkpoint: float-quantized is its own format (compressed_tensors_fp8), read
  // here because both share quant_method "compressed-tensors".
  if (**format == kFloatQuantized) out.format = Format::kCompressedTensorsFp8;
  out.version = **format;
  absl::StatusOr<std::optional<std::string>> status = config.String({"quantization_status"});
  if (!status.ok()) return status.status();
  if (status->has_value() && **status != "compressed") {
    return config.FieldError("quantization_status",
                             absl::StrCat("is '", **status,
                                          "', only 'compressed' checkpoints (weights stored "
                                          "packed) are served"));
  }
  absl::StatusOr<std::vector<std::string>> groups = config.Members("config_groups");
  if (!groups.ok()) return groups.status();
  std::optional<WeightScheme> scheme;
  std::string scheme_group;
  for (const std::string& group : *groups) {
    absl::StatusOr<std::optional<WeightScheme>> s = ReadWeightScheme(config, group, out.version);
    if (!s.ok()) return s.status();
    if (!s->has_value()) continue;
    if (scheme.has_value() && !(*scheme == **s)) {
      return config.FieldError(
          "config_groups",
          absl::StrCat("has groups '", scheme_group, "' and '", group,
                       "' that quantize weights differently (", Difference(*scheme, **s),
                       "); one weights scheme per checkpoint is served"));
    }
    scheme = **s;
    scheme_group = group;
  }
  if (!scheme.has_value()) {
    return config.FieldError("config_groups", "has no group with a 'weights' scheme");
  }
  out.bits = scheme->bits;
  out.group_size = scheme->group_size;  // -1 for channel and tensor
  out.zero_point = !scheme->symmetric;
  out.desc_act = scheme->actorder_group;
  out.strategy = scheme->strategy;
  if (scheme->strategy == "block") {
    out.block_rows = scheme->block_structure[0];
    out.group_size = scheme->block_structure[1];
  }
  return out;
}

bool ShapeFromStored(absl::Span<const StoredTensor> tensors, const StoredTensorOptions& options,
                     QuantShape* shape, StoredTensorProblem* problem) {
  const QuantizationConfig* config = options.config;
  const int bits = config != nullptr ? config->bits : 4;
  const StoredTensor& packed = tensors[kWeightPacked];
  const StoredTensor& scale = tensors[kWeightScale];
  const StoredTensor& zero_point = tensors[kWeightZeroPoint];
  const StoredTensor& g_idx = tensors[kWeightGidx];
  const StoredTensor& dense_shape = tensors[kWeightShape];
  for (int r : {kWeightPacked, kWeightScale, kWeightShape})
    if (!tensors[r].present) return StoredProblem(problem, r, "presence", "is missing");
  if (!CheckStoredDims(packed, kWeightPacked, 2, problem) ||
      !CheckPackedWords(packed, kWeightPacked, options, problem)) {
    return false;
  }
  if (!CheckStoredDims(dense_shape, kWeightShape, 1, problem)) return false;
  if (dense_shape.shape[0] != 2) {
    return StoredProblem(problem, kWeightShape, "shape",
                         absl::StrCat("is ", Dims(dense_shape.shape), ", want (2)"));
  }
  if (dense_shape.dtype != "I64") {
    return StoredProblem(problem, kWeightShape, "dtype",
                         absl::StrCat("is ", AbslView(dense_shape.dtype), ", want I64"));
  }
  *shape = QuantShape{};
  shape->format = Format::kCompressedTensors;
  shape->orientation = Orientation::kNK;
  shape->bits = bits;
  if (!StoredScaleDType(scale, kWeightScale, kScaleDTypes, &shape->scale_dtype, problem)) {
    return false;
  }
  const int64_t N = packed.shape[0];
  const int64_t words = packed.shape[1];
  if (N > kMaxOutputElements || words > kMaxOutputElements / 32) {
    return StoredProblem(problem, kWeightPacked, "shape",
                         absl::StrCat("is ", Dims(packed.shape), ", over the limit of ",
                                      kMaxOutputElements, " elements"));
  }
  const int64_t K = words * 32 / bits;
  shape->N = N;
  shape->K = K;
  if (g_idx.present) {
    if (!CheckStoredDims(g_idx, kWeightGidx, 1, problem)) return false;
    if (g_idx.dtype != "I32") {
      return StoredProblem(problem, kWeightGidx, "dtype",
                           absl::StrCat("is ", AbslView(g_idx.dtype), ", want I32"));
    }
    if (g_idx.shape[0] != K) {
      return StoredProblem(problem, kWeightGidx, "shape",
                           absl::StrCat("has ", g_idx.shape[0], " entries, want K = 32 * ", words,
                                        " / ", bits, " = ", K, " (weight_packed columns)"));
    }
  } else {
    if (config != nullptr && config->desc_act) {
      return StoredProblem(problem, kWeightGidx, "presence",
                           "is missing; actorder is 'group', so each column's group must come "
                           "from weight_g_idx");
    }
    shape->format_flags |= kNoGidx;
  }
  // The strategy: declared, else read off weight_scale's dims.
  std::string strategy = config != nullptr ? config->strategy : "";
  if (strategy.empty()) {
    strategy = scale.shape.size() == 1                          ? "tensor"
               : scale.shape.size() == 2 && scale.shape[1] == 1 ? "channel"
                                                                : "group";
  }
  int64_t groups = 1;
  if (strategy == "tensor") {
    shape->format_flags |= kTensorScale;
    shape->group_size = K;
    int64_t elements = 1;
    for (int64_t d : scale.shape) elements *= d;
    if (scale.shape.empty() || scale.shape.size() > 2 || elements != 1) {
      return StoredProblem(
          problem, kWeightScale, "shape",
          absl::StrCat("is ", Dims(scale.shape), ", want (1): strategy 'tensor' has one scale"));
    }
  } else {
    if (!CheckStoredDims(scale, kWeightScale, 2, problem)) return false;
    int64_t G = K;
    if (strategy == "group") {
      G = config != nullptr                               ? config->group_size
          : scale.shape[1] > 0 && K % scale.shape[1] == 0 ? K / scale.shape[1]
                                                          : 0;
    }
    if (G <= 0 || K % G != 0) {
      return StoredProblem(problem, kWeightScale, "shape",
                           absl::StrCat("is ", Dims(scale.shape), ", which does not cut K = ", K,
                                        " into whole groups"));
    }
    groups = K / G;
    shape->group_size = G;
    if (scale.shape[0] != N || scale.shape[1] != groups) {
      return StoredProblem(
          problem, kWeightScale, "shape",
          absl::StrCat("is ", Dims(scale.shape), ", want (N, K/G) = (", N, ", ", groups,
                       ") (strategy '", strategy, "', K = ", K, ", group_size ", G, ")"));
    }
  }
  if (zero_point.present) {
    if (strategy == "tensor") {
      return StoredProblem(problem, kWeightZeroPoint, "presence",
                           "is present; an asymmetric tensor strategy is not served");
    }
    if (!CheckStoredDims(zero_point, kWeightZeroPoint, 2, problem) ||
        !CheckPackedWords(zero_point, kWeightZeroPoint, options, problem)) {
      return false;
    }
    if (zero_point.shape[0] != ZeroPointRows(N, bits) || zero_point.shape[1] != groups) {
      return StoredProblem(
          problem, kWeightZeroPoint, "shape",
          absl::StrCat("is ", Dims(zero_point.shape), ", want (ceil(N*bits/32), K/G) = (",
                       ZeroPointRows(N, bits), ", ", groups, ") (packed along N)"));
    }
  } else {
    if (config != nullptr && config->zero_point) {
      return StoredProblem(problem, kWeightZeroPoint, "presence",
                           "is missing; symmetric is false, so zero points must be stored");
    }
    shape->format_flags |= kSym;
  }
  return true;
}

TensorSpec TensorSpecOf(const QuantShape& shape, int role) {
  const uint32_t flags = shape.format_flags;
  switch (role) {
    case kWeightPacked:
      return {kRoleNames[kWeightPacked], DType::kI32, shape.N, PackedRowWords(shape.K, shape.bits)};
    case kWeightScale:
      if ((flags & kTensorScale) != 0) return {kRoleNames[kWeightScale], shape.scale_dtype, 1, 1};
      return {kRoleNames[kWeightScale], shape.scale_dtype, shape.N, shape.groups()};
    case kWeightZeroPoint:
      if ((flags & kSym) != 0) return {kRoleNames[kWeightZeroPoint], DType::kI32, 0, 0};
      return {kRoleNames[kWeightZeroPoint], DType::kI32, ZeroPointRows(shape.N, shape.bits),
              shape.groups()};
    case kWeightGidx:
      if ((flags & kNoGidx) != 0) return {kRoleNames[kWeightGidx], DType::kI32, 0, 0};
      return {kRoleNames[kWeightGidx], DType::kI32, shape.K, 1};
    default:
      return {kRoleNames[kWeightShape], DType::kI64, 2, 1};
  }
}

absl::Status ValidateShape(const QuantShape& shape) {
  if (!ServedBits(shape.bits)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bits must be 4 or 8 for compressed_tensors, got ", shape.bits));
  }
  if ((shape.format_flags & ~kKnownFlags) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("format_flags ", shape.format_flags,
                                                   " has bits compressed_tensors does not define"));
  }
  if (shape.N <= 0 || shape.N > kMaxOutputElements) {
    return absl::InvalidArgumentError(absl::StrCat("N must be positive, got ", shape.N));
  }
  if (shape.K > kMaxOutputElements || shape.K * shape.bits % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "K must have K * bits a multiple of 32 (whole weight_packed words), got K = ", shape.K,
        " with bits = ", shape.bits));
  }
  if (absl::Status s = ValidateGroupSize(shape); !s.ok()) return s;
  if ((shape.format_flags & kTensorScale) != 0 &&
      ((shape.format_flags & kSym) == 0 || shape.group_size != shape.K)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tensor-strategy layer (one weight_scale) must be symmetric with "
                     "group_size = K = ",
                     shape.K, ", got group_size ", shape.group_size,
                     (shape.format_flags & kSym) == 0 ? " and zero points" : ""));
  }
  return ValidateScaleDType(shape, kScaleDTypes, "weight_scale");
}

absl::Status CheckStored(const QuantView& in) {
  const QuantShape& shape = in.shape;
  int64_t dense[2];  // memcpy: an inline request's copy is only 4-byte aligned
  std::memcpy(dense, WeightShape(in), sizeof dense);
  if (dense[0] != shape.N || dense[1] != shape.K) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight_shape is (", dense[0], ", ", dense[1], "), want (N, K) = (", shape.N, ", ", shape.K,
        ") (weight_packed holds ", shape.N, " rows of ", shape.K, " ", shape.bits,
        "-bit codes; a K that is not a whole number of words is not served)"));
  }
  if (const int32_t* g_idx = WeightGidx(in); g_idx != nullptr) {
    const int64_t groups = shape.groups();
    std::vector<int64_t> count(static_cast<size_t>(groups), 0);
    for (int64_t k = 0; k < shape.K; ++k) {
      if (g_idx[k] < 0 || g_idx[k] >= groups) {
        return absl::InvalidArgumentError(
            absl::StrCat("weight_g_idx[", k, "] is ", g_idx[k], ", want [0, ", groups,
                         ") (groups = K / group_size = ", shape.K, " / ", shape.group_size, ")"));
      }
      ++count[static_cast<size_t>(g_idx[k])];
    }
    for (int64_t g = 0; g < groups; ++g) {
      if (count[static_cast<size_t>(g)] == shape.group_size) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "weight_g_idx: group ", g, " holds ", count[static_cast<size_t>(g)],
          " columns, want group_size = ", shape.group_size,
          " (compressed-tensors groups columns by their rank in g_idx order; dequantd serves a "
          "g_idx whose groups each hold group_size columns, as GPTQ act-order writes it)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace dequantd::compressed_tensors
