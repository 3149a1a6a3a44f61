// Size classes of a layer that v4's launch choices depend on (thresholds measured on the H200;
// see DefaultConfig in launch_config.cc and the launcher in dequant_cuda.cu). Host only.
#pragma once

#include <cstdint>

#include "kernels/dequant.h"

namespace dequantd::cuda {

enum class LayerSize {
  kSmall,  // fewer than 4M outputs (e.g. 1536x1536): launch overhead dominates
  kMid,    // 4M to 32M outputs (e.g. 1536x8960): about one wave of the grid, L2-sized
  kLarge,  // 32M outputs or more (e.g. 4096x14336): streaming at the memory rate
};

inline LayerSize ClassifyLayer(const QuantShape& shape) {
  const int64_t outputs = shape.output_elements();
  if (outputs >= (int64_t{32} << 20)) return LayerSize::kLarge;
  if (outputs >= (int64_t{4} << 20)) return LayerSize::kMid;
  return LayerSize::kSmall;
}

}  // namespace dequantd::cuda
