// A synthetic AWQ checkpoint for the end-to-end benchmark: one layer per requested output size
// (fp16 bytes), random packed data, written as config.json + model.safetensors.
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
  QuantShape shape;              // G = 128, fp16 scales
  std::vector<int32_t> qweight;  // (K, N/8)
  std::vector<int32_t> qzeros;   // (K/G, N/8)
  std::vector<uint16_t> scales;  // (K/G, N) fp16 bits in about [-0.05, 0.05]

  QuantView view() const { return {shape, qweight.data(), qzeros.data(), scales.data()}; }
};

// The shape whose fp16 result is about `output_bytes`: N = 4096 up to 256 MB, else 28672; K the
// nearest multiple of 128 (>= 128). 470e6 bytes gives 8192 x 28672.
QuantShape ShapeForBytes(int64_t output_bytes);

// Random layers, one per size, deterministic in `seed`.
std::vector<SyntheticLayer> MakeLayers(const std::vector<int64_t>& output_bytes, uint32_t seed);

// Writes `dir`/config.json (awq, 4 bits, group_size 128, gemm) and `dir`/model.safetensors.
absl::Status WriteCheckpoint(const std::string& dir, const std::vector<SyntheticLayer>& layers);

// A Llama-3-8B-shaped model: `blocks` blocks of the 7 projections (q 4096x4096, k and v
// 4096x1024, o 4096x4096, gate and up 4096x14336, down 14336x4096; every dimension divided by
// `shrink`, 1 = the real shapes: 32 blocks = 224 layers, 13.96 GB of fp16), named
// "model.layers.<b>.<self_attn|mlp>.<proj>". The blocks share the packed data of one block (so
// the reference is computed for 7 layers), in ListTensors' name order.
struct SyntheticModel {
  std::vector<SyntheticLayer> distinct;  // the 7 projections' data
  std::vector<std::string> names;        // every layer, sorted by name (ListTensors' order)
  std::vector<size_t> data_of;           // names[i]'s data: distinct[data_of[i]]
  int64_t fp16_bytes() const;            // the whole model's fp16 result, bytes
};
// `shrink` must divide 1024 and leave K a multiple of 128 (1, 2, 4, 8: 14336 / 8 = 1792;
// 16: 256/64/896, whose K 896 is 7 x 128).
SyntheticModel MakeLlamaShapedModel(int blocks, int shrink, uint32_t seed);

// A Llama model's projection sizes: hidden, intermediate and the k/v width (kv heads x 128).
struct LlamaDims {
  int64_t hidden = 4096;
  int64_t intermediate = 14336;
  int64_t kv = 1024;
};
inline constexpr LlamaDims kLlama8B{};  // 32 blocks: 224 layers, 3.75 GB packed
inline constexpr LlamaDims kLlama70B{.hidden = 8192, .intermediate = 28672, .kv = 1024};
// (80 blocks: 560 layers, 35.6 GB packed, 137 GB of fp16.) As MakeLlamaShapedModel, for `dims`.
SyntheticModel MakeLlamaModel(const LlamaDims& dims, int blocks, int shrink, uint32_t seed);
// Writes a checkpoint as WriteCheckpoint does, holding `data[i]`'s packed tensors under the layer
// name `names[i]` (so layers can share data: a SyntheticModel's names and distinct data, plus
// any other layers).
absl::Status WriteCheckpoint(const std::string& dir, const std::vector<std::string>& names,
                             const std::vector<const SyntheticLayer*>& data);
// The same in `shards` files model-0000i-of-0000S.safetensors (consecutive layers, about equal
// sizes) with model.safetensors.index.json, as Hugging Face writes large checkpoints.
absl::Status WriteShardedCheckpoint(const std::string& dir, const std::vector<std::string>& names,
                                    const std::vector<const SyntheticLayer*>& data, int shards);

}  // namespace dequantd::e2e
