// Host-side API of the dequantization library: the packed-tensor view, its one validation
// function, and the CPU paths (the reference every test compares against, and a threaded path).
// No gRPC, protobuf or I/O here. The format itself is defined in awq_format.h.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/awq_format.h"

namespace dequantd {

// Shape of one AWQ GEMM linear layer, in elements.
struct AwqShape {
  int64_t K = 0;           // in_features: rows of qweight and of the output
  int64_t N = 0;           // out_features: columns of the output; multiple of 8
  int64_t group_size = 0;  // G: rows sharing one scale/zero row; K % G == 0 (G = K for "-1")
  DType scale_dtype = DType::kF16;  // fp16 or bf16

  int64_t groups() const { return group_size > 0 ? K / group_size : 0; }
  int64_t qweight_elements() const { return K * (N / awq::kPackFactor); }        // int32
  int64_t qzeros_elements() const { return groups() * (N / awq::kPackFactor); }  // int32
  int64_t scales_elements() const { return groups() * N; }
  int64_t qweight_bytes() const { return qweight_elements() * 4; }
  int64_t qzeros_bytes() const { return qzeros_elements() * 4; }
  int64_t scales_bytes() const { return scales_elements() * DTypeSize(scale_dtype); }
  int64_t output_elements() const { return K * N; }
  int64_t output_bytes(DType out) const { return output_elements() * DTypeSize(out); }
  // Bytes a dequantization must move: packed inputs read plus output written.
  int64_t bytes_moved(DType out) const {
    return qweight_bytes() + qzeros_bytes() + scales_bytes() + output_bytes(out);
  }
};

// Largest K * N accepted (2^40 elements): keeps every byte count far from int64 overflow.
inline constexpr int64_t kMaxOutputElements = int64_t{1} << 40;

// Checks a shape and output dtype before any work. Returns INVALID_ARGUMENT naming the field:
// "K", "N", "group_size", "scales dtype", "output dtype" (e.g. "N must be a positive multiple of
// 8, got 1001"). Every entry point (CPU, CUDA, server) calls this first.
absl::Status ValidateShape(const AwqShape& shape, DType out_dtype);

// A packed layer in memory (host or device, depending on the function it is passed to).
// Pointers are not owned. qweight: (K, N/8) int32; qzeros: (K/G, N/8) int32; scales: (K/G, N).
struct PackedTensorView {
  AwqShape shape;
  const int32_t* qweight = nullptr;
  const int32_t* qzeros = nullptr;
  const void* scales = nullptr;
};

// CPU reference: the plain, obviously right loop that defines the result (awq_format.h).
// Writes rows [row_begin, row_end) of the row-major (K, N) output; `out` points at row row_begin
// and holds (row_end - row_begin) * N elements of `out_dtype`. Single-threaded.
// Errors: INVALID_ARGUMENT from ValidateShape, or for a bad row range / null pointer.
absl::Status DequantizeReference(const PackedTensorView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out);

// Fast CPU path: the same result bit for bit, split across up to `threads` threads (0 = hardware
// concurrency; fewer for small requests) over row ranges. Inner loop: one 8-lane AVX2 vector per
// packed word when the CPU has AVX2 + F16C, else a portable word-at-a-time loop; outputs of
// 32 MiB or more use non-temporal stores. Same contract as DequantizeReference, plus
// INVALID_ARGUMENT for threads < 0. Thread-safe; blocks until done (kernels/cpu_dequant.cc).
absl::Status DequantizeCpu(const PackedTensorView& in, DType out_dtype, int64_t row_begin,
                           int64_t row_end, void* out, int threads = 0);

}  // namespace dequantd
