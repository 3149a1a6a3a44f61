// The checks of stored tensors and shapes that several formats' row functions share
// (kernels/format_registry.h: shape_from_stored, validate), each with its one message wording.
// Each format's own rules stay in its <f>.cc; these are only the ones that read alike everywhere.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/format_registry.h"

namespace dequantd {

// std::string_view as absl::string_view (this Abseil build's string_view is not std's).
inline absl::string_view AbslView(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

// Fills `problem` (role, field, what) and returns false: the shape_from_stored failure idiom.
bool StoredProblem(StoredTensorProblem* problem, int role, const char* field, std::string what);

// Role `role` has `dims` dims, else false with "shape": "has D dims, want <dims>".
bool CheckStoredDims(const StoredTensor& t, int role, size_t dims, StoredTensorProblem* problem);

// Role `role` holds packed int32 words: dtype I32 (or U32 with options.packed_u32), else false
// with "dtype": "is X, want I32[ or U32]".
bool CheckPackedWords(const StoredTensor& t, int role, const StoredTensorOptions& options,
                      StoredTensorProblem* problem);

// The scale dtype of role `role` from its safetensors code, one of `allowed` (F16, BF16, F32),
// else false with "dtype": "is X, want F16 or BF16" (the allowed codes).
bool StoredScaleDType(const StoredTensor& t, int role, absl::Span<const DType> allowed, DType* out,
                      StoredTensorProblem* problem);

// group_size positive and dividing K (INVALID_ARGUMENT "group_size must be positive, got G" /
// "K (K) must be a multiple of group_size (G)").
absl::Status ValidateGroupSize(const QuantShape& shape);

// shape.scale_dtype is one of `allowed`, else INVALID_ARGUMENT "scale_dtype: <role> dtype must be
// fp16 or bf16, got X" (the message starts with the QuantShape field it refuses; an inline request
// names it packed.scale_dtype).
absl::Status ValidateScaleDType(const QuantShape& shape, absl::Span<const DType> allowed,
                                std::string_view role);

}  // namespace dequantd
