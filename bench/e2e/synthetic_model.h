// A synthetic AWQ checkpoint for the end-to-end benchmark: one layer per requested output size
// (fp16 bytes), or a Llama-3-8B-shaped model, random packed data, written as config.json +
// model.safetensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/dequant.h"

namespace dequantd::e2e {

// One layer held in memory (for inline requests and the reference result).
struct SyntheticLayer {
  std::string name;              // "layers.<i>.<K>x<N>"
  AwqShape shape;                // G = 128, fp16 scales
  std::vector<int32_t> qweight;  // (K, N/8)
  std::vector<int32_t> qzeros;   // (K/G, N/8)
  std::vector<uint16_t> scales;  // (K/G, N) fp16 bits in about [-0.05, 0.05]

  PackedTensorView view() const { return {shape, qweight.data(), qzeros.data(), scales.data()}; }
};

// The shape whose fp16 result is about `output_bytes`: N = 4096 up to 256 MB, else 28672; K the
// nearest multiple of 128 (>= 128). 470e6 bytes gives 8192 x 28672.
AwqShape ShapeForBytes(int64_t output_bytes);

// Random layers, one per size, deterministic in `seed`.
std::vector<SyntheticLayer> MakeLayers(const std::vector<int64_t>& output_bytes, uint32_t seed);

// A layer to generate: its name in the checkpoint and its shape.
struct LayerSpec {
  std::string name;
  AwqShape shape;
};

// Random layers of the given names and shapes, deterministic in `seed`.
std::vector<SyntheticLayer> MakeLayersOf(const std::vector<LayerSpec>& specs, uint32_t seed);

// The quantized linear layers of Llama-3-8B (32 blocks x q, k, v, o, gate, up, down = 224 layers,
// named "model.layers.<b>.self_attn.q_proj" etc.; K x N = 4096 x 4096, 4096 x 1024, 4096 x 1024,
// 4096 x 4096, 4096 x 14336, 4096 x 14336, 14336 x 4096), G = 128, fp16 scales: 13.96 GB of fp16
// output (6.98e9 elements), about 3.6 GB packed.
std::vector<LayerSpec> Llama8BLayers();

// Writes `dir`/config.json (awq, 4 bits, group_size 128, gemm) and `dir`/model.safetensors.
absl::Status WriteCheckpoint(const std::string& dir, const std::vector<SyntheticLayer>& layers);

}  // namespace dequantd::e2e
