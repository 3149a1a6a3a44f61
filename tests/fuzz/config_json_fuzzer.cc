// Fuzzes config.json parsing: Checkpoint::Open on a directory holding the input as config.json
// and a valid one-layer shard. It must return a status; when it accepts the config, the numbers
// it read are the ones dequantd serves (AWQ bits 4, GPTQ 2/3/4/8 with checkpoint_format gptq or
// gptq_v2; compressed-tensors pack-quantized 4/8 with a served strategy, float-quantized 8 with
// tensor, channel, group or block (positive block_structure); group_size -1 or positive). (A
// compressed-tensors config is parsed in full, then refused for the AWQ shard.)
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "server/model/checkpoint.h"
#include "tests/fuzz/fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dequantd;
  const std::string& dir = fuzz::CheckpointDir();
  static const bool shard_written = [&] {
    fuzz::WriteFile(dir + "/model.safetensors", fuzz::ValidShard());
    return true;
  }();
  (void)shard_written;
  fuzz::WriteFile(dir + "/config.json", data, size);
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  if (!checkpoint.ok()) return 0;
  const QuantizationConfig& c = (*checkpoint)->config();
  const bool bits_served =
      c.format == Format::kGptq ? (c.bits == 2 || c.bits == 3 || c.bits == 4 || c.bits == 8) &&
                                      (c.version == "gptq" || c.version == "gptq_v2")
      : c.format == Format::kCompressedTensors
          ? (c.bits == 4 || c.bits == 8) && c.version == "pack-quantized" &&
                (c.strategy == "group" || c.strategy == "channel" || c.strategy == "tensor")
      : c.format == Format::kCompressedTensorsFp8
          ? c.bits == 8 && c.version == "float-quantized" &&
                (c.strategy == "group" || c.strategy == "channel" || c.strategy == "tensor" ||
                 (c.strategy == "block" && c.block_rows > 0 && c.group_size > 0))
          : c.bits == 4;
  if (!bits_served || (c.group_size != -1 && c.group_size <= 0)) std::abort();
  return 0;
}
