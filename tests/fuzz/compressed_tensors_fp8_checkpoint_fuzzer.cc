// Fuzzes compressed-tensors float-quantized (FP8) checkpoint loading
// (tests/fuzz/format_checkpoint.h) under a block-strategy config.json (block_structure [2, 4]: a
// weight_scale grid of (ceil(N/2), ceil(K/4)), partial edge blocks). Seeds: small FP8 checkpoints
// (fp32, bf16 and fp16 scales; partial and 1 x 1 grids; an input_scale and an unquantized `.weight`
// beside a layer).
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/format_checkpoint.h"

namespace {

constexpr char kConfig[] =
    R"({"quantization_config":{"quant_method":"compressed-tensors","format":"float-quantized",)"
    R"("quantization_status":"compressed","config_groups":{"group_0":{"targets":["Linear"],)"
    R"("weights":{"num_bits":8,"type":"float","symmetric":true,"strategy":"block",)"
    R"("block_structure":[2,4],"dynamic":false}}}}})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dequantd::fuzz::FuzzFormatCheckpoint(kConfig, data, size);
}
