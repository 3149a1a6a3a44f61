// Fuzzes compressed-tensors checkpoint loading (tests/fuzz/format_checkpoint.h) under a
// pack-quantized config.json (int4, group 32, asymmetric, actorder group: weight_zero_point and
// weight_g_idx required, weight_shape checked). Seeds: the compressed-tensors reference vectors.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/format_checkpoint.h"

namespace {

constexpr char kConfig[] =
    R"({"quantization_config":{"quant_method":"compressed-tensors","format":"pack-quantized",)"
    R"("quantization_status":"compressed","config_groups":{"group_0":{"targets":["Linear"],)"
    R"("weights":{"num_bits":4,"type":"int","symmetric":false,"strategy":"group",)"
    R"("group_size":32,"actorder":"group","dynamic":false}}}}})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dequantd::fuzz::FuzzFormatCheckpoint(kConfig, data, size);
}
