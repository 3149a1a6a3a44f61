// The checkpoint store: an AWQ GEMM checkpoint directory, memory-mapped and validated.
// A directory holds config.json (with quantization_config: quant_method "awq", bits 4,
// group_size, zero_point true, version "gemm") and one `model.safetensors`, or several shards
// listed in `model.safetensors.index.json` ("weight_map": tensor -> file). A quantized layer is
// a prefix P with P.qweight (int32 (K, N/8)), P.qzeros (int32 (K/G, N/8)) and P.scales
// (fp16/bf16 (K/G, N)); G is derived from the shapes (K / scales rows) and must divide K.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/safetensors.h"
#include "kernels/dequant.h"

namespace dequantd {

struct QuantizationConfig {
  std::string quant_method;  // "awq"
  int bits = 4;
  int64_t group_size = 128;  // as written; -1 means per-column (G = K)
  bool zero_point = true;
  std::string version;  // "gemm"
};

struct QuantizedLayer {
  std::string name;       // prefix, e.g. "model.layers.0.mlp.down_proj"
  PackedTensorView view;  // host pointers into the mapped files (or aligned copies); 4-byte aligned
  std::string file;       // the safetensors file holding qweight
};

class Checkpoint {
 public:
  // Opens and validates `dir`. Policy for a corrupt file (bad safetensors header, offsets past
  // the end, a layer whose tensors disagree on shape or dtype): the checkpoint is refused and
  // the server does not start; the error names the file, tensor and field.
  // Errors: NOT_FOUND (dir, config.json or a shard missing), INVALID_ARGUMENT (not AWQ gemm 4-bit,
  // inconsistent shapes), DATA_LOSS (truncated file).
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);
  ~Checkpoint();

  const std::string& dir() const { return dir_; }
  const QuantizationConfig& config() const { return config_; }
  // Layers sorted by name. Views stay valid for the Checkpoint's lifetime.
  const std::vector<QuantizedLayer>& layers() const { return layers_; }
  // nullptr if there is no such layer.
  const QuantizedLayer* Find(std::string_view name) const;

 private:
  Checkpoint() = default;
  std::string dir_;
  QuantizationConfig config_;
  std::vector<std::unique_ptr<safetensors::MappedFile>> files_;
  std::vector<std::vector<int32_t>> aligned_copies_;  // for tensors not 4-byte aligned in a map
  std::vector<QuantizedLayer> layers_;
};

}  // namespace dequantd
