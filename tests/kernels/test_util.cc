#include "tests/kernels/test_util.h"
#include "kernels/awq_format.h"

#include <random>

namespace dequantd::testing {

uint32_t PackColumns(const std::array<uint32_t, 8>& columns) {
  uint32_t word = 0;
  for (int i = 0; i < 8; ++i) word |= (columns[kOrderMap[i]] & 0xFu) << (4 * i);
  return word;
}

HostLayer ZeroLayer(const QuantShape& shape) {
  HostLayer layer;
  layer.shape = shape;
  layer.qweight.assign(static_cast<size_t>(awq::QweightElements(shape)), 0);
  layer.qzeros.assign(static_cast<size_t>(awq::QzerosElements(shape)), 0);
  layer.scales.assign(static_cast<size_t>(awq::ScalesElements(shape)), 0);
  return layer;
}

HostLayer RandomLayer(const QuantShape& shape, uint64_t seed) {
  HostLayer layer = ZeroLayer(shape);
  std::mt19937_64 rng(seed);
  for (int32_t& w : layer.qweight) w = static_cast<int32_t>(static_cast<uint32_t>(rng()));
  for (int32_t& w : layer.qzeros) w = static_cast<int32_t>(static_cast<uint32_t>(rng()));
  // Finite patterns: fp16 exponent field (bits 10..14) != 31; bf16 exponent (bits 7..14) != 255.
  const uint16_t exp_mask = shape.scale_dtype == DType::kF16 ? 0x7C00 : 0x7F80;
  for (uint16_t& s : layer.scales) {
    do {
      s = static_cast<uint16_t>(rng());
    } while ((s & exp_mask) == exp_mask);
  }
  return layer;
}

std::vector<uint8_t> OutputBuffer(int64_t elements, DType dtype) {
  return std::vector<uint8_t>(static_cast<size_t>(elements * DTypeSize(dtype)), 0xA5);
}

}  // namespace dequantd::testing
