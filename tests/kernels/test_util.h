// Test helpers for kernels_test: host-side packed layers (hand-built or random) and packing
// written independently of kernels/awq_format.h (from AutoAWQ's packing loop).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kernels/awq_format.h"  // awq::MakeView only; the packing here is independent
#include "kernels/dequant.h"

namespace dequantd::testing {

// AutoAWQ gemm.py, WQLinear_GEMM.from_linear: `order_map = [0, 2, 4, 6, 1, 3, 5, 7]` and
// `qweight |= intweight[:, order_map[i]] << (i * 4)`: nibble i holds column kOrderMap[i].
inline constexpr std::array<int, 8> kOrderMap = {0, 2, 4, 6, 1, 3, 5, 7};

// Packs eight 4-bit values given in output-column order into one AWQ word (as AutoAWQ does).
uint32_t PackColumns(const std::array<uint32_t, 8>& columns);

// A packed layer owned by host vectors. scales hold fp16 or bf16 bits (shape.scale_dtype).
struct HostLayer {
  QuantShape shape;
  std::vector<int32_t> qweight;  // (K, N/8)
  std::vector<int32_t> qzeros;   // (K/G, N/8)
  std::vector<uint16_t> scales;  // (K/G, N)

  QuantView view() const {
    return awq::MakeView(shape, qweight.data(), qzeros.data(), scales.data());
  }
};

// Zero-filled layer of the given shape (shape must be valid).
HostLayer ZeroLayer(const QuantShape& shape);

// Random layer: every qweight/qzeros word is a full 32-bit random value (sign bit included);
// scales are random bit patterns over the whole finite range of scale_dtype (no inf or NaN), so
// products overflow to inf in fp16 and subnormals occur.
HostLayer RandomLayer(const QuantShape& shape, uint64_t seed);

// Output buffer of `elements` elements of `dtype`, as bytes, filled with 0xA5 so unwritten
// elements show.
std::vector<uint8_t> OutputBuffer(int64_t elements, DType dtype);

}  // namespace dequantd::testing
