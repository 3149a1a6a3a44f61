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
  kGptq = 1,     // GPTQ / GPTQModel, checkpoint_format gptq and gptq_v2 (kernels/gptq_format.h)
  kCompressedTensors = 2,  // compressed-tensors pack-quantized int4/int8
                           // (kernels/compressed_tensors_format.h)
  kFp8Block = 3,  // FP8 E4M3 with 128x128 block scales, DeepSeek-V3 style (fp8_block_format.h)
  kCompressedTensorsFp8 = 4,  // compressed-tensors float-quantized FP8 E4M3, tensor / channel /
                              // group / block scales (compressed_tensors_fp8_format.h)
  kMxfp4 = 5,  // MXFP4 as gpt-oss ships it: E2M1 nibbles, E8M0 scales per 32, stacked experts
               // (mxfp4_format.h)
};

// The layout of a result, chosen per request (every kernel writes either; no host transpose):
//   kKN: row-major (K, N), w_kn[k][n]: AWQ's own (its reference computes it so);
//   kNK: row-major (N, K), w_nk[n][k] = w_kn[k][n]: PyTorch nn.Linear's `weight` (out, in), the
//        orientation GPTQ and compressed-tensors references produce.
// A request that names none gets its format's own (FormatRow::default_orientation).
enum class Orientation : uint8_t { kKN = 0, kNK = 1 };
// "kn" / "nk".
std::string_view OrientationName(Orientation orientation);
// Accepts "kn" / "nk" (any case); false otherwise.
bool ParseOrientation(std::string_view name, Orientation* out);

// Most stored tensors one layer of any format has (AWQ: 3; compressed-tensors: 5).
inline constexpr int kMaxTensorRoles = 6;

// Shape of one quantized linear layer, in elements, the format parameters the kernels need and
// the orientation of the result they write. The result is the matrix w[k, n] of the format's
// definition, row-major as (K, N) or, for Orientation::kNK, as (N, K).
struct QuantShape {
  int64_t K = 0;           // in_features
  int64_t N = 0;           // out_features
  int64_t group_size = 0;  // G: input rows sharing one scale row; K % G == 0 (G = K for "-1")
  DType scale_dtype = DType::kF16;   // dtype of the stored scales
  Format format = Format::kAwqGemm;  // after the four above, so {K, N, G, scale dtype} reads as
                                     // an AWQ shape
  // The result's layout. A layer loaded from a checkpoint carries its format's own; a request
  // may set either (the service does). Not a property of the stored tensors.
  Orientation orientation = Orientation::kKN;
  int bits = 4;  // bits per stored code (AWQ: 4; GPTQ: 2, 3, 4 or 8; compressed-tensors: 4 or 8)
  // Format-specific flags of the stored tensors (GPTQ: gptq::kZerosV1, gptq::kNoGidx;
  // compressed-tensors: compressed_tensors::kSym, ...); 0 for AWQ.
  uint32_t format_flags = 0;
  // Rows n of w sharing one scale, for a format whose scales form a 2-D grid of (rows, group_size)
  // blocks over the (N, K) weight (compressed_tensors_fp8: 1 for channel and group, N for tensor,
  // block_structure[0] for block; 0 reads as 1, what an inline request carries). 0 for the others.
  int64_t scale_block_rows = 0;
  // Matrices stacked in the layer (the expert axis E of a MoE layer stored as one tensor per role:
  // MXFP4's [E, N, K/32, 16] blocks); 1 for every format whose row has no expert axis
  // (FormatRow::stacked_experts; ValidateShape refuses any other value there). The result is the
  // E matrices one after another: (E, K, N) or, for kNK, (E, N, K); read as rows, (E*K, N) or
  // (E*N, K): result_rows() counts the rows of every expert, and a row range or byte range of a
  // result is a range of that stacked matrix.
  int64_t experts = 1;

  int64_t groups() const { return group_size > 0 ? K / group_size : 0; }
  // Rows and columns of the row-major result, experts stacked: (E*K, N) or (E*N, K).
  int64_t result_rows() const { return experts * (orientation == Orientation::kKN ? K : N); }
  int64_t result_cols() const { return orientation == Orientation::kKN ? N : K; }
  // Rows of one expert's matrix in the result: K, or N for kNK.
  int64_t expert_rows() const { return orientation == Orientation::kKN ? K : N; }
  int64_t output_elements() const { return experts * K * N; }
  int64_t output_bytes(DType out) const { return output_elements() * DTypeSize(out); }
  // Bytes of every stored tensor (TensorSpecOf over the format's roles). ValidateShape first.
  int64_t packed_bytes() const;
  // Bytes a dequantization must move: the stored tensors read plus the output written.
  int64_t bytes_moved(DType out) const { return packed_bytes() + output_bytes(out); }
  bool operator==(const QuantShape&) const = default;
};

// One stored tensor of a layer: its role, dtype and row-major dims in elements.
struct TensorSpec {
  std::string_view role;  // the format's name, e.g. "qweight"; checkpoints: <layer>.<role>
  DType dtype = DType::kI32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t elements() const { return rows * cols; }
  int64_t bytes() const { return elements() * DTypeSize(dtype); }
};

// A quantized layer in memory: host or device pointers (as the function it is passed to says),
// not owned. tensors[r] holds role r of the format (TensorSpecOf(shape, r)); unused slots null,
// as is an optional role the layer does not store (FormatRow::optional_roles, whose TensorSpec then
// has 0 rows and 0 columns).
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
