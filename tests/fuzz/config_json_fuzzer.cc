// Fuzzes config.json parsing: Checkpoint::Open on a directory holding the input as config.json
// and a valid one-layer shard. It must return a status; when it accepts the config, the numbers
// it read are the ones dequantd serves (bits 4, group_size -1 or positive).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "server/checkpoint.h"
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
  if (c.bits != 4 || (c.group_size != -1 && c.group_size <= 0)) std::abort();
  return 0;
}
