// Force-included into every source of the fuzz build (scripts/fuzz.sh, clang 14 only):
// clang 14's __builtin_cpu_supports does not know "f16c" (kernels/cpu_dequant.cc asks for it;
// GCC does), so the name is routed through this function, which answers "f16c" from CPUID
// (leaf 1, ECX bit 29) and every other feature kernels/ uses from the builtin.
#pragma once

#include <cpuid.h>

static inline bool DequantdFuzzCpuSupports(const char* feature) {
  if (__builtin_strcmp(feature, "f16c") == 0) {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  }
  if (__builtin_strcmp(feature, "avx2") == 0) return __builtin_cpu_supports("avx2");
  if (__builtin_strcmp(feature, "fma") == 0) return __builtin_cpu_supports("fma");
  if (__builtin_strcmp(feature, "avx512f") == 0) return __builtin_cpu_supports("avx512f");
  return false;
}
#define __builtin_cpu_supports(feature) DequantdFuzzCpuSupports(feature)
