// Fuzzes FP8 block-scaled checkpoint loading: Checkpoint::Open on a directory holding DeepSeek's
// fp8 config.json (weight_block_size [128, 128]) and the input as model.safetensors. It must
// return a status; every layer it accepts has a shape that passes ValidateShape and a scale grid
// that covers its weight, and the CPU reference and CPU path dequantize its first and last row of
// either orientation. Seeds: small fp8 checkpoints (full, partial and 1 x 1 block grids; fp32,
// bf16 and fp16 scales) and an unquantized `.weight` beside a layer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "kernels/dequant.h"
#include "kernels/format_registry.h"
#include "kernels/fp8_block_format.h"
#include "server/model/checkpoint.h"
#include "tests/fuzz/fuzz_files.h"

namespace {

constexpr char kFp8Config[] =
    R"({"quantization_config":{"activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8",)"
    R"("weight_block_size":[128,128]}})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dequantd;
  const std::string& dir = fuzz::CheckpointDir();
  static const bool config_written = [&] {
    fuzz::WriteFile(dir + "/config.json", kFp8Config);
    return true;
  }();
  (void)config_written;
  fuzz::WriteFile(dir + "/model.safetensors", data, size);
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  if (!checkpoint.ok()) return 0;
  for (const QuantizedLayer& layer : (*checkpoint)->layers()) {
    const QuantShape& shape = layer.view.shape;
    if (!ValidateShape(shape, DType::kF32).ok()) std::abort();
    const TensorSpec scale = TensorSpecOf(shape, fp8_block::kWeightScaleInv);
    if (scale.rows * fp8_block::kBlock < shape.N || scale.cols * fp8_block::kBlock < shape.K) {
      std::abort();  // the grid must cover the weight
    }
    for (Orientation o : {Orientation::kKN, Orientation::kNK}) {
      QuantView view = layer.view;
      view.shape.orientation = o;
      const int64_t rows = view.shape.result_rows();
      std::vector<float> row(static_cast<size_t>(view.shape.result_cols()));
      for (int64_t r : {int64_t{0}, rows - 1}) {
        if (!DequantizeReference(view, DType::kF32, r, r + 1, row.data()).ok()) std::abort();
        if (!DequantizeCpu(view, DType::kF32, r, r + 1, row.data(), 1).ok()) std::abort();
      }
    }
  }
  return 0;
}
