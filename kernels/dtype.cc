// DType names: the spellings used on the wire (proto), in safetensors headers and in configs.
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"

namespace dequantd {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
    case DType::kF32:
      return "fp32";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kF8E4M3:
      return "fp8_e4m3";
    case DType::kU8:
      return "uint8";
  }
  return "unknown";
}

bool ParseDType(std::string_view name, DType* out) {
  struct Spelling {
    std::string_view name;
    DType dtype;
  };
  // Matched case-insensitively: "F16" is safetensors' spelling, "float16" torch's.
  static constexpr Spelling kSpellings[] = {
      {"fp16", DType::kF16},        {"float16", DType::kF16},
      {"f16", DType::kF16},         {"bf16", DType::kBF16},
      {"bfloat16", DType::kBF16},   {"fp32", DType::kF32},
      {"float32", DType::kF32},     {"f32", DType::kF32},
      {"int32", DType::kI32},       {"i32", DType::kI32},
      {"int64", DType::kI64},       {"i64", DType::kI64},
      {"fp8_e4m3", DType::kF8E4M3}, {"float8_e4m3fn", DType::kF8E4M3},
      {"f8_e4m3", DType::kF8E4M3},  {"uint8", DType::kU8},
      {"u8", DType::kU8},
  };
  for (const Spelling& s : kSpellings) {
    if (absl::EqualsIgnoreCase(absl::string_view(name.data(), name.size()),
                               absl::string_view(s.name.data(), s.name.size()))) {
      if (out != nullptr) *out = s.dtype;
      return true;
    }
  }
  return false;
}

}  // namespace dequantd
