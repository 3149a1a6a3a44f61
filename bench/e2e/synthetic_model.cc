// Synthetic checkpoint (see synthetic_model.h).
#include "bench/e2e/synthetic_model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "formats/safetensors.h"

namespace dequantd::e2e {
namespace {

template <typename T>
absl::Span<const uint8_t> Bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

}  // namespace

AwqShape ShapeForBytes(int64_t output_bytes) {
  const int64_t N = output_bytes > (int64_t{256} << 20) ? 28672 : 4096;
  const int64_t rows = (output_bytes / (N * 2) + 64) / 128 * 128;
  return AwqShape{
      .K = std::max<int64_t>(128, rows), .N = N, .group_size = 128, .scale_dtype = DType::kF16};
}

std::vector<SyntheticLayer> MakeLayersOf(const std::vector<LayerSpec>& specs, uint32_t seed) {
  std::vector<SyntheticLayer> layers;
  std::mt19937 rng(seed);
  for (const LayerSpec& spec : specs) {
    SyntheticLayer layer;
    layer.shape = spec.shape;
    layer.name = spec.name;
    layer.qweight.resize(static_cast<size_t>(layer.shape.qweight_elements()));
    layer.qzeros.resize(static_cast<size_t>(layer.shape.qzeros_elements()));
    layer.scales.resize(static_cast<size_t>(layer.shape.scales_elements()));
    for (int32_t& w : layer.qweight) w = static_cast<int32_t>(rng());
    for (int32_t& z : layer.qzeros) z = static_cast<int32_t>(rng());
    // fp16 magnitudes 2^-12 .. ~2^-5, either sign.
    for (uint16_t& s : layer.scales)
      s = static_cast<uint16_t>(0x0C00u + rng() % 0x0C00u) | ((rng() & 1u) << 15);
    layers.push_back(std::move(layer));
  }
  return layers;
}

std::vector<SyntheticLayer> MakeLayers(const std::vector<int64_t>& output_bytes, uint32_t seed) {
  std::vector<LayerSpec> specs;
  for (size_t i = 0; i < output_bytes.size(); ++i) {
    const AwqShape shape = ShapeForBytes(output_bytes[i]);
    specs.push_back({absl::StrCat("layers.", i, ".", shape.K, "x", shape.N), shape});
  }
  return MakeLayersOf(specs, seed);
}

std::vector<LayerSpec> Llama8BLayers() {
  struct Projection {
    const char* name;
    int64_t K, N;
  };
  constexpr Projection kBlock[] = {
      {"self_attn.q_proj", 4096, 4096}, {"self_attn.k_proj", 4096, 1024},
      {"self_attn.v_proj", 4096, 1024}, {"self_attn.o_proj", 4096, 4096},
      {"mlp.gate_proj", 4096, 14336},   {"mlp.up_proj", 4096, 14336},
      {"mlp.down_proj", 14336, 4096}};
  std::vector<LayerSpec> specs;
  for (int block = 0; block < 32; ++block) {
    for (const Projection& p : kBlock) {
      specs.push_back(
          {absl::StrCat("model.layers.", block, ".", p.name),
           AwqShape{.K = p.K, .N = p.N, .group_size = 128, .scale_dtype = DType::kF16}});
    }
  }
  return specs;
}

absl::Status WriteCheckpoint(const std::string& dir, const std::vector<SyntheticLayer>& layers) {
  std::filesystem::create_directories(dir);
  std::ofstream config(std::filesystem::path(dir) / "config.json");
  config << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",)"
         << R"( "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,)"
         << R"( "zero_point": true, "version": "gemm"}})" << '\n';
  config.close();
  if (!config) return absl::InternalError(absl::StrCat("cannot write ", dir, "/config.json"));
  std::vector<safetensors::TensorToWrite> tensors;
  for (const SyntheticLayer& l : layers) {
    const int64_t words = l.shape.N / 8;
    tensors.push_back({l.name + ".qweight", "I32", {l.shape.K, words}, Bytes(l.qweight)});
    tensors.push_back({l.name + ".qzeros", "I32", {l.shape.groups(), words}, Bytes(l.qzeros)});
    tensors.push_back({l.name + ".scales", "F16", {l.shape.groups(), l.shape.N}, Bytes(l.scales)});
  }
  return safetensors::WriteFile((std::filesystem::path(dir) / "model.safetensors").string(),
                                tensors);
}

}  // namespace dequantd::e2e
