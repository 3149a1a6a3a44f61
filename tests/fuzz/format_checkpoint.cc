// See format_checkpoint.h.
#include "tests/fuzz/format_checkpoint.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dequant.h"
#include "kernels/format_registry.h"
#include "server/model/checkpoint.h"
#include "tests/fuzz/fuzz_files.h"

namespace dequantd::fuzz {

int FuzzFormatCheckpoint(const char* config, const uint8_t* data, size_t size) {
  const std::string& dir = CheckpointDir();
  static const bool config_written = [&] {
    WriteFile(dir + "/config.json", config);
    return true;
  }();
  (void)config_written;
  WriteFile(dir + "/model.safetensors", data, size);
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  if (!checkpoint.ok()) return 0;
  for (const QuantizedLayer& layer : (*checkpoint)->layers()) {
    if (!ValidateShape(layer.view.shape, DType::kF32).ok()) std::abort();
    const FormatRow& row = FormatRowOf(layer.view.shape.format);
    if (row.check_stored != nullptr && !row.check_stored(layer.view).ok()) std::abort();
    for (Orientation o : {Orientation::kKN, Orientation::kNK}) {
      QuantView view = layer.view;
      view.shape.orientation = o;
      std::vector<float> first(static_cast<size_t>(view.shape.result_cols()));
      if (!DequantizeReference(view, DType::kF32, 0, 1, first.data()).ok()) std::abort();
      if (!DequantizeCpu(view, DType::kF32, 0, 1, first.data(), 1).ok()) std::abort();
    }
  }
  return 0;
}

}  // namespace dequantd::fuzz
