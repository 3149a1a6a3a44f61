// 4-bit codes placed, two at a time, in the low mantissa bits of a pair of 16-bit floats (the
// "magic number" unpack of AWQ's Lop3Unpack, kernels/cuda/awq_decode.cuh), for the formats that
// pack codes sequentially (code m of a word at bits [4m, 4m + 4): GPTQ and compressed-tensors,
// kernels/bit_stream.h). Host and device code, integer operations only: on the GPU each helper is
// one or two instructions (inline PTX lop3.b32 / prmt.b32, a shift); on the host the same
// functions emulate those instructions bit for bit from their PTX definitions, so the CPU tests
// (tests/kernels/nibble_pairs_test.cc) pin every nibble position the kernels rely on. No CUDA
// headers: the arithmetic on the pairs is in kernels/cuda/half2_pairs.cuh.
//
// A pair is one 32-bit word, low half = the lower column (memory order of a 16-byte store). Each
// half holds one code v in [0, 16) in one of three forms, all exact:
//   kF16Lo:  fp16 0x6400 | v        = 1024 + v   (v at bits [0, 4) of the half)
//   kF16Hi:  fp16 0x5400 | v << 4   =   64 + v   (v at bits [4, 8): 2^6 * (1 + 16v / 1024))
//   kBf16Lo: bf16 0x4300 | v        =  128 + v   (v at bits [0, 4); bf16 has 7 mantissa bits,
//                                                  so it has no form for bits [4, 8))
// Subtracting a zero pair of the same forms, (base + q) - (base + z), is then exact in that dtype
// (|q - z| <= 15, and every value involved is an integer, or for kF16Hi a multiple of 1/16, that
// the dtype represents), which is what kernels/cuda/half2_pairs.cuh's SubPairs does.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"  // DEQUANTD_HD

namespace dequantd::nibble_pairs {

// ---- The two instructions --------------------------------------------------------------------

// lop3.b32 d, a, b, c, kLut: bit i of d is bit (4 a_i + 2 b_i + c_i) of kLut (PTX ISA "lop3": the
// look-up table is F(0xF0, 0xCC, 0xAA) for the function F of a, b, c).
template <uint32_t kLut>
DEQUANTD_HD uint32_t Lop3(uint32_t a, uint32_t b, uint32_t c) {
  static_assert(kLut <= 0xFFu);
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(kLut));
  return d;
#else
  uint32_t d = 0;
  for (int i = 0; i < 32; ++i) {
    const uint32_t index = ((a >> i) & 1u) << 2 | ((b >> i) & 1u) << 1 | ((c >> i) & 1u);
    d |= ((kLut >> index) & 1u) << i;
  }
  return d;
#endif
}

// (a & b) | c: F(0xF0, 0xCC, 0xAA).
inline constexpr uint32_t kAndOr = (0xF0u & 0xCCu) | 0xAAu;
static_assert(kAndOr == 0xEAu);

// prmt.b32 d, a, b, selector (default mode): the 8 bytes {b, a} numbered 0-3 (a, low first) and
// 4-7 (b); byte i of d is the byte that bits [4i, 4i + 3) of the selector name, or, when bit
// 4i + 3 is set, that byte's sign bit replicated (PTX ISA "prmt").
DEQUANTD_HD uint32_t Prmt(uint32_t a, uint32_t b, uint32_t selector) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
#else
  const uint64_t bytes = static_cast<uint64_t>(b) << 32 | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (selector >> (4 * i)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(bytes >> (8 * (s & 7u))) & 0xFFu;
    if ((s & 8u) != 0) byte = (byte & 0x80u) != 0 ? 0xFFu : 0u;
    d |= byte << (8 * i);
  }
  return d;
#endif
}

// The selector that puts byte i of a in byte 0 and byte i of b in byte 2 (bytes 1 and 3: byte 0 of
// a, masked off by every use below).
DEQUANTD_HD uint32_t SplitByteSelector(int i) {
  return static_cast<uint32_t>(i) | static_cast<uint32_t>(4 + i) << 8;
}

// ---- Forms ------------------------------------------------------------------------------------

inline constexpr uint32_t kF16Lo = 0x6400u;   // 1024.0
inline constexpr uint32_t kF16Hi = 0x5400u;   // 64.0
inline constexpr uint32_t kBf16Lo = 0x4300u;  // 128.0
inline constexpr uint32_t kF16LoBase = 1024;
inline constexpr uint32_t kF16HiBase = 64;
inline constexpr uint32_t kBf16LoBase = 128;

// The pair (base + z_lo, base + z_hi) of the forms (lo_form, hi_form) named by the magic words.
DEQUANTD_HD uint32_t ZeroPair(uint32_t z_lo, uint32_t z_hi, uint32_t lo_form, uint32_t hi_form) {
  const uint32_t lo = lo_form == kF16Hi ? z_lo << 4 : z_lo;
  const uint32_t hi = hi_form == kF16Hi ? z_hi << 4 : z_hi;
  return (lo_form | lo) | (hi_form | hi) << 16;
}

// ---- Codes (2i, 2i + 1) of one sequential word: one column pair of a row ---------------------

// (kF16Lo of code 2i, kF16Hi of code 2i + 1), i in [0, 4): one prmt (byte i to bytes 0 and 2) and
// one lop3: code 2i is the low nibble of byte 0, code 2i + 1 the high nibble of byte 2.
DEQUANTD_HD uint32_t SeqPairF16LoHi(uint32_t word, int i) {
  return Lop3<kAndOr>(Prmt(word, word, 0x1111u * static_cast<uint32_t>(i)), 0x00F0000Fu,
                      kF16Hi << 16 | kF16Lo);
}

// Both codes in kF16Lo: byte i of word (code 2i in its low nibble) and of word >> 4 (code 2i + 1).
// `word_shr4` = word >> 4, shared by the four pairs.
DEQUANTD_HD uint32_t SeqPairF16Lo(uint32_t word, uint32_t word_shr4, int i) {
  return Lop3<kAndOr>(Prmt(word, word_shr4, SplitByteSelector(i)), 0x000F000Fu,
                      kF16Lo << 16 | kF16Lo);
}

// Both codes in kF16Hi: byte i of word << 4 (code 2i in its high nibble) and of word (code 2i + 1).
// `word_shl4` = word << 4, shared by the four pairs.
DEQUANTD_HD uint32_t SeqPairF16Hi(uint32_t word_shl4, uint32_t word, int i) {
  return Lop3<kAndOr>(Prmt(word_shl4, word, SplitByteSelector(i)), 0x00F000F0u,
                      kF16Hi << 16 | kF16Hi);
}

// Both codes in kBf16Lo (as SeqPairF16Lo).
DEQUANTD_HD uint32_t SeqPairBf16(uint32_t word, uint32_t word_shr4, int i) {
  return Lop3<kAndOr>(Prmt(word, word_shr4, SplitByteSelector(i)), 0x000F000Fu,
                      kBf16Lo << 16 | kBf16Lo);
}

// ---- Code j of two words x and y: two columns of one row (GPTQ (K, N)) ------------------------

// Byte b of x in byte 0 and byte b of y in byte 2: codes 2b and 2b + 1 of both words, shared by
// the two rows j = 2b and 2b + 1.
DEQUANTD_HD uint32_t CrossBytes(uint32_t x, uint32_t y, int b) {
  return Prmt(x, y, SplitByteSelector(b));
}

// (code j of x, code j of y) from t = CrossBytes(x, y, j / 2), `odd` = j % 2: for even j both in
// kF16Lo (low nibbles), for odd j both in kF16Hi (high nibbles, no shift). One lop3.
DEQUANTD_HD uint32_t CrossPairF16(uint32_t t, bool odd) {
  return odd ? Lop3<kAndOr>(t, 0x00F000F0u, kF16Hi << 16 | kF16Hi)
             : Lop3<kAndOr>(t, 0x000F000Fu, kF16Lo << 16 | kF16Lo);
}

// The same in kBf16Lo: odd j first shifts the high nibbles down (bf16 has no kF16Hi-like form).
DEQUANTD_HD uint32_t CrossPairBf16(uint32_t t, bool odd) {
  return Lop3<kAndOr>(odd ? t >> 4 : t, 0x000F000Fu, kBf16Lo << 16 | kBf16Lo);
}

}  // namespace dequantd::nibble_pairs
