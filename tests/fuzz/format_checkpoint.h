// The body of the per-format checkpoint fuzzers (gptq_checkpoint, compressed_tensors_checkpoint):
// Checkpoint::Open on a directory holding `config` as config.json and the input as
// model.safetensors. It must return a status; every layer it accepts has a shape that passes
// ValidateShape, values that pass the format's stored-value checks, and the CPU reference and CPU
// path dequantize its first row of either orientation; anything else aborts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dequantd::fuzz {

int FuzzFormatCheckpoint(const char* config, const uint8_t* data, size_t size);

}  // namespace dequantd::fuzz
