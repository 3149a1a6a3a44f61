// Fuzzes MXFP4 (gpt-oss) checkpoint loading (tests/fuzz/format_checkpoint.h) under gpt-oss's
// config.json (quant_method "mxfp4"): layers from <prefix>_blocks / <prefix>_scales ('_' joins
// prefix and role), the expert axis from their dims. Seeds: transformers' vector checkpoint (two
// projections of 2 experts with their bf16 biases), a 3-expert layer whose scales hold 0, 0xFF and
// 254, a layer without an expert axis, and blocks with no scales beside them.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/format_checkpoint.h"

namespace {

constexpr char kConfig[] =
    R"({"quantization_config":{"quant_method":"mxfp4","modules_to_not_convert":)"
    R"(["model.layers.*.self_attn","model.layers.*.mlp.router","model.embed_tokens","lm_head"]}})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dequantd::fuzz::FuzzFormatCheckpoint(kConfig, data, size);
}
