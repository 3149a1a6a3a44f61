// DequantizeRequest field parsing (see request.h).
#include "server/request.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

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
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<InlineTensor> InlineTensor::FromProto(const v1::InlinePackedTensor& packed,
                                                     int64_t max_request_bytes) {
  return FromParts(packed, packed.qweight(), packed.qzeros(), packed.scales(), max_request_bytes);
}

absl::StatusOr<InlineTensor> InlineTensor::FromParts(const v1::InlinePackedTensor& packed,
                                                     std::string_view qweight,
                                                     std::string_view qzeros,
                                                     std::string_view scales,
                                                     int64_t max_request_bytes) {
  const int64_t total = static_cast<int64_t>(qweight.size() + qzeros.size() + scales.size());
  if (total > max_request_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("inline packed tensors (qweight + qzeros + scales) are ", total,
                     " bytes, more than the server's max_request_bytes = ", max_request_bytes));
  }

  AwqShape shape;
  switch (packed.scale_dtype()) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_FP16:
      shape.scale_dtype = DType::kF16;
      break;
    case v1::DTYPE_BF16:
      shape.scale_dtype = DType::kBF16;
      break;
    default: {
      const int d = packed.scale_dtype();
      return absl::InvalidArgumentError(absl::StrCat(
          "packed.scale_dtype must be DTYPE_FP16 or DTYPE_BF16, got ",
          v1::DType_IsValid(d) ? v1::DType_Name(static_cast<v1::DType>(d)) : absl::StrCat(d)));
    }
  }
  shape.K = packed.in_features();
  shape.N = packed.out_features();
  shape.group_size = packed.group_size() == -1 ? packed.in_features() : packed.group_size();
  if (absl::Status s = ValidateShape(shape, DType::kF16); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("packed: ", s.message()));
  }

  const int64_t words = shape.N / awq::kPackFactor;
  if (absl::Status s = CheckLength("qweight", qweight, shape.qweight_bytes(),
                                   absl::StrCat("K * N/8 * 4 = ", shape.K, " * ", words, " * 4"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckLength("qzeros", qzeros, shape.qzeros_bytes(),
                      absl::StrCat("K/G * N/8 * 4 = ", shape.groups(), " * ", words, " * 4"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLength(
          "scales", scales, shape.scales_bytes(),
          absl::StrCat("K/G * N * ", DTypeSize(shape.scale_dtype), " = ", shape.groups(), " * ",
                       shape.N, " * ", DTypeSize(shape.scale_dtype)));
      !s.ok()) {
    return s;
  }

  InlineTensor tensor;
  tensor.view_.shape = shape;
  if (Aligned4(qweight) && Aligned4(qzeros) && Aligned4(scales)) {
    tensor.view_.qweight = reinterpret_cast<const int32_t*>(qweight.data());
    tensor.view_.qzeros = reinterpret_cast<const int32_t*>(qzeros.data());
    tensor.view_.scales = scales.data();
    return tensor;
  }
  // Copy all three into one int32 buffer; each part starts on a 4-byte boundary.
  const int64_t qweight_words = shape.qweight_elements();
  const int64_t qzeros_words = shape.qzeros_elements();
  const int64_t scales_words = (shape.scales_bytes() + 3) / 4;
  tensor.storage_.resize(static_cast<size_t>(qweight_words + qzeros_words + scales_words));
  int32_t* base = tensor.storage_.data();
  std::memcpy(base, qweight.data(), qweight.size());
  std::memcpy(base + qweight_words, qzeros.data(), qzeros.size());
  std::memcpy(base + qweight_words + qzeros_words, scales.data(), scales.size());
  tensor.view_.qweight = base;
  tensor.view_.qzeros = base + qweight_words;
  tensor.view_.scales = base + qweight_words + qzeros_words;
  return tensor;
}

}  // namespace dequantd
