// Files for the checkpoint fuzzers: one private directory per process holding config.json and
// model.safetensors, rewritten for each input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dequantd::fuzz {

// The fuzzer's checkpoint directory (created on first use under $TMPDIR or /tmp).
const std::string& CheckpointDir();

// Writes `size` bytes at `data` to `path` (replacing it).
void WriteFile(const std::string& path, const uint8_t* data, size_t size);
inline void WriteFile(const std::string& path, const std::string& text) {
  WriteFile(path, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

// A valid model.safetensors holding one AWQ layer "l" (K 64, N 8, group size 64, fp16 scales).
std::string ValidShard();
// A valid config.json for it.
inline constexpr char kValidConfig[] =
    R"({"quantization_config":{"quant_method":"awq","bits":4,"group_size":64,)"
    R"("zero_point":true,"version":"gemm"}})";

}  // namespace dequantd::fuzz
