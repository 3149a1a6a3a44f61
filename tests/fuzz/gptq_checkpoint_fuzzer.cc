// Fuzzes GPTQ checkpoint loading (tests/fuzz/format_checkpoint.h) under a GPTQ config.json (v1
// zeros, desc_act, so g_idx is required and gathered). Seeds: the GPTQ reference vectors.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/format_checkpoint.h"

namespace {

constexpr char kGptqConfig[] =
    R"({"quantization_config":{"quant_method":"gptq","bits":4,"group_size":32,"desc_act":true,)"
    R"("sym":false,"checkpoint_format":"gptq"}})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dequantd::fuzz::FuzzFormatCheckpoint(kGptqConfig, data, size);
}
