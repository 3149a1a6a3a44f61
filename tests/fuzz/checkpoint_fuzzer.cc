// Fuzzes checkpoint loading: Checkpoint::Open on a directory holding a valid config.json and the
// input as model.safetensors. It must return a status; every layer it accepts has a shape that
// passes ValidateShape and tensors of exactly the bytes that shape needs, which the CPU
// reference then dequantizes (row 0 only, to stay fast).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "kernels/dequant.h"
#include "server/model/checkpoint.h"
#include "tests/fuzz/fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dequantd;
  const std::string& dir = fuzz::CheckpointDir();
  static const bool config_written = [&] {
    fuzz::WriteFile(dir + "/config.json", fuzz::kValidConfig);
    return true;
  }();
  (void)config_written;
  fuzz::WriteFile(dir + "/model.safetensors", data, size);
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  if (!checkpoint.ok()) return 0;
  for (const QuantizedLayer& layer : (*checkpoint)->layers()) {
    if (!ValidateShape(layer.view.shape, DType::kF32).ok()) std::abort();
    std::vector<float> row(static_cast<size_t>(layer.view.shape.N));
    if (!DequantizeReference(layer.view, DType::kF32, 0, 1, row.data()).ok()) std::abort();
  }
  return 0;
}
