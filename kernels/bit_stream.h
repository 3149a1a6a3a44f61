// Packed-integer bit streams as GPTQ and compressed-tensors store them (host and device code): the
// int32 words along one axis of a tensor, each read from its low bit, form one little-endian bit
// stream; value i of `bits` bits occupies stream bits [i*bits, i*bits + bits), low bit first (for
// bits 2, 4, 8: word i*bits/32, bits [(i*bits) % 32, ...); for 3, 5, 6, 7 a value may straddle two
// words). No interleave (unlike AWQ). Sources: gptq_format.h, compressed_tensors_format.h.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"  // DEQUANTD_HD

namespace dequantd {

// Words of a stream of `values` values of `bits` bits, when values * bits is a multiple of 32.
constexpr int64_t StreamWords(int64_t values, int bits) { return values * bits / 32; }

// Value i (bits in [1, 32)) of a bit stream whose word j is words[j * stride].
DEQUANTD_HD uint32_t StreamField(const int32_t* words, int64_t stride, int64_t i, int bits) {
  const int64_t bit = i * bits;
  const int64_t w = bit >> 5;
  const int shift = static_cast<int>(bit & 31);
  uint32_t v = static_cast<uint32_t>(words[w * stride]) >> shift;
  if (shift + bits > 32) v |= static_cast<uint32_t>(words[(w + 1) * stride]) << (32 - shift);
  return v & ((1u << bits) - 1u);
}

}  // namespace dequantd
