// Fuzzes GPTQ checkpoint loading: Checkpoint::Open on a directory holding a GPTQ config.json
// (v1 zeros, desc_act, so g_idx is required and gathered) and the input as model.safetensors.
// It must return a status; every layer it accepts has a shape that passes ValidateShape, values
// that pass the format's stored-value checks (g_idx in range), and the CPU reference and CPU path
// dequantize its first row of either orientation. Seeds: the GPTQ reference vectors.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "kernels/dequant.h"
#include "kernels/format_registry.h"
#include "server/checkpoint.h"
#include "tests/fuzz/fuzz_files.h"

namespace {

constexpr char kGptqConfig[] =
    R"({"quantization_config":{"quant_method":"gptq","bits":4,"group_size":32,"desc_act":true,)"
    R"("sym":false,"checkpoint_format":"gptq"}})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dequantd;
  const std::string& dir = fuzz::CheckpointDir();
  static const bool config_written = [&] {
    fuzz::WriteFile(dir + "/config.json", kGptqConfig);
    return true;
  }();
  (void)config_written;
  fuzz::WriteFile(dir + "/model.safetensors", data, size);
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
