// Synthetic checkpoint (see synthetic_model.h).
#include "bench/e2e/synthetic_model.h"
#include "kernels/awq_format.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "formats/safetensors.h"

namespace dequantd::e2e {
namespace {

template <typename T>
absl::Span<const uint8_t> Bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

// Random packed data of one (K, N) layer, G = 128, fp16 scales.
SyntheticLayer RandomLayer(std::string name, int64_t K, int64_t N, std::mt19937& rng) {
  SyntheticLayer layer;
  layer.name = std::move(name);
  layer.shape = QuantShape{.K = K, .N = N, .group_size = 128, .scale_dtype = DType::kF16};
  layer.qweight.resize(static_cast<size_t>(awq::QweightElements(layer.shape)));
  layer.qzeros.resize(static_cast<size_t>(awq::QzerosElements(layer.shape)));
  layer.scales.resize(static_cast<size_t>(awq::ScalesElements(layer.shape)));
  for (int32_t& w : layer.qweight) w = static_cast<int32_t>(rng());
  for (int32_t& z : layer.qzeros) z = static_cast<int32_t>(rng());
  // fp16 magnitudes 2^-12 .. ~2^-5, either sign.
  for (uint16_t& s : layer.scales)
    s = static_cast<uint16_t>(0x0C00u + rng() % 0x0C00u) | ((rng() & 1u) << 15);
  return layer;
}

}  // namespace

QuantShape ShapeForBytes(int64_t output_bytes) {
  const int64_t N = output_bytes > (int64_t{256} << 20) ? 28672 : 4096;
  const int64_t rows = (output_bytes / (N * 2) + 64) / 128 * 128;
  return QuantShape{
      .K = std::max<int64_t>(128, rows), .N = N, .group_size = 128, .scale_dtype = DType::kF16};
}

std::vector<SyntheticLayer> MakeLayers(const std::vector<int64_t>& output_bytes, uint32_t seed) {
  std::vector<SyntheticLayer> layers;
  std::mt19937 rng(seed);
  for (size_t i = 0; i < output_bytes.size(); ++i) {
    const QuantShape shape = ShapeForBytes(output_bytes[i]);
    layers.push_back(
        RandomLayer(absl::StrCat("layers.", i, ".", shape.K, "x", shape.N), shape.K, shape.N, rng));
  }
  return layers;
}

namespace {

absl::Status WriteConfig(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream config(std::filesystem::path(dir) / "config.json");
  config << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",)"
         << R"( "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,)"
         << R"( "zero_point": true, "version": "gemm"}})" << '\n';
  config.close();
  if (!config) return absl::InternalError(absl::StrCat("cannot write ", dir, "/config.json"));
  return absl::OkStatus();
}

// The three tensors of layers [begin, end).
std::vector<safetensors::TensorToWrite> LayerTensors(
    const std::vector<std::string>& names, const std::vector<const SyntheticLayer*>& layers,
    size_t begin, size_t end) {
  std::vector<safetensors::TensorToWrite> tensors;
  for (size_t i = begin; i < end; ++i) {
    const SyntheticLayer& l = *layers[i];
    const int64_t words = l.shape.N / 8;
    tensors.push_back({names[i] + ".qweight", "I32", {l.shape.K, words}, Bytes(l.qweight)});
    tensors.push_back({names[i] + ".qzeros", "I32", {l.shape.groups(), words}, Bytes(l.qzeros)});
    tensors.push_back(
        {names[i] + ".scales", "F16", {l.shape.groups(), l.shape.N}, Bytes(l.scales)});
  }
  return tensors;
}

}  // namespace

absl::Status WriteCheckpoint(const std::string& dir, const std::vector<std::string>& names,
                             const std::vector<const SyntheticLayer*>& layers) {
  if (absl::Status s = WriteConfig(dir); !s.ok()) return s;
  return safetensors::WriteFile((std::filesystem::path(dir) / "model.safetensors").string(),
                                LayerTensors(names, layers, 0, names.size()));
}

absl::Status WriteShardedCheckpoint(const std::string& dir, const std::vector<std::string>& names,
                                    const std::vector<const SyntheticLayer*>& layers, int shards) {
  if (absl::Status s = WriteConfig(dir); !s.ok()) return s;
  int64_t total = 0;
  for (const SyntheticLayer* l : layers) total += l->shape.packed_bytes();
  std::ofstream index(std::filesystem::path(dir) / "model.safetensors.index.json");
  index << R"({"metadata": {"total_size": )" << total << R"(}, "weight_map": {)";
  size_t begin = 0;
  int64_t written = 0;
  bool first = true;
  for (int s = 0; s < shards && begin < names.size(); ++s) {
    // Layers until this shard's share of the total is reached (the last takes the rest).
    size_t end = begin;
    const int64_t target = total * (s + 1) / shards;
    while (end < names.size() && (written < target || end == begin || s == shards - 1)) {
      written += layers[end]->shape.packed_bytes();
      ++end;
    }
    const std::string file = absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards);
    if (absl::Status st = safetensors::WriteFile((std::filesystem::path(dir) / file).string(),
                                                 LayerTensors(names, layers, begin, end));
        !st.ok()) {
      return st;
    }
    for (size_t i = begin; i < end; ++i) {
      for (const char* role : {"qweight", "qzeros", "scales"}) {
        index << (first ? "" : ", ") << '"' << names[i] << '.' << role << R"(": ")" << file << '"';
        first = false;
      }
    }
    begin = end;
  }
  index << "}}\n";
  index.close();
  if (!index)
    return absl::InternalError(absl::StrCat("cannot write ", dir, "/model.safetensors.index.json"));
  return absl::OkStatus();
}

absl::Status WriteCheckpoint(const std::string& dir, const std::vector<SyntheticLayer>& layers) {
  std::vector<std::string> names;
  std::vector<const SyntheticLayer*> data;
  for (const SyntheticLayer& l : layers) {
    names.push_back(l.name);
    data.push_back(&l);
  }
  return WriteCheckpoint(dir, names, data);
}

int64_t SyntheticModel::fp16_bytes() const {
  int64_t total = 0;
  for (size_t d : data_of) total += distinct[d].shape.output_bytes(DType::kF16);
  return total;
}

SyntheticModel MakeLlamaShapedModel(int blocks, int shrink, uint32_t seed) {
  return MakeLlamaModel(kLlama8B, blocks, shrink, seed);
}

SyntheticModel MakeLlamaModel(const LlamaDims& dims, int blocks, int shrink, uint32_t seed) {
  struct Projection {
    const char* name;
    int64_t K, N;
  };
  const int64_t h = dims.hidden, f = dims.intermediate, kv = dims.kv;
  const Projection kBlock[] = {{"self_attn.q_proj", h, h},  {"self_attn.k_proj", h, kv},
                               {"self_attn.v_proj", h, kv}, {"self_attn.o_proj", h, h},
                               {"mlp.gate_proj", h, f},     {"mlp.up_proj", h, f},
                               {"mlp.down_proj", f, h}};
  SyntheticModel model;
  std::mt19937 rng(seed);
  for (const Projection& p : kBlock) {
    model.distinct.push_back(RandomLayer(p.name, p.K / shrink, p.N / shrink, rng));
  }
  std::vector<std::pair<std::string, size_t>> layers;
  for (int b = 0; b < blocks; ++b) {
    for (size_t p = 0; p < std::size(kBlock); ++p) {
      layers.emplace_back(absl::StrCat("model.layers.", b, ".", kBlock[p].name), p);
    }
  }
  std::sort(layers.begin(), layers.end());
  for (auto& [name, p] : layers) {
    model.names.push_back(std::move(name));
    model.data_of.push_back(p);
  }
  return model;
}

}  // namespace dequantd::e2e
