// The generic quantized tensor: which format, its shape in elements, and its stored tensors by
// role. Every layer above the kernels (checkpoint store, backends, service, client, benchmarks)
// handles a quantized layer through these types only; what a format's tensors are, how they are
// checked and how they decode is in the format's own files, reached through its one row in
// kernels/format_registry.h. Host types only; no I/O.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "kernels/dtype.h"

namespace dequantd {

// The quantized formats dequantd reads. Each value has one row in kernels/format_registry.cc.
enum class Format : uint8_t {
  kAwqGemm = 0,  // AutoAWQ "gemm" (kernels/awq_format.h)
};

// Most stored tensors one layer of any format has (AWQ: 3).
inline constexpr int kMaxTensorRoles = 6;

// Shape of one quantized linear layer, in elements, and the format parameters the kernels need.
// The result is the row-major (K, N) matrix w[k, n] of the format's definition.
struct QuantShape {
  int64_t K = 0;           // in_features: rows of the (K, N) result
  int64_t N = 0;           // out_features: columns of the (K, N) result
  int64_t group_size = 0;  // G: input rows sharing one scale row; K % G == 0 (G = K for "-1")
  DType scale_dtype = DType::kF16;   // dtype of the stored scales
  Format format = Format::kAwqGemm;  // last, so {K, N, G, scale dtype} reads as an AWQ shape

  int64_t groups() const { return group_size > 0 ? K / group_size : 0; }
  int64_t output_elements() const { return K * N; }
  int64_t output_bytes(DType out) const { return output_elements() * DTypeSize(out); }
  // Bytes of every stored tensor (TensorSpecOf over the format's roles). ValidateShape first.
  int64_t packed_bytes() const;
  // Bytes a dequantization must move: the stored tensors read plus the output written.
  int64_t bytes_moved(DType out) const { return packed_bytes() + output_bytes(out); }
  bool operator==(const QuantShape&) const = default;
};

// One stored tensor of a layer: its role, dtype and row-major dims in elements.
struct TensorSpec {
  std::string_view role;  // the format's name for it, e.g. "qweight"; checkpoints: <layer>.<role>
  DType dtype = DType::kI32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t elements() const { return rows * cols; }
  int64_t bytes() const { return elements() * DTypeSize(dtype); }
};

// A quantized layer in memory: host or device pointers (as the function it is passed to says),
// not owned. tensors[r] holds role r of the format (TensorSpecOf(shape, r)); unused slots null.
struct QuantView {
  QuantShape shape;
  std::array<const void*, kMaxTensorRoles> tensors{};
};

// The format's name as written on the wire and in logs and the tune cache: "awq_gemm".
std::string_view FormatName(Format format);
// Parses FormatName's spelling (case-insensitive); false if unknown.
bool ParseFormat(std::string_view name, Format* out);
// Number of stored tensors (roles) of a layer of `format`, in [1, kMaxTensorRoles].
int TensorRoleCount(Format format);
// Role `role` of `shape`'s format for this shape: name, dtype, dims. `shape` must pass
// ValidateShape; role in [0, TensorRoleCount).
TensorSpec TensorSpecOf(const QuantShape& shape, int role);

}  // namespace dequantd
