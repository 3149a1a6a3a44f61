// Compares a streamed Dequantize result with a reference tensor from a safetensors or NumPy .npy
// file (for example the original, unquantized weights) and reports the error:
//   max_abs_error       max |out - ref|
//   rms_error           sqrt(mean((out - ref)^2))
//   relative_rms_error  rms_error / sqrt(mean(ref^2))
// over the elements where both values are finite (others are counted in `nonfinite`). Sums are
// in double. The reference is (K, N) row-major like the result, or (N, K) (PyTorch's
// nn.Linear.weight layout, out_features x in_features), compared transposed. Reference dtypes:
// safetensors F16, BF16, F32, F64; .npy '<f2', '<f4', '<f8' (C order). The reference tensor's
// bytes are read into memory by Open (a safetensors file's header is parsed from a memory map
// that Open drops; the tensor itself is read with pread), so a reference file truncated or
// rewritten later changes nothing (no SIGBUS). Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dequant/v1/dequant.pb.h"

namespace dequantd {

struct ErrorStats {
  int64_t count = 0;  // elements compared (both values finite)
  // Elements where both values are non-finite and agree (both NaN, or the same infinity): equal,
  // left out of the error sums.
  int64_t nonfinite = 0;
  // Elements where one value is finite and the other not, or both are non-finite and differ (NaN
  // and inf, +inf and -inf): mismatches. Any makes max_abs_error +inf; the rms errors stay over
  // the `count` finite pairs.
  int64_t nonfinite_mismatches = 0;
  double max_abs_error = 0;
  double rms_error = 0;
  double relative_rms_error = 0;  // 0 when the reference is all zeros
};

// How the reference is laid out relative to the (K, N) result.
enum class ReferenceLayout {
  kAuto,  // (K, N) if its shape is (K, N), else (N, K) if that matches; refused when K == N
  kKN,    // same layout as the result
  kNK,    // transposed (nn.Linear.weight)
};

// Parses "auto", "kn", "nk". INVALID_ARGUMENT otherwise.
absl::StatusOr<ReferenceLayout> ParseReferenceLayout(const std::string& text);

class ReferenceComparer {
 public:
  // `spec` is "FILE.safetensors", "FILE.safetensors:TENSOR" or "FILE.npy". Without TENSOR, the
  // safetensors file's only tensor is used, else the first of `default_names` present (a .npy
  // file holds one array). Errors: NOT_FOUND (file, tensor), INVALID_ARGUMENT (reference dtype
  // not one of those above, naming it; a Fortran-order .npy array; "FILE.npy:TENSOR"; no tensor
  // name can be chosen), DATA_LOSS (a truncated .npy or safetensors file), other errno-derived
  // codes for I/O.
  static absl::StatusOr<std::unique_ptr<ReferenceComparer>> Open(
      const std::string& spec, const std::vector<std::string>& default_names,
      ReferenceLayout layout);

  // Checks the reference against the result's header. INVALID_ARGUMENT when the shapes do not
  // match in the requested layout, when the layout is kAuto and the result is square (K == N:
  // (K, N) and (N, K) cannot be told apart), or the output dtype is not fp16/bf16/fp32.
  absl::Status Begin(const ::dequant::v1::DequantizeHeader& header);
  // Consecutive bytes of the result (elements may be split across calls).
  absl::Status Add(absl::Span<const uint8_t> data);
  ErrorStats Stats() const;

  const std::string& tensor_name() const { return tensor_name_; }  // empty for a .npy file
  const std::string& path() const { return path_; }
  // "FILE.safetensors:TENSOR" or "FILE.npy", for messages.
  std::string reference() const;
  bool transposed() const { return transposed_; }

 private:
  ReferenceComparer() = default;
  double OutputAt(const uint8_t* p) const;
  double ReferenceAt(int64_t index) const;  // index in the row-major (K, N) result
  void Accumulate(double out, double ref);

  static absl::StatusOr<std::unique_ptr<ReferenceComparer>> OpenSafetensors(
      const std::string& spec, const std::vector<std::string>& default_names);
  static absl::StatusOr<std::unique_ptr<ReferenceComparer>> OpenNpy(const std::string& spec);

  std::string path_;
  std::vector<uint8_t> ref_data_;  // the reference tensor's bytes, read by Open
  std::string tensor_name_;
  std::string ref_dtype_;  // safetensors dtype string: F16, BF16, F32 or F64
  std::vector<int64_t> ref_shape_;
  absl::Span<const uint8_t> ref_bytes_;  // ref_data_
  ReferenceLayout layout_ = ReferenceLayout::kAuto;
  bool transposed_ = false;
  int64_t K_ = 0, N_ = 0;
  int64_t experts_ = 1;  // matrices stacked in the result (a 3-D (E, ., .) header: MXFP4)
  int64_t rows_ = 0;     // one matrix's rows and columns as delivered ((K, N) or (N, K))
  int64_t cols_ = 0;
  ::dequant::v1::DType out_dtype_ = ::dequant::v1::DTYPE_UNSPECIFIED;
  int64_t out_element_bytes_ = 0;
  int64_t next_element_ = 0;      // index of the next result element
  std::vector<uint8_t> partial_;  // bytes of an element split across Add calls
  int64_t count_ = 0, nonfinite_ = 0, nonfinite_mismatches_ = 0;
  double max_abs_ = 0, sum_sq_err_ = 0, sum_sq_ref_ = 0;
};

}  // namespace dequantd
