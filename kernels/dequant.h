// Host-side API of the dequantization library for every format: the one validation function and
// the CPU paths (the reference every test compares against, and a threaded path). Each dispatches
// through the format's row (kernels/format_registry.h). No gRPC, protobuf or I/O here. The types
// are in quant_tensor.h; each format's layout in its own header (AWQ: awq_format.h).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/quant_tensor.h"

namespace dequantd {

// Largest K * N accepted (2^40 elements): keeps every byte count far from int64 overflow.
inline constexpr int64_t kMaxOutputElements = int64_t{1} << 40;

// Checks a shape and output dtype before any work: the orientation, the output dtype (fp16, bf16
// or fp32), K and N
// positive with K * N <= kMaxOutputElements, then the format's own rules. Returns
// INVALID_ARGUMENT naming the field: "K", "N", "group_size", "scales dtype", "output dtype" (e.g.
// AWQ: "N must be a positive multiple of 8, got 1001"). Every entry point (CPU, CUDA, server)
// calls this first.
absl::Status ValidateShape(const QuantShape& shape, DType out_dtype);

// CPU reference: the plain, obviously right loop that defines the result (the format's header).
// Writes rows [row_begin, row_end) of the row-major result in in.shape.orientation ((K, N), or
// (N, K) for kNK: rows are then output columns n); `out` points at row row_begin and holds
// (row_end - row_begin) * result_cols() elements of `out_dtype`. Single-threaded.
// Errors: INVALID_ARGUMENT from ValidateShape, or for a bad row range / null pointer.
absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out);

// Fast CPU path: the same result bit for bit, split across up to `threads` threads (0 = hardware
// concurrency; fewer for small requests) over row ranges. Inner loop: one 8-lane AVX2 vector per
// packed word when the CPU has AVX2 + F16C, else a portable word-at-a-time loop; outputs of
// 32 MiB or more use non-temporal stores (AWQ; each format says what its fast path does). Same
// contract as DequantizeReference, plus INVALID_ARGUMENT for threads < 0. Thread-safe; blocks until
// done (kernels/cpu_dequant.cc).
absl::Status DequantizeCpu(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, int threads = 0);

}  // namespace dequantd
