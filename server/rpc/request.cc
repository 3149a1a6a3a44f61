// DequantizeRequest field parsing (see request.h).
#include "server/rpc/request.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/awq_format.h"
#include "kernels/format_checks.h"
#include "kernels/format_registry.h"
#include "kernels/gptq_format.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

bool Aligned4(std::string_view bytes) {
  return reinterpret_cast<uintptr_t>(bytes.data()) % alignof(int32_t) == 0;
}

// INVALID_ARGUMENT "packed.<field> has <actual> bytes, expected <expected> (<formula>)".
absl::Status CheckLength(const char* field, std::string_view bytes, int64_t expected,
                         const std::string& formula) {
  const int64_t actual = static_cast<int64_t>(bytes.size());
  if (actual == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "packed.", field, " has ", actual, " bytes, expected ", expected, " (", formula, ")"));
}

// The format a request names: empty = awq_gemm; else FormatName's spelling, or INVALID_ARGUMENT
// "packed.format 'x' is not known; served: 'awq_gemm'".
absl::StatusOr<Format> FormatOf(const v1::InlinePackedTensor& packed) {
  Format format = Format::kAwqGemm;
  if (packed.format().empty() || ParseFormat(packed.format(), &format)) return format;
  std::string known;
  for (const FormatRow& row : FormatRows()) {
    absl::StrAppend(&known, known.empty() ? "" : ", ", "'",
                    absl::string_view(row.name.data(), row.name.size()), "'");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("packed.format '", packed.format(), "' is not known; served: ", known));
}

}  // namespace

absl::StatusOr<int64_t> EffectiveChunkBytes(int64_t requested, int64_t default_bytes) {
  if (requested < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes must be >= 0 (0 = server default), got ", requested));
  }
  const int64_t bytes = requested == 0 ? default_bytes : requested;
  return std::clamp(bytes, kMinChunkBytes, kMaxChunkBytes);
}

absl::StatusOr<ResultRange> RequestedRange(int64_t offset, int64_t length, int64_t total_bytes,
                                           int64_t element_bytes) {
  for (const auto& [field, value] : {std::pair<const char*, int64_t>{"offset", offset},
                                     std::pair<const char*, int64_t>{"length", length}}) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must be >= 0 (bytes of the result), got ", value));
    }
    if (value % element_bytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " ", value, " is not a multiple of the output dtype's size (",
                       element_bytes, " bytes)"));
    }
  }
  if (offset >= total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offset ", offset, " is not inside the result, which has ", total_bytes, " bytes"));
  }
  if (length > total_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat("length ", length, " from offset ", offset,
                                                   " runs past the result's end (", total_bytes,
                                                   " bytes)"));
  }
  return ResultRange{.offset = offset, .length = length == 0 ? total_bytes - offset : length};
}

absl::StatusOr<Orientation> OrientationFromProto(v1::Orientation orientation, Format format) {
  switch (orientation) {
    case v1::ORIENTATION_UNSPECIFIED:
      return FormatRowOf(format).default_orientation;
    case v1::ORIENTATION_KN:
      return Orientation::kKN;
    case v1::ORIENTATION_NK:
      return Orientation::kNK;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "orientation must be ORIENTATION_UNSPECIFIED, ORIENTATION_KN or ORIENTATION_NK, got ",
          static_cast<int>(orientation)));
  }
}

absl::StatusOr<RegionReplyKind> RegionReplyFromProto(v1::RegionReply reply,
                                                     bool has_output_region) {
  if (reply != v1::REGION_REPLY_UNSPECIFIED && reply != v1::REGION_REPLY_HEADERS &&
      reply != v1::REGION_REPLY_SUMMARY) {
    return absl::InvalidArgumentError(
        absl::StrCat("region_reply must be REGION_REPLY_UNSPECIFIED, REGION_REPLY_HEADERS or "
                     "REGION_REPLY_SUMMARY, got ",
                     static_cast<int>(reply)));
  }
  if (!has_output_region && reply != v1::REGION_REPLY_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("region_reply: ", v1::RegionReply_Name(reply),
                     " is the reply of a call into a region; it needs output_region (a streamed "
                     "result carries each layer's header)"));
  }
  return reply == v1::REGION_REPLY_SUMMARY ? RegionReplyKind::kSummary
                                           : RegionReplyKind::kLayerHeaders;
}

v1::Orientation OrientationToProto(Orientation orientation) {
  return orientation == Orientation::kNK ? v1::ORIENTATION_NK : v1::ORIENTATION_KN;
}

absl::StatusOr<DType> OutputDTypeFromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_FP16:
      return DType::kF16;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    case v1::DTYPE_FP32:
      return DType::kF32;
    default:
      break;
  }
  const std::string name =
      v1::DType_IsValid(dtype) ? v1::DType_Name(dtype) : absl::StrCat(static_cast<int>(dtype));
  return absl::InvalidArgumentError(
      absl::StrCat("output_dtype must be DTYPE_FP16, DTYPE_BF16 or DTYPE_FP32, got ", name));
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return v1::DTYPE_FP16;
    case DType::kBF16:
      return v1::DTYPE_BF16;
    case DType::kF32:
      return v1::DTYPE_FP32;
    case DType::kI32:
      return v1::DTYPE_INT32;
    case DType::kI64:
      return v1::DTYPE_INT64;
    case DType::kF8E4M3:
      return v1::DTYPE_FP8_E4M3;
    case DType::kU8:
      return v1::DTYPE_UINT8;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<InlineTensor> InlineTensor::FromProto(const v1::InlinePackedTensor& packed,
                                                     int64_t max_request_bytes) {
  absl::StatusOr<Format> parsed = FormatOf(packed);
  if (!parsed.ok()) return parsed.status();
  const Format format = *parsed;
  const FormatRow& row = FormatRowOf(format);
  std::array<std::string_view, kMaxTensorRoles> parts{};
  const bool legacy =
      !packed.qweight().empty() || !packed.qzeros().empty() || !packed.scales().empty();
  if (legacy && packed.tensors_size() > 0) {
    return absl::InvalidArgumentError(
        "packed: give the tensors either in packed.tensors or in packed.qweight/qzeros/scales, "
        "not both");
  }
  if (packed.tensors_size() == 0) {
    if (format != Format::kAwqGemm) {
      return absl::InvalidArgumentError(absl::StrCat(
          "packed.tensors is empty: format '", packed.format(), "' needs its tensors by role"));
    }
    parts[awq::kQweight] = packed.qweight();
    parts[awq::kQzeros] = packed.qzeros();
    parts[awq::kScales] = packed.scales();
  } else {
    std::array<bool, kMaxTensorRoles> seen{};
    for (const v1::RoleBytes& t : packed.tensors()) {
      int role = -1;
      for (int r = 0; r < row.role_count; ++r)
        if (t.role() == row.roles[static_cast<size_t>(r)]) role = r;
      if (role < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("packed.tensors: role '", t.role(), "' is not a tensor of format ",
                         absl::string_view(row.name.data(), row.name.size())));
      }
      if (seen[static_cast<size_t>(role)]) {
        return absl::InvalidArgumentError(
            absl::StrCat("packed.tensors: role '", t.role(), "' is given twice"));
      }
      seen[static_cast<size_t>(role)] = true;
      parts[static_cast<size_t>(role)] = t.data();
    }
    for (int r = 0; r < row.role_count; ++r) {
      // An optional role left out: its part stays empty, which FromParts reads as not stored.
      if (!seen[static_cast<size_t>(r)] && (row.optional_roles >> r & 1u) == 0) {
        const std::string_view role = row.roles[static_cast<size_t>(r)];
        return absl::InvalidArgumentError(absl::StrCat(
            "packed.tensors: role '", absl::string_view(role.data(), role.size()), "' is missing"));
      }
    }
  }
  return FromParts(packed, absl::MakeConstSpan(parts.data(), static_cast<size_t>(row.role_count)),
                   max_request_bytes);
}

namespace {

// The format's stored-value checks (FormatRow::check_stored, e.g. GPTQ's g_idx range) on inline
// tensors, as at checkpoint load; the message gets the "packed: " prefix.
absl::Status CheckStored(const FormatRow& row, const QuantView& view) {
  if (row.check_stored == nullptr) return absl::OkStatus();
  const absl::Status s = row.check_stored(view);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("packed: ", s.message()));
}

}  // namespace

absl::StatusOr<InlineTensor> InlineTensor::FromParts(const v1::InlinePackedTensor& packed,
                                                     absl::Span<const std::string_view> parts,
                                                     int64_t max_request_bytes) {
  absl::StatusOr<Format> parsed = FormatOf(packed);
  if (!parsed.ok()) return parsed.status();
  const Format format = *parsed;
  const FormatRow& row = FormatRowOf(format);
  if (static_cast<int>(parts.size()) != row.role_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed: ", parts.size(), " tensors given, format has ", row.role_count));
  }
  int64_t total = 0;
  for (std::string_view part : parts) total += static_cast<int64_t>(part.size());
  if (total > max_request_bytes) {
    std::string names;
    for (int r = 0; r < row.role_count; ++r) {
      const std::string_view role = row.roles[static_cast<size_t>(r)];
      absl::StrAppend(&names, r == 0 ? "" : " + ", absl::string_view(role.data(), role.size()));
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("inline packed tensors (", names, ") are ", total,
                     " bytes, more than the server's max_request_bytes = ", max_request_bytes));
  }

  QuantShape shape;
  shape.format = format;
  shape.orientation = row.default_orientation;  // the request's own is applied by the service
  switch (packed.scale_dtype()) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_FP16:
      shape.scale_dtype = DType::kF16;
      break;
    case v1::DTYPE_BF16:
      shape.scale_dtype = DType::kBF16;
      break;
    case v1::DTYPE_FP32:  // fp8_block's fp32 scales; the format's checks refuse it elsewhere
      shape.scale_dtype = DType::kF32;
      break;
    case v1::DTYPE_UINT8:  // mxfp4's E8M0 scales; the format's checks refuse it elsewhere
      shape.scale_dtype = DType::kU8;
      break;
    default: {
      const int d = packed.scale_dtype();
      return absl::InvalidArgumentError(absl::StrCat(
          "packed.scale_dtype must be DTYPE_FP16, DTYPE_BF16, DTYPE_FP32 or DTYPE_UINT8, got ",
          v1::DType_IsValid(d) ? v1::DType_Name(static_cast<v1::DType>(d)) : absl::StrCat(d)));
    }
  }
  shape.K = packed.in_features();
  shape.N = packed.out_features();
  shape.group_size = packed.group_size() == -1 ? packed.in_features() : packed.group_size();
  shape.experts = packed.experts() == 0 ? 1 : packed.experts();
  if (packed.bits() != 0) shape.bits = packed.bits();
  // An optional role given no bytes is not stored: the row's flag says so (GPTQ g_idx kNoGidx,
  // compressed-tensors weight_zero_point kSym), as a checkpoint layer without it.
  uint32_t empty_roles = 0;
  for (int r = 0; r < row.role_count; ++r) {
    if (parts[static_cast<size_t>(r)].empty()) empty_roles |= 1u << r;
  }
  shape.format_flags |= AbsentRoleFlags(format, empty_roles);
  if (packed.scale_block_rows() != 0 && format != Format::kCompressedTensorsFp8) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed.scale_block_rows is for format compressed_tensors_fp8 only, got ",
                     packed.scale_block_rows(), " with format ", AbslView(FormatName(format))));
  }
  shape.scale_block_rows = packed.scale_block_rows();
  // GPTQ's zero convention is not in the bytes (v1 and v2 layers have the same sizes): the
  // request must say it, or a v1 layer would be read as v2 and be wrong by one zero step.
  if (format == Format::kGptq) {
    if (packed.checkpoint_format() == "gptq") {
      shape.format_flags |= gptq::kZerosV1;
    } else if (packed.checkpoint_format() != "gptq_v2") {
      return absl::InvalidArgumentError(absl::StrCat(
          "packed.checkpoint_format must be 'gptq' (zeros stored minus one) or 'gptq_v2' for "
          "format gptq, got '",
          packed.checkpoint_format(), "'"));
    }
  } else if (!packed.checkpoint_format().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed.checkpoint_format is for format gptq only, got '",
                     packed.checkpoint_format(), "' with format ", AbslView(FormatName(format))));
  }
  if (absl::Status s = ValidateShape(shape, DType::kF16); !s.ok()) {
    // A refused scale dtype is named by its field ("scale_dtype: ..."): the request's field is
    // packed.scale_dtype. Every other shape message names the layer's K, N or group_size.
    const bool names_scale_dtype = absl::StartsWith(s.message(), "scale_dtype:");
    return absl::InvalidArgumentError(
        absl::StrCat(names_scale_dtype ? "packed." : "packed: ", s.message()));
  }

  InlineTensor tensor;
  tensor.view_.shape = shape;
  bool aligned = true;
  std::array<int64_t, kMaxTensorRoles> words{};  // int32 words of each part's aligned copy
  int64_t total_words = 0;
  for (int r = 0; r < row.role_count; ++r) {
    const TensorSpec spec = TensorSpecOf(shape, r);
    const std::string_view bytes = parts[static_cast<size_t>(r)];
    if (absl::Status s = CheckLength(
            std::string(spec.role).c_str(), bytes, spec.bytes(),
            absl::StrCat(
                spec.rows, " * ", spec.cols, " * ", DTypeSize(spec.dtype), " (",
                absl::string_view(DTypeName(spec.dtype).data(), DTypeName(spec.dtype).size()),
                ")"));
        !s.ok()) {
      return s;
    }
    aligned &= Aligned4(bytes);
    words[static_cast<size_t>(r)] = (spec.bytes() + 3) / 4;
    total_words += words[static_cast<size_t>(r)];
  }
  if (aligned) {
    for (int r = 0; r < row.role_count; ++r) {
      const std::string_view bytes = parts[static_cast<size_t>(r)];
      tensor.view_.tensors[static_cast<size_t>(r)] = bytes.empty() ? nullptr : bytes.data();
    }
    if (absl::Status s = CheckStored(row, tensor.view_); !s.ok()) return s;
    return tensor;
  }
  // Copy every part into one int32 buffer; each part starts on a 4-byte boundary.
  tensor.storage_.resize(static_cast<size_t>(total_words));
  int32_t* at = tensor.storage_.data();
  for (int r = 0; r < row.role_count; ++r) {
    const std::string_view bytes = parts[static_cast<size_t>(r)];
    if (bytes.empty()) continue;  // an absent optional role: its pointer stays null
    std::memcpy(at, bytes.data(), bytes.size());
    tensor.view_.tensors[static_cast<size_t>(r)] = at;
    at += words[static_cast<size_t>(r)];
  }
  if (absl::Status s = CheckStored(row, tensor.view_); !s.ok()) return s;
  return tensor;
}

}  // namespace dequantd
