// Test helpers for server_test: random packed AWQ layers owned by host vectors, and their
// inline-request form (dequant.v1.InlinePackedTensor).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dequant/v1/dequant.pb.h"
#include "kernels/awq_format.h"
#include "kernels/dequant.h"

namespace dequantd::testing {

struct PackedLayer {
  QuantShape shape;
  std::vector<int32_t> qweight;  // (K, N/8), every bit pattern (sign bit included)
  std::vector<int32_t> qzeros;   // (K/G, N/8)
  std::vector<uint16_t> scales;  // (K/G, N), finite fp16 / bf16 values in about [2^-7, 1)

  QuantView view() const {
    return awq::MakeView(shape, qweight.data(), qzeros.data(), scales.data());
  }
};

inline PackedLayer RandomPackedLayer(const QuantShape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  PackedLayer layer;
  layer.shape = shape;
  layer.qweight.resize(static_cast<size_t>(awq::QweightElements(shape)));
  layer.qzeros.resize(static_cast<size_t>(awq::QzerosElements(shape)));
  layer.scales.resize(static_cast<size_t>(awq::ScalesElements(shape)));
  for (int32_t& w : layer.qweight) w = static_cast<int32_t>(rng());
  for (int32_t& z : layer.qzeros) z = static_cast<int32_t>(rng());
  for (uint16_t& s : layer.scales) {
    const uint32_t r = rng();
    s = static_cast<uint16_t>(shape.scale_dtype == DType::kBF16 ? 0x3C00u + r % 0x0300u
                                                                : 0x2000u + r % 0x1C00u);
    if (r & 0x80000000u) s |= 0x8000u;  // negative scales too
  }
  return layer;
}

inline std::string Bytes(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

// The layer as an inline request field (group_size as given, e.g. -1).
inline dequant::v1::InlinePackedTensor ToInline(const PackedLayer& layer, int64_t group_size) {
  dequant::v1::InlinePackedTensor packed;
  packed.set_in_features(layer.shape.K);
  packed.set_out_features(layer.shape.N);
  packed.set_group_size(group_size);
  packed.set_scale_dtype(layer.shape.scale_dtype == DType::kBF16 ? dequant::v1::DTYPE_BF16
                                                                 : dequant::v1::DTYPE_FP16);
  packed.set_qweight(Bytes(layer.qweight.data(), layer.qweight.size() * 4));
  packed.set_qzeros(Bytes(layer.qzeros.data(), layer.qzeros.size() * 4));
  packed.set_scales(Bytes(layer.scales.data(), layer.scales.size() * 2));
  return packed;
}

// The whole (K, N) result of the CPU reference, as bytes.
inline std::vector<uint8_t> ReferenceBytes(const PackedLayer& layer, DType out_dtype) {
  std::vector<uint8_t> out(static_cast<size_t>(layer.shape.output_bytes(out_dtype)));
  if (!DequantizeReference(layer.view(), out_dtype, 0, layer.shape.K, out.data()).ok()) return {};
  return out;
}

}  // namespace dequantd::testing
